"""Selection primitives (treenic.sparse.select) and the RedSync model (treenic.sparse.redsync)."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.sparse.base import SparseError
from treenic.sparse.redsync import RedSync, bruck_received, cost, pack, unpack
from treenic.sparse.select import (TRIM_RATIOS, ThresholdReuse, binary_search_histogram,
                                   block_topk, counts_above, counts_by_histogram, exact_mean_abs, exact_sum,
                                   float_to_key, magnitude_keys, quantize_mean, radix_topk,
                                   redsync_threshold, sign_for_step, signed_keys,
                                   threshold_binary_search, topk, topk_reference, trimmed_topk)

FAST = settings(max_examples=60, deadline=None)


@st.composite
def vectors(draw, max_size=3000):
    """float32 vectors from several laws, including heavy ties, zeros and signs."""
    n = draw(st.integers(1, max_size))
    seed = draw(st.integers(0, 2**32 - 1))
    law = draw(st.sampled_from(["normal", "t3", "uniform", "ties", "sparse", "tiny"]))
    rng = np.random.default_rng(seed)
    if law == "normal":
        x = rng.standard_normal(n)
    elif law == "t3":
        x = rng.standard_t(3, n)
    elif law == "uniform":
        x = rng.random(n)
    elif law == "ties":
        x = rng.integers(-4, 5, n).astype(float)
    elif law == "sparse":
        x = rng.standard_normal(n) * (rng.random(n) < 0.05)
    else:                                           # subnormals and tiny normals
        x = rng.standard_normal(n) * 1e-40
    return x.astype(np.float32)


def sort_reference(x, k, sign=0):
    """Independent reference: Python sort on (−|x|, index), zeros (or wrong sign) excluded."""
    items = [(-abs(float(v)), i) for i, v in enumerate(x)
             if v != 0 and (sign == 0 or (v > 0) == (sign > 0))]
    items.sort()
    return np.array(sorted(i for _, i in items[:k]), np.int64)


# ---- exact top-k ---------------------------------------------------------------------------

@FAST
@given(vectors(), st.integers(1, 400), st.sampled_from([1, 4, 8, 11, 16]),
       st.sampled_from([0, 1, -1]))
def test_radix_topk_equals_sort_references(x, k, digit_bits, sign):
    keys = signed_keys(x, sign)
    got = radix_topk(keys, k, digit_bits)
    ref = sort_reference(x, k, sign)
    assert np.array_equal(got.indices, ref)
    assert np.array_equal(got.indices, topk_reference(keys, k))
    # tie rule is numpy's stable argsort of -key
    stable = np.sort(np.argsort(-keys.astype(np.int64), kind="stable")[:ref.size])
    assert np.array_equal(got.indices, stable)
    if ref.size:
        assert got.kth_key == int(keys[ref].min())
        assert got.above == int(np.count_nonzero(keys > got.kth_key))


@FAST
@given(st.integers(10, 2000), st.integers(0, 2**32 - 1))
def test_radix_topk_matches_argpartition_on_distinct_keys(n, seed):
    rng = np.random.default_rng(seed)
    keys = rng.choice(2**31 - 1, n, replace=False).astype(np.uint32) + np.uint32(1)
    k = int(rng.integers(1, n + 1))
    part = np.sort(np.argpartition(-keys.astype(np.int64), k - 1)[:k])
    assert np.array_equal(radix_topk(keys, k).indices, part)


def test_radix_topk_ties_break_by_ascending_index():
    x = np.array([1, 3, 3, 0, 3, 2, 3], np.float32)
    assert radix_topk(magnitude_keys(x), 3).indices.tolist() == [1, 2, 4]
    assert topk(x, 10).tolist() == [0, 1, 2, 4, 5, 6]        # zeros never selected


def test_radix_trace_histograms_are_counter_banks():
    x = np.array([5, 1, 7, 7, 2], np.float32)
    r = radix_topk(magnitude_keys(x), 2, digit_bits=8)
    assert len(r.histograms) == 4 and r.histograms[0].sum() == 5
    assert key_of(7) == r.kth_key


def key_of(v):
    return int(np.array([v], np.float32).view(np.uint32)[0])


# ---- deterministic statistics -----------------------------------------------------------

@FAST
@given(vectors(max_size=2000))
def test_exact_sum_is_correctly_rounded(x):
    assert exact_sum(x) == math.fsum(x.astype(np.float64).tolist())
    exact = sum(Fraction(float(v)) for v in np.abs(x))
    assert exact_mean_abs(x) == np.float32(float(exact) / x.size)


def test_exact_sum_is_order_free_and_handles_extremes():
    x = np.array([3.4e38, 1.0, -3.4e38, 1e-45, 2**-126], np.float32)
    assert exact_sum(x) == math.fsum(x.astype(float).tolist())
    assert exact_sum(x[::-1]) == exact_sum(x)


def test_quantize_mean_is_exact_mean():
    v = np.array([0.1, 0.2, 0.7, 1e-8], np.float32)
    ref = float(sum(Fraction(float(a)) for a in v) / 4)
    assert quantize_mean(v) == np.float32(ref)
    with pytest.raises(SparseError, match="empty"):
        quantize_mean(np.zeros(0, np.float32))


def test_threshold_ratios_and_arithmetic():
    assert TRIM_RATIOS[1] == 0.6 and TRIM_RATIOS[3] == 0.2 and TRIM_RATIOS[4] == 0.0
    assert 0.8 - 0.2 - 0.2 != TRIM_RATIOS[2]               # the drift the exact ratios avoid
    thr = redsync_threshold(np.float32(1.0), np.float32(3.0), 0.25)
    assert thr == float_to_key(1.5)
    assert redsync_threshold(np.float32(1.0), np.float32(3.0), -2.0) == 0   # clamped


@FAST
@given(vectors(max_size=1500), st.lists(st.floats(0, 10, width=32), min_size=1, max_size=20))
def test_counts_above_one_pass_equals_brute_force(x, thresholds):
    keys = magnitude_keys(x)
    thr = [float_to_key(t) for t in thresholds]
    brute = [int(np.count_nonzero(keys > t)) for t in thr]
    assert counts_above(keys, thr).tolist() == brute
    assert counts_by_histogram(keys, thr).tolist() == brute


# ---- trimmed top-k ----------------------------------------------------------------------

@FAST
@given(vectors(), st.integers(1, 500), st.sampled_from([0, 1, -1]))
def test_trimmed_topk_is_exact_topk(x, k, sign):
    r = trimmed_topk(x, k, sign)
    assert np.array_equal(r.indices, sort_reference(x, k, sign))
    keys = signed_keys(x, sign)
    assert r.candidates == int(np.count_nonzero(keys > r.threshold_key))
    assert r.candidates >= r.indices.size
    # the trim threshold is the first scheduled one reaching k, or 0
    for i in range(r.step):
        assert r.counts[i] < k


def test_trimmed_topk_degenerate_inputs():
    assert trimmed_topk(np.zeros(100, np.float32), 5).indices.size == 0
    same = np.full(50, -2.0, np.float32)
    assert trimmed_topk(same, 7).indices.tolist() == list(range(7))        # max == mean
    with pytest.raises(SparseError, match="non-finite"):
        trimmed_topk(np.array([1, np.nan], np.float32), 1)
    with pytest.raises(SparseError, match="float32"):
        trimmed_topk(np.ones(4), 1)


# ---- threshold binary search ------------------------------------------------------------

@FAST
@given(vectors(), st.integers(1, 300), st.integers(2, 16), st.booleans(),
       st.sampled_from(["mean", "zero"]), st.sampled_from([0, 1, -1]))
def test_binary_search_window_or_band_fill(x, k, depth, strict, lower, sign):
    r = threshold_binary_search(x, k, depth=depth, strict=strict, lower=lower, sign=sign)
    keys = signed_keys(x, sign)
    exact = sort_reference(x, k, sign)
    if r.converged:
        lo = k + 1 if strict else k
        assert lo <= r.indices.size < 2 * k
        assert np.array_equal(r.indices, np.flatnonzero(keys > r.threshold_key))
        assert set(exact.tolist()) <= set(r.indices.tolist())
        assert r.trace[-1][2] == r.indices.size
    else:
        # band fill (A7): everything above thr(hi), then ascending index inside the band
        assert r.hi - r.lo <= 1 or keys.max() == 0
        assert r.indices.size <= k
        above_lo = int(np.count_nonzero(keys > r.threshold_key))
        if keys.max() > 0:
            assert r.indices.size == min(k, above_lo)
    assert np.all(np.diff(r.indices) > 0)
    assert len(r.trace) <= depth


@FAST
@given(vectors(), st.integers(1, 300), st.integers(2, 16), st.integers(1, 9), st.booleans(),
       st.sampled_from(["mean", "zero"]))
def test_histogram_replay_equals_sequential_search(x, k, depth, hist_bits, strict, lower):
    seq = threshold_binary_search(x, k, depth=depth, strict=strict, lower=lower)
    hist = binary_search_histogram(x, k, depth=depth, hist_bits=hist_bits, strict=strict,
                                   lower=lower)
    assert hist.trace == seq.trace
    assert hist.threshold_key == seq.threshold_key and hist.converged == seq.converged
    assert np.array_equal(hist.indices, seq.indices)
    assert hist.passes <= max(1, -(-len(seq.trace) // hist_bits)) + (1 if not seq.converged else 0)


def test_reproduces_notes_section_11_normal_row():
    """docs/sparse-models.md, RedSync R-11 (a numpy prototype, M = 2^20, k = 1048, normal data):
    trimmed counts 32, 973, 13923 (candidates 1.3 % of M); binary search B = 12: 4 steps,
    L/k = 1.62. The same draw reproduces them with this independent implementation."""
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    t = trimmed_topk(x, 1048)
    assert t.counts[:t.step + 1].tolist() == [32, 973, 13923]
    b = threshold_binary_search(x, 1048, depth=12)
    assert b.converged and len(b.trace) == 4 and round(b.indices.size / 1048, 2) == 1.62


def test_binary_search_converges_on_normal_data_like_the_notes():
    x = np.random.default_rng(7).standard_normal(1 << 16).astype(np.float32)
    r = threshold_binary_search(x, 65, depth=12)
    assert r.converged and 65 <= r.indices.size < 130 and 2 <= len(r.trace) <= 10
    h = binary_search_histogram(x, 65, depth=12, hist_bits=8)
    assert h.passes == 1


def test_binary_search_plateau_needs_zero_lower_bound():
    """A8: all magnitudes equal -> no key exceeds mean(|x|), the [mean, max] search cannot
    select anything; with lower="zero" the band fill takes the first k by index."""
    x = np.full(40, -0.5, np.float32)
    r = threshold_binary_search(x, 5)
    assert not r.converged and r.indices.size == 0
    z = threshold_binary_search(x, 5, lower="zero")
    assert not z.converged and z.indices.tolist() == [0, 1, 2, 3, 4]


def test_search_rejects_bad_parameters():
    x = np.ones(8, np.float32)
    with pytest.raises(SparseError, match="depth"):
        threshold_binary_search(x, 2, depth=0)
    with pytest.raises(SparseError, match="hist_bits"):
        binary_search_histogram(x, 2, hist_bits=0)
    with pytest.raises(SparseError, match="lower"):
        threshold_binary_search(x, 2, lower="median")
    with pytest.raises(SparseError, match="k must be"):
        threshold_binary_search(x, 0)
    with pytest.raises(SparseError, match="sign"):
        signed_keys(x, 2)


# ---- threshold reuse --------------------------------------------------------------------

def test_reuse_searches_every_interval_and_caps():
    rng = np.random.default_rng(3)
    k = 20
    reuse = ThresholdReuse(k, interval=5, cap_factor=4)
    first = reuse.select(rng.standard_normal(4000).astype(np.float32))
    assert first.searched and not first.force_search_next
    # reuse on a much larger vector: the cached threshold passes far more than 4k -> capped
    big = (rng.standard_normal(4000) * 50).astype(np.float32)
    second = reuse.select(big)
    assert not second.searched and second.truncated and second.indices.size == 4 * k
    assert np.array_equal(second.indices,
                          np.flatnonzero(magnitude_keys(big) > second.threshold_key)[:4 * k])
    assert second.force_search_next
    assert reuse.select(big).searched                     # forced re-search
    for _ in range(2):
        reuse.select(big)
    assert reuse.iteration == 5 and reuse.select(big).searched   # t % 5 == 0


def test_reuse_rejects_bad_options():
    with pytest.raises(SparseError, match="interval"):
        ThresholdReuse(5, interval=0)
    with pytest.raises(SparseError, match="cap_factor"):
        ThresholdReuse(5, cap_factor=1)


# ---- block top-k and signs ----------------------------------------------------------------

@FAST
@given(vectors(max_size=1000), st.integers(1, 64), st.integers(1, 8))
def test_block_topk_equals_per_block_reference(x, block, kb):
    got = block_topk(x, block, kb)
    ref = np.concatenate([sort_reference(x[s:s + block], kb) + s
                          for s in range(0, x.size, block)])
    assert np.array_equal(got, ref)


def test_sign_alternation():
    assert [sign_for_step(t) for t in range(4)] == [1, -1, 1, -1]
    x = np.array([-3, 1, -0.0, 2, -1], np.float32)
    assert topk(x, 5, sign=1).tolist() == [1, 3]
    assert topk(x, 5, sign=-1).tolist() == [0, 4]


# ---- RedSync messages, allgather and the model -----------------------------------------

def test_pack_unpack_round_trip_and_layout():
    idx = np.array([2, 9, 40])
    vals = np.array([1.5, -2.0, 0.25], np.float32)
    words = pack(idx, vals)
    assert words.size == 1 + 2 * 3 and words[0] == 3
    i2, v2 = unpack(words, quantized=False)
    assert np.array_equal(i2, idx) and np.array_equal(v2, vals)
    q = pack(idx, mean=np.float32(0.5))
    assert q.size == 2 + 3
    assert unpack(q, quantized=True)[1].tolist() == [0.5] * 3
    assert unpack(pack([], mean=np.float32(0)), quantized=True)[0].size == 0
    with pytest.raises(SparseError, match="does not match"):
        unpack(words[:-1], quantized=False)


@pytest.mark.parametrize("P", [2, 3, 5, 8, 13])
def test_bruck_allgather_delivers_every_message_once(P):
    sizes = np.arange(1, P + 1, dtype=np.int64) * 10
    rec = bruck_received(sizes)
    assert rec.shape[0] == math.ceil(math.log2(P))
    assert np.array_equal(rec.sum(0) + sizes, np.full(P, sizes.sum()))


@pytest.mark.parametrize("selection", ["exact", "trimmed", "binary", "histogram", "reuse"])
@pytest.mark.parametrize("P", [2, 3, 6])
def test_redsync_invariants_and_error_feedback(selection, P):
    rng = np.random.default_rng(P)
    algo = RedSync(P, 3000, 0.01, selection=selection)
    for _ in range(4):
        old = algo.residuals.copy()
        g = rng.standard_normal((P, 3000)).astype(np.float32)
        res = algo.step(g)
        assert all(res.info["invariants"].values()), res.info["invariants"]
        V = old + g
        expect = np.zeros(3000, np.float32)
        for w in range(P):
            sel = np.flatnonzero(res.residuals[w] != V[w])
            expect[sel] += V[w, sel]
        assert np.array_equal(res.result[0], expect)
        assert (res.result == res.result[0]).all()
    if selection in ("exact", "trimmed"):
        assert res.info["selected"] == [30] * P


def test_redsync_quantized_alternates_sign_and_sends_means():
    rng = np.random.default_rng(1)
    algo = RedSync(4, 2000, 0.01, selection="trimmed", quantize=True)
    for t in range(3):
        res = algo.step(rng.standard_normal((4, 2000)).astype(np.float32))
        assert res.info["sign"] == (1 if t % 2 == 0 else -1)
        assert all(res.info["invariants"].values())
        assert all(b == 4 * (2 + 20) for b in res.info["message_bytes"])
        assert np.all(np.sign(res.result[0][res.result[0] != 0]) == res.info["sign"])


def test_redsync_lossless_at_full_density_matches_dense_sum():
    rng = np.random.default_rng(2)
    g = rng.integers(-8, 9, (5, 700)).astype(np.float32)
    res = RedSync(5, 700, 1.0, selection="exact").step(g)
    assert np.array_equal(res.result[0], g.sum(0)) and not res.residuals.any()


def test_redsync_bad_options():
    with pytest.raises(SparseError, match="quantization"):
        RedSync(4, 100, 0.1, selection="reuse", quantize=True)
    with pytest.raises(SparseError, match="selection"):
        RedSync(4, 100, 0.1, selection="random")
    with pytest.raises(SparseError, match="workers"):
        RedSync(1, 100, 0.1)
    with pytest.raises(SparseError, match="shape"):
        RedSync(2, 100, 0.1).step(np.zeros((3, 100), np.float32))


def test_redsync_cost_matches_notes():
    # docs/sparse-models.md, RedSync R-10 item 9: with alpha = 0 the sparse/dense bandwidth
    # ratio is p*D (non-quantized)
    p, M, D, beta = 128, 10**8, 0.001, 1.0
    dense = 2 * (p - 1) / p * 4 * M * beta
    ratio = cost(p, M, D, 0.0, beta)["bandwidth"] / dense
    assert abs(ratio - p * D) < 1e-3
    q = cost(p, M, D, 0.0, beta, quantized=True)["bandwidth"] / dense
    assert abs(q - p * D / 2) < 1e-3
    assert cost(6, 1000, 0.01, 1.0, 0.0)["latency"] == 3


def test_histogram_search_records_its_grid_passes():
    """``grids`` lists one (first point, step, count) per count pass; every probe of the
    trace is a point of the grid of its pass (what the RTL replay asks its threshold source)."""
    rng = np.random.default_rng(21)
    for hist_bits in (1, 3, 8):
        for k in (1, 7, 50):
            x = rng.standard_t(3, 300).astype(np.float32)
            res = binary_search_histogram(x, k, depth=16, hist_bits=hist_bits)
            assert len(res.grids) == res.passes
            points = [{start + j * step for j in range(count)} for start, step, count in res.grids]
            assert all(count == (1 << min(hist_bits, 16)) - 1 or step == 1
                       for _, step, count in res.grids)
            assert all(any(mid in p for p in points) for mid, _, _ in res.trace)
