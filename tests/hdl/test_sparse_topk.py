"""Amaranth-simulator tests of the streaming top-k unit against the golden selectors of
``treenic.sparse.select`` (exact top-k, threshold reuse, binary-search outcomes)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from treenic.hdl.sparse.simdrive import run_stream_unit
from treenic.hdl.sparse.topk import (PASSES, Mode, TopKUnit, chunk_beats, command_word,
                                     decode_pairs, exact_cycles, output_is_last,
                                     search_command)
from treenic.sparse import select

SUBNORMALS = np.array([1, 2, 3, 0x7FFFFF, 0x400000], np.uint32).view(np.float32)


def run_topk(x, cmd, *, lanes, mode, p_valid=1.0, p_ready=1.0, seed=0, scan_bins=2):
    dut = TopKUnit(lanes=lanes, max_chunk=1024, scan_bins=scan_bins)
    beats = chunk_beats(x, lanes, PASSES[Mode(mode)])

    def setup(ctx):
        ctx.set(dut.cmd.payload.as_value(), cmd)
        ctx.set(dut.cmd.valid, 1)

    out, cycles = run_stream_unit(dut, beats, setup=setup, p_valid=p_valid, p_ready=p_ready,
                                  seed=seed, until=lambda w: output_is_last(w, lanes))
    idx, val = decode_pairs(out, lanes)
    return idx, val, cycles


def check_exact(x, k, lanes, sign=0, **kw):
    idx, val, cycles = run_topk(x, command_word(Mode.EXACT, k=k, sign=sign), lanes=lanes,
                                mode=Mode.EXACT, **kw)
    gold = select.topk(x, k, sign=sign)
    assert np.array_equal(idx, gold), (idx, gold)
    assert np.array_equal(val, x.view(np.uint32)[gold])
    return cycles


@st.composite
def chunks(draw):
    """Chunks with heavy ties, signed zeros, subnormals and all-equal magnitudes."""
    n = draw(st.sampled_from([8, 16, 24, 40]))
    kind = draw(st.sampled_from(["ties", "mixed", "equal", "zeros"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if kind == "ties":
        pool = np.array([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -2.0], np.float32)
        x = rng.choice(pool, n)
    elif kind == "equal":
        x = rng.choice(np.array([3.0, -3.0], np.float32), n)
    elif kind == "zeros":
        x = rng.choice(np.array([0.0, -0.0], np.float32), n)
        x[rng.integers(0, n)] = np.float32(-1e-3)
    else:
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.random(n) < 0.3] = 0
        x[rng.random(n) < 0.2] = rng.choice(SUBNORMALS, 1)[0] * rng.choice([-1, 1])
    return x.astype(np.float32)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=chunks(), k=st.sampled_from([1, 2, 3, 7, 64]), lanes=st.sampled_from([2, 4, 8]),
       sign=st.sampled_from([0, 0, 1, -1]), seed=st.integers(0, 99))
def test_exact_matches_golden_with_stalls(x, k, lanes, sign, seed):
    check_exact(x, k, lanes, sign, p_valid=0.7, p_ready=0.5, seed=seed)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=chunks(), k=st.sampled_from([1, 2, 3, 7, 64]), lanes=st.sampled_from([2, 4]),
       scan_bins=st.sampled_from([4, 8, 16, 32]), seed=st.integers(0, 99))
def test_exact_wide_scan_matches_golden(x, k, lanes, scan_bins, seed):
    """scan_bins bins per histogram row: the scan takes 256/scan_bins + scan_latency cycles
    a pass (the suffix-sum network cut by a register from 8 bins a row), the selection is
    the same."""
    check_exact(x, k, lanes, p_valid=0.7, p_ready=0.5, seed=seed, scan_bins=scan_bins)


def test_wide_scan_is_shorter():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(128).astype(np.float32)
    narrow = check_exact(x, 5, 4)
    wide = check_exact(x, 5, 4, scan_bins=16)
    # four scans of 128 rows against four of 16 rows, each two stages longer at 16 bins
    assert narrow - wide == 4 * (128 - 16) - 4 * 2, (narrow, wide)
    assert (narrow, wide) == (exact_cycles(128, 4), exact_cycles(128, 4, 16))


def test_exact_k_one_and_k_at_least_nonzeros():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(64).astype(np.float32)
    x[::3] = 0
    for k in (1, int(np.count_nonzero(x)), 64, 1000):
        check_exact(x, k, 4)


def test_long_tie_quota_at_sixteen_lanes():
    """The tie quota (``ties_left``) across its narrow/saturated switch at 3W (the unit
    keeps min(ties_left, W) on a narrow subtraction below 3W): all-equal magnitudes, W = 16,
    k around 3W and far above it, with stalls."""
    x = np.where(np.arange(256) % 5 == 0, np.float32(-2.0), np.float32(2.0)).astype(np.float32)
    x[7] = np.float32(4.0)                      # one key above the tie band
    for k in (1, 17, 47, 48, 49, 50, 100, 200, 256):
        check_exact(x, k, 16, p_valid=0.8, p_ready=0.6, seed=k)


def test_exact_cycles_independent_of_k():
    """...and equal to the documented contract ``exact_cycles`` (the network model's)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(128).astype(np.float32)
    cycles = {check_exact(x, k, 4) for k in (1, 10, 100)}
    assert cycles == {exact_cycles(128, 4)}, cycles
    assert check_exact(x, 3, 8, scan_bins=16) == exact_cycles(128, 8, 16)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=chunks(), k=st.integers(1, 6), lanes=st.sampled_from([2, 4]),
       thr_pick=st.integers(0, 39), seed=st.integers(0, 99))
