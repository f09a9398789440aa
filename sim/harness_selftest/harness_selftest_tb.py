"""cocotb side of the harness self-test."""
import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset


@cocotb.test()
async def inc_ok(dut):
    n = bench_params()["n"]
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=lambda d: setattr(d.i, "value", 0))
    for _ in range(n):
        v = rng.randrange(256)
        await FallingEdge(dut.clk)
        dut.i.value = v
        await RisingEdge(dut.clk)
        await ReadOnly()
        assert int(dut.o.value) == (v + 1) & 0xFF


@cocotb.test()
async def inc_wrong(dut):
    """Deliberately wrong expectation: the harness must report this test as failed."""
    await start_clock_and_reset(dut, init=lambda d: setattr(d.i, "value", 0))
    dut.i.value = 3
    await RisingEdge(dut.clk)
    await ReadOnly()
    assert int(dut.o.value) == 5
