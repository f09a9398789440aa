"""MultiTree (Algorithm 1) against the paper's worked example and its promised properties."""
import numpy as np
import pytest

from treenic import topology as T
from treenic.algorithms import build
from treenic.algorithms.multitree import build_trees
from treenic.schedule import check
from treenic.schedule.execute import run_and_check
from treenic.schedule.ir import Op
from treenic.schedule.table import node_entries


def test_fig3_trees_2x2_mesh():
    """Fig. 3c–e: allocation order, levels and the 2-step schedule of the 2x2 mesh."""
    edges, steps = build_trees(T.parse("mesh:2x2"))
    assert steps == 2
    as_edges = [[(path[0], path[-1], t) for path, t in tree] for tree in edges]
    assert as_edges == [
        [(0, 2, 1), (0, 1, 1), (2, 3, 2)],
        [(1, 3, 1), (1, 0, 1), (3, 2, 2)],
        [(2, 0, 1), (2, 3, 1), (0, 1, 2)],
        [(3, 1, 1), (3, 2, 1), (1, 0, 2)],   # sequence 7 (0-based): 3 -> 2 closes step 1
    ]


def test_fig5_table_accelerator0():
    s = build("multitree", "mesh:2x2")
    got = [(e.op.name, e.flow, e.parent, sorted(e.children), e.step) for e in node_entries(s, 0)]
    assert got == [
        ("REDUCE", 3, 1, [], 1),       # leaf of tree 3: first to send
        ("REDUCE", 0, None, [1, 2], 2),
        ("REDUCE", 1, 1, [], 2),
        ("REDUCE", 2, 2, [1], 2),      # waits for child 1's contribution in tree 2
        ("GATHER", 0, None, [1, 2], 3),
        ("GATHER", 1, 1, [], 3),
        ("GATHER", 2, 2, [1], 4),
        ("GATHER", 3, 1, [], 4),
    ]


@pytest.mark.parametrize("spec", ["mesh:2x2", "torus:4x4", "mesh:4x4", "torus:4x8", "mesh:3x5",
                                  "ring:7", "torus:8x8"])
def test_direct_networks_contention_free_and_exact(spec):
    s = build("multitree", spec)
    summary = check.check_all(s)
    assert summary["link_conflicts"] == 0
    # every transfer uses exactly one physical link
    assert all(s.topology.hops(t.src, t.dst) == 1 for t in s.transfers)
    rng = np.random.default_rng(1)
    rep = run_and_check(s, rng.standard_normal((s.n, 777)).astype(np.float32))
    assert rep.bit_exact and rep.all_nodes_equal


@pytest.mark.parametrize("spec", ["fattree:16", "bigraph:4x8", "switch:8", "dgx2"])
def test_switch_networks(spec):
    s = build("multitree", spec)
    assert check.check_all(s)["link_conflicts"] == 0
    assert all(t.route is not None and T.is_switch(t.route[1]) for t in s.transfers)
    rep = run_and_check(s, np.ones((s.n, 100), np.float32))
    assert rep.bit_exact and np.all(rep.result == s.n)


def test_two_n_entries_per_node_2x2():
    s = build("multitree", "mesh:2x2")
    for v in range(s.n):
        assert len([e for e in node_entries(s, v) if e.op != Op.NOP]) == 2 * s.n


@pytest.mark.parametrize("spec", ["torus:4x4", "fattree:16", "mesh:4x4"])
def test_one_reduce_and_one_gather_per_send_step(spec):
    """2N entries, plus one GATHER entry for every extra step at which a node serves
    children of the same tree (sending early would break contention-freedom)."""
    s = build("multitree", spec)
    for v in range(s.n):
        ents = [e for e in node_entries(s, v) if e.op != Op.NOP]
        red = [e.flow for e in ents if e.op == Op.REDUCE]
        assert sorted(red) == list(range(s.n))
        send_steps = {}
        for t in s.transfers:
            if t.op == Op.GATHER and t.src == v:
                send_steps.setdefault(t.flow, set()).add(t.step)
        expect = sum(max(1, len(send_steps.get(f, ()))) for f in range(s.n))
        assert len([e for e in ents if e.op == Op.GATHER]) == expect


