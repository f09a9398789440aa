"""Zen golden model: MurmurHash3, hierarchical hashing, hash bitmap, the all-reduce, costs."""
import math

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.sparse import sparcml, zen
from treenic.sparse.base import SparseError, make
from treenic.sparse.synthetic import (expected_row_density, gaussian_shared_grads,
                                      tokens_for_density, zipf_embedding_grads)
from treenic.sparse.zen import (EMPTY, Zen, candidate_sets, choose_scheme, union_profile, hash_bitmap_decode,
                                hash_bitmap_encode, hierarchical_hash,
                                hierarchical_hash_reference, imbalance_bound, murmur3_32,
                                pack_bits, partition_of, pull_imbalance, push_imbalance,
                                region_sizes, skewness_ratio, slot_hashes, unpack_bits)

FAST = settings(max_examples=40, deadline=None)


def mmh3_u32(key, seed):
    return mmh3.hash(int(key).to_bytes(4, "little"), int(seed), signed=False)


# ---- MurmurHash3 --------------------------------------------------------------------------

@FAST
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200), st.integers(0, 2**32 - 1))
def test_murmur3_bit_exact_against_mmh3(keys, seed):
    got = murmur3_32(np.array(keys, np.uint32), seed)
    assert got.dtype == np.uint32
    assert got.tolist() == [mmh3_u32(k, seed) for k in keys]


def test_murmur3_bulk_and_published_vectors():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)
    for seed in (0, 1, 0x9747B28C, 0xFFFFFFFF):
        assert murmur3_32(keys, seed).tolist() == [mmh3_u32(k, seed) for k in keys]
    assert int(murmur3_32(np.uint32(0x74736574), 0)) == 0xBA6BD213       # mmh3("test", 0)
    table = {0x0: ["2362f9de", "fbf1402a", "40b23b7f", "32850971", "ffca7f79", "40d35e42"],
             0x9747B28C: ["a366817d", "f354e7bc", "8019b286", "1c2db6a9", "9e6a9d94", "5b77c560"]}
    keys = np.array([0, 1, 2, 3, 1000, 0xFFFFFFFE], np.uint32)
    for seed, row in table.items():
        assert [format(int(h), "08x") for h in murmur3_32(keys, seed)] == row


def test_hash_rejects_bad_keys():
    with pytest.raises(SparseError, match="integers"):
        murmur3_32(np.array([1.5]))
    with pytest.raises(SparseError, match="2\\^32"):
        murmur3_32(np.array([-1]))


# ---- hierarchical hashing ------------------------------------------------------------------

def test_notes_example_a_memory_image():
    mem = hierarchical_hash(np.array([3, 17, 42, 99, 100, 101, 512, 1023]), 2, 4, 3, [0, 1, 2])
    E = int(EMPTY)
    assert mem.x.astype(np.int64).tolist() == [[101, 1023, 99, E, 100, E, E],
                                                [17, 3, 512, 42, E, E, E]]
    assert mem.counter.tolist() == [5, 4] and mem.overflow.size == 0


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 600), st.integers(1, 9), st.integers(1, 64),
       st.integers(0, 10), st.integers(1, 4), st.booleans())
def test_hierarchical_hash_equals_sequential_reference(seed, m, n, r1, r2, k, shuffle):
    rng = np.random.default_rng(seed)
    idx = rng.choice(200_000, m, replace=False)
    if not shuffle:
        idx = np.sort(idx)                       # stream order is part of the semantics
    seeds = [int(s) for s in rng.integers(0, 2**32, k + 1)]
    fast = hierarchical_hash(idx, n, r1, r2, seeds)
    ref = hierarchical_hash_reference(idx, n, r1, r2, seeds)
    assert np.array_equal(fast.x, ref.x)
    assert np.array_equal(fast.counter, ref.counter)
    assert np.array_equal(fast.slot, ref.slot)
    assert np.array_equal(fast.overflow, ref.overflow)
    # lossless: stored entries plus the reported overflow are exactly the input
    stored = np.concatenate(fast.pieces())
    assert np.array_equal(np.sort(stored), np.sort(idx))
    # partition and slot correctness
    part = partition_of(idx, n, seeds[0])
    probes = slot_hashes(idx, r1, seeds[1:])
    for t in range(m):
        q = fast.slot[t]
        if 0 <= q < r1:
            assert q in probes[t] and fast.x[part[t], q] == idx[t]
        elif q >= r1:
            assert fast.x[part[t], q] == idx[t]


