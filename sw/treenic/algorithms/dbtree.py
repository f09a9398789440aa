"""Double binary tree all-reduce (Sanders et al. 2009; NCCL 2.4; MultiTree paper §II-C, Fig. 4b).

Trees — NCCL's construction (``src/graph/trees.cc``: ``ncclGetBtree`` / ``ncclGetDtree``),
on ranks = node ids:

* tree 0 is NCCL's bit-pattern binary tree rooted at rank 0. For rank ``r > 0`` let ``b`` be
  its lowest set bit: parent ``(r ^ b) | (b << 1)``, or ``r ^ b`` when that is ``>= N``;
  children ``r - b/2`` and ``r + b/2`` (the latter shrunk by halving ``b/2`` until it is
  ``< N``; none when ``b == 1``). Rank 0 has the single child ``P/2`` (P = smallest power of
  two ``>= N``). Odd ranks are the leaves, even ranks interior;
* tree 1 for **even N** is the mirror: rank ``r`` plays tree-0 rank ``N-1-r`` — every leaf
  of tree 0 (odd) is interior in tree 1 and vice versa;
* tree 1 for **odd N** is the shift: rank ``r`` plays tree-0 rank ``(r-1) mod N``. Then rank
  0 is the only node interior in both trees (NCCL's documented behaviour for odd counts).

Data: two chunks (``num_chunks = 2·pipeline``); tree ``f`` reduces and broadcasts the
chunks of half ``f`` (``flow = f``). Steps: a node of depth ``d`` in a tree of height ``H``
sends its partial to its parent at tree-local reduce step ``H - d + 1 + j`` for pipeline
sub-chunk ``j`` (0-based; steps 1-based, leaves first), and receives the broadcast at
tree-local gather step ``d + j``
(level-synchronous: both children of a node send in the same step). Tree-local step ``k``
runs in global step ``2k - 1`` for tree 0 and ``2k`` for tree 1 — the even/odd alternation of
the paper's Fig. 4b, so no node sends or receives in both trees in the same step. Hence
``reduce_steps = max(2(H0+P-1) - 1, 2(H1+P-1))`` and the same for the all-gather (broadcast)
phase, ``P = pipeline``.

``pipeline = 1`` (the default, what :func:`treenic.algorithms.build` uses) is the paper's
step model: each tree moves its whole half per step, so the α–β bandwidth term grows with the
tree height (it is the NCCL pipelining over many small chunks that makes DBTree bandwidth
optimal in Table I; ``pipeline > 1`` models that). The trees ignore the physical topology:
parent/child pairs that are not neighbours are routed on shortest paths and the contention
model charges the shared links (severe on tori, the paper's observation).
"""
from __future__ import annotations

from ..schedule.ir import Op, Schedule, ScheduleError, Transfer
from ..topology import Topology


def btree(n: int, rank: int) -> tuple[int, list[int]]:
    """NCCL ``ncclGetBtree``: (parent or -1, children) of ``rank`` in tree 0 of ``n`` ranks."""
    bit = 1
    while bit < n:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    children = []
    if low:
        children.append(rank - low)
        lb = low
        while lb and rank + lb >= n:
            lb >>= 1
        if lb:
            children.append(rank + lb)
    return up, children


def dtree(n: int) -> list[tuple[list[int], list[list[int]]]]:
    """Both trees as (parent[r], children[r]) lists (parent -1 at the root)."""
    trees = []
    for which in (0, 1):
        if which == 0:
            to_t0, from_t0 = (lambda r: r), (lambda r: r)
        elif n % 2 == 0:                                   # mirror
            to_t0, from_t0 = (lambda r: n - 1 - r), (lambda r: n - 1 - r)
        else:                                              # shift by one
            to_t0, from_t0 = (lambda r: (r - 1) % n), (lambda r: (r + 1) % n)
        parent, children = [], []
        for r in range(n):
            up, ch = btree(n, to_t0(r))
            parent.append(-1 if up == -1 else from_t0(up))
            children.append(sorted(from_t0(c) for c in ch))
        trees.append((parent, children))
    return trees


def _depths(parent: list[int]) -> list[int]:
    depth = [-1] * len(parent)
    for r in range(len(parent)):
        chain, v = [], r
        while depth[v] < 0 and parent[v] != -1:
            chain.append(v)
            v = parent[v]
        d = 0 if depth[v] < 0 else depth[v]
        depth[v] = d
        for w in reversed(chain):
            d += 1
            depth[w] = d
    return depth


def build(topo: Topology, pipeline: int = 1) -> Schedule:
    if not isinstance(topo, Topology):
        raise ScheduleError(f"dbtree: expected a Topology, got {type(topo).__name__}")
    if pipeline < 1:
        raise ScheduleError(f"dbtree: pipeline must be >= 1, got {pipeline}")
    n = topo.n
    trees = dtree(n)
    heights = []
    info = []
    for parent, _ in trees:
        depth = _depths(parent)
        heights.append(max(depth))
        info.append(depth)

    def glob(tree: int, k: int) -> int:         # tree-local step k (1-based) -> global step
        return 2 * k - 1 if tree == 0 else 2 * k

    P = pipeline
    phase = max(glob(f, h + P - 1) for f, h in enumerate(heights))
    transfers = []
    for f, ((parent, _), depth) in enumerate(zip(trees, info)):
        H = heights[f]
        for r in range(n):
            if parent[r] == -1:
                continue
            for j in range(P):
                chunk = (f * P + j,)
                transfers.append(Transfer(glob(f, H - depth[r] + 1 + j), r, parent[r],
                                          Op.REDUCE, chunk, f))
                transfers.append(Transfer(phase + glob(f, depth[r] + j), parent[r], r,
                                          Op.GATHER, chunk, f))
    return Schedule("dbtree", topo, 2 * P, transfers, reduce_steps=phase, gather_steps=phase,
                    meta={"parents": [t[0] for t in trees], "heights": heights,
                          "pipeline": P})
