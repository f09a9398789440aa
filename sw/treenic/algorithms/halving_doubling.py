"""Halving-doubling all-reduce (Rabenseifner; Thakur, Rabenseifner & Gropp 2005) and HDRM,
halving-doubling with rank mapping on the EFLOPS BiGraph (Dong et al., HPCA 2020; MultiTree
paper §II-C, Table I).

Core (both variants), on ``p = 2^k`` *ranks* ``v = 0..p-1`` with ``p`` chunks:

* recursive-halving reduce-scatter, steps ``j = 1..k``: distance ``d = p >> j``; rank ``v``
  exchanges with ``v ^ d``. Each rank holds a contiguous chunk range; the rank whose bit ``d``
  is 0 keeps the lower half and sends (REDUCE) the upper half, its partner the opposite. After
  ``k`` steps rank ``v`` holds chunk ``v`` fully reduced over the ``p`` ranks;
* recursive-doubling all-gather, steps ``j = 1..k``: distance ``d = 1 << (j-1)``; partners
  swap (GATHER) everything they hold, the ranges double.

Distances follow Thakur, Rabenseifner & Gropp (2005): ``p/2`` first in the halving,
``1`` first in the doubling, so rank ``v`` ends the reduce-scatter owning chunk ``v`` (MPICH's
code walks the halving from distance 1 with a permuted block map: the same bytes per step,
other partners). A transfer carries the chunk range it sends (``p/2, p/4, …`` chunks, then
``1, 2, …``); ``flow`` is the first chunk id of that range. For ``N = 2^k``: ``2·log2 N`` steps and
``2(N−1)/N·M`` bytes sent per node (the α–β closed form ``2k·α + 2(N−1)/N·M·β``).

**Any node count** (:func:`build`, ranks = node ids): with ``p = 2^⌊log2 N⌋`` and
``r = N − p`` the standard fold of MPICH's ``MPIR_Allreduce_intra_reduce_scatter_allgather``
is used. In an extra first step, each even node ``2i`` (``i < r``) sends (REDUCE) its whole
buffer (all ``p`` chunks) to node ``2i+1`` and sits out; the remaining ``p`` nodes take ranks
``v = i`` → node ``2i+1`` for ``v < r`` and ``v`` → node ``v + r`` otherwise, and run the core.
In an extra last step each node ``2i+1`` sends (GATHER) the complete result to ``2i``. So
every node ends with the full sum; the count is ``2·log2 p + 2`` steps when ``r > 0``.

**HDRM** (:func:`build_hdrm`, BiGraph only, ``N`` a power of two): the paper describes
EFLOPS's mapping by its property — every halving/doubling pair joins a node on an upper-layer
switch with a node on a lower-layer switch, and the pairs spread over the switch-to-switch
links without contention. We realise that property with this mapping (our construction,
documented here rather than copied from EFLOPS's tables). Write rank ``v`` (``m = log2 N``
bits) as ``u = v >> 1`` plus bit 0; ``h = S/2`` switches per layer, ``K`` nodes per switch:

* layer(v) = parity of popcount(v) (0: upper). Partners differ in exactly one bit, so every
  exchange of every step crosses the layers;
* upper layer: switch = the top ``log2 h`` bits of ``u``, slot = its low ``log2 K`` bits;
  lower layer: switch = the *low* ``log2 h`` bits of ``u``, slot = its high ``log2 K`` bits
  (node id = switch·K + slot, lower switches numbered after the upper ones).

For a fixed upper switch the partners' lower switches are then uniformly spread (the two bit
fields together have full rank over GF(2), and flipping one bit of ``u`` only permutes them),
in every step and both directions: each upper↔lower switch pair carries at most ``max(1, K/h)``
transfers per step per direction — within the ``ceil(K/h)`` parallel links of the
non-blocking ``bigraph:SxK`` (:func:`treenic.topology.bigraph`), so HDRM has zero link
conflicts, and it is the minimum any pairing can reach (``N/2`` cross-layer pairs per step).
Ranks = node ids instead (plain :func:`build` on a BiGraph) pile up to ``K`` pairs on one
switch pair and conflict.
Non-BiGraph topologies and non-power-of-two BiGraphs raise :class:`ScheduleError`.
"""
from __future__ import annotations