def test_degenerate_sizing_falls_back_to_sequential_loop():
    idx = np.arange(0, 3000, 7)
    fast = hierarchical_hash(idx, 1, 1, idx.size, [0, 1])         # one slot: a single chain
    ref = hierarchical_hash_reference(idx, 1, 1, idx.size, [0, 1])
    assert np.array_equal(fast.x, ref.x) and fast.overflow.size == 0


def test_overflow_is_reported_not_dropped():
    idx = np.arange(0, 400, 3)
    mem = hierarchical_hash(idx, 2, 4, 2, [0, 1, 2])
    assert mem.overflow.size > 0
    assert np.array_equal(np.sort(np.concatenate(mem.pieces())), idx)
    assert np.all(mem.counter == 4 + 2)


def test_serial_rate_is_small_at_recommended_sizing():
    idx = np.random.default_rng(4).choice(10**7, 20_000, replace=False)
    r1, r2 = region_sizes(idx.size, 16)
    mem = hierarchical_hash(np.sort(idx), 16, r1, r2, [0, 1, 2, 3])
    load = idx.size / 16 / r1
    assert 0.25 < load <= 0.5
    serial = np.count_nonzero(mem.slot >= r1) / idx.size
    # docs/sparse-models.md, Zen Z-3.3: 2.9 % at load 0.5, k = 3
    assert serial < 0.03 and mem.overflow.size == 0


