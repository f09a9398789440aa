"""MultiTree-Sparse: trees from the Schedule IR, re-selection per hop, flows, residuals."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic import algorithms
from treenic.schedule.execute import execute
from treenic.schedule.ir import Op, Schedule, Transfer
from treenic.sparse import zen
from treenic.sparse.base import PAIR_BYTES, SparseError, make
from treenic.sparse.multitree_sparse import (MultiTreeSparse, TreePlan, build_schedule,
                                             default_topology)
from conftest import assert_exact_mass_conservation


def test_default_topology():
    assert default_topology(16) == "torus:4x4"
    assert default_topology(12) == "torus:3x4"
    assert default_topology(7) == "ring:7"
    assert default_topology(2) == "ring:2"


@pytest.mark.parametrize("p,topo", [(4, None), (5, "ring:5"), (6, None), (9, "torus:3x3"),
                                    (16, "torus:4x4"), (8, "mesh:2x4"), (8, "switch:8")])
def test_density_one_matches_dense_executor_bit_for_bit(p, topo):
    """kb = |flow|: nothing dropped; same trees, same (step, rx_port) order as the golden
    executor, so the float32 results agree exactly."""
    n = 37 * p + 3
    g = (np.random.default_rng(p).standard_normal((p, n)) *
         10.0 ** np.random.default_rng(p + 1).integers(-3, 4, (p, n))).astype(np.float32)
    a = MultiTreeSparse(p, n, 1.0, topology=topo)
    r = a.step(g)
    ref = execute(build_schedule(p, topo), g)
    assert np.array_equal(r.result, ref)
    assert not r.residuals.any()
    assert all(r.info["invariants"].values())


def test_schedule_is_the_ir_multitree():
    a = MultiTreeSparse(16, 1600, 0.05)
    s = algorithms.build("multitree", "torus:4x4")
    assert a.schedule.num_chunks == s.num_chunks == 16
    assert [(t.step, t.src, t.dst, t.chunks) for t in a.schedule.transfers] == \
           [(t.step, t.src, t.dst, t.chunks) for t in s.transfers]
    assert a.plan.roots == list(range(16))           # tree c is rooted at node c


def test_reselection_at_every_hop_and_traffic():
    """Dense random data: every message (reduce and gather) carries exactly kb pairs, so the
    measured bytes equal the cost model's per-node word counts."""
    p, n = 16, 16 * 200
    g = np.random.default_rng(0).standard_normal((p, n)).astype(np.float32)
    r = MultiTreeSparse(p, n, 0.05).step(g)
    kb = 10
    c = MultiTreeSparse.cost(p, n, 0.05)
    recv_words = r.bytes_received_per_worker() / 4
    assert recv_words.mean() == c.words_lo and recv_words.max() == c.words_hi
    assert r.steps == c.rounds == build_schedule(p).steps
    assert np.all(r.sent % (kb * PAIR_BYTES) == 0)
    assert np.count_nonzero(r.result[0]) == p * kb


def test_flow_assignment_hash_uses_zen_h0():
    p, n = 8, 4000
    a = MultiTreeSparse(p, n, 0.01, flow_assignment="hash", seed=5)
    flow = zen.partition_of(np.arange(n, dtype=np.uint32), 8, 5)
    assert np.array_equal(np.diff(a.offsets), np.bincount(flow, minlength=8))
    assert np.array_equal(np.sort(a.perm), np.arange(n))
    assert np.all(np.diff(flow[a.perm]) >= 0)


def test_hash_flows_balance_a_hot_index_range():
    """Nonzeros confined to the first 1/8 of the index space: contiguous flows give one tree
    all the data, Zen's hash spreads it over every tree."""
    p, n = 8, 8000
    g = np.zeros((p, n), np.float32)
    g[:, : n // 8] = np.random.default_rng(1).standard_normal((p, n // 8))
    res = {}
    for fa in ("contiguous", "hash"):
        r = MultiTreeSparse(p, n, 0.02, flow_assignment=fa, topology="ring:8").step(g)
        res[fa] = np.count_nonzero(r.result[0])
        assert all(r.info["invariants"].values())
    assert res["hash"] > 4 * res["contiguous"]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(2, None), (3, None), (4, None), (5, "ring:5"), (6, None), (6, "mesh:3x2"),
                        (9, None)]),
       st.integers(1, 12), st.sampled_from([0.05, 0.2, 0.6, 1.0]),
       st.sampled_from(["contiguous", "hash"]), st.sampled_from(["local", "global"]),
       st.integers(0, 10 ** 6))
def test_mass_conservation_exact(pt, per, dens, fa, resid, seed):
    p, topo = pt
    n = p * per
    if round(dens * n) == 0:
        return
    rng = np.random.default_rng(seed)
    a = MultiTreeSparse(p, n, dens, topology=topo, flow_assignment=fa, residual=resid, seed=seed)
    assert_exact_mass_conservation(a, 3, rng)


def test_local_residual_keeps_discards_where_they_happen():
    """A leaf's discard is its own value; an inner node's discard can hold children's values."""
    p, n = 3, 3
    g = np.array([[1, 0, 0], [2, 0, 0], [4, 0, 0]], np.float32)
    a = MultiTreeSparse(p, n, 1 / 3, topology="ring:3")
    r = a.step(g)
    assert r.result[0].sum() + r.residuals.sum() == 7
    assert set(np.flatnonzero(r.result[0])) <= {0}


def test_tree_plan_rejects_non_tree_schedules():
    topo = "ring:3"
    ok = algorithms.build("ring", topo)
    TreePlan(ok)                                   # ring reduce-scatter is acceptable
    from treenic.topology import parse
    t = parse(topo)
    twice = Schedule("bad", t, 3, [Transfer(1, 1, 0, Op.REDUCE, (0,), 0),
                                   Transfer(2, 1, 0, Op.REDUCE, (0,), 0),
                                   Transfer(2, 2, 0, Op.REDUCE, (0,), 0),
                                   Transfer(1, 0, 1, Op.REDUCE, (1,), 1),
                                   Transfer(1, 2, 1, Op.REDUCE, (1,), 1),
                                   Transfer(1, 0, 2, Op.REDUCE, (2,), 2),
                                   Transfer(1, 1, 2, Op.REDUCE, (2,), 2)], 2, 0)
    with pytest.raises(SparseError, match="twice"):
        TreePlan(twice)
    late = Schedule("bad", t, 1, [Transfer(1, 1, 0, Op.REDUCE, (0,), 0),
                                  Transfer(2, 2, 1, Op.REDUCE, (0,), 0)], 2, 0)
    with pytest.raises(SparseError, match="after sending"):
        TreePlan(late)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(topology="ring:5"), "has 5 nodes"),
    (dict(topology="torus:0x0"), "bad topology"),
    (dict(flow_assignment="random"), "flow_assignment"),
    (dict(residual="none"), "residual"),
    (dict(colour="red"), "unknown option"),
])
def test_bad_options(kwargs, msg):
    with pytest.raises(SparseError, match=msg):
        make("multitree-sparse", workers=4, elements=40, density=0.1, **kwargs)
