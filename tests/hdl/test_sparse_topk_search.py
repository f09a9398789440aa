"""Amaranth-simulator tests of the top-k unit's SEARCH mode (RedSync threshold binary search
replayed from histograms in RTL) against ``select.binary_search_histogram``: the selection,
the converged flag, the threshold, the pass count and every threshold request."""
import random

import numpy as np
import pytest
from amaranth import Elaboratable, Module
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings, strategies as st

from treenic.hdl.sparse.threshold import GridThresholdSource
from treenic.hdl.sparse.topk import (Mode, TopKUnit, chunk_beats, command_word, decode_pairs,
                                     grid_thresholds, output_is_last, search_passes,
                                     search_requests)
from treenic.sparse import select

from test_sparse_topk import chunks


async def _handshake(ctx, ready, *sampled):
    """Ticks until ``ready`` is high at a clock edge (``tick().until`` without its
    generator, which cannot be closed cleanly when the simulation ends in a background
    testbench); returns the ``sampled`` values of that edge."""
    while True:
        _, _, r, *values = await ctx.tick().sample(ready, *sampled)
        if r:
            return values


class _WithRtlSource(Elaboratable):
    """The unit with ``threshold.GridThresholdSource`` on its grid/thr ports."""

    def __init__(self, unit):
        self.unit, self.source = unit, GridThresholdSource()

    def __getattr__(self, name):
        return getattr(self.__dict__["unit"], name)

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit, m.submodules.source = self.unit, self.source
        connect(m, self.unit.grid, self.source.grid)
        connect(m, self.source.thr, self.unit.thr)
        return m


def run_search(x, k, *, lanes=4, depth=16, strict=False, sign=0, lower="mean", search_bits=3,
               p_valid=1.0, p_ready=1.0, p_thr=1.0, seed=0, rtl_source=False):
    """One SEARCH selection; the chunk is re-streamed while the unit is busy (as the banked
    buffer does) and a threshold source answers each ``grid`` request with the golden's grid
    thresholds after random gaps -- or, with ``rtl_source``, ``GridThresholdSource`` does
    (given the golden's base and top keys) and the requests are only observed. Returns the
    outcome as a dict."""
    dut = TopKUnit(lanes=lanes, max_chunk=1024, search_bits=search_bits)
    if rtl_source:
        dut = _WithRtlSource(dut)
    rng = random.Random(seed)
    one_pass = chunk_beats(x, lanes, 1)
    got = {"words": [], "requests": [], "passes": 0}

    async def producer(ctx):
        ctx.set(dut.cmd.payload.as_value(), command_word(Mode.SEARCH, k=k, sign=sign,
                                                         depth=depth, strict=strict))
        ctx.set(dut.cmd.valid, 1)
        await _handshake(ctx, dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        while True:
            for word in one_pass:
                while rng.random() >= p_valid:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.payload.as_value(), word)
                ctx.set(dut.i.valid, 1)
                await _handshake(ctx, dut.i.ready)
            got["passes"] += 1

    async def observe_requests(ctx):
        _, _, base, top = select._search_setup(x, 1, sign, depth, lower)
        ctx.set(dut.source.base, int(select.float_to_key(base)))
        ctx.set(dut.source.top, int(select.float_to_key(top)))
        ctx.set(dut.source.depth, depth)
        while True:
            _, _, valid, ready, *req = await ctx.tick().sample(
                dut.grid.valid, dut.grid.ready, dut.grid.payload.start, dut.grid.payload.step,
                dut.grid.payload.count)
            if valid and ready:
                got["requests"].append(tuple(req))

    async def threshold_source(ctx):
        while True:
            ctx.set(dut.grid.ready, 1)
            start, step, count = await _handshake(ctx, dut.grid.valid, dut.grid.payload.start,
                                                  dut.grid.payload.step, dut.grid.payload.count)
            ctx.set(dut.grid.ready, 0)
            got["requests"].append((start, step, count))
            for thr in grid_thresholds(x, start, step, count, depth=depth, sign=sign,
                                       lower=lower):
                while rng.random() >= p_thr:
                    ctx.set(dut.thr.valid, 0)
                    await ctx.tick()
                ctx.set(dut.thr.payload, thr)
                ctx.set(dut.thr.valid, 1)
                await _handshake(ctx, dut.thr.ready)
            ctx.set(dut.thr.valid, 0)

    async def consumer(ctx):
        for _ in range(200_000):
            ready = int(rng.random() < p_ready)
            ctx.set(dut.o.ready, ready)
            _, _, valid, word = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value())
            if valid and ready:
                got["words"].append(word)
                if output_is_last(word, lanes):
                    await ctx.tick().repeat(2)       # busy falls, the outcome is readable
                    assert not ctx.get(dut.busy)
                    got.update(converged=ctx.get(dut.converged),
                               threshold=ctx.get(dut.search_threshold),
                               count_passes=ctx.get(dut.search_passes))
                    return
        raise TimeoutError("SEARCH did not finish")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(observe_requests if rtl_source else threshold_source, background=True)
    sim.add_testbench(consumer)
    sim.run()
    got["indices"], got["values"] = decode_pairs(got["words"], lanes)
    return got


