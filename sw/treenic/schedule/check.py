"""Schedule checkers (docs/architecture.md §4), in the spirit of MSCCLang's postcondition check.

1. :func:`check_postcondition` — executing the schedule leaves every node holding, for every
   chunk, the sum of all N inputs exactly once (symbolic: contributor sets, not floats).
2. :func:`link_conflicts` — per step, transfers routed over one directed link beyond its
   parallel-link count. Contention-free algorithms (MultiTree on direct networks) score 0.
3. :func:`check_dependencies` — the data-dependence graph of transfers is acyclic, each
   dependence points to a strictly earlier step, every node sends each chunk's partial at
   most once per phase and never receives a contribution for a chunk after sending it on.
"""
from __future__ import annotations

from collections import Counter, defaultdict

import networkx as nx

from .execute import symbolic
from .ir import Op, Schedule, ScheduleError


def check_postcondition(schedule: Schedule) -> None:
    sym = symbolic(schedule)
    full = frozenset(range(schedule.n))
    for v in range(schedule.n):
        for k in range(schedule.num_chunks):
            got = sym.contributors[v][k]
            if got != full:
                missing = sorted(full - got)
                raise ScheduleError(f"postcondition: node {v} chunk {k} lacks contributions "
                                    f"from {missing[:8]}{'…' if len(missing) > 8 else ''}")


def link_loads(schedule: Schedule) -> dict[int, Counter]:
    """Per step, how many transfers cross each directed (u, v) link pair."""
    loads: dict[int, Counter] = defaultdict(Counter)
    for t in schedule.transfers:
        path = schedule.route(t)
        for u, v in zip(path, path[1:]):
            loads[t.step][(u, v)] += 1
    return loads


def link_conflicts(schedule: Schedule) -> int:
    g = schedule.topology.graph
    total = 0
    for counter in link_loads(schedule).values():
        for (u, v), k in counter.items():
            total += max(0, k - g.number_of_edges(u, v))
    return total


def check_dependencies(schedule: Schedule) -> nx.DiGraph:
    """Returns the transfer dependence DAG; raises ScheduleError when a rule is broken."""
    dag = nx.DiGraph()
    arrivals: dict[tuple[int, int], list[int]] = defaultdict(list)   # (node, chunk) -> transfer idx
    sent_reduce: dict[tuple[int, int], int] = {}
    for i, t in enumerate(schedule.transfers):
        dag.add_node(i)
        for k in t.chunks:
            for j in arrivals[(t.src, k)]:
                u = schedule.transfers[j]
                if u.step >= t.step:
                    raise ScheduleError(f"{t} depends on same-step or later arrival {u}")
                dag.add_edge(j, i)
            if t.op == Op.REDUCE:
                if (t.src, k) in sent_reduce:
                    raise ScheduleError(f"node {t.src} sends its chunk-{k} partial twice "
                                        f"(steps {sent_reduce[(t.src, k)]} and {t.step})")
                sent_reduce[(t.src, k)] = t.step
                if (t.dst, k) in sent_reduce and sent_reduce[(t.dst, k)] <= t.step:
                    raise ScheduleError(f"{t}: node {t.dst} already forwarded chunk {k} at "
                                        f"step {sent_reduce[(t.dst, k)]}; contribution lost")
            arrivals[(t.dst, k)].append(i)
    if not nx.is_directed_acyclic_graph(dag):
        raise ScheduleError("transfer dependencies contain a cycle")
    return dag


def check_all(schedule: Schedule) -> dict:
    """Run every checker; returns a summary (raises on the first failure)."""
    check_postcondition(schedule)
    check_dependencies(schedule)
    return {"postcondition": True, "dependencies": True, "link_conflicts": link_conflicts(schedule)}
