"""Dense baseline algorithms (Ring, DBTree, 2D-Ring, halving-doubling, HDRM) → Schedule IR.

Every schedule must pass the checkers and run bit-exact against the independent replay;
step counts, α–β byte counts and link conflicts are compared with closed forms.
"""
import math

import numpy as np
import pytest

from treenic.algorithms import build
from treenic.algorithms.dbtree import btree, dtree
from treenic.algorithms.halving_doubling import hdrm_rank_node
from treenic.algorithms.ring import ring_order
from treenic.schedule.check import check_all, link_conflicts, link_loads
from treenic.schedule.cost import alpha_beta
from treenic.schedule.execute import execute, run_and_check
from treenic.schedule.ir import Op, Schedule, ScheduleError
from treenic.topology import parse

CASES = [
    ("ring", t) for t in ["ring:2", "ring:8", "ring:7", "torus:4x4", "torus:4x8", "torus:3x5",
                          "torus:5x5", "mesh:4x4", "mesh:3x3", "mesh:2x5", "fattree:16",
                          "bigraph:4x8", "switch:5", "dgx2"]
] + [
    ("dbtree", t) for t in ["ring:2", "ring:3", "ring:8", "torus:4x4", "torus:4x8", "mesh:3x5",
                            "fattree:16", "bigraph:4x8", "switch:13"]
] + [
    ("ring2d", t) for t in ["torus:4x4", "torus:4x8", "torus:8x4", "mesh:4x4", "mesh:3x5",
                            "torus:1x6", "torus:2x3"]
] + [
    ("halving-doubling", t) for t in ["ring:2", "ring:3", "ring:8", "ring:6", "torus:4x4",
                                      "torus:4x8", "torus:3x5", "mesh:3x3", "fattree:16",
                                      "bigraph:4x8", "switch:13", "dgx2"]
] + [
    ("hdrm", t) for t in ["bigraph:2x4", "bigraph:4x8", "bigraph:8x4", "bigraph:4x16"]
]


@pytest.mark.parametrize("name,spec", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_checkers_and_bit_exact(name, spec, rng):
    s = build(name, spec)
    summary = check_all(s)
    assert summary["postcondition"] and summary["dependencies"]
    # odd element count: unequal chunks; a subnormal column and an order-sensitive column
    # (±3e38: partial sums overflow to ±inf or not depending on the reduction order)
    buf = rng.standard_normal((s.n, 53)).astype(np.float32)
    buf[:, 0] = np.float32(1e-40)
    buf[::2, 1] = np.float32(3e38)
    buf[1::2, 1] = np.float32(-3e38)
    rep = run_and_check(s, buf)
    assert rep.bit_exact and rep.all_nodes_equal
    exact = buf[:, 2:].astype(np.float64).sum(axis=0)
    assert np.max(np.abs(rep.result[0, 2:] - exact)) < 1e-5 * s.n
    assert rep.result[0, 0] == np.float32(1e-40) * s.n or s.n > 8   # subnormals kept
    assert rep.result[0, 0] > 0
    # JSON export round-trips to the same transfers and results
    again = Schedule.loads(s.dumps())
    assert again.transfers == s.transfers
    assert np.array_equal(execute(again, buf).view(np.uint32), rep.result.view(np.uint32))


# ---- step counts --------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["ring:2", "ring:8", "ring:7", "torus:4x8", "mesh:3x3",
                                  "fattree:16"])
def test_ring_steps(spec):
    s = build("ring", spec)
    assert (s.reduce_steps, s.gather_steps) == (s.n - 1, s.n - 1)
    assert s.num_chunks == s.n and len(s.transfers) == 2 * s.n * (s.n - 1)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 31, 32, 64])
def test_halving_doubling_steps(n):
    s = build("halving-doubling", f"switch:{n}")
    k = int(math.log2(n))
    if n & (n - 1) == 0:
        assert s.steps == 2 * k and s.reduce_steps == k
    else:   # one fold step before, one after (MPICH)
        assert s.steps == 2 * k + 2 and s.reduce_steps == k + 1
    check_all(s)


