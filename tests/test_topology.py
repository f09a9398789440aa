import json

import networkx as nx
import pytest

from treenic import topology as T


@pytest.mark.parametrize("spec,n,switches", [
    ("ring:8", 8, 0), ("torus:4x4", 16, 0), ("torus:4x8", 32, 0), ("mesh:8x8", 64, 0),
    ("mesh:2x2", 4, 0), ("fattree:16", 16, 8), ("fattree:64", 64, 16), ("bigraph:4x8", 32, 4),
    ("switch:8", 8, 1), ("dgx2", 16, 12),
])
def test_specs(spec, n, switches):
    t = T.parse(spec)
    assert t.n == n and len(t.switches) == switches
    assert t.nodes == list(range(n))
    assert nx.is_strongly_connected(t.graph)


def test_torus_degree_and_wrap():
    t = T.parse("torus:4x8")
    assert all(len(t.neighbours(v)) == 4 for v in t.nodes)
    m = T.parse("mesh:4x8")
    assert sorted(len(m.neighbours(v)) for v in m.nodes)[:4] == [2, 2, 2, 2]
    # node id = y*X + x: node 5 on a 4-wide torus is (1, 1)
    assert t.coords(5) == (1, 1)


def test_y_then_x_port_order():
    t = T.parse("torus:4x4")
    # node 5 = (1,1): Y neighbours 1 and 9, then X neighbours 4 and 6
    assert [p.peer for p in t.ports(5)] == [1, 9, 4, 6]
    m = T.parse("mesh:2x2")
    assert [p.peer for p in m.ports(0)] == [2, 1]


def test_switches_distinct_from_nodes():
    t = T.parse("fattree:16")
    assert all(T.is_switch(v) for v in t.neighbours(0))
    assert t.hops(0, 1) == 2 and t.hops(0, 15) == 4


def test_bigraph_non_blocking():
    t = T.parse("bigraph:4x8")
    assert t.graph.number_of_edges(("sw", 0), ("sw", 2)) == 4


@pytest.mark.parametrize("bad", ["torus:4", "ring:x", "ring:1", "mesh:1x1", "hypercube:3",
                                 "torus:4x4x4", "", "fattree:10:4", "bigraph:3x4", "dgx2:3"])
def test_bad_specs(bad):
    with pytest.raises(T.TopologyError):
        T.parse(bad)


def test_graph_files(tmp_path):
    f = tmp_path / "g.edgelist"
    f.write_text("0 1\n1 2\n2 0\n")
    assert T.parse(str(f)).n == 3
    j = tmp_path / "g.json"
    g = nx.cycle_graph(5)
    g.add_node("s", switch=True)
    g.add_edge("s", 0)
    j.write_text(json.dumps(nx.node_link_data(g, edges="links")))
    t = T.parse(f"file:{j}")
    assert t.n == 5 and len(t.switches) == 1
    (tmp_path / "d.edgelist").write_text("0 1\n2 3\n")
    with pytest.raises(T.TopologyError, match="disconnected"):
        T.parse(str(tmp_path / "d.edgelist"))
    with pytest.raises(T.TopologyError, match="not found"):
        T.parse(str(tmp_path / "missing.json"))


def test_heterogeneous_parallel_links():
    g = nx.MultiGraph()
    g.add_edge(0, 1, bandwidth=16e9)
    g.add_edge(0, 1, bandwidth=8e9)
    g.add_edge(1, 2)
    t = T.from_graph(g)
    assert len(t.ports(0)) == 2 and t.graph.number_of_edges(0, 1) == 2
