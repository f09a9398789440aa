"""Network topologies as networkx graphs.

Every topology is a :class:`networkx.MultiDiGraph` whose *end nodes* (accelerators, each with
one NIC) are the integers ``0..N-1`` and whose switches are tuples ``("sw", k)``. Each physical
link is a pair of directed edges carrying ``bandwidth`` (bytes/s) and ``latency`` (s); parallel
links between the same pair are separate edges of the multigraph (heterogeneous links).

Direct networks (ring, torus, mesh, graph files without switches) connect end nodes to end
nodes. Switch-based networks (fat-tree, BiGraph, single switch, DGX-2-like) keep switches
distinct: end nodes attach to leaf switches only.

Text specs (docs/architecture.md §3)::

    ring:8  torus:4x4  mesh:8x8  torus:4x8  fattree:16  fattree:64:8  bigraph:4x8
    switch:8  dgx2  file:PATH (networkx node-link JSON, GraphML or edge list)

``torus:XxY``/``mesh:XxY``: X columns by Y rows, node id ``y*X + x``.

Port numbering (what the NIC schedule table stores): a node's ports are its outgoing links
in canonical neighbour order. For tori and meshes that order is Y-dimension neighbours then
X-dimension neighbours (MultiTree §III-C, line 10), each dimension in ascending node id;
elsewhere ascending neighbour id (switches after end nodes), parallel links by key.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import networkx as nx

#: Defaults from the MultiTree paper, Table III: 16 GB/s links, 150 ns link latency.
DEFAULT_BANDWIDTH = 16e9
DEFAULT_LATENCY = 150e-9


class TopologyError(ValueError):
    """A topology spec or graph that cannot be used (malformed, disconnected, too small)."""


def is_switch(v) -> bool:
    return isinstance(v, tuple) and len(v) == 2 and v[0] == "sw"


@dataclass(frozen=True)
class Port:
    """One outgoing link of an end node: local port number, the peer at the other end."""
    index: int
    peer: object            # end node id or ("sw", k)
    key: int                # multigraph edge key (parallel links)
    bandwidth: float
    latency: float


@dataclass
class Topology:
    spec: str
    kind: str
    graph: nx.MultiDiGraph
    dims: tuple[int, int] | None = None    # (X, Y) for tori and meshes
    meta: dict = field(default_factory=dict)

    # ---- basic facts -------------------------------------------------------------------
    @cached_property
    def nodes(self) -> list[int]:
        return sorted(v for v in self.graph.nodes if not is_switch(v))

    @property
    def n(self) -> int:
        return len(self.nodes)

    @cached_property
    def switches(self) -> list[tuple]:
        return sorted(v for v in self.graph.nodes if is_switch(v))

    @property
    def is_direct(self) -> bool:
        return not self.switches

    def coords(self, v: int) -> tuple[int, int]:
        """(x, y) of an end node of a torus or mesh."""
        if self.dims is None:
            raise TopologyError(f"{self.spec} has no coordinates")
        X, _ = self.dims
        return v % X, v // X

    # ---- neighbour order and ports -----------------------------------------------------
    def _neighbour_sort_key(self, u, v):
        if self.dims is not None and not is_switch(v):
            (ux, uy), (vx, vy) = self.coords(u), self.coords(v)
            dim = 0 if ux == vx else 1       # 0: Y-dimension neighbour, 1: X-dimension
            return (0, dim, v)
        return (1, 0, v) if is_switch(v) else (0, 0, v)

    def ports(self, u) -> list[Port]:
        """Outgoing links of ``u`` in canonical order; ``Port.index`` is the local port number."""
        return self._ports[u]

    @cached_property
    def _ports(self) -> dict:
        out = {}
        for u in self.graph.nodes:
            edges = sorted(self.graph.out_edges(u, keys=True, data=True),
                           key=lambda e: (self._neighbour_sort_key(u, e[1]), e[2]))
            out[u] = [Port(i, v, k, d["bandwidth"], d["latency"])
                      for i, (_, v, k, d) in enumerate(edges)]
        return out

    def neighbours(self, u) -> list:
        """Distinct neighbours (end nodes or switches) of ``u`` in canonical order."""
        seen, out = set(), []
        for p in self.ports(u):
            if p.peer not in seen:
                seen.add(p.peer)
                out.append(p.peer)
        return out

    def port_to(self, u, v) -> int | None:
        """Local port number of ``u``'s first link to ``v``; None when not adjacent."""
        for p in self.ports(u):
            if p.peer == v:
                return p.index
        return None

    def max_ports(self) -> int:
        """Most links any end node has: the port count of this topology's NICs."""
        return max(len(self.ports(v)) for v in self.nodes)

    # ---- routing -----------------------------------------------------------------------
    def route(self, src: int, dst: int) -> list:
        """Deterministic shortest path src..dst (by hop count; ties: lowest node ids)."""
        return self._routes(src)[dst]

    def _routes(self, src):
        cache = self.__dict__.setdefault("_route_cache", {})
        if src not in cache:
            # BFS in canonical neighbour order gives a deterministic shortest-path tree.
            parent = {src: None}
            frontier = [src]
            while frontier:
                nxt = []
                for u in frontier:
                    for v in self.neighbours(u):
                        if v not in parent:
                            parent[v] = u
                            nxt.append(v)
                frontier = nxt
            paths = {}
            for v in parent:
                path, w = [], v
                while w is not None:
                    path.append(w)
                    w = parent[w]
                paths[v] = path[::-1]
            cache[src] = paths
        return cache[src]

    def hops(self, src: int, dst: int) -> int:
        return len(self.route(src, dst)) - 1

    def link(self, u, v) -> dict:
        """Attributes of the first (u→v) link."""
        data = self.graph.get_edge_data(u, v)
        if not data:
            raise TopologyError(f"no link {u}->{v} in {self.spec}")
        return data[min(data)]

    def directed_links(self) -> list[tuple]:
        return sorted(((u, v, k) for u, v, k in self.graph.edges(keys=True)), key=repr)

    def describe(self) -> str:
        sw = f", {len(self.switches)} switches" if self.switches else ""
        return f"{self.spec}: {self.n} nodes{sw}, {self.graph.number_of_edges()} directed links"


