"""SkidBuffer: the identity on transfers under random valid/ready, full throughput, and
``i.ready`` a register (it never follows ``o.ready`` within a cycle)."""
import random

import pytest
from amaranth.sim import Simulator

from treenic.hdl.skid import SkidBuffer


def _run(p_in, p_out, n=400, seed=1):
    rng = random.Random(seed)
    dut = SkidBuffer(16)
    data = [rng.getrandbits(16) for _ in range(n)]
    got, cycles = [], [0]

    async def source(ctx):
        for d in data:
            ctx.set(dut.i.payload, d)
            ctx.set(dut.i.valid, 0)
            while rng.random() < p_in:          # idle cycles
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        for _ in range(20 * n):                  # bounded: a lost transfer fails, not hangs
            if len(got) == n:
                break
            rdy = rng.random() >= p_out          # backpressure
            ctx.set(dut.o.ready, rdy)
            ready_before = ctx.get(dut.i.ready)
            await ctx.delay(1e-9)                # o.ready changed: i.ready must not
            assert ctx.get(dut.i.ready) == ready_before
            _, _, v, d = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            cycles[0] += 1
            if v and rdy:
                got.append(d)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return data, got, cycles[0]


@pytest.mark.parametrize("p_in,p_out", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.4), (0.5, 0.5)])
def test_skid_is_the_identity_under_stalls(p_in, p_out):
    data, got, _ = _run(p_in, p_out)
    assert got == data


def test_skid_full_throughput():
    data, got, cycles = _run(0.0, 0.0, n=200)
    assert got == data and cycles <= len(data) + 2    # one cycle of latency
