"""Amaranth-simulator tests of the scatter-accumulate unit against
``treenic.sparse.base.scatter_accumulate`` (local value first, messages in order)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from treenic.hdl.sparse.scatter import LATENCY, ScatterAccumulate
from treenic.hdl.sparse.simdrive import run_stream_unit
from treenic.sparse.base import SparseError, scatter_accumulate

DEPTH = 64


def _values(rng, n):
    """binary32 patterns with ±0, subnormals, exact cancellations and large magnitudes."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 30, n)
    sub = rng.integers(1, 1 << 23, n).astype(np.uint32).view(np.float32)
    x = np.where(rng.random(n) < 0.2, sub, x)
    x = np.where(rng.random(n) < 0.1, np.float32(-0.0), x)
    return x.astype(np.float32)


def run_scatter(dense, messages, banks=1, **kw):
    dut = ScatterAccumulate(depth=DEPTH, init=dense.view(np.uint32).tolist(), banks=banks)
    words = [int(i) | (int(v) << 32) for idx, val in messages
             for i, v in zip(idx, np.asarray(val, np.float32).view(np.uint32))]
    out, cycles = run_stream_unit(dut, words, **kw)
    return [(w & 0xFFFFFFFF, w >> 32) for w in out], cycles


def _messages(rng, count, dense):
    msgs = []
    for _ in range(count):
        idx = np.sort(rng.choice(DEPTH, int(rng.integers(1, 20)), replace=False))
        val = _values(rng, idx.size)
        cancel = rng.random(idx.size) < 0.1                     # exact x + (-x) = +0
        val[cancel] = -dense[idx[cancel]]
        msgs.append((idx, val))
    return msgs


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), count=st.integers(1, 5), banks=st.sampled_from([1, 2, 16]))
def test_matches_golden_with_stalls(seed, count, banks):
    """The golden writes, with the buffer in one block RAM or in banks (the engine's)."""
    rng = np.random.default_rng(seed)
    dense = _values(rng, DEPTH)
    msgs = _messages(rng, count, dense)
    _, writes = scatter_accumulate(dense, msgs)
    got, _ = run_scatter(dense, msgs, banks=banks, p_valid=0.7, p_ready=0.6, seed=seed)
    gold = [(i, int(np.float32(v).view(np.uint32))) for i, v in writes]
    assert got == gold


def test_one_pair_per_cycle_within_a_message():
    rng = np.random.default_rng(1)
    dense = _values(rng, DEPTH)
    idx = np.arange(0, DEPTH, 1)
    msgs = [(idx, _values(rng, idx.size))]
    got, cycles = run_scatter(dense, msgs)
    assert len(got) == DEPTH
    assert cycles <= DEPTH + LATENCY + 1, cycles


def test_golden_rejects_bad_messages():
    with pytest.raises(SparseError, match="range"):
        scatter_accumulate(np.zeros(4, np.float32), [([4], [1.0])])
    with pytest.raises(SparseError, match="ascending"):
        scatter_accumulate(np.zeros(4, np.float32), [([2, 1], [1.0, 2.0])])


def test_distinct_pairs_in_any_order_one_a_cycle():
    """``distinct_port``: pairs the caller guarantees distinct (the hash placer's sweep: a
    permutation of the buffer) issue one a cycle in any order, each write the golden's
    (every pair its own one-pair message); without the port the unit drains at every
    descent."""
    rng = np.random.default_rng(3)
    dense = _values(rng, DEPTH)
    order = rng.permutation(DEPTH)
    val = _values(rng, DEPTH)
    msgs = [(np.array([i]), val[n:n + 1]) for n, i in enumerate(order)]
    _, writes = scatter_accumulate(dense, msgs)
    gold = [(i, int(np.float32(v).view(np.uint32))) for i, v in writes]
    words = [int(i) | (int(v) << 32) for i, v in zip(order, val.view(np.uint32))]
    dut = ScatterAccumulate(depth=DEPTH, init=dense.view(np.uint32).tolist(), distinct_port=True)
    out, cycles = run_stream_unit(dut, words, setup=lambda ctx: ctx.set(dut.distinct, 1))
    assert [(w & 0xFFFFFFFF, w >> 32) for w in out] == gold
    assert cycles <= DEPTH + LATENCY + 1, cycles
    _, slow = run_scatter(dense, msgs)
    assert slow > 2 * DEPTH


