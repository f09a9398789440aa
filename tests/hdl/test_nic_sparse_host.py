"""SparseHost alone in Amaranth's simulator, beside a queue reference: host words pushed
through SP_IN / SP_PUSH reach ``host_i`` in order, none lost or doubled, a START word
behind every word pushed before it, with random engine stalls; HOST_IN takes exactly
``host_fifo`` words while the engine takes none (its level in SP_STATUS), and refuses the
next. Words the engine writes on ``host_o`` whenever ``ready`` says so all reach the host's
SP_OUT_POP / INDEX / VALUE reads, in order, under random host pops; HOST_OUT holds
``host_fifo`` words."""
import random

import pytest
from amaranth.sim import Simulator

from treenic.hdl.nic import NicParams
from treenic.hdl.nic.host import sparse_push_writes
from treenic.hdl.nic.params import SPARSE_READ_REGS, Reg, SparseParams
from treenic.hdl.nic.sparse_engine import HostKind
from treenic.hdl.nic.sparse_host import SparseHost
from treenic.schedule.sparse_table import compile_sparse
from treenic.sparse.multitree_sparse import MultiTreeSparse

from nic_unit_helpers import simulate


def _host(host_fifo):
    prog = compile_sparse(MultiTreeSparse(2, 64, 0.25, seed=1, topology="ring:2"))
    sparse = SparseParams.for_program(prog, lanes=2, topk_units=1, host_fifo=host_fifo)
    return SparseHost(params=NicParams(ports=prog.ports, depth=64, max_nodes=4,
                                       max_entries=16, max_steps=8, sub_words=4, credits=6,
                                       sparse=sparse))


def _reg(ctx, dut, reg):
    return ctx.get(dut.regs[SPARSE_READ_REGS.index(reg)])


async def _cycle(ctx, dut, op, *, ready=0, start=0):
    """One cycle: bus write ``op`` (or none), engine ``host_i.ready``, ``start``. Returns
    (refused, the word the engine took or None)."""
    ctx.set(dut.we, op is not None)
    if op is not None:
        ctx.set(dut.addr, int(op[0]))
        ctx.set(dut.wdata, op[1])
    ctx.set(dut.host_i.ready, ready)
    ctx.set(dut.start, start)
    refused = ctx.get(dut.refused)
    took = ctx.get(dut.host_i.payload.as_value()) if ready and ctx.get(dut.host_i.valid) \
        else None
    await ctx.tick()
    return bool(refused), took


@pytest.mark.parametrize("host_fifo", [2, 3, 16])
def test_host_in_keeps_order_and_holds_host_fifo_words(host_fifo):
    rng = random.Random(host_fifo)
    dut = _host(host_fifo)

    async def tb(ctx):
        ctx.set(dut.drained, 1)
        assert await _cycle(ctx, dut, (Reg.SP_MODE, 1)) == (False, None)
        assert ctx.get(dut.mode) == 1
        # the engine takes nothing: exactly host_fifo words fit, the next is refused
        held = [rng.getrandbits(120) << 3 | HostKind.GRAD for _ in range(host_fifo + 1)]
        refusals = []
        for w in held:
            for op in sparse_push_writes(w):
                refusals.append((await _cycle(ctx, dut, op))[0])
        assert refusals[:-1] == [False] * (len(refusals) - 1) and refusals[-1]
        await _cycle(ctx, dut, None)
        assert (_reg(ctx, dut, Reg.SP_STATUS) >> 8) & 0xFF == host_fifo
        # random pushes, a START, more pushes, the engine stalling at random
        want, got = held[:-1], []
        ops = [(op, w) for w in (rng.getrandbits(120) << 3 | HostKind.GRAD
                                 for _ in range(30)) for op in sparse_push_writes(w)]
        pushes, i, n = 0, 0, 0
        while i < len(ops) or n < 40 * host_fifo:
            op, w = ops[i] if i < len(ops) and rng.random() < 0.7 else (None, None)
            i += op is not None
            is_push = op is not None and op[0] == Reg.SP_PUSH
            pushes += is_push
            # START (the fabric-wide start) with the 16th SP_PUSH: behind that word too
            start = is_push and pushes == 16
            refused, took = await _cycle(ctx, dut, op, ready=rng.random() < 0.5, start=start)
            if is_push and not refused:
                want.append(w)
            if start:
                want.append("START")
            if took is not None:
                got.append("START" if took & 7 == HostKind.START else took)
            n += i >= len(ops)
        assert "START" in want and got == want
        assert (_reg(ctx, dut, Reg.SP_STATUS) >> 8) & 0xFF == 0

    simulate(dut, tb)


async def _pop(ctx, dut):
    """SP_OUT_POP, then INDEX and VALUE: the head word (index, value, final, end) or None."""
    ctx.set(dut.addr, int(Reg.SP_OUT_POP))
    ctx.set(dut.re, 1)
    await ctx.tick()
    ctx.set(dut.re, 0)
    flags = _reg(ctx, dut, Reg.SP_OUT_POP)     # HostRegs registers this cycle's value
    await ctx.tick()
    if not flags & 1:
        return None
    return (_reg(ctx, dut, Reg.SP_OUT_INDEX), _reg(ctx, dut, Reg.SP_OUT_VALUE),
            flags >> 1 & 1, flags >> 2 & 1)


@pytest.mark.parametrize("host_fifo", [2, 5, 16])
def test_host_out_loses_nothing_and_holds_host_fifo_words(host_fifo):
    """The engine writes whenever ``host_o.ready`` (a register) says so; every word is
    kept (the FIFO had room), in order, under random host pops."""
    rng = random.Random(host_fifo)
    dut = _host(host_fifo)
    words = [(rng.getrandbits(32), rng.getrandbits(32), rng.getrandbits(1), 0)
             for _ in range(12 * host_fifo)]
    words[-1] = words[-1][:3] + (1,)
    sent = []

    async def engine(ctx):
        """host_o: offers the next word at random, counts it sent on valid & ready."""
        while True:
            n = len(sent)
            offer = n < len(words) and rng.random() < 0.7
            if offer:
                index, value, final, end = words[n]
                ctx.set(dut.host_o.payload.as_value(),
                        index | value << 32 | final << 64 | end << 65)
            ctx.set(dut.host_o.valid, offer)
            if offer and ctx.get(dut.host_o.ready):
                sent.append(words[n])
            await ctx.tick()

    async def tb(ctx):
        for _ in range(8 * host_fifo):              # nobody pops: host_fifo words fit
            await ctx.tick()
        assert len(sent) == host_fifo
        assert (_reg(ctx, dut, Reg.SP_STATUS) >> 16) & 0xFF == host_fifo
        got = []
        for _ in range(20 * len(words)):        # bounded: a lost END word fails, not hangs
            if got and got[-1][3]:
                break
            for _ in range(rng.randrange(4)):
                await ctx.tick()
            word = await _pop(ctx, dut)
            if word is not None:
                got.append(word)
        assert got == words == sent

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(engine, background=True)
    sim.add_testbench(tb)
    sim.run()
