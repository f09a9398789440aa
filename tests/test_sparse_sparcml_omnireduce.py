"""SparCML (recursive doubling + dense switch) and OmniReduce (block-sparse) golden models."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.sparse import omnireduce, sparcml
from treenic.sparse.base import SparseError, make, merge_add
from treenic.sparse.sparcml import merge_sorted

FAST = settings(max_examples=30, deadline=None)


def integer_grads(rng, P, N, density):
    """Small-integer gradients: every float32 sum is exact, so results compare bit for bit."""
    g = rng.integers(-8, 9, (P, N)) * (rng.random((P, N)) < density)
    return g.astype(np.float32)


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 300), st.integers(0, 300))
def test_merge_sorted_equals_base_merge_add(seed, na, nb):
    rng = np.random.default_rng(seed)
    a = np.sort(rng.choice(1000, min(na, 1000), replace=False))
    b = np.sort(rng.choice(1000, min(nb, 1000), replace=False))
    av = rng.standard_normal(a.size).astype(np.float32)
    bv = rng.standard_normal(b.size).astype(np.float32)
    i1, v1 = merge_sorted(a, av, b, bv)
    i2, v2 = merge_add(a, av, b, bv)
    assert np.array_equal(i1, i2) and np.array_equal(v1.view(np.uint32), v2.view(np.uint32))
    # recursive-doubling partners merge in opposite roles: the sums must be bit-identical
    i3, v3 = merge_sorted(b, bv, a, av)
    assert np.array_equal(i1, i3) and np.array_equal(v1.view(np.uint32), v3.view(np.uint32))


# ---- lossless cases against the dense reference ----------------------------------------------

@FAST
@given(st.integers(2, 11), st.integers(1, 2000), st.floats(0.0, 0.8),
       st.sampled_from(["sparcml", "omnireduce"]), st.integers(0, 2**32 - 1))
def test_lossless_equals_dense_sum_any_worker_count(P, N, density, name, seed):
    g = integer_grads(np.random.default_rng(seed), P, N, density)
    options = {"block": int(np.random.default_rng(seed).integers(1, 300))} if name == "omnireduce" else {}
    res = make(name, workers=P, elements=N, density=1.0, select="nonzero", **options).step(g)
    assert np.array_equal(res.result, np.broadcast_to(g.sum(0), (P, N)))
    assert not res.residuals.any()
    assert all(res.info["invariants"].values()), res.info["invariants"]
    assert res.sent.sum() == res.received.sum()


@pytest.mark.parametrize("name", ["sparcml", "omnireduce"])
@pytest.mark.parametrize("P", [2, 5, 8])
def test_error_feedback_mass_conservation_over_steps(name, P):
    rng = np.random.default_rng(P)
    N = 5000
    algo = make(name, workers=P, elements=N, density=0.01)
    total_in = np.zeros(N)
    total_out = np.zeros(N)
    for _ in range(4):
        g = rng.standard_normal((P, N)).astype(np.float32)
        old = algo.residuals.copy()
        res = algo.step(g)
        assert all(res.info["invariants"].values()), res.info["invariants"]
        assert res.info["selected"] == [50] * P
        # the result is the sum of exactly what left each worker's residual
        V = old + g
        sent = np.where(res.residuals != V, V, 0).astype(np.float64).sum(0)
        assert np.allclose(res.result[0], sent, rtol=1e-6, atol=1e-6)
        assert (res.result == res.result[0]).all()
        total_in += g.astype(np.float64).sum(0)
        total_out += res.result[0]
    leftover = algo.residuals.astype(np.float64).sum(0)
    assert np.allclose(total_out + leftover, total_in, atol=1e-4)


# ---- SparCML traffic ---------------------------------------------------------------------------

@pytest.mark.parametrize("P", [2, 3, 4, 6, 7, 8, 12])
def test_sparcml_steps_and_sparse_message_sizes(P):
    N = 4000
    rng = np.random.default_rng(P)
    g = integer_grads(rng, P, N, 0.01)
    res = sparcml.SparCML(P, N, 1.0, select="nonzero").step(g)
    core = 1 << (P.bit_length() - 1)
    assert res.steps == int(math.log2(core)) + (2 if core < P else 0)
    support = [set(np.flatnonzero(g[w])) for w in range(P)]
    # fold-in: excess rank r sends its own COO to r - core
    offset = 0
    if core < P:
        for r in range(core, P):
            assert res.sent[0, r] == 8 * len(support[r])
        offset = 1
        for r in range(core):
            if r + core < P:
                support[r] |= support[r + core]
    # round i: rank r sends the union of its aligned group of 2^(i-1) core ranks
    dist = 1
    for s in range(int(math.log2(core))):
        for r in range(core):
            base = r & ~(dist - 1)
            group = set().union(*(support[q] for q in range(base, base + dist)))
            assert res.sent[offset + s, r] == 8 * len(group)
        dist <<= 1


def test_sparcml_dense_switch_at_break_even():
    P, N = 8, 1000
    g = integer_grads(np.random.default_rng(0), P, N, 0.3)   # unions pass 50 % after 2 rounds
    on = sparcml.SparCML(P, N, 1.0, select="nonzero").step(g)
    off = sparcml.SparCML(P, N, 1.0, select="nonzero", dense_switch=False).step(g)
    assert np.array_equal(on.result, off.result)
    assert on.info["final_dense"] and not off.info["final_dense"]
    assert on.sent[-1].tolist() == [4 * N] * P                # dense messages: 4 B per element
    assert off.sent[-1].min() > 4 * N                         # COO would have cost more
    assert on.sent.sum() < off.sent.sum()
    assert all(on.info["invariants"].values())


def test_sparcml_cost_model():
    c = sparcml.cost(8, 10**6, 0.001, 2.0, 1.0)
    assert c["steps"] == 3 and c["latency"] == 6.0
    expect = sum(8 * (1 - (1 - 0.001) ** g) * 10**6 for g in (1, 2, 4))
    assert c["bandwidth"] == pytest.approx(expect)
    assert sparcml.cost(6, 1000, 0.01, 1.0, 0.0)["steps"] == 4
    dense = sparcml.cost(8, 1000, 0.5, 0.0, 1.0)
    assert max(dense["bytes_per_step"]) == 4 * 1000              # switched to dense


def test_sparcml_bad_options():
    with pytest.raises(SparseError, match="switch_density"):
        sparcml.SparCML(4, 100, 0.1, switch_density=0)
    with pytest.raises(SparseError, match="select"):
        sparcml.SparCML(4, 100, 0.1, select="random")
    with pytest.raises(SparseError, match="shape"):
        sparcml.SparCML(4, 100, 0.1).step(np.zeros((4, 99), np.float32))


# ---- OmniReduce traffic -----------------------------------------------------------------------

@pytest.mark.parametrize("P,N,block", [(4, 4096, 256), (3, 1000, 64), (7, 777, 50)])
def test_omnireduce_block_traffic(P, N, block):
    rng = np.random.default_rng(N)
    g = integer_grads(rng, P, N, 0.01)
    algo = omnireduce.OmniReduce(P, N, 1.0, select="nonzero", block=block, block_id_bytes=4)
    res = algo.step(g)
    nb = -(-N // block)
    length = np.full(nb, block)
    length[-1] = N - (nb - 1) * block
    owner = np.concatenate([np.full(len(c), j) for j, c in
                            enumerate(np.array_split(np.arange(nb), P))])
    for w in range(P):
        blocks = np.unique(np.flatnonzero(g[w]) // block)
        out = sum(4 * length[b] + 4 for b in blocks if owner[b] != w)
        assert res.sent[0, w] == out
    agg_blocks = np.unique(np.flatnonzero(g.sum(0)) // block)
    for w in range(P):
        into = sum(4 * length[b] + 4 for b in agg_blocks if owner[b] != w)
        assert res.received[1, w] == into
    assert res.info["aggregated_nonzero_blocks"] == agg_blocks.size


def test_omnireduce_skew_overloads_one_aggregator():
    P, N = 8, 64 * 256
    g = np.zeros((P, N), np.float32)
    rng = np.random.default_rng(0)
    for w in range(P):                                            # all traffic in aggregator 0's range
        g[w, rng.choice(N // P, 100, replace=False)] = 1.0
    res = omnireduce.OmniReduce(P, N, 1.0, select="nonzero").step(g)
    ingress = res.info["aggregator_ingress"]
    assert ingress[1:].sum() == 0 and ingress[0] > 0
    assert res.info["push_imbalance"] == pytest.approx(P)


def test_omnireduce_cost_model():
    c = omnireduce.cost(4, 256 * 100, 1.0, 1.0, 1.0)
    per_block = 4 * 256 + 4
    assert c["push_bytes"] == pytest.approx(3 / 4 * 100 * per_block)
    assert c["pull_bytes"] == pytest.approx(3 / 4 * 100 * per_block)
    assert c["latency"] == 6
    low = omnireduce.cost(16, 10**6, 0.0001, 0.0, 1.0)
    assert low["push_bytes"] < low["pull_bytes"]                  # aggregation densifies blocks


def test_omnireduce_bad_options():
    with pytest.raises(SparseError, match="block"):
        omnireduce.OmniReduce(4, 100, 0.1, block=0)
    with pytest.raises(SparseError, match="block_id_bytes"):
        omnireduce.OmniReduce(4, 100, 0.1, block_id_bytes=-1)
    with pytest.raises(SparseError, match="workers"):
        omnireduce.OmniReduce(1, 100, 0.1)


@pytest.mark.parametrize("name", ["sparcml", "omnireduce", "zen"])
def test_results_are_read_only_and_flag_is_validated(name):
    algo = make(name, workers=3, elements=50, density=0.1)
    res = algo.step(np.ones((3, 50), np.float32))
    with pytest.raises(ValueError):
        res.result[0, 0] = 1.0
    with pytest.raises(ValueError):
        res.residuals[0, 0] = 1.0
    quiet = make(name, workers=3, elements=50, density=0.1, check_invariants=False)
    assert "mass_conservation" not in quiet.step(np.ones((3, 50), np.float32)).info["invariants"]
    with pytest.raises(SparseError, match="check_invariants"):
        make(name, workers=3, elements=50, density=0.1, check_invariants="yes")


@pytest.mark.parametrize("name", ["sparcml", "omnireduce", "zen"])
def test_overflow_raises_and_leaves_state_untouched(name):
    algo = make(name, workers=2, elements=8, density=0.125)          # k = 1
    g = np.zeros((2, 8), np.float32)
    g[0, :2] = [3e38, 2e38]
    algo.step(g)                                   # index 0 sent, 2e38 stays in the residual
    before = algo.residuals.copy()
    g[0, :2] = [0, 2e38]                           # 2e38 + 2e38 overflows float32
    with pytest.raises(SparseError, match="overflows"):
        algo.step(g)
    assert np.array_equal(algo.residuals, before)
    g[0, 1] = np.inf
    with pytest.raises(SparseError, match="NaN or Inf"):
        algo.step(g)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("name", ["sparcml", "omnireduce", "zen"])
def test_overflowing_sum_fails_the_invariants(name):
    g = np.zeros((2, 4), np.float32)
    g[:, 0] = 3e38                                 # each finite, the sum is not
    res = make(name, workers=2, elements=4, density=0.25).step(g)
    assert not res.info["invariants"]["finite_result"]