def test_old_port_reports_every_logged_operand_in_order():
    """``old_port``: every pair fed with ``log`` high reports (index, the word it
    replaces), in input order, with stalls and backpressure and across message boundaries
    (read-after-write on one index); pairs fed with ``log`` low report nothing; the writes
    stay the golden's."""
    from amaranth.sim import Simulator
    rng = np.random.default_rng(5)
    dense = _values(rng, DEPTH)
    msgs = _messages(rng, 4, dense)
    pairs = [(int(i), v) for idx, val in msgs for i, v in zip(idx, val.view(np.uint32))]
    logged = rng.random(len(pairs)) < 0.7
    buf, want = dense.copy(), []
    for (i, v), log in zip(pairs, logged):
        if log:
            want.append((i, int(buf[i:i + 1].view(np.uint32)[0])))
        buf[i] = buf[i] + np.uint32(v).view(np.float32)
    dut = ScatterAccumulate(depth=DEPTH, init=dense.view(np.uint32).tolist(), old_port=True)
    got, writes = [], []

    async def producer(ctx):
        for (i, v), log in zip(pairs, logged):
            while rng.random() < 0.3:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload.index, i)
            ctx.set(dut.i.payload.value, int(v))
            ctx.set(dut.log, int(log))
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def monitor(ctx):
        while len(writes) < len(pairs):
            ctx.set(dut.o.ready, int(rng.random() < 0.6))
            _, _, ov, oi, oo, wv, wr = await ctx.tick().sample(
                dut.old.valid, dut.old.payload.index, dut.old.payload.value, dut.o.valid,
                dut.o.ready)
            if ov:
                got.append((oi, oo))
            if wv and wr:
                writes.append(1)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(monitor)
    sim.run()
    assert got == want and len(want) > 10


def test_idle_is_low_exactly_while_an_accepted_pair_is_unwritten():
    """``idle`` each cycle equals (pairs accepted in range == writes done), with stalls,
    backpressure, message boundaries and out-of-range pairs (dropped, never counted)."""
    from amaranth.sim import Simulator
    rng = np.random.default_rng(9)
    dense = _values(rng, DEPTH)
    pairs = [(int(i), int(v)) for idx, val in _messages(rng, 5, dense)
             for i, v in zip(idx, val.view(np.uint32))]
    for at in rng.choice(len(pairs), 4, replace=False):
        pairs[at] = (DEPTH + int(at), pairs[at][1])
    in_range = sum(i < DEPTH for i, _ in pairs)
    dut = ScatterAccumulate(depth=DEPTH, init=dense.view(np.uint32).tolist())
    seen = []

    async def producer(ctx):
        for i, v in pairs:
            while rng.random() < 0.3:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload.index, i)
            ctx.set(dut.i.payload.value, v)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def monitor(ctx):
        accepted = written = 0
        while written < in_range:
            ctx.set(dut.o.ready, int(rng.random() < 0.6))
            _, _, idle, iv, ir, ii, ov, orr = await ctx.tick().sample(
                dut.idle, dut.i.valid, dut.i.ready, dut.i.payload.index, dut.o.valid,
                dut.o.ready)
            seen.append((idle, accepted == written))
            accepted += bool(iv and ir and ii < DEPTH)
            written += bool(ov and orr)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(monitor)
    sim.run()
    assert all(bool(idle) == want for idle, want in seen)
    assert sum(not want for _, want in seen) > len(pairs)


def test_golden_receive_rule_drops_malformed_messages_whole():
    """``receive_message`` / ``receive_words`` (the engine's receive rule): a well-formed
    message is scatter-accumulated; a pair outside the flow, not ascending, over the
    budget, broken framing or words that do not decode leave the buffer as it was."""
    from treenic.sparse.base import receive_message
    from treenic.sparse.codec import encode_message, receive_words
    dense = np.arange(8, dtype=np.float32)
    kw = dict(lo=2, n=4, k=3)
    ok, taken = receive_message(dense, [2, 5], [1.0, 2.0], **kw)
    assert taken and ok.tolist() == [0, 1, 3, 3, 4, 7, 6, 7]
    for idx, extra in (([1, 3], {}), ([2, 6], {}), ([3, 3], {}), ([4, 2], {}),
                       ([2, 3, 4, 5], {}), ([2, 3], {"intact": False})):
        got, taken = receive_message(dense, idx, np.ones(len(idx), np.float32), **kw, **extra)
        assert not taken and np.array_equal(got, dense) and got is not dense
    words = encode_message(np.array([0, 3]), np.array([1.0, 2.0], np.float32), 4)
    got, taken = receive_words(dense, words, **kw)
    assert taken and np.array_equal(got, ok)
    got, taken = receive_words(dense, words[:-1], **kw)
    assert not taken and np.array_equal(got, dense)
