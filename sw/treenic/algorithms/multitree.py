"""MultiTree all-reduce (Huang et al., ISCA'21, §III, Algorithm 1; full citation in
docs/sparse-models.md).

One spanning tree per node (tree ``f`` is rooted at node ``f`` and owns chunk ``f``), built
top-down and concurrently. Every time step gets a fresh copy of the directed link graph;
trees take turns, each adding at most one node per turn over a link still free in this step;
when no tree can add a node, the next step starts. The all-gather schedule is what was built;
reduce-scatter is its reverse (Algorithm 1, lines 15–18)::

    all-gather edge (p → c) built at step t   ⇒   REDUCE c → p at step T − t + 1
                                                  GATHER p → c at step T + t

Tie-breaks the paper leaves open (documented choices):

* trees take turns in ascending root id (``priority="root"``, Algorithm 1); a tree that is
  complete, or that cannot add a node in the current step, is skipped until the next step.
  The paper notes that on asymmetric or irregular networks trees with more left to build can
  go first; ``priority="remaining"`` does that (turn order by nodes still to add, then root
  id, fixed per step). ``priority="auto"`` (default) uses ``root`` on rings, tori and meshes
  and ``remaining`` on switch-based and irregular networks, where it closes most of the gap
  to the lower bound (BiGraph 4x8: 39 → 32 all-gather steps, bound 31; ``make bench``);
* parent candidates ``p`` are the tree's nodes added in *earlier* steps, examined in the order
  they joined the tree (breadth-first, line 9);
* a parent's candidate children are its neighbours in port order: on tori and meshes the
  Y-dimension neighbours, then X (line 10), each dimension in ascending node id; elsewhere
  ascending id (``Topology.ports``);
* switch networks (§III-C3): from ``p`` a breadth-first search runs over switches only,
  through links still free in this step, starting at ``p``'s attached switches in port order;
  at each switch reached, its attached end nodes not yet in the tree are candidates in
  ascending id. The first one found becomes the child, and every link on the path from ``p``
  is consumed for the step (node→switch, switch→switch…, switch→node).

Variants (``build(topo, variant=...)``): ``"paper"`` is Algorithm 1 with exactly the
tie-breaks above (the 2x2 mesh reproduces Fig. 3); ``"bound"`` (default) uses the latitude
the paper leaves -- geometric child order on tori, cyclic child order on switch networks,
chain trees where nothing else ties Ring -- and reaches the link lower bound or one step
above it (torus 4x4: 5, bound 4; 8x8: 17; 16x16: 64; switch:N and fattree:N: N − 1; BiGraph:
N − 1); see :func:`build` and ``docs/performance.md``.

Speed: a parent candidate that fails once fails for the rest of the step (links are only
consumed and trees only grow within a step), so each tree keeps a cursor into its parent
list that only moves forward during a step; parents whose neighbours are all in the tree are
dropped for good. Torus 32x32 builds in seconds (see ``make bench``).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import deque

from ..schedule.ir import Op, Schedule, ScheduleError, Transfer

PRIORITIES = ("auto", "root", "remaining")
#: candidate-child orders: ``ports`` (Algorithm 1 as printed, topology port order),
#: ``geometric`` (tori/meshes: -Y, +Y, -X, +X), ``cyclic`` (switches: end nodes after the
#: parent's id, cyclically), ``reachable`` (switches: over all reachable end nodes, first in
#: cyclic order after the parent)
CHILD_ORDERS = ("ports", "geometric", "cyclic", "reachable")
VARIANTS = ("bound", "paper")
from ..topology import Topology, is_switch


class _Links:
    """Free capacity of every directed (u, v) pair in the current step."""

    def __init__(self, topo: Topology):
        g = topo.graph
        self.capacity = {(u, v): g.number_of_edges(u, v) for u, v in set(g.edges())}
        self.free = dict(self.capacity)

    def new_step(self):
        self.free = dict(self.capacity)

    def take(self, path):
        for u, v in zip(path, path[1:]):
            self.free[(u, v)] -= 1


def _find_child_switched(topo, p, in_tree, links, attached, cyclic=False, n=0):
    """§III-C3: breadth-first over switches from p through free links. ``cyclic``: at each
    switch, try its end nodes in cyclic order after ``p`` (p+1, p+2, ... mod n) instead of
    ascending id."""
    # direct end-node neighbours (mixed graphs) come first, as in the direct case
    for v in topo.neighbours(p):
        if not is_switch(v) and not in_tree[v] and links.free[(p, v)] > 0:
            return [p, v]
    start = [s for s in topo.neighbours(p) if is_switch(s) and links.free[(p, s)] > 0]
    parent = {s: p for s in start}
    queue = deque(start)
    while queue:
        s = queue.popleft()
        ends = attached[s]
        if cyclic:
            k = bisect_right(ends, p)
            ends = ends[k:] + ends[:k]
        for c in ends:
            if not in_tree[c] and links.free[(s, c)] > 0:
                return _path_back(parent, c, s, p)
        for s2 in topo.neighbours(s):
            if is_switch(s2) and s2 not in parent and links.free[(s, s2)] > 0:
                parent[s2] = s
                queue.append(s2)
    return None


def _find_child_reachable(topo, p, in_tree, links, attached, n):
    """Like :func:`_find_child_switched`, but over *every* end node reachable through free
    links, the first in cyclic order after ``p`` wins (its breadth-first path is used)."""
    for v in topo.neighbours(p):
        if not is_switch(v) and not in_tree[v] and links.free[(p, v)] > 0:
            return [p, v]
    start = [s for s in topo.neighbours(p) if is_switch(s) and links.free[(p, s)] > 0]
    parent = {s: p for s in start}
    queue = deque(start)
    best = None                                  # (cyclic rank, child, its switch)
    while queue:
        s = queue.popleft()
        for c in attached[s]:
            if not in_tree[c] and links.free[(s, c)] > 0:
                rank = (c - p - 1) % n
                if best is None or rank < best[0]:
                    best = (rank, c, s)
        for s2 in topo.neighbours(s):
            if is_switch(s2) and s2 not in parent and links.free[(s, s2)] > 0:
                parent[s2] = s
                queue.append(s2)
    return None if best is None else _path_back(parent, best[1], best[2], p)


def _path_back(parent, c, s, p):
    path = [c, s]
    while path[-1] != p:
        path.append(parent[path[-1]])
    return path[::-1]


def _turn_order(remaining, priority):
    if priority == "root":
        return range(len(remaining))
    return sorted(range(len(remaining)), key=lambda r: (-remaining[r], r))


def resolve_priority(topo: Topology, priority: str = "auto") -> str:
    """``auto``: Algorithm 1's root-id alternation on rings, tori and meshes; on switch-based
    and irregular networks the paper's suggested refinement (§III-C): trees with more nodes
    still to add take their turn first (ties by root id)."""
    if priority not in PRIORITIES:
        raise ScheduleError(f"multitree priority must be one of {PRIORITIES}, got {priority!r}")
    if priority != "auto":
        return priority
    return "root" if topo.kind in ("ring", "torus", "mesh") else "remaining"


def build_trees(topo: Topology, priority: str = "auto",
                children: str = "ports") -> tuple[list[list[tuple]], int]:
    """All-gather trees of Algorithm 1: per root, the allocations ``(path, step)`` in the
    order they were made (``path[0]`` the parent, ``path[-1]`` the child, switches between);
    and the total step count T. ``children`` is the candidate-child order (see
    :data:`CHILD_ORDERS`); ``"ports"`` is Algorithm 1 as printed."""
    priority = resolve_priority(topo, priority)
    if children not in CHILD_ORDERS:
        raise ScheduleError(f"multitree child order must be one of {CHILD_ORDERS}, "
                            f"got {children!r}")
    grower = (_DirectGrower(topo, children) if topo.is_direct
              else _SwitchedGrower(topo, children))
    n = topo.n
    remaining = [n - 1] * n
    t = 0
    while any(remaining):                      # lines 4–14: one time step per iteration
        t += 1
        grower.new_step(remaining)
        active = [r for r in _turn_order(remaining, priority) if remaining[r]]
        progress = False
        while active:                          # trees take turns, one node per turn
            still = []
            for r in active:
                if grower.grow(r, t):
                    remaining[r] -= 1
                    progress = True
                    if remaining[r]:
                        still.append(r)
            active = still
        if not progress:
            raise RuntimeError(f"MultiTree made no progress at step {t} on {topo.spec}")
    return grower.edges, t


def _geometric_neighbours(topo: Topology, v: int) -> list[int]:
    """Torus/mesh neighbours of ``v`` in geometric order -Y, +Y, -X, +X (wrap-around
    neighbours in their geometric slot)."""
    X, Y = topo.dims
    x, y = topo.coords(v)
    cand = [((y - 1) % Y) * X + x, ((y + 1) % Y) * X + x,
            y * X + (x - 1) % X, y * X + (x + 1) % X]
    linked = set(topo.neighbours(v))
    out = []
    for u in cand:
        if u != v and u in linked and u not in out:
            out.append(u)
    return out + [u for u in topo.neighbours(v) if u not in out]


class _DirectGrower:
    """Tree growth over one-hop links (tori, meshes, rings, direct graphs)."""

    def __init__(self, topo: Topology, children: str = "ports"):
        n = topo.n
        geometric = children == "geometric" and topo.dims is not None
        self.nbr = nbr = [_geometric_neighbours(topo, v) if geometric else topo.neighbours(v)
                          for v in range(n)]
        # capacity per (node, neighbour slot); parallel links give capacity > 1
        self.cap = [[topo.graph.number_of_edges(v, u) for u in nbr[v]] for v in range(n)]
        self.in_tree = [bytearray(n) for _ in range(n)]
        # outside[r][p]: p's neighbours not yet in tree r (0: p can never gain a child)
        self.outside = [[len(nbr[p]) for p in range(n)] for _ in range(n)]
        self.members = [[r] for r in range(n)]   # join order: breadth-first (line 9)
        self.edges: list[list[tuple]] = [[] for _ in range(n)]
        self.eligible = [[] for _ in range(n)]
        for r in range(n):
            self.in_tree[r][r] = 1
            for u in nbr[r]:
                self.outside[r][u] -= 1

    def new_step(self, remaining):
        self.free = [list(c) for c in self.cap]
        self.cursor = [0] * len(remaining)
        for r, left in enumerate(remaining):
            if left:     # parents: members from earlier steps that still have an outside neighbour
                out_r = self.outside[r]
                self.members[r] = [p for p in self.members[r] if out_r[p]]
                self.eligible[r] = list(self.members[r])

    def grow(self, r, t) -> bool:
        cand, tin, out_r, nbr, free = (self.eligible[r], self.in_tree[r], self.outside[r],
                                       self.nbr, self.free)
        i = self.cursor[r]
        while i < len(cand):
            p = cand[i]
            if out_r[p]:
                fp = free[p]
                for j, c in enumerate(nbr[p]):
                    if fp[j] and not tin[c]:
                        fp[j] -= 1
                        self.cursor[r] = i
                        tin[c] = 1
                        for u in nbr[c]:
                            out_r[u] -= 1
                        self.members[r].append(c)
                        self.edges[r].append(((p, c), t))
                        return True
            i += 1
        self.cursor[r] = i
        return False


class _SwitchedGrower:
    """Tree growth through switches (§III-C3)."""

    def __init__(self, topo: Topology, children: str = "ports"):
        n = topo.n
        self.topo = topo
        self.children = children
        self.attached = {s: sorted(v for v in topo.neighbours(s) if not is_switch(v))
                         for s in topo.switches}
        self.links = _Links(topo)
        self.in_tree = [[r == v for v in range(n)] for r in range(n)]
        self.members = [[r] for r in range(n)]
        self.edges: list[list[tuple]] = [[] for _ in range(n)]

    def new_step(self, remaining):
        self.links.new_step()
        self.cursor = [0] * len(remaining)
        self.eligible = [list(m) if left else [] for m, left in zip(self.members, remaining)]

    def grow(self, r, t) -> bool:
        cand, tree_in = self.eligible[r], self.in_tree[r]
        while self.cursor[r] < len(cand):
            p = cand[self.cursor[r]]
            if self.children == "reachable":
                found = _find_child_reachable(self.topo, p, tree_in, self.links,
                                              self.attached, len(tree_in))
            else:
                found = _find_child_switched(self.topo, p, tree_in, self.links, self.attached,
                                             self.children == "cyclic", len(tree_in))
            if found:
                self.links.take(found)
                tree_in[found[-1]] = True
                self.members[r].append(found[-1])
                self.edges[r].append((tuple(found), t))
                return True
            self.cursor[r] += 1
        return False


def chain_trees(topo: Topology) -> tuple[list[list[tuple]], int] | None:
    """One path-shaped tree per root along the ring order (:func:`ring.ring_order`): tree
    rooted at position ``i`` adds position ``i+t`` from ``i+t-1`` at step ``t``. Every step
    uses each hop of the ring once, so the trees are conflict-free iff the N hop routes
    together fit the links; None when they do not (or a direct network's hop is not one
    link). N − 1 steps: the lower bound where every end node has a single link."""
    from .ring import ring_order
    order = ring_order(topo)
    n = len(order)
    hops = [tuple(topo.route(order[k], order[(k + 1) % n])) for k in range(n)]
    if topo.is_direct and any(len(h) != 2 for h in hops):
        return None
    load: dict = {}
    for h in hops:
        for u, v in zip(h, h[1:]):
            load[(u, v)] = load.get((u, v), 0) + 1
    if any(k > topo.graph.number_of_edges(u, v) for (u, v), k in load.items()):
        return None
    edges = [[(hops[(i + t - 1) % n], t) for t in range(1, n)] for i in range(n)]
    return [edges[order.index(r)] for r in range(n)], n - 1


def _link_bound(topo: Topology) -> int:
    """All-gather lower bound: N(N-1) chunk deliveries over the end nodes' outgoing links."""
    links = sum(1 for u, _ in topo.graph.edges() if not is_switch(u))
    return -(-topo.n * (topo.n - 1) // links)


def construct(topo: Topology, priority: str = "auto", variant: str = "bound"):
    """(all-gather trees, steps, how) for a variant (see :func:`build`)."""
    if variant not in VARIANTS:
        raise ScheduleError(f"multitree variant must be one of {VARIANTS}, got {variant!r}")
    pri = resolve_priority(topo, priority)
    if variant == "paper":
        edges, steps = build_trees(topo, pri, "ports")
        return edges, steps, f"algorithm1/{pri}/ports"
    rules = [(pri, "geometric")] if topo.is_direct else [(pri, "reachable"), (pri, "cyclic")]
    bound, best = _link_bound(topo), None
    for p, children in rules:
        edges, steps = build_trees(topo, p, children)
        if best is None or steps < best[1]:
            best = (edges, steps, f"algorithm1/{p}/{children}")
        if steps <= bound:
            return best
    if best[1] > topo.n - 1:                  # more steps than Ring: chain trees tie it
        chain = chain_trees(topo)
        if chain is not None:
            best = (*chain, "chain")
    return best


def build(topo: Topology, priority: str = "auto", variant: str = "bound") -> Schedule:
    """MultiTree schedule. ``variant="paper"``: Algorithm 1 with the tie-breaks documented
    above (children in port order). ``variant="bound"`` (default): the same Algorithm 1
    with the latitude the paper leaves used to approach the link lower bound --

    * direct tori/meshes: children in geometric order -Y, +Y, -X, +X (the wrap-around
      neighbour in its geometric slot; meshes and the Fig. 3 trees are unchanged);
    * switch networks: the child is the first end node in cyclic order after the parent
      among all reachable through free links (``reachable``), else the first at the
      nearest switch in cyclic order (``cyclic``), whichever gives fewer steps;
    * if no rule beats Ring's N − 1 steps (BiGraph), chain trees along the ring order
      (:func:`chain_trees`) -- conflict-free, N − 1 steps, the bound on networks whose end
      nodes have one link each.

    ``meta["construction"]`` says which rule built the trees."""
    edges, total, how = construct(topo, priority, variant)
    direct = topo.is_direct
    transfers = []
    for root, tree in enumerate(edges):
        for path, t in tree:
            p, c = path[0], path[-1]
            fwd = None if direct else tuple(path)
            back = None if direct else tuple(reversed(path))
            transfers.append(Transfer(total - t + 1, c, p, Op.REDUCE, (root,), root, back))
            transfers.append(Transfer(total + t, p, c, Op.GATHER, (root,), root, fwd))
    return Schedule("multitree", topo, num_chunks=topo.n, transfers=transfers,
                    reduce_steps=total, gather_steps=total,
                    meta={"trees": "one per root; flow f = chunk f = tree rooted at node f",
                          "priority": resolve_priority(topo, priority), "variant": variant,
                          "construction": how, "link_bound": _link_bound(topo)})
