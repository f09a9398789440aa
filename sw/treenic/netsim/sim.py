"""Event-driven network timing model of a schedule on the NIC fabric (message granularity).

Every node runs its **NIC schedule table** — the entries :func:`treenic.schedule.table.
node_entries` derives from the Schedule IR, NOPs included, in table order — through the
issue rules of the RTL (``hdl/nic/core.py``): the head entry issues when its step has come
and its data dependencies are written back (REDUCE: the children's contributions; GATHER:
the parent's data, or every contribution at the root) and its TX units are idle; a NOP
loads the lockstep down-counter; the timestep advances when the counter is zero, every TX
unit is idle and the head entry belongs to a later step. No schedule logic lives here.

Each send is one message per chunk (as the NIC sends it) of :func:`~.timing.message_flits`
flits. A message occupies every directed link of its route for ``flits / rate`` cycles
(rate: the link's bandwidth in flits per cycle, capped by the credit loop
``credits / (2·latency + credit_return)``); links are granted first come, first served in
issue order, with cut-through between hops of one message (switches and multi-hop routes)
and back-pressure bounded by the credits. Between steps the NIC stores and forwards: a
dependent send starts after the whole incoming message is reduced (``forward="store"``, the
RTL), or after its first sub-packet (``"cut-through"``, a what-if).

Events are node wake-ups in a heap ordered by time; a node runs its table as far as known
times allow and either schedules its next wake-up or waits for a message that has not been
issued yet. Cost is linear in table entries plus messages.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from treenic.schedule.ir import Op, Schedule
from treenic.schedule.table import node_entries
from treenic.topology import is_switch

from .timing import RTL, NicTiming, message_flits

__all__ = ["simulate", "SimResult", "NetsimError"]


class NetsimError(ValueError):
    """Bad input to the network model (named in the message)."""


@dataclass
class SimResult:
    """What one simulated all-reduce cost.

    Members
    -------
    cycles: fabric cycles from START to the last NIC's DONE (NIC clock).
    seconds: ``cycles / clock_hz``.
    messages, flits, head_flits: totals over all links' first hops.
    step_cycles_node0: cycles node 0 spent in each timestep (the RTL's step log).
    node_done: per node, the cycle its DONE rose.
    wall_seconds: model run time (entries derivation included).
    """
    cycles: float
    seconds: float
    elements: int
    nodes: int
    messages: int
    flits: int
    head_flits: int
    step_cycles_node0: list
    node_done: list
    wall_seconds: float
    timing: NicTiming
    link_busy: dict = field(default_factory=dict, repr=False)

    @property
    def bytes(self) -> int:
        return 4 * self.elements

    def algbw(self) -> float:
        """nccl-tests algorithm bandwidth: buffer bytes / time (bytes/s)."""
        return self.bytes / self.seconds if self.seconds > 0 else math.inf

    def busbw(self) -> float:
        """nccl-tests bus bandwidth for all-reduce: algbw · 2(N−1)/N."""
        return self.algbw() * 2 * (self.nodes - 1) / self.nodes

    def summary(self) -> dict:
        return {"cycles": round(self.cycles, 1), "seconds": self.seconds,
                "algbw_GBps": self.algbw() / 1e9, "busbw_GBps": self.busbw() / 1e9,
                "messages": self.messages, "flits": self.flits, "head_flits": self.head_flits,
                "model_wall_s": round(self.wall_seconds, 3)}


class _NodeView:
    """The schedule restricted to the transfers touching one node, so that the table
    encoder (which scans ``transfers``) costs O(node's transfers) instead of O(all)."""

    def __init__(self, schedule: Schedule, transfers):
        self._s = schedule
        self.transfers = transfers

    def __getattr__(self, name):
        return getattr(self._s, name)


def _tables(schedule: Schedule, elements: int) -> list:
    per = defaultdict(list)
    for t in schedule.transfers:
        per[t.src].append(t)
        per[t.dst].append(t)
    return [node_entries(_NodeView(schedule, per[u]), u, elements) for u in range(schedule.n)]


class _Links:
    """Directed links: cycles per flit, latency cycles and next free time (FCFS)."""

    def __init__(self, schedule: Schedule, timing: NicTiming):
        self.topo = topo = schedule.topology
        self.timing = timing
        flit_per_s = timing.flit_bytes * timing.clock_hz
        self.cpf, self.lat, self.free = {}, {}, {}
        self.busy = defaultdict(float)
        for u, v in {(u, v) for u, v in topo.graph.edges()}:
            data = topo.graph.get_edge_data(u, v).values()
            bw = sum(d["bandwidth"] for d in data)          # parallel links share a pair
            lat = (timing.link_latency_cycles if timing.link_latency_cycles is not None
                   else min(d["latency"] for d in data) * timing.clock_hz)
            rate = min(bw / flit_per_s, timing.link_rate(lat) * len(data))
            self.cpf[(u, v)], self.lat[(u, v)], self.free[(u, v)] = 1.0 / rate, lat, 0.0
        self._routes = {}

    def route(self, schedule, src, dst, route):
        if route is not None:
            return route
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = tuple(self.topo.route(src, dst))
        return r

    def send(self, path, ready: float, flits: int, not_before: float = 0.0):
        """Stream a message along ``path`` from cycle ``ready``; returns (last flit off the
        first link, last flit into the destination, first flit into the destination)."""
        links = list(zip(path, path[1:]))
        starts, ends = [], []
        t = ready
        for k, ln in enumerate(links):
            dur = flits * self.cpf[ln]
            s = max(t, self.free[ln])
            e = max(s + dur, not_before if k == len(links) - 1 else 0.0)
            starts.append(s)
            ends.append(e)
            t = s + self.lat[ln]
        # back-pressure: an upstream link cannot finish more than a credit window ahead
        credits = self.timing.credits
        for k in range(len(links) - 2, -1, -1):
            ends[k] = max(ends[k], ends[k + 1] - self.lat[links[k]] - credits * self.cpf[links[k]])
        for ln, s, e in zip(links, starts, ends):
            self.free[ln] = e
            self.busy[ln] += e - s
        last = links[-1]
        return ends[0], ends[-1] + self.lat[last], starts[-1] + self.lat[last]


@dataclass
class _Node:
    entries: list
    hp: int = 0
    ts: int = 1
    head_ready: float = 0.0
    lk_zero: float = 0.0
    step_start: float = 0.0
    tx_idle: dict = field(default_factory=dict)
    steplog: list = field(default_factory=list)
    done: float | None = None


def _check(schedule: Schedule, elements: int):
    if not isinstance(schedule, Schedule):
        raise NetsimError(f"expected a treenic Schedule, got {type(schedule).__name__}")
    if not isinstance(elements, (int, np.integer)) or elements < 1:
        raise NetsimError(f"elements must be a positive integer, got {elements!r}")
    if elements > 1 << 34:
        raise NetsimError(f"elements {elements} exceeds the model's bound of 2^34")


def simulate(schedule: Schedule, elements: int, timing: NicTiming = RTL,
             *, tables: list | None = None) -> SimResult:
    """Simulate one all-reduce of ``elements`` float32 per node; see the module docstring.
    ``tables``: per-node entries already derived for this schedule and element count."""
    _check(schedule, elements)
    t_wall = time.perf_counter()
    from treenic.firmware.image import lockstep_estimate
    n = schedule.n
    tables = tables if tables is not None else _tables(schedule, elements)
    links = _Links(schedule, timing)
    lockstep = timing.lockstep_cycles
    if lockstep is None:
        lockstep = lockstep_estimate(schedule, elements, timing.flit_bytes * 8)
    routes = _transfer_routes(schedule)
    sim = _Sim(schedule, timing, links, lockstep, routes, tables)
    sim.run()
    cycles = max(sim.nodes[u].done for u in range(n)) + timing.done_cycles
    return SimResult(cycles=cycles, seconds=cycles / timing.clock_hz, elements=int(elements),
                     nodes=n, messages=sim.messages, flits=sim.flits, head_flits=sim.heads,
                     step_cycles_node0=sim.nodes[0].steplog,
                     node_done=[sim.nodes[u].done for u in range(n)],
                     wall_seconds=time.perf_counter() - t_wall, timing=timing,
                     link_busy=dict(links.busy))


def _transfer_routes(schedule: Schedule) -> dict:
    """(src, dst, op, step) -> allocated route, where the algorithm allocated one."""
    return {(t.src, t.dst, t.op, t.step): t.route for t in schedule.transfers
            if t.route is not None}


class _Sim:
    def __init__(self, schedule, timing, links, lockstep, routes, tables):
        self.s, self.t, self.links, self.lockstep = schedule, timing, links, lockstep
        self.routes = routes
        topo = schedule.topology
        self.peer = {u: [p.peer for p in topo.ports(u)] for u in range(schedule.n)}
        self.nodes = [_Node(tables[u]) for u in range(schedule.n)]
        self.arr = {}                 # (node, op, flow, src) -> (first, full) ready cycles
        self.expect = defaultdict(list)   # node -> arrival keys it waits for before DONE
        self.waiters = defaultdict(list)
        self.heap = []
        self.seq = 0
        self.messages = self.flits = self.heads = 0
        self.flit_cache = {}

    def push(self, when, u):
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, u))

    def run(self):
        t = self.t
        for u, node in enumerate(self.nodes):
            start = len(node.entries) + t.scan_overhead
            node.head_ready = start + t.run_start
            node.lk_zero = node.step_start = float(start)
            node.tx_idle = {p: float(start) for p in range(len(self.peer[u]))}
            self._expectations(u, node)
            self.push(node.head_ready, u)
        while self.heap:
            now, _, u = heapq.heappop(self.heap)
            self._step(u, now)
        stuck = [u for u, nd in enumerate(self.nodes) if nd.done is None]
        if stuck:
            raise NetsimError(f"model deadlocked: nodes {stuck[:8]} never finished "
                              f"(a dependency was never sent)")

    def _expectations(self, u, node):
        for e in node.entries:
            if e.op == Op.REDUCE:
                for k in e.children:
                    self.expect[u].append((u, Op.REDUCE, e.flow, k))
            elif e.op == Op.GATHER and e.parent is not None:
                self.expect[u].append((u, Op.GATHER, e.flow, e.parent))
        self.expect[u] = list(dict.fromkeys(self.expect[u]))

    def _deps(self, u, e):
        """Arrival keys the entry waits for (None: sends nothing, retires when due)."""
        if e.op == Op.NOP or e.size == 0:
            return None
        if e.op == Op.REDUCE:
            if e.parent is None:
                return None
            return [(u, Op.REDUCE, e.flow, k) for k in e.children]
        if not e.children:
            return None
        if e.parent is not None:
            return [(u, Op.GATHER, e.flow, e.parent)]
        # the root: every contribution of its REDUCE entry for this flow
        return [k for k in self.expect[u] if k[1] == Op.REDUCE and k[2] == e.flow]

    def _step(self, u, now):
        node, t = self.nodes[u], self.t
        while node.hp < len(node.entries):
            e = node.entries[node.hp]
            if e.step > node.ts:                       # advance the timestep
                a = max(node.head_ready, node.lk_zero,
                        max(node.tx_idle.values(), default=0.0) + 1)
                node.steplog.append(a - node.step_start)
                node.step_start = a
                node.ts += 1
                node.head_ready = a + t.due_cycles
                continue
            deps = self._deps(u, e)
            if deps is None:                           # NOP or sends nothing
                x = node.head_ready
                if e.op == Op.NOP:
                    node.lk_zero = x + 1 + self.lockstep
                node.hp += 1
                node.head_ready = x + t.entry_cycles
                continue
            ready, full = 0.0, 0.0
            for k in deps:
                a = self.arr.get(k)
                if a is None:                          # its sender has not issued yet
                    self.waiters[k].append(u)
                    return
                ready, full = max(ready, a[0]), max(full, a[1])
            ports = self._send_ports(u, e)
            x = max(node.head_ready, ready + t.dep_cycles,
                    max(node.tx_idle[p] for p, _ in ports) + t.idle_cycles)
            if x > now:
                self.push(x, u)
                return
            self._issue(u, node, e, x, ports, full)
            node.hp += 1
            node.head_ready = x + t.entry_cycles
        self._finish(u, node)

    def _send_ports(self, u, e):
        if e.op == Op.REDUCE:
            return [(e.parent_port, e.parent)]
        return [(self._first_port(u, d, e.step), d) for d in sorted(e.children)]

    def _first_port(self, u, d, step):
        p = self.s.topology.port_to(u, d)
        if p is not None:
            return p
        path = self.links.route(self.s, u, d, self.routes.get((u, d, Op.GATHER, step)))
        return self.s.topology.port_to(u, path[1])

    def _flits(self, words):
        f = self.flit_cache.get(words)
        if f is None:
            f = self.flit_cache[words] = message_flits(words, self.t)
        return f

    def _issue(self, u, node, e, x, ports, dep_full):
        t = self.t
        flits, heads = self._flits(e.size)
        # cut-through forwarding: the send may not finish before the data it forwards is in
        not_before = dep_full + t.tx_start if t.forward == "cut-through" else 0.0
        for p, d in ports:
            path = self.links.route(self.s, u, d, self.routes.get((u, d, e.op, e.step)))
            tx_end, last_in, first_in = self.links.send(path, x + t.tx_start, flits, not_before)
            node.tx_idle[p] = tx_end + t.tx_tail
            full = last_in + t.rx_done
            first = full
            if t.forward == "cut-through":
                sub = min(flits, 1 + math.ceil(t.sub_words / t.lanes))
                first = min(full, first_in + sub * self.links.cpf[(path[-2], path[-1])]
                            + t.rx_done)
            key = (d, e.op, e.flow, u)
            self.arr[key] = (first, full)
            for w in self.waiters.pop(key, ()):
                self.push(first, w)
            self.messages += 1
            self.flits += flits
            self.heads += heads

    def _finish(self, u, node):
        if node.done is not None:
            return
        t = self.t
        last_rx = 0.0
        for k in self.expect[u]:
            a = self.arr.get(k)
            if a is None:
                self.waiters[k].append(u)
                return
            last_rx = max(last_rx, a[1])
        end = max(node.head_ready, max(node.tx_idle.values(), default=0.0) + 1, last_rx + 1)
        node.steplog.append(end - node.step_start)
        node.done = end