def check_search(x, k, **kw):
    args = {a: kw[a] for a in ("depth", "strict", "sign", "lower") if a in kw}
    H = kw.get("search_bits", 3)
    gold = select.binary_search_histogram(x, k, hist_bits=H, **args)
    keys = select.signed_keys(x, kw.get("sign", 0))
    got = run_search(x, k, **kw)
    assert np.array_equal(got["indices"], gold.indices), (got["indices"], gold.indices)
    assert np.array_equal(got["values"], x.view(np.uint32)[gold.indices])
    assert got["requests"] == search_requests(gold, keys, kw.get("depth", 16), H), \
        (got["requests"], gold.grids)
    assert got["passes"] == search_passes(gold, keys)
    if keys.size and keys.max():
        assert (bool(got["converged"]), got["threshold"], got["count_passes"]) == \
            (gold.converged, gold.threshold_key, gold.passes)
    return gold


@st.composite
def spread_chunks(draw):
    """Chunks where the search both converges and runs out of interval."""
    n = draw(st.sampled_from([16, 32, 48]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    kind = draw(st.sampled_from(["normal", "heavy", "uniform"]))
    x = {"normal": rng.standard_normal(n), "heavy": rng.standard_t(3, n),
         "uniform": rng.uniform(-1, 1, n)}[kind].astype(np.float32)
    x[rng.random(n) < 0.2] = 0
    return x


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=st.one_of(chunks(), spread_chunks()), k=st.sampled_from([1, 2, 3, 5, 8, 64]),
       lanes=st.sampled_from([2, 4]), depth=st.sampled_from([1, 2, 5, 16]),
       H=st.sampled_from([1, 2, 3, 4]), strict=st.booleans(),
       sign=st.sampled_from([0, 0, 1, -1]), seed=st.integers(0, 99))
def test_search_matches_golden_with_stalls(x, k, lanes, depth, H, strict, sign, seed):
    check_search(x, k, lanes=lanes, depth=depth, search_bits=H, strict=strict, sign=sign,
                 p_valid=0.7, p_ready=0.6, p_thr=0.5, seed=seed)


def test_search_converges_and_falls_back():
    rng = np.random.default_rng(11)
    x = rng.standard_normal(64).astype(np.float32)
    for k in (1, 3, 6, 10, 20):
        check_search(x, k, lanes=4, depth=16, search_bits=3)
    ties = np.full(32, 2.0, np.float32)            # a plateau: no threshold splits it
    assert not check_search(ties, 5, lanes=2, depth=8).converged
    check_search(np.zeros(16, np.float32), 3, lanes=4)           # all zero: empty, 2 passes
    check_search(-np.abs(x), 4, lanes=4, sign=1)                 # no key of that sign
    check_search(x, 5, lanes=4, lower="zero", depth=12, search_bits=4)


def test_command_rejects_bad_depth_and_search_bits():
    with pytest.raises(ValueError, match="depth"):
        command_word(Mode.SEARCH, k=1, depth=0)
    with pytest.raises(ValueError, match="depth"):
        command_word(Mode.SEARCH, k=1, depth=31)
    with pytest.raises(ValueError, match="search_bits"):
        TopKUnit(lanes=2, search_bits=5)
