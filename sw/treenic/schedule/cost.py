"""Timing models for a schedule, computed from the Schedule IR (never re-derived).

* :func:`alpha_beta` — the classic α–β model: each step costs one latency α plus the largest
  number of bytes any node sends in that step times β = 1/bandwidth. Topology-blind and
  single-ported: a node's sends in one step are charged as if serialised on one link, which is
  what the algorithms' textbook formulas count (Ring: 2(N−1)·α + 2(N−1)/N·M·β) — and why it
  under-rates MultiTree, whose nodes drive all their links at once.
* :func:`contention` — per step, the most-loaded directed link's bytes ÷ its bandwidth (all
  transfers routed on deterministic shortest paths share it), plus the longest route's hops ×
  link latency. This is the model under which DBTree and 2D-Ring pay for their mismatch with
  the physical network.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..topology import DEFAULT_BANDWIDTH, DEFAULT_LATENCY
from .ir import Schedule


@dataclass
class StepCost:
    step: int
    seconds: float
    max_link_bytes: int
    max_hops: int


def alpha_beta(schedule: Schedule, elements: int, *, alpha: float = DEFAULT_LATENCY,
               bandwidth: float = DEFAULT_BANDWIDTH, itemsize: int = 4) -> float:
    total = 0.0
    for step, transfers in schedule.by_step().items():
        if not transfers:
            continue
        sent = defaultdict(int)
        for t in transfers:
            sent[t.src] += schedule.bytes_of(t, elements, itemsize)
        total += alpha + max(sent.values()) / bandwidth
    return total


def contention_steps(schedule: Schedule, elements: int, itemsize: int = 4) -> list[StepCost]:
    topo = schedule.topology
    g = topo.graph
    out = []
    for step, transfers in schedule.by_step().items():
        if not transfers:
            continue
        link_bytes = defaultdict(int)
        max_hops, max_lat = 0, 0.0
        for t in transfers:
            path = schedule.route(t)
            b = schedule.bytes_of(t, elements, itemsize)
            lat = 0.0
            for u, v in zip(path, path[1:]):
                link_bytes[(u, v)] += b
                lat += topo.link(u, v)["latency"]
            max_hops, max_lat = max(max_hops, len(path) - 1), max(max_lat, lat)
        # parallel links share a pair's load; bandwidth of the pair = sum of its links
        worst, worst_bytes = 0.0, 0
        for (u, v), b in link_bytes.items():
            bw = sum(d["bandwidth"] for d in g.get_edge_data(u, v).values())
            if b / bw > worst:
                worst, worst_bytes = b / bw, b
        out.append(StepCost(step, worst + max_lat, worst_bytes, max_hops))
    return out


def contention(schedule: Schedule, elements: int, itemsize: int = 4) -> float:
    return sum(s.seconds for s in contention_steps(schedule, elements, itemsize))


def ideal(schedule: Schedule, elements: int, itemsize: int = 4) -> float:
    """The contention model with contention removed: per step, the largest single transfer's
    bytes ÷ its first link's bandwidth plus the longest route's latency. ``contention / ideal``
    is the slowdown a schedule pays for sharing links (1.0 when contention-free)."""
    topo = schedule.topology
    total = 0.0
    for transfers in schedule.by_step().values():
        if not transfers:
            continue
        worst, lat = 0.0, 0.0
        for t in transfers:
            path = schedule.route(t)
            worst = max(worst, schedule.bytes_of(t, elements, itemsize)
                        / topo.link(path[0], path[1])["bandwidth"])
            lat = max(lat, sum(topo.link(u, v)["latency"] for u, v in zip(path, path[1:])))
        total += worst + lat
    return total