# ---- constructors ----------------------------------------------------------------------

def _new_graph():
    return nx.MultiDiGraph()


def _link(g, u, v, bandwidth=DEFAULT_BANDWIDTH, latency=DEFAULT_LATENCY):
    """A bidirectional physical link = two directed edges."""
    g.add_edge(u, v, bandwidth=bandwidth, latency=latency)
    g.add_edge(v, u, bandwidth=bandwidth, latency=latency)


def ring(n: int) -> Topology:
    _require(n >= 2, f"ring needs at least 2 nodes, got {n}")
    g = _new_graph()
    g.add_nodes_from(range(n))
    for i in range(n if n > 2 else 1):
        _link(g, i, (i + 1) % n)
    return _finish(Topology(f"ring:{n}", "ring", g))


def torus(x: int, y: int, wrap: bool = True) -> Topology:
    kind = "torus" if wrap else "mesh"
    _require(x >= 1 and y >= 1 and x * y >= 2, f"{kind} needs at least 2 nodes, got {x}x{y}")
    g = _new_graph()
    g.add_nodes_from(range(x * y))
    for j in range(y):
        for i in range(x):
            v = j * x + i
            if i + 1 < x:
                _link(g, v, j * x + i + 1)
            elif wrap and x > 2:
                _link(g, v, j * x)
            if j + 1 < y:
                _link(g, v, (j + 1) * x + i)
            elif wrap and y > 2:
                _link(g, v, i)
    return _finish(Topology(f"{kind}:{x}x{y}", kind, g, dims=(x, y)))


def mesh(x: int, y: int) -> Topology:
    return torus(x, y, wrap=False)


def single_switch(n: int) -> Topology:
    _require(n >= 2, f"switch needs at least 2 nodes, got {n}")
    g = _new_graph()
    g.add_nodes_from(range(n))
    for i in range(n):
        _link(g, i, ("sw", 0))
    return _finish(Topology(f"switch:{n}", "switch", g))


