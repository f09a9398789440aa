"""Whole-board bench at the pins: BoardCore (LiteEth RGMII PHY + MAC + ARP/IPv4/UDP, host
protocol engine, NIC) with cocotbext-eth RGMII models on its Ethernet pins; the host
protocol's requests go in as real Ethernet frames and the replies are checked against the
golden codec (make sim; Verilator by default for this bench: Icarus runs LiteEth's
Verilog at ~1 k cycles/s)."""
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
    return run_bench(BoardCore(params=NicParams(**SIM_NIC), verilog=liteeth_sources()[0]),
                     name=name, test_module=test_module, sim=sim,
                     extra_sources=liteeth_sources(), build_args=["--timing"],
                     params={"nic": SIM_NIC, **(params or {})}, testcase=testcase,
                     test_dir=HERE)


def test_board_core_host_protocol():
    board_bench("board_core", "board_core_tb")


def test_udp_driver_transport_through_loopback_bridge():
    """The udp backend's BoardClient, in its own process, over a real UDP socket bridged
    to the simulated board's RGMII pins (same build as the bench above)."""
    board_bench("board_core", "board_bridge_tb")
