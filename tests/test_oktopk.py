"""Ok-Topk golden model: exact-threshold iteration, threshold reuse, repartition, invariants."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.sparse import select
from treenic.sparse.base import SparseError
from treenic.sparse.oktopk import OkTopk
from conftest import assert_exact_mass_conservation


def test_exact_iteration_is_global_topk_of_reduced_local_topk():
    rng = np.random.default_rng(0)
    p, n, k = 4, 400, 8
    g = rng.standard_normal((p, n)).astype(np.float32)
    r = OkTopk(p, n, k / n).step(g)
    red = np.zeros(n, np.float32)
    sels = [select.topk(g[w], k) for w in range(p)]
    for w, s in enumerate(sels):
        red[s] += g[w, s]
    G = select.topk(red, k)
    expect = np.zeros(n, np.float32)
    expect[G] = red[G]
    assert np.array_equal(r.result[0], expect)
    for w, s in enumerate(sels):
        zero = np.intersect1d(s, G)
        assert not r.residuals[w, zero].any()
        rest = np.setdiff1d(np.arange(n), zero)
        assert np.array_equal(r.residuals[w, rest], g[w, rest])
    assert r.info["exact_threshold_iteration"] and r.info["repartitioned"]
    # P-1 split-and-reduce rounds, a Bruck for the repartition proposals, a Bruck all-gather
    assert r.steps == (p - 1) + 2 * math.ceil(math.log2(p))


def test_threshold_reuse_and_periods():
    rng = np.random.default_rng(1)
    a = OkTopk(4, 1000, 0.02, threshold_period=3, repartition_period=2)
    flags = []
    for t in range(6):
        thr_prev = a.thr_glob
        r = a.step(rng.standard_normal((4, 1000)).astype(np.float32))
        flags.append((r.info["exact_threshold_iteration"], r.info["repartitioned"]))
        assert all(r.info["invariants"].values())
        out = r.result[0]
        if r.info["exact_threshold_iteration"]:
            assert np.count_nonzero(out) <= 20
            assert a.thr_glob == np.abs(out[out != 0]).min()
        else:
            # reuse: the global set is every reduced value strictly above the stored threshold
            assert np.all(np.abs(out[out != 0]) > thr_prev)
            assert r.info["global_selected"] == np.count_nonzero(out)
    assert flags == [(True, True), (False, False), (False, True), (True, False),
                     (False, True), (False, False)]


def test_repartition_balances_skewed_selections():
    """All large values sit in the first 10% of the index space: equal regions give worker 0
    the whole load, the repartitioned regions spread it."""
    rng = np.random.default_rng(2)
    p, n = 8, 8000
    g = (rng.standard_normal((p, n)) * 0.01).astype(np.float32)
    g[:, : n // 10] *= 100
    a = OkTopk(p, n, 0.02, repartition_period=1)
    r = a.step(g)
    b = r.info["region_bounds"]
    assert b[0] == 0 and b[-1] == n and b[1] < n // 10
    assert r.info["region_load_max"] <= 2 * r.info["region_load_mean"]


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.integers(8, 90), st.sampled_from([0.05, 0.2, 0.5, 1.0]),
       st.integers(1, 3), st.integers(1, 3), st.integers(0, 10 ** 6))
def test_mass_conservation_exact(p, n, dens, tp, rp, seed):
    if round(dens * n) == 0:
        return
    rng = np.random.default_rng(seed)
    a = OkTopk(p, n, dens, threshold_period=tp, repartition_period=rp)
    assert_exact_mass_conservation(a, 4, rng)


def test_density_one_exact_iteration_is_dense():
    g = np.random.default_rng(4).standard_normal((5, 100)).astype(np.float32)
    r = OkTopk(5, 100, 1.0).step(g)
    tol = 5 * np.finfo(np.float32).eps * np.abs(g).astype(np.float64).sum(0)
    assert np.all(np.abs(r.result[0] - g.astype(np.float64).sum(0)) <= tol)
    assert not r.residuals.any()


@pytest.mark.parametrize("p,lat,lo,hi", [(8, 22, 1.75, 5.25), (12, 2 * (12 + math.log2(12)), 11 / 6, 5.5),
                                         (14, 2 * (14 + math.log2(14)), 13 / 7, 78 / 14)])
def test_table_i(p, lat, lo, hi):
    n, k = 100 * p, 10 * p
    c = OkTopk.cost(p, n, k / n)
    assert c.rounds == pytest.approx(lat)
    assert c.words_lo / k == pytest.approx(lo) and c.words_hi / k == pytest.approx(hi)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(threshold_period=0), "threshold_period"),
    (dict(repartition_period=1.5), "repartition_period"),
    (dict(warmup=3), "unknown option"),
])
def test_bad_options(kwargs, msg):
    with pytest.raises(SparseError, match=msg):
        OkTopk(4, 100, 0.1, **kwargs)