def fat_tree(n: int, radix: int | None = None) -> Topology:
    """2-level fat-tree: n/radix leaf switches of ``radix`` nodes, ``radix`` spines, every
    leaf linked once to every spine (full bisection)."""
    _require(n >= 2, f"fattree needs at least 2 nodes, got {n}")
    if radix is None:
        radix = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        radix = n // radix if radix == 1 else radix
    _require(n % radix == 0, f"fattree:{n}: {n} nodes do not split into leaves of {radix}")
    leaves = n // radix
    g = _new_graph()
    g.add_nodes_from(range(n))
    for v in range(n):
        _link(g, v, ("sw", v // radix))
    if leaves > 1:
        for leaf in range(leaves):
            for s in range(radix):
                _link(g, ("sw", leaf), ("sw", leaves + s))
    return _finish(Topology(f"fattree:{n}:{radix}", "fattree", g, meta={"radix": radix}))


def bigraph(switches: int, per_switch: int) -> Topology:
    """EFLOPS BiGraph: ``switches`` switches in two layers (upper half, lower half), every
    upper switch linked to every lower switch, ``per_switch`` nodes on each switch. Like
    EFLOPS' switches (as many up-ports as down-ports) the core is non-blocking: each
    upper–lower pair gets ``ceil(per_switch / (switches/2))`` parallel links."""
    _require(switches >= 2 and switches % 2 == 0,
             f"bigraph needs an even switch count >= 2, got {switches}")
    _require(per_switch >= 1, f"bigraph needs >= 1 node per switch, got {per_switch}")
    g = _new_graph()
    n = switches * per_switch
    g.add_nodes_from(range(n))
    for v in range(n):
        _link(g, v, ("sw", v // per_switch))
    half = switches // 2
    parallel = -(-per_switch // half)
    for up in range(half):
        for lo in range(half, switches):
            for _ in range(parallel):
                _link(g, ("sw", up), ("sw", lo))
    return _finish(Topology(f"bigraph:{switches}x{per_switch}", "bigraph", g,
                            meta={"upper": list(range(half)), "per_switch": per_switch,
                                  "parallel_links": parallel}))


def dgx2() -> Topology:
    """DGX-2-like: 16 GPUs on two baseboards of 8; each board has 6 NVSwitches, every GPU links
    to all 6 switches of its board, switch i of board 0 links to switch i of board 1."""
    g = _new_graph()
    g.add_nodes_from(range(16))
    for v in range(16):
        board = v // 8
        for s in range(6):
            _link(g, v, ("sw", board * 6 + s))
    for s in range(6):
        _link(g, ("sw", s), ("sw", 6 + s))
    return _finish(Topology("dgx2", "dgx2", g))


def from_graph(graph: nx.Graph, spec: str = "graph") -> Topology:
    """Any networkx graph. End nodes are the non-switch vertices; they are relabelled
    0..N-1 in sorted order (of their repr when not all ints). Switches are vertices with
    attribute ``switch=True`` or labelled ``("sw", k)``. Edge attributes ``bandwidth`` and
    ``latency`` are kept (defaults from the paper); an undirected graph becomes a bidirectional
    multigraph, a multigraph keeps its parallel links."""
    if graph.number_of_nodes() == 0:
        raise TopologyError(f"{spec}: empty graph")
    sw = [v for v, d in graph.nodes(data=True) if d.get("switch") or is_switch(v)]
    ends = [v for v in graph.nodes if v not in set(sw)]
    key = (lambda v: v) if all(isinstance(v, int) for v in ends) else repr
    mapping = {v: i for i, v in enumerate(sorted(ends, key=key))}
    mapping.update({v: ("sw", i) for i, v in enumerate(sorted(sw, key=repr))})
    g = _new_graph()
    g.add_nodes_from(mapping.values())
    directed = graph.is_directed()
    for u, v, d in graph.edges(data=True):
        if u == v:
            raise TopologyError(f"{spec}: self-loop on {u!r}")
        bw = float(d.get("bandwidth", DEFAULT_BANDWIDTH))
        lat = float(d.get("latency", DEFAULT_LATENCY))
        if bw <= 0 or lat < 0:
            raise TopologyError(f"{spec}: link {u!r}-{v!r} has bandwidth {bw} / latency {lat}")
        if directed:
            g.add_edge(mapping[u], mapping[v], bandwidth=bw, latency=lat)
        else:
            _link(g, mapping[u], mapping[v], bw, lat)
    return _finish(Topology(spec, "graph", g))


def load_graph_file(path: str | Path) -> Topology:
    p = Path(path)
    if not p.is_file():
        raise TopologyError(f"graph file not found: {p}")
    try:
        if p.suffix == ".json":
            data = json.loads(p.read_text())
            graph = nx.node_link_graph(data, edges="links") if "links" in data else nx.node_link_graph(data)
        elif p.suffix == ".graphml":
            graph = nx.read_graphml(p)
        else:
            graph = nx.read_edgelist(p, nodetype=_int_or_str, data=(("bandwidth", float), ("latency", float))) \
                if _edgelist_has_data(p) else nx.read_edgelist(p, nodetype=_int_or_str)
    except (ValueError, KeyError, TypeError, nx.NetworkXError, json.JSONDecodeError) as e:
        raise TopologyError(f"cannot read graph file {p}: {e}") from None
    return from_graph(graph, spec=f"file:{p}")


def _int_or_str(s: str):
    try:
        return int(s)
    except ValueError:
        return s


def _edgelist_has_data(p: Path) -> bool:
    for line in p.read_text().splitlines():
        line = line.split("#")[0].split()
        if line:
            return len(line) >= 4
    return False


_SPEC = re.compile(r"^(?P<kind>[a-z0-9]+)(?::(?P<args>.+))?$")


def parse(spec: str) -> Topology:
    """Build a topology from its text spec (see module docstring); raises TopologyError."""
    if isinstance(spec, Topology):
        return spec
    spec = str(spec).strip()
    if spec.startswith("file:") or Path(spec).suffix in (".json", ".graphml", ".edgelist", ".txt"):
        return load_graph_file(spec.removeprefix("file:"))
    m = _SPEC.match(spec)
    if not m:
        raise TopologyError(f"malformed topology spec {spec!r}; expected e.g. torus:4x4, ring:8")
    kind, args = m["kind"], m["args"]

    def ints(sep, count):
        parts = (args or "").split(sep)
        if len(parts) not in count or not all(p.isdigit() for p in parts):
            raise TopologyError(f"malformed topology spec {spec!r}")
        return [int(p) for p in parts]

    if kind == "ring":
        (n,) = ints(":", (1,))
        return ring(n)
    if kind in ("torus", "mesh"):
        x, y = ints("x", (2,))
        return torus(x, y, wrap=(kind == "torus"))
    if kind == "switch":
        (n,) = ints(":", (1,))
        return single_switch(n)
    if kind == "fattree":
        vals = ints(":", (1, 2))
        return fat_tree(*vals)
    if kind == "bigraph":
        s, k = ints("x", (2,))
        return bigraph(s, k)
    if kind == "dgx2":
        if args:
            raise TopologyError(f"dgx2 takes no arguments: {spec!r}")
        return dgx2()
    raise TopologyError(f"unknown topology kind {kind!r} in {spec!r}; known: ring, torus, mesh, "
                        "fattree, bigraph, switch, dgx2, file:PATH")


def _require(cond, msg):
    if not cond:
        raise TopologyError(msg)


def _finish(t: Topology) -> Topology:
    g = t.graph
    if t.n < 2:
        raise TopologyError(f"{t.spec}: needs at least 2 end nodes, has {t.n}")
    if not nx.is_strongly_connected(g):
        raise TopologyError(f"{t.spec}: topology is disconnected")
    for v in t.switches:
        if not any(not is_switch(u) for u in nx.descendants(g, v)):
            raise TopologyError(f"{t.spec}: switch {v} reaches no end node")
    return t