@pytest.mark.parametrize("spec", ["torus:4x4", "torus:4x8", "torus:8x4", "mesh:3x5", "torus:1x6"])
def test_ring2d_steps(spec):
    s = build("ring2d", spec)
    X, Y = parse(spec).dims
    assert s.steps == 2 * (X - 1) + 2 * (Y - 1)
    assert s.reduce_steps == (X - 1) + (Y - 1)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 14, 16, 33, 64])
def test_dbtree_steps(n):
    # both NCCL trees have height ceil(log2 N); tree 0 in odd steps, tree 1 in even steps
    s = build("dbtree", f"switch:{n}")
    h = math.ceil(math.log2(n))
    assert s.meta["heights"] == [h, h]
    assert (s.reduce_steps, s.gather_steps) == (2 * h, 2 * h)


# ---- α–β closed forms (bytes per node) --------------------------------------------------

def _bytes_per_node(s, elements):
    """Σ over steps of the most bytes any node sends: α–β with α = 0, β = 1 s/byte."""
    return alpha_beta(s, elements, alpha=0.0, bandwidth=1.0)


@pytest.mark.parametrize("spec", ["ring:8", "torus:4x4", "torus:4x8", "fattree:16", "mesh:3x5"])
def test_ring_bytes_closed_form(spec):
    s = build("ring", spec)
    n = s.n
    M = 4 * n * 1000                      # bytes, divisible into N equal chunks
    assert _bytes_per_node(s, M // 4) == pytest.approx(2 * (n - 1) / n * M, rel=0, abs=0)
    # latency term: 2(N-1) α
    assert alpha_beta(s, M // 4, alpha=1.0, bandwidth=1e300) == pytest.approx(2 * (n - 1))


@pytest.mark.parametrize("spec", ["switch:8", "torus:4x4", "torus:4x8", "bigraph:4x8"])
def test_halving_doubling_bytes_closed_form(spec):
    names = ("halving-doubling", "hdrm") if spec.startswith("bigraph") else ("halving-doubling",)
    for name in names:
        s = build(name, spec)
        n = s.n
        M = 4 * n * 1000
        assert _bytes_per_node(s, M // 4) == 2 * (n - 1) / n * M


def test_halving_doubling_non_power_of_two_bytes():
    # fold steps send the whole buffer: 2M extra on top of the core's 2(p-1)/p M
    s = build("halving-doubling", "switch:12")
    M = 4 * 8 * 1000
    assert _bytes_per_node(s, M // 4) == 2 * M + 2 * 7 / 8 * M


@pytest.mark.parametrize("spec", ["torus:4x4", "torus:4x8", "mesh:3x5"])
def test_ring2d_bytes_closed_form(spec):
    s = build("ring2d", spec)
    X, Y = parse(spec).dims
    M = 4 * X * Y * 1000
    expect = 2 * (X - 1) / X * M + 2 * (Y - 1) / (X * Y) * M   # rows: super-chunks, cols: chunks
    assert _bytes_per_node(s, M // 4) == pytest.approx(expect, rel=1e-12)
    assert expect == pytest.approx(2 * (X * Y - 1) / (X * Y) * M)   # = Ring's, fewer steps


def test_dbtree_bytes_step_model():
    # non-pipelined, N = 16, H = 4: each reduce step a node sends its half (M/2) once; in the
    # broadcast an interior node sends its half to two children (M), except the root's first
    # step (NCCL roots have one child): 2H·M/2 + 2·(M/2 + (H-1)·M)
    s = build("dbtree", "switch:16")
    M = 4 * 2 * 1000
    H = 4
    assert _bytes_per_node(s, M // 4) == 2 * H * M / 2 + 2 * (M / 2 + (H - 1) * M)
    # pipelining over P sub-chunks per tree approaches the bandwidth-optimal regime
    from treenic.algorithms.dbtree import build as dbt
    p = dbt(parse("switch:16"), pipeline=16)
    check_all(p)
    M = 4 * 32 * 1000
    assert p.steps == 2 * 2 * (4 + 16 - 1)
    rs = alpha_beta(Schedule(p.algorithm, p.topology, p.num_chunks,
                             [t for t in p.transfers if t.op == Op.REDUCE], p.reduce_steps, 0),
                    M // 4, alpha=0.0, bandwidth=1.0)
    assert rs == p.reduce_steps * M / 32                   # one sub-chunk per step
    assert _bytes_per_node(p, M // 4) <= p.reduce_steps * M / 32 + p.gather_steps * M / 16
    assert _bytes_per_node(p, M // 4) < _bytes_per_node(build("dbtree", "switch:16"), M // 4) / 2


# ---- link conflicts -------------------------------------------------------------------------

@pytest.mark.parametrize("name,spec", [("ring", "ring:8"), ("ring", "torus:4x4"),
                                       ("ring", "torus:4x8"), ("ring", "torus:5x5"),
                                       ("ring", "mesh:4x8"), ("ring2d", "torus:4x4"),
                                       ("ring2d", "torus:4x8"), ("hdrm", "bigraph:4x8"),
                                       ("hdrm", "bigraph:4x16"), ("hdrm", "bigraph:8x4")])
def test_contention_free(name, spec):
    assert link_conflicts(build(name, spec)) == 0


@pytest.mark.parametrize("name,spec", [("dbtree", "torus:4x4"), ("dbtree", "torus:8x8"),
                                       ("halving-doubling", "bigraph:4x8"),
                                       ("halving-doubling", "torus:4x4")])
def test_contention_when_mismatched(name, spec):
    assert link_conflicts(build(name, spec)) > 0


def test_ring2d_mesh_closing_hop():
    # no wrap-around link on a mesh: the ring-closing hop X-1 -> 0 crosses X-1 links
    # (against the ring direction, so it adds latency, not conflicts)
    s = build("ring2d", "mesh:4x8")
    hops = {s.topology.hops(t.src, t.dst) for t in s.transfers}
    assert hops == {1, 3, 7}
    assert link_conflicts(s) == 0
    tor = build("ring2d", "torus:4x8")
    assert {tor.topology.hops(t.src, t.dst) for t in tor.transfers} == {1}


def test_ring_order_one_hop_on_grids():
    for spec in ["torus:4x4", "torus:4x8", "torus:3x5", "torus:5x5", "torus:3x3", "mesh:2x5",
                 "mesh:4x8", "mesh:5x4", "torus:8x8"]:
        t = parse(spec)
        order = ring_order(t)
        assert sorted(order) == t.nodes
        assert all(t.hops(a, b) == 1 for a, b in zip(order, order[1:] + order[:1])), spec
    # odd x odd mesh: bipartite with an odd node count, no Hamiltonian cycle -> node-id order
    assert ring_order(parse("mesh:3x3")) == list(range(9))
    assert ring_order(parse("fattree:16")) == list(range(16))


# ---- DBTree structure (NCCL trees.cc diagrams) -------------------------------------------

def test_nccl_btree_diagram_14():
    parent = {r: btree(14, r)[0] for r in range(14)}
    assert parent == {0: -1, 8: 0, 4: 8, 12: 8, 2: 4, 6: 4, 10: 12, 13: 12, 1: 2, 3: 2,
                      5: 6, 7: 6, 9: 10, 11: 10}
    assert btree(14, 12)[1] == [10, 13] and btree(14, 0)[1] == [8]


def test_nccl_dtree_mirror_12_and_shift_13():
    (_, _), (p1, _) = dtree(12)
    assert {r: p1[r] for r in range(12)} == {11: -1, 3: 11, 1: 3, 7: 3, 0: 1, 2: 1, 5: 7,
                                             9: 7, 4: 5, 6: 5, 8: 9, 10: 9}
    (_, _), (p1, _) = dtree(13)
    assert {r: p1[r] for r in range(13)} == {1: -1, 9: 1, 5: 9, 0: 9, 3: 5, 7: 5, 11: 0,
                                             2: 3, 4: 3, 6: 7, 8: 7, 10: 11, 12: 11}


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 13, 16, 24, 33])
def test_dbtree_complementary_and_alternating(n):
    (p0, c0), (p1, c1) = dtree(n)
    for parent in (p0, p1):           # spanning trees
        assert parent.count(-1) == 1
        for r in range(n):
            seen, v = set(), r
            while parent[v] != -1:
                assert v not in seen
                seen.add(v)
                v = parent[v]
    both = [r for r in range(n) if c0[r] and c1[r]]
    assert both == ([] if n % 2 == 0 else [0])
    s = build("dbtree", f"switch:{n}")
    for step, ts in s.by_step().items():
        assert {t.flow for t in ts} <= {(step - 1) % 2}       # tree 0 odd, tree 1 even steps


# ---- HDRM mapping -------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["bigraph:2x4", "bigraph:4x8", "bigraph:4x16", "bigraph:8x4",
                                  "bigraph:8x2", "bigraph:16x8"])
def test_hdrm_pairs_cross_layers_and_spread(spec):
    t = parse(spec)
    s = build("hdrm", t)
    half = t.n // 2
    for tr in s.transfers:
        assert (tr.src < half) != (tr.dst < half)
    par = t.meta["parallel_links"]
    for counter in link_loads(s).values():
        assert max(counter.values()) <= par
    assert link_conflicts(s) == 0
    assert sorted(hdrm_rank_node(len(t.switches), t.meta["per_switch"])) == list(range(t.n))


# ---- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,spec,msg", [("ring2d", "ring:8", "torus:XxY or mesh:XxY"),
                                           ("ring2d", "fattree:16", "torus:XxY or mesh:XxY"),
                                           ("hdrm", "torus:4x4", "bigraph"),
                                           ("hdrm", "bigraph:6x4", "power-of-two")])
def test_unsupported_topology(name, spec, msg):
    with pytest.raises(ScheduleError, match=msg) as e:
        build(name, spec)
    assert "\n" not in str(e.value)


def test_ops_by_phase():
    s = build("halving-doubling", "switch:12")
    for t in s.transfers:
        assert (t.op == Op.REDUCE) == (t.step <= s.reduce_steps)
    # the folded even nodes send everything in step 1 and get everything back in the last
    firsts = [t for t in s.transfers if t.step == 1]
    assert {(t.src, t.dst) for t in firsts} == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert all(len(t.chunks) == s.num_chunks for t in firsts)


# ---- dense benchmark smoke test (quick mode) ----------------------------------------------

@pytest.mark.slow
def test_bench_dense_quick(tmp_path):
    from treenic import bench_dense
    res = bench_dense.run(tmp_path, quick=True)
    for f in ("dense.md", "dense.json", "dense_bandwidth_contention.png",
              "dense_bandwidth_alpha_beta.png"):
        assert (tmp_path / f).stat().st_size > 0
    study = res["bandwidth"]
    assert study["torus:4x4"]["ring2d"]["status"] == "ok"
    assert study["bigraph:4x8"]["ring2d"]["status"] == "n/a"
    assert study["torus:8x8"]["hdrm"]["status"] == "n/a"
    assert all(r["status"] in ("ok", "n/a") for algs in study.values() for r in algs.values())
    # the ring's modelled time grows with the data size; zero-conflict schedules lose nothing
    ring = study["torus:8x8"]["ring"]
    assert ring["contention_us"][64 << 20] > ring["contention_us"][32 << 10]
    assert ring["link_conflicts"] == 0 and ring["contention_slowdown"] == pytest.approx(1.0)
    # Ring under the contention model: 2(N-1) steps of M/N bytes on one link + 150 ns each
    M = 64 << 20
    assert ring["contention_us"][M] == pytest.approx(126 * (M / 64 / 16e9 + 150e-9) * 1e6)
    by_claim = {c["claim"]: c["holds"] for c in res["claims"]}
    assert by_claim["MultiTree beats 2D-Ring and Ring at 64 MiB on torus:8x8"]
    assert "## Dense all-reduce" in res["markdown"]
    b = {r["topology"]: r for r in res["bounds"]}
    assert b["fattree:16"]["bound"] == 15 and b["torus:4x4"]["ceil_N(N-1)/L"] == 4
    assert b["mesh:4x4"]["per_node"] == 8
