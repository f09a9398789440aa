"""Fault injector (hdl/link/inject.py) in the Amaranth simulator against its golden
function: delivered beats bit for bit per fault mode, and the credits the sender gets back
(one per flit it sent, except on a dead link)."""
import random

import pytest
from amaranth.sim import Simulator

from treenic.hdl.link import model
from treenic.hdl.link.crc import append_crc
from treenic.hdl.link.flit import FlitFormat
from treenic.hdl.link.inject import FaultInjector, FaultMode, apply_fault

FMT = FlitFormat(vcs=1)


def stream(rng):
    flits = []
    for _ in range(4):
        n = rng.randint(1, 30)
        h = dict(vc=0, flow=1, op=1, step=2, offset=rng.randrange(500), length=n)
        flits += model.packetise(h, [rng.getrandbits(32) for _ in range(n)], "message", FMT,
                                 sub_words=8)
    return append_crc(FMT, flits)


@pytest.mark.parametrize("mode", [FaultMode.FLIP, FaultMode.DROP, FaultMode.DUP,
                                  FaultMode.STALL, FaultMode.KILL])
def test_injector_matches_golden(mode):
    rng = random.Random(int(mode))
    beats = stream(rng)
    at = rng.randrange(len(beats))
    mask = rng.getrandbits(FMT.flit_bits + 16) | 1
    dut = FaultInjector(FMT, crc_width=16, max_sub_flits=8)
    got, credits = [], [0]

    async def sender(ctx):
        ctx.set(dut.mode, int(mode))
        ctx.set(dut.mask, mask)
        ctx.set(dut.length, 7)
        for k, (f, c) in enumerate(beats):
            if k == at:
                for _ in range(4):                      # let the FIFO drain, then arm
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.arm, 1)
            while rng.random() < 0.3:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.flit.as_value(), f)
            ctx.set(dut.i.crc, c)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(60)

    async def receiver(ctx):
        pend = 0
        async for _, _, v, f, c, cr in ctx.tick().sample(dut.o.valid, dut.o.flit.as_value(),
                                                          dut.o.crc, dut.i.credit):
            credits[0] += cr
            ctx.set(dut.o.credit, pend)               # the receiver pops at once
            pend = v
            if v:
                got.append((f, c))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(sender)
    sim.add_testbench(receiver, background=True)
    sim.run()
    assert got == apply_fault(FMT, beats, mode, at=at, mask=mask)
    if mode == FaultMode.KILL:
        assert credits[0] == at
    else:
        assert credits[0] == len(beats)