def _bound(s):
    links = sum(1 for u, _ in s.topology.graph.edges() if not T.is_switch(u))
    return -(-s.n * (s.n - 1) // links)


def test_all_gather_steps_near_lower_bound():
    for spec, slack in [("torus:4x4", 1), ("torus:8x8", 1), ("torus:4x8", 1),
                        ("fattree:16", 0), ("switch:8", 0), ("switch:6", 0)]:
        s = build("multitree", spec)
        assert s.meta["link_bound"] == _bound(s)
        assert _bound(s) <= s.gather_steps <= _bound(s) + slack, spec


@pytest.mark.parametrize("spec,paper,improved", [("torus:4x4", 6, 5), ("torus:8x8", 18, 17),
                                                 ("torus:8x4", 11, 9), ("switch:6", 6, 5),
                                                 ("fattree:12", 12, 11), ("mesh:4x4", 8, 8)])
def test_paper_variant_kept_and_improved_variant_default(spec, paper, improved):
    p = build("multitree", spec, variant="paper")
    b = build("multitree", spec)
    assert (p.gather_steps, b.gather_steps) == (paper, improved)
    assert (p.meta["variant"], b.meta["variant"]) == ("paper", "bound")
    for s in (p, b):
        assert check.check_all(s)["link_conflicts"] == 0


def test_fig3_unchanged_by_improved_variant():
    for variant in ("paper", "bound"):
        s = build("multitree", "mesh:2x2", variant=variant)
        assert s.gather_steps == 2
    assert build("multitree", "mesh:2x2").transfers == \
        build("multitree", "mesh:2x2", variant="paper").transfers


@pytest.mark.parametrize("spec", ["switch:3", "switch:5", "switch:7", "switch:12", "fattree:6",
                                  "fattree:9", "fattree:20", "bigraph:4x8", "bigraph:8x4",
                                  "bigraph:6x3", "bigraph:4x4", "dgx2", "ring:9"])
def test_never_more_steps_than_ring_and_exact(spec):
    s = build("multitree", spec)
    ring = build("ring", spec)
    assert s.gather_steps <= ring.gather_steps
    assert check.check_all(s)["link_conflicts"] == 0
    rep = run_and_check(s, np.random.default_rng(3).standard_normal((s.n, 97)).astype(np.float32))
    assert rep.bit_exact and rep.all_nodes_equal


@pytest.mark.slow
def test_never_more_steps_than_ring_every_switch_and_fattree_size():
    """switch:N and fattree:N for every N in 3..64 (~30 s)."""
    for kind in ("switch", "fattree"):
        for n in range(3, 65):
            s = build("multitree", f"{kind}:{n}")
            assert s.gather_steps <= n - 1, s.topology.spec


def test_chain_trees_on_bigraph_are_conflict_free_paths():
    s = build("multitree", "bigraph:4x8")
    assert s.meta["construction"] == "chain" and s.gather_steps == 31 == _bound(s)
    assert check.check_all(s)["link_conflicts"] == 0


def test_reduce_scatter_is_reversed_all_gather():
    s = build("multitree", "torus:4x4")
    total = s.reduce_steps
    red = {(t.flow, t.dst, t.src, total - t.step + 1) for t in s.transfers if t.op == Op.REDUCE}
    gat = {(t.flow, t.src, t.dst, t.step - total) for t in s.transfers if t.op == Op.GATHER}
    assert red == gat


def test_priority_auto_helps_switch_networks_and_keeps_algorithm1_on_tori():
    assert build("multitree", "torus:4x4").meta["priority"] == "root"
    auto = build("multitree", "bigraph:4x8", variant="paper")
    plain = build("multitree", "bigraph:4x8", priority="root", variant="paper")
    assert auto.meta["priority"] == "remaining"
    assert auto.gather_steps < plain.gather_steps and auto.gather_steps <= 33   # bound 31
    assert check.check_all(auto)["link_conflicts"] == 0


def test_bad_options_rejected():
    from treenic.schedule.ir import ScheduleError
    with pytest.raises(ScheduleError, match="priority"):
        build("multitree", "ring:4", priority="tallest")
    with pytest.raises(ScheduleError, match="variant"):
        build("multitree", "ring:4", variant="fastest")
    with pytest.raises(ScheduleError, match="unsupported option"):
        build("ring", "ring:4", bogus=1)
