"""TopkA, TopkDSA, gTopk golden models: exact values, residuals, traffic, Table I costs."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.sparse import select
from treenic.sparse.base import PAIR_BYTES, SparseError, make
from treenic.sparse.topk_family import GTopk, TopkA, TopkDSA, binomial_reduce_pairs
from conftest import assert_exact_mass_conservation


def ref_topk(v, k):
    """Sort-based exact top-k (|v| desc, ties ascending index, zeros never selected)."""
    order = sorted(range(v.size), key=lambda i: (-abs(float(v[i])), i))
    return np.array(sorted(i for i in order[:k] if v[i] != 0), np.int64)


def test_topka_values_residuals_and_bytes():
    rng = np.random.default_rng(1)
    p, n, dens = 6, 200, 0.05
    g = rng.integers(-5, 6, (p, n)).astype(np.float32)
    r = TopkA(p, n, dens).step(g)
    k = 10
    expect = np.zeros(n, np.float32)
    res = g.copy()
    for w in range(p):
        s = ref_topk(g[w], k)
        expect[s] += g[w, s]
        res[w, s] = 0
    assert np.array_equal(r.result[0], expect) and np.array_equal(r.residuals, res)
    assert r.steps == math.ceil(math.log2(p))
    # every worker receives the other P-1 workers' k pairs
    assert np.all(r.bytes_received_per_worker() == (p - 1) * k * PAIR_BYTES)
    assert all(r.info["invariants"].values())


def test_topkdsa_equals_topka_numerically_and_switches_to_dense():
    rng = np.random.default_rng(2)
    g = rng.standard_normal((5, 500)).astype(np.float32)
    a, b = TopkA(5, 500, 0.02), TopkDSA(5, 500, 0.02)
    for _ in range(3):
        ra, rb = a.step(g), b.step(g)
        assert np.array_equal(ra.result, rb.result) and np.array_equal(ra.residuals, rb.residuals)
    assert rb.info["allgather"] == "sparse"
    assert rb.steps == (5 - 1) + 3          # P-1 direct-send rounds + Bruck
    dense = TopkDSA(5, 500, 0.5).step(g)
    assert dense.info["allgather"] == "dense"
    # dense all-gather: every worker receives the other regions as 4-byte values
    bounds = dense.info["region_bounds"]
    sizes = np.diff(bounds)
    rs_bytes = dense.received[:4].sum(0)
    ag_bytes = dense.received[4:].sum(0)
    assert np.all(ag_bytes == 4 * (500 - sizes))
    assert rs_bytes.sum() == dense.sent[:4].sum()
    # reduce-scatter messages: pairs while sparse, the dense region once pairs cost more
    assert rb.info["reduce_scatter_dense_messages"] == 0
    full = TopkDSA(5, 500, 0.9).step(g)
    assert full.info["reduce_scatter_dense_messages"] == 5 * 4
    assert np.all(full.sent[:4] == 4 * 100)


def test_gtopk_tree_and_residual_rule():
    assert binomial_reduce_pairs(8) == [[(0, 1), (2, 3), (4, 5), (6, 7)], [(0, 2), (4, 6)], [(0, 4)]]
    assert binomial_reduce_pairs(6) == [[(0, 1), (2, 3), (4, 5)], [(0, 2)], [(0, 4)]]
    rng = np.random.default_rng(3)
    p, n, k = 4, 40, 4
    g = rng.integers(-9, 10, (p, n)).astype(np.float32)
    r = GTopk(p, n, k / n).step(g)
    # independent reference: dict-based merges, receiver first
    held = {w: {int(i): g[w, i] for i in ref_topk(g[w], k)} for w in range(p)}
    for pairs in binomial_reduce_pairs(p):
        for dst, src in pairs:
            u = dict(held[dst])
            for i, v in held.pop(src).items():
                u[i] = np.float32(u.get(i, np.float32(0)) + v) if i in u else v
            vals = np.array([u[i] for i in sorted(u)], np.float32)
            keep = ref_topk(vals, k)
            keys = sorted(u)
            held[dst] = {keys[j]: u[keys[j]] for j in keep}
    expect = np.zeros(n, np.float32)
    for i, v in held[0].items():
        expect[i] = v
    assert np.array_equal(r.result[0], expect)
    final = set(held[0])
    for w in range(p):
        s = set(ref_topk(g[w], k).tolist())
        zeroed = set(np.flatnonzero((r.residuals[w] == 0) & (g[w] != 0)).tolist())
        assert zeroed == s & final
    assert r.steps == 2 * 2


def test_gtopk_violates_mass_conservation_on_some_seeds():
    """docs/sparse-models.md, SparDL S-5.4: in-procedure discards are lost in gTopk (63/200 P=4
    trials)."""
    violated = 0
    for seed in range(40):
        g = np.random.default_rng(seed).integers(-9, 10, (4, 32)).astype(np.float32)
        r = GTopk(4, 32, 0.125).step(g)
        violated += r.info["mass_defect"] > 0
        assert "mass_conservation" not in r.info["invariants"]
    assert violated > 0


def test_gtopk_non_power_of_two():
    g = np.random.default_rng(0).standard_normal((6, 300)).astype(np.float32)
    r = GTopk(6, 300, 0.05).step(g)
    assert r.steps == 2 * 3 and np.count_nonzero(r.result[0]) <= 15


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["topka", "topkdsa"]), st.integers(2, 11), st.integers(4, 80),
       st.sampled_from([0.05, 0.2, 0.5, 1.0]), st.integers(0, 10 ** 6))
def test_mass_conservation_exact(name, p, n, dens, seed):
    if round(dens * n) == 0:
        return
    rng = np.random.default_rng(seed)
    a = make(name, workers=p, elements=n, density=dens)
    assert_exact_mass_conservation(a, 3, rng)


@pytest.mark.parametrize("name", ["topka", "topkdsa", "gtopk"])
def test_density_one_is_dense_sum(name):
    p, n = 5, 120
    g = np.random.default_rng(7).standard_normal((p, n)).astype(np.float32)
    r = make(name, workers=p, elements=n, density=1.0).step(g)
    tol = p * np.finfo(np.float32).eps * np.abs(g).astype(np.float64).sum(0)
    assert np.all(np.abs(r.result[0] - g.astype(np.float64).sum(0)) <= tol)
    assert not r.residuals.any()


def test_shared_top_k_is_the_select_module():
    v = np.array([0, 3, -3, 1, 0, 3], np.float32)
    from treenic.sparse._common import topk_1d
    assert topk_1d(v, 2).tolist() == [1, 2] == select.topk(v, 2).tolist()
    assert topk_1d(np.zeros(4, np.float32), 3).size == 0         # zeros never selected


# docs/sparse-models.md, SparDL S-9 table (latency α, bandwidth k·β); baselines use plain log2 P
@pytest.mark.parametrize("cls,p,lat,lo,hi", [
    (TopkA, 8, 3, 14, 14), (TopkA, 12, math.log2(12), 22, 22), (TopkA, 14, math.log2(14), 26, 26),
    (TopkDSA, 8, 14, 3.5, None), (TopkDSA, 12, 12 + 2 * math.log2(12), 11 / 3, None),
    (TopkDSA, 14, 14 + 2 * math.log2(14), 26 / 7, None),
    (GTopk, 8, 6, 12, 12), (GTopk, 16, 8, 16, 16),
])
def test_table_i(cls, p, lat, lo, hi):
    n, k = 1000 * p, 10 * p
    c = cls.cost(p, n, k / n, alpha=2.0, beta=0.5)
    assert c.rounds == pytest.approx(lat) and c.words_lo / k == pytest.approx(lo)
    if hi is not None:
        assert c.words_hi / k == pytest.approx(hi)
    else:   # TopkDSA's upper bound is (P-1)/P·(2k + n)
        assert c.words_hi == pytest.approx((p - 1) / p * (2 * k + n))
    assert c.time == pytest.approx(2.0 * c.rounds + 0.5 * c.words_lo)
    assert float(f"{lat:.2f}") == pytest.approx(round(c.rounds, 2))


@pytest.mark.parametrize("kwargs,msg", [
    (dict(workers=1, elements=10, density=0.5), "at least 2 workers"),
    (dict(workers=3, elements=10, density=0.0), "density"),
    (dict(workers=3, elements=10, density=-1), "density"),
    (dict(workers=3, elements=10, density=0.01), "k = 0"),
    (dict(workers=3, elements=10, density=0.5, bogus=1), "unknown option"),
])
@pytest.mark.parametrize("name", ["topka", "topkdsa", "gtopk"])
def test_bad_parameters(name, kwargs, msg):
    with pytest.raises(SparseError, match=msg):
        make(name, **kwargs)


def test_float32_overflow_is_reported_not_hidden():
    """IEEE overflow to inf (docs/architecture.md §5): TopkA's sum overflows and the invariant says
    so; a model that must re-select an inf raises and leaves its state untouched."""
    g = np.full((4, 64), 3e38, np.float32)
    r = TopkA(4, 64, 0.5).step(g)
    assert np.isinf(r.result[0]).any() and r.info["invariants"]["mass_conservation"] is False
    for name, opts in (("spardl", {"teams": 2, "sag": "b"}), ("oktopk", {}), ("gtopk", {})):
        a = make(name, workers=4, elements=64, density=0.5, **opts)
        before = {k: repr(getattr(a, k)) for k in a.STATE}
        with pytest.raises(SparseError, match="non-finite"):
            a.step(g)
        assert a.iteration == 0 and not a.residuals.any()
        assert {k: repr(getattr(a, k)) for k in a.STATE} == before
