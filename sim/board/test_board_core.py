"""Whole-board bench at the pins: BoardCore (LiteEth RGMII PHY + MAC + ARP/IPv4/UDP, host
protocol engine, NIC) with cocotbext-eth RGMII models on its Ethernet pins; the host
protocol's requests go in as real Ethernet frames and the replies are checked against the
golden codec (make sim; Verilator by default for this bench, ``TREENIC_BOARD_SIM=icarus``
for Icarus: LiteEth's Verilog normalised by Yosys first, ~2.5 min here)."""
import os
from pathlib import Path

import pytest

from harness import run_bench

pytest.importorskip("liteeth")
pytest.importorskip("cocotbext.eth")

from treenic.boards.boardsim import SIM_NIC, VERILATOR_MAKEFLAGS, liteeth_sources  # noqa
from treenic.boards.core import BoardCore                      # noqa: E402
from treenic.hdl.nic import NicParams                          # noqa: E402

HERE = Path(__file__).resolve().parent


def board_bench(name, test_module, params=None, testcase=None, sim=None):
    sim = sim or os.environ.get("TREENIC_BOARD_SIM", "verilator")
    if sim == "verilator":
        os.environ["MAKEFLAGS"] = VERILATOR_MAKEFLAGS
    src = liteeth_sources(sim)
    return run_bench(BoardCore(params=NicParams(**SIM_NIC), verilog=src[0]),
                     name=name, test_module=test_module, sim=sim, extra_sources=src,
                     build_args=["--timing"] if sim == "verilator" else [],
                     params={"nic": SIM_NIC, **(params or {})}, testcase=testcase,
                     test_dir=HERE)


def test_board_core_host_protocol():
    board_bench("board_core", "board_core_tb")


def test_udp_driver_transport_through_loopback_bridge():
    """The udp backend's BoardClient, in its own process, over a real UDP socket bridged
    to the simulated board's RGMII pins (same build as the bench above)."""
    board_bench("board_core", "board_bridge_tb")


def test_pins_harness_agrees_with_cocotbext(tmp_path):
    """The fast board simulator (:mod:`treenic.boards.pinsim`, RGMII PHY in C++) against
    the reference (cocotbext-eth's RGMII models under cocotb) on the same board top: the
    same requests give the same reply bytes, and the host link the same WRITE rate."""
    import json
    from treenic.boards import pinsim
    p = NicParams(**SIM_NIC)
    reqs, bulk = pinsim.agreement_requests(p), pinsim.bulk_writes(p)
    out = tmp_path / "reference.json"
    # TREENIC_SIM_MAKEFLAGS: e.g. "OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0", a faster build
    os.environ["MAKEFLAGS"] = (VERILATOR_MAKEFLAGS + " " +
                               os.environ.get("TREENIC_SIM_MAKEFLAGS", "")).strip()
    run_bench(pinsim.PinBoard(params=p, verilog=liteeth_sources()[0]), name="pin_board_ref",
              test_module="pins_agree_tb", sim="verilator", extra_sources=liteeth_sources(),
              build_args=["--timing"], test_dir=HERE,
              params={"ports": p.ports, "requests": reqs, "bulk": bulk,
                      "timeout_ns": 100_000, "out": str(out)})
    ref = json.loads(out.read_text())
    cl = pinsim.PinCluster(None, p)
    cl.reset()
    fast = pinsim.run_requests(cl, 0, reqs, bulk, timeout_cycles=100_000 // 8)
    stats = cl.stats()
    cl.close()
    (HERE.parents[1] / "build" / "sim" / "pin_board_ref" / "agreement.json").write_text(
        json.dumps({"cocotbext_payload_mbps": ref["bulk_payload_mbps"],
                    "pins_payload_mbps": fast["bulk_payload_mbps"],
                    "replies_equal": fast["replies"] == ref["replies"], "pins_stats": stats}))
    assert fast["replies"] == ref["replies"]
    assert ref["replies"][4] is None and None not in ref["replies"][:4]
    assert abs(fast["bulk_payload_mbps"] - ref["bulk_payload_mbps"]) < 0.01 * ref["bulk_payload_mbps"]
    assert stats["fcs_errors"] == stats["framing_errors"] == 0