def test_threshold_reuse_matches_golden(x, k, lanes, thr_pick, seed):
    keys = select.magnitude_keys(x)
    reuse = select.ThresholdReuse(k, interval=100, cap_factor=2)
    reuse.cached, reuse.iteration = np.uint32(keys[thr_pick % keys.size]), 1   # a reuse step
    gold = reuse.select(x)
    assert not gold.searched
    cmd = command_word(Mode.THRESHOLD, threshold=gold.threshold_key, limit=2 * k)
    idx, val, _ = run_topk(x, cmd, lanes=lanes, mode=Mode.THRESHOLD, p_valid=0.8,
                           p_ready=0.6, seed=seed)
    assert np.array_equal(idx, gold.indices)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=chunks(), k=st.integers(1, 8), lanes=st.sampled_from([2, 4]),
       depth=st.sampled_from([2, 4, 16]), seed=st.integers(0, 99))
def test_binary_search_outcome_matches_golden(x, k, lanes, depth, seed):
    cmd, gold = search_command(x, k, depth=depth, hist_bits=4)
    mode = Mode.THRESHOLD if gold.converged else Mode.BAND
    idx, _, _ = run_topk(x, cmd, lanes=lanes, mode=mode, p_valid=0.8, p_ready=0.6, seed=seed)
    assert np.array_equal(idx, gold.indices)


def test_band_mode_is_the_band_fill():
    x = np.array([5, 1, 2, 2, 3, 2, 0, 4, 2, 1, 6, 2, 2, 0, 3, 2], np.float32)
    keys = select.magnitude_keys(x)
    lo, hi = select.float_to_key(1.0), select.float_to_key(3.0)
    for k in (1, 3, 5, 8, 20):
        idx, _, _ = run_topk(x, command_word(Mode.BAND, k=k, threshold=hi, lo=lo), lanes=4,
                             mode=Mode.BAND)
        assert np.array_equal(idx, select._band_fill(keys, k, lo, hi)), k


def test_bad_parameters_rejected():
    with pytest.raises(ValueError, match="lanes"):
        TopKUnit(lanes=3)
    with pytest.raises(ValueError, match="max_chunk"):
        TopKUnit(lanes=4, max_chunk=6)


def test_suffix_network_levels_and_cut():
    """The scan's suffix-sum network (Sklansky): log2(n) levels, every suffix sum at the
    end, and the same result when continued from a cut after any level."""
    from amaranth import Const, Module, Signal
    from amaranth.sim import Simulator

    from treenic.hdl.sparse.topk import _suffix_levels
    rng = np.random.default_rng(2)
    for n in (2, 4, 8, 16, 32):
        vals = rng.integers(0, 1000, n).tolist()
        levels = _suffix_levels([Const(v, 16) for v in vals], 16)
        assert len(levels) == n.bit_length()         # the inputs and log2(n) levels
        want = np.cumsum(vals[::-1])[::-1].tolist()
        for cut in range(len(levels)):
            ends = _suffix_levels(levels[cut], 16, start=cut)[-1]
            m = Module()
            outs = [Signal(16, name=f"o{h}") for h in range(n)]
            m.d.comb += [o.eq(e) for o, e in zip(outs, ends)]
            sim = Simulator(m)
            got = []

            async def bench(ctx):
                got.extend(ctx.get(o) for o in outs)
            sim.add_testbench(bench)
            sim.run()
            assert got == want, (n, cut)
