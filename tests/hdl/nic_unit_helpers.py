"""Shared helpers of the NIC per-component Amaranth-simulator tests (tests/hdl/)."""
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from treenic.hdl.nic import NicParams
from treenic.hdl.nic.buffer import READ_LATENCY, BankedBuffer

#: a small NIC build: 2 ports, 64-bit flits (2 lanes), 64-element buffer
SMALL = NicParams(ports=2, depth=64, max_nodes=4, max_entries=16, max_steps=8, sub_words=8,
                  credits=8)


def simulate(top, testbench, *, processes=()):
    """Run ``testbench(ctx)`` (async) on ``top`` with a 100 MHz clock."""
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    for p in processes:
        sim.add_process(p)
    sim.run()


class UnitWithBuffer(Elaboratable):
    """A unit under test with its own :class:`BankedBuffer` (reader 0 and writer 0 for the
    testbench, then the unit's ``read`` / ``write`` ports)."""

    def __init__(self, unit, params, *, unit_reads=True, unit_writes=False):
        self.unit, self.params = unit, params
        self.unit_reads, self.unit_writes = unit_reads, unit_writes
        self.buf = BankedBuffer(depth=params.depth, banks=params.banks, lanes=params.lanes,
                                readers=1 + unit_reads, writers=1 + unit_writes,
                                write_back=[1] if unit_writes else [])

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit, m.submodules.buf = self.unit, self.buf
        if self.unit_reads:
            wiring.connect(m, self.unit.read, self.buf.rd[1])
        if self.unit_writes:
            wiring.connect(m, self.unit.write, self.buf.wr[1])
        return m


async def buffer_fill(ctx, buf, words):
    """Write ``words`` (uint32) into the buffer through writer 0, one element a cycle."""
    for e, w in enumerate(words):
        ctx.set(buf.wr[0].addr, e)
        ctx.set(buf.wr[0].en, 1)
        ctx.set(buf.wr[0].data, int(w))
        await ctx.tick()
    ctx.set(buf.wr[0].en, 0)


async def buffer_dump(ctx, buf, n):
    """Read elements 0..n-1 through reader 0 (never refused: the highest priority)."""
    out = []
    for e in range(n):
        ctx.set(buf.rd[0].req, 1)
        ctx.set(buf.rd[0].addr, e)
        await ctx.tick()
        ctx.set(buf.rd[0].req, 0)
        await ctx.tick().repeat(READ_LATENCY - 1)
        out.append(ctx.get(buf.rd[0].data) & 0xFFFFFFFF)
    return out