from ..schedule.ir import Op, Schedule, ScheduleError, Transfer
from ..topology import Topology


def _hd_transfers(rank_node: list[int], step0: int, gather0: int) -> tuple[list, list]:
    """Core halving/doubling on ranks 0..p-1 placed on nodes ``rank_node``."""
    p = len(rank_node)
    k = p.bit_length() - 1
    assert 1 << k == p
    lo = [0] * p
    hi = [p] * p
    rs, ag = [], []
    for j in range(1, k + 1):
        d = p >> j
        new = []
        for v in range(p):
            mid = (lo[v] + hi[v]) // 2
            keep, give = ((lo[v], mid), (mid, hi[v])) if not v & d else ((mid, hi[v]), (lo[v], mid))
            ch = tuple(range(*give))
            rs.append(Transfer(step0 + j, rank_node[v], rank_node[v ^ d], Op.REDUCE, ch, ch[0]))
            new.append(keep)
        lo, hi = [a for a, _ in new], [b for _, b in new]
    assert all(lo[v] == v and hi[v] == v + 1 for v in range(p))
    for j in range(1, k + 1):
        d = 1 << (j - 1)
        for v in range(p):
            ch = tuple(range(lo[v], hi[v]))
            ag.append(Transfer(gather0 + j, rank_node[v], rank_node[v ^ d], Op.GATHER, ch, ch[0]))
        lo = [min(lo[v], lo[v ^ d]) for v in range(p)]
        hi = [max(hi[v], hi[v ^ d]) for v in range(p)]
    return rs, ag


def build(topo: Topology) -> Schedule:
    if not isinstance(topo, Topology):
        raise ScheduleError(f"halving-doubling: expected a Topology, got {type(topo).__name__}")
    n = topo.n
    p = 1 << (n.bit_length() - 1)
    r = n - p
    k = p.bit_length() - 1
    fold = 1 if r else 0
    rank_node = [2 * v + 1 if v < r else v + r for v in range(p)]
    rs, ag = _hd_transfers(rank_node, fold, k + fold)
    transfers = rs + ag
    allc = tuple(range(p))
    for i in range(r):
        transfers.append(Transfer(1, 2 * i, 2 * i + 1, Op.REDUCE, allc, 0))
        transfers.append(Transfer(2 * (k + fold), 2 * i + 1, 2 * i, Op.GATHER, allc, 0))
    return Schedule("halving-doubling", topo, p, transfers, reduce_steps=k + fold,
                    gather_steps=k + fold,
                    meta={"rank_node": rank_node, "folded": [2 * i for i in range(r)]})


def hdrm_rank_node(switches: int, per_switch: int) -> list[int]:
    """HDRM rank → node map for ``bigraph:{switches}x{per_switch}`` (module docstring)."""
    h, K = switches // 2, per_switch
    n = switches * per_switch
    if n & (n - 1):
        raise ScheduleError(f"hdrm: needs a power-of-two node count, bigraph:{switches}x"
                            f"{per_switch} has {n}")
    lh, lk = h.bit_length() - 1, K.bit_length() - 1
    out = []
    for v in range(n):
        u = v >> 1
        if bin(v).count("1") % 2 == 0:           # upper layer
            sw, slot = u >> lk, u & (K - 1)
            out.append(sw * K + slot)
        else:                                    # lower layer
            sw, slot = u & (h - 1), u >> lh
            out.append(n // 2 + sw * K + slot)
    assert sorted(out) == list(range(n))
    return out


def build_hdrm(topo: Topology) -> Schedule:
    if not isinstance(topo, Topology) or topo.kind != "bigraph":
        spec = getattr(topo, "spec", topo)
        raise ScheduleError(f"hdrm: needs a bigraph:SxK topology, got {spec}")
    S = len(topo.meta["upper"]) * 2
    K = topo.meta["per_switch"]
    rank_node = hdrm_rank_node(S, K)
    p = len(rank_node)
    k = p.bit_length() - 1
    rs, ag = _hd_transfers(rank_node, 0, k)
    return Schedule("hdrm", topo, p, rs + ag, reduce_steps=k, gather_steps=k,
                    meta={"rank_node": rank_node})