@pytest.mark.parametrize("load,k,percent", [(0.25, 1, 11.5), (0.5, 3, 2.9), (1.0, 4, 14.1)])
def test_serial_spill_matches_notes_simulation(load, k, percent):
    """docs/sparse-models.md, Zen Z-3.3 spill table: uniform indices, n = 16, 200k items, sequential
    insertion; the spill fraction is a property of Algorithm 1's semantics (std < 0.1 pp)."""
    idx = np.random.default_rng(0).choice(2**31, 200_000, replace=False)
    r1 = int(200_000 / 16 / load)
    mem = hierarchical_hash(idx, 16, r1, r1, list(range(k + 1)))
    assert mem.overflow.size == 0
    assert abs(100 * np.count_nonzero(mem.slot >= r1) / idx.size - percent) < 0.4
    if load == 1.0:                        # with the paper's r2 = r1/10 the serial region overflows
        tight = hierarchical_hash(idx, 16, r1, r1 // 10, list(range(k + 1)))
        assert tight.overflow.size > 0
        assert np.array_equal(np.sort(np.concatenate(tight.pieces())), np.sort(idx))


def test_hash_input_validation():
    with pytest.raises(SparseError, match="unique"):
        hierarchical_hash(np.array([1, 1]), 2, 4, 1, [0, 1])
    with pytest.raises(SparseError, match="EMPTY"):
        hierarchical_hash(np.array([0xFFFFFFFF]), 2, 4, 1, [0, 1])
    with pytest.raises(SparseError, match="seeds"):
        hierarchical_hash(np.array([1]), 2, 4, 1, [0])
    with pytest.raises(SparseError, match="r1"):
        hierarchical_hash(np.array([1]), 2, 0, 1, [0, 1])


# ---- balance --------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 13, 16])
@pytest.mark.parametrize("layout", ["uniform", "skewed"])
def test_imbalance_within_chernoff_bound(n, layout):
    """Theorem 2 / docs/sparse-models.md, Zen Z-3.3: each bound holds with probability
    >= 1 - 1/n, so over `trials` independent seeds (hash seed and data) at most trials/n may
    exceed it. A biased or data-dependent partition function fails this by a wide margin (see
    the contiguous split)."""
    N, m, trials = 2_000_000, 100 * n, 20
    push_over = pull_over = 0
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        span = N if layout == "uniform" else N // n          # adversarial: all in the first 1/n
        workers_idx = [np.sort(rng.choice(span, m, replace=False)) for _ in range(n)]
        parts = [partition_of(i, n, seed) for i in workers_idx]
        push_over += push_imbalance(parts, n) > imbalance_bound(n, m, all_workers=True)
        union = np.unique(np.concatenate(workers_idx))
        counts = np.bincount(partition_of(union, n, seed), minlength=n)
        pull_over += pull_imbalance(counts) > imbalance_bound(n, union.size)
        if layout == "skewed":                                 # a contiguous split collapses
            contiguous = np.bincount(union * n // N, minlength=n)
            assert pull_imbalance(contiguous) == pytest.approx(n)
    assert push_over <= trials / n and pull_over <= trials / n


# ---- hash bitmap -----------------------------------------------------------------------------

def test_notes_example_b_candidate_sets_and_bitmaps():
    U, rank = candidate_sets(15, 3, 0)
    assert [u.tolist() for u in U] == [[5, 12, 13], [0, 1, 4, 6, 11], [2, 3, 7, 8, 9, 10, 14]]
    agg = np.zeros(15, np.float32)
    agg[[4, 11, 9]] = [1.0, 2.0, -3.0]
    words = [hash_bitmap_encode(agg[u])[0] for u in U]
    assert [int(w[0]) for w in words] == [0, 0b10100, 0b0010000]
    assert rank[11] == 4 and rank[9] == 4


@FAST
@given(st.lists(st.booleans(), max_size=300))
def test_bit_packing_layout_and_round_trip(bits):
    words = pack_bits(np.array(bits, bool))
    assert words.size == -(-len(bits) // 32)
    for t, b in enumerate(bits):
        assert bool((int(words[t >> 5]) >> (t & 31)) & 1) == b
    assert unpack_bits(words, len(bits)).tolist() == bits


@FAST
@given(st.integers(2, 9), st.integers(1, 3000), st.integers(0, 2**32 - 1))
def test_hash_bitmap_round_trip(n, N, seed):
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal(N) * (rng.random(N) < rng.random())).astype(np.float32)
    dense[rng.random(N) < 0.05] = -0.0
    U, _ = candidate_sets(N, n, seed)
    assert sum(u.size for u in U) == N and np.array_equal(np.sort(np.concatenate(U)), np.arange(N))
    out = np.zeros(N, np.float32)
    for u in U:
        words, vals = hash_bitmap_encode(dense[u])
        assert words.size == -(-u.size // 32)              # data-independent bitmap size
        idx, v = hash_bitmap_decode(u, words, vals)
        out[idx] = v
    assert np.array_equal(out, dense)                       # -0.0 == 0.0: sign-of-zero blind


def test_bitmap_decode_rejects_mismatched_values():
    words, vals = hash_bitmap_encode(np.array([1, 0, 2], np.float32))
    with pytest.raises(SparseError, match="set bits"):
        hash_bitmap_decode(np.array([0, 1, 2]), words, vals[:1])


# ---- the all-reduce ----------------------------------------------------------------------------

@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_zen_lossless_natural_sparsity_equals_dense_sum(P):
    rng = np.random.default_rng(P)
    g = (rng.integers(-6, 7, (P, 4000)) * (rng.random((P, 4000)) < 0.05)).astype(np.float32)
    algo = make("zen", workers=P, elements=4000, density=0.05, select="nonzero")
    res = algo.step(g)
    assert all(res.info["invariants"].values()), res.info["invariants"]
    assert np.array_equal(res.result, np.broadcast_to(g.sum(0), (P, 4000)))
    assert not res.residuals.any()


def test_zen_error_feedback_and_exact_byte_accounting():
    P, N, rng = 6, 20_000, np.random.default_rng(11)
    algo = Zen(P, N, 0.02, seed=5)
    U, _ = algo.candidate_sets()
    for _ in range(3):
        old = algo.residuals.copy()
        g = rng.standard_normal((P, N)).astype(np.float32)
        res = algo.step(g)
        inv = res.info["invariants"]
        assert all(inv.values()), inv
        V = old + g
        sel = [np.flatnonzero(res.residuals[w] != V[w]) for w in range(P)]
        assert [s.size for s in sel] == [400] * P
        # push: server j receives 8 B per selected index in U_j from every other worker
        owner = partition_of(np.arange(N), P, algo.seeds[0])
        for j in range(P):
            expect = sum(8 * np.count_nonzero(owner[sel[w]] == j) for w in range(P) if w != j)
            assert res.received[0, j] == expect
        # pull: worker w receives bitmap words + non-zero values of every other server
        agg = res.result[0]
        for w in range(P):
            expect = sum(4 * (-(-U[j].size // 32)) + 4 * np.count_nonzero(agg[U[j]])
                         for j in range(P) if j != w)
            assert res.received[1, w] == expect
        assert res.sent.sum() == res.received.sum()
        # float64 reference of the sum of what was sent (order differs: tolerance)
        ref = sum(np.where(res.residuals[w] != V[w], V[w], 0).astype(np.float64) for w in range(P))
        assert np.allclose(agg, ref, rtol=1e-6, atol=1e-6)


def test_zen_traffic_matches_paper_formula():
    P, N = 16, 200_000
    g = np.random.default_rng(1).standard_normal((P, N)).astype(np.float32)
    res = Zen(P, N, 0.01).step(g)
    d, dn = 0.01, res.info["aggregated_density"]
    received = res.received.sum(0) / (4 * N)
    formula = (P - 1) / P * (2 * d + dn + 1 / 32)
    bound = imbalance_bound(P, int(d * N), all_workers=True)
    assert np.all(received <= formula * bound) and np.all(received >= formula / bound)
    c = zen.cost(P, N, d, 0.0, 1.0, aggregated_density=dn)
    assert c["bandwidth"] / (4 * N) == pytest.approx(formula)
    assert res.info["push_imbalance"] <= bound


def test_zen_balances_skewed_synthetic_embeddings():
    rows, dim, P = 5000, 16, 8
    tokens = tokens_for_density(rows, 0.0247, 1.1)
    g = zipf_embedding_grads(P, rows, dim, tokens, seed=3)
    density = np.count_nonzero(g) / g.size
    assert abs(density - 0.0247) < 0.004
    assert skewness_ratio(g[0] != 0, P) > 2                     # C3: hot low rows
    res = make("zen", workers=P, elements=rows * dim, density=0.0247, select="nonzero").step(g)
    assert all(res.info["invariants"].values())
    dn = res.info["aggregated_density"]
    assert density < dn < P * density                          # C2: sub-linear densification
    assert res.info["pull_imbalance"] < 1.1
    omni = make("omnireduce", workers=P, elements=rows * dim, density=0.0247,
                select="nonzero").step(g)
    assert omni.info["push_imbalance"] > 2 * res.info["push_imbalance"]


def test_zen_options_and_errors():
    with pytest.raises(SparseError, match="seeds"):
        Zen(4, 100, 0.1, seeds=[1, 2])
    with pytest.raises(SparseError, match="k_hashes"):
        Zen(4, 100, 0.1, k_hashes=0)
    with pytest.raises(SparseError, match="select"):
        Zen(4, 100, 0.1, select="all")
    with pytest.raises(SparseError, match="density"):
        Zen(4, 100, 0.0)
    with pytest.raises(SparseError, match="float32"):
        Zen(2, 100, 0.1).step(np.zeros((2, 100)))
    with pytest.raises(SparseError, match="NaN"):
        Zen(2, 4, 0.5).step(np.array([[np.nan, 0, 0, 0], [0, 0, 0, 0]], np.float32))
    lit = Zen(4, 1000, 0.1, paper_literal_regions=True)
    assert all(lit.step(np.ones((4, 1000), np.float32)).info["invariants"].values())


# ---- cost model sanity checks (docs/sparse-models.md, Zen Z-2.4) -----------------------------

def test_cost_extremes_hierarchical_centralization_vs_balanced_parallelism():
    n, N, d = 16, 10**7, 0.001
    bp = lambda dn: zen.cost(n, N, d, 0.0, 1.0, aggregated_density=dn, pull_format="coo")["bandwidth"]
    # full overlap: HC = log2 n, BP = 2 (n-1)/n (units of 8 d N)
    hc_full = sparcml.cost(n, N, d, 0.0, 1.0, union_density=lambda g: d)["bandwidth"]
    assert hc_full / (8 * d * N) == pytest.approx(math.log2(n))
    assert bp(d) / (8 * d * N) == pytest.approx(2 * (n - 1) / n)
    # no overlap: HC = n - 1, BP = (n - 1)(1 + 1/n): HC wins by 1 + 1/n
    hc_none = sparcml.cost(n, N, d, 0.0, 1.0, union_density=lambda g: g * d)["bandwidth"]
    assert hc_none / (8 * d * N) == pytest.approx(n - 1)
    assert bp(n * d) / hc_none == pytest.approx(1 + 1 / n)


def test_cost_hash_bitmap_vs_coo_pull_fig15a():
    n, N = 16, 10**6
    dense = 4 * N
    for D, bitmap_saves, coo_saves in [(0.95, True, False), (0.4, True, True), (0.6, True, False)]:
        pull_bitmap = zen.cost(n, N, 0.01, 0, 1, aggregated_density=D)["pull_bytes"] * n / (n - 1)
        pull_coo = zen.cost(n, N, 0.01, 0, 1, aggregated_density=D, pull_format="coo")["pull_bytes"] * n / (n - 1)
        assert (pull_bitmap < dense) == bitmap_saves and (pull_coo < dense) == coo_saves
    with pytest.raises(SparseError, match="pull_format"):
        zen.cost(4, 100, 0.1, 0, 1, pull_format="csr")


def test_synthetic_generators():
    assert expected_row_density(1000, 0, 1.1) == 0
    t = tokens_for_density(1000, 0.3)
    assert expected_row_density(1000, t, 1.1) >= 0.3 > expected_row_density(1000, t - 1, 1.1)
    g = gaussian_shared_grads(4, 1000, shared=1.0, layers=3, seed=1)
    assert g.dtype == np.float32 and np.array_equal(g[0], g[3])
    with pytest.raises(SparseError, match="shared"):
        gaussian_shared_grads(2, 10, shared=2)


def test_scheme_selection_on_measured_unions():
    n, N, m = 16, 100_000, 100
    rng = np.random.default_rng(0)
    shared = np.sort(rng.choice(N, m, replace=False))
    full = choose_scheme([shared] * n, N)                      # full overlap: BP (2 vs log n)
    assert full["scheme"] == "balanced-parallelism"
    assert full["hierarchical_centralization"] == pytest.approx(2 * 4 * m / N)
    disjoint = [np.arange(w * m, (w + 1) * m) for w in range(n)]
    none = choose_scheme(disjoint, N)                          # no overlap: HC by 1 + 1/n
    assert none["scheme"] == "hierarchical-centralization"
    assert none["balanced_parallelism"] / none["hierarchical_centralization"] == pytest.approx(1 + 1 / n)
    prof = union_profile(disjoint[:6], N)
    assert sorted(prof) == [1, 2, 4, 6] and prof[4] == 4 * m / N and prof[6] == 6 * m / N
