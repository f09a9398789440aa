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
from treenic.schedule.table import all_node_entries

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
    engine: ``"event"`` or ``"sweep"`` (see :func:`simulate`).
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
    engine: str = "event"

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
        return {"engine": f"treenic.netsim ({self.engine})",
                "cycles": round(self.cycles, 1), "seconds": self.seconds,
                "algbw_GBps": self.algbw() / 1e9, "busbw_GBps": self.busbw() / 1e9,
                "messages": self.messages, "flits": self.flits, "head_flits": self.head_flits,
                "model_wall_s": round(self.wall_seconds, 3)}


def _tables(schedule: Schedule, elements: int) -> list:
    return all_node_entries(schedule, elements)


class _Links:
    """Directed links between vertex pairs, each pair with one server per parallel link:
    cycles per flit, latency cycles and the time each server is next free (FCFS)."""

    def __init__(self, schedule: Schedule, timing: NicTiming, stalls=None):
        self.topo = topo = schedule.topology
        self.timing = timing
        #: links whose stall schedule is replayed flit by flit (:mod:`.stalls`), or None
        self.stalls = stalls
        flit_per_s = timing.flit_bytes * timing.clock_hz
        self.cpf, self.lat, self.free = {}, {}, {}
        for u, v in {(u, v) for u, v in topo.graph.edges()}:
            data = list(topo.graph.get_edge_data(u, v).values())
            lat = (timing.link_latency_cycles if timing.link_latency_cycles is not None
                   else min(d["latency"] for d in data) * timing.clock_hz)
            # the pair's first link (a NIC's port to a neighbour is its first link to it)
            rate = min(data[0]["bandwidth"] / flit_per_s, timing.link_rate(lat))
            self.cpf[(u, v)], self.lat[(u, v)] = 1.0 / rate, lat
            self.free[(u, v)] = [0.0] * len(data)
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
        """Stream a message along ``path`` from cycle ``ready`` (cut-through: each hop starts
        a latency after the previous one and cannot finish before it; the first hop is the
        NIC port's link, later hops take the earliest free of a pair's parallel links);
        returns (last flit off the first link, last flit into the destination, first flit
        into the destination)."""
        links = list(zip(path, path[1:]))
        starts, ends, servers, frees = [], [], [], []
        t, prev_end = ready, 0.0
        first_in = None
        for k, ln in enumerate(links):
            free = self.free[ln]
            j = 0 if k == 0 else min(range(len(free)), key=free.__getitem__)
            s = max(t, free[j])
            tail = not_before if k == len(links) - 1 else 0.0
            if self.stalls is not None and ln in self.stalls:
                # the link's own stall cycles, flit by flit; it is free for the next message
                # once the sender is through (its buffer keeps the order)
                sent, d_first, d_last = self.stalls.transmit(ln, s, flits)
                e = max(d_last + 1 - self.lat[ln], prev_end, tail)
                first_in, f = d_first, sent
            else:
                e = max(s + flits * self.cpf[ln], prev_end, tail)
                first_in, f = s + self.lat[ln], None
            starts.append(s)
            ends.append(e)
            servers.append(j)
            frees.append(f)
            t = s + self.lat[ln]
            prev_end = e + self.lat[ln]
        # back-pressure: an upstream link cannot finish more than a credit window ahead
        credits = self.timing.credits
        for k in range(len(links) - 2, -1, -1):
            ends[k] = max(ends[k], ends[k + 1] - self.lat[links[k]] - credits * self.cpf[links[k]])
        for ln, j, e, f in zip(links, servers, ends, frees):
            self.free[ln][j] = e if f is None else f
        last = links[-1]
        return (ends[0] if frees[0] is None else frees[0]), ends[-1] + self.lat[last], first_in


@dataclass
class _Node:
    entries: list                  # compiled: (step, kind, deps, sends, flits, heads)
    expect: tuple                  # arrival keys that must be in before DONE
    hp: int = 0
    ts: int = 1
    head_ready: float = 0.0
    lk_zero: float = 0.0
    step_start: float = 0.0
    tx_idle: list = field(default_factory=list)
    steplog: list = field(default_factory=list)
    done: float | None = None


_NOP, _RETIRE, _SEND = 0, 1, 2


def _check(schedule: Schedule, elements: int):
    if not isinstance(schedule, Schedule):
        raise NetsimError(f"expected a treenic Schedule, got {type(schedule).__name__}")
    if not isinstance(elements, (int, np.integer)) or elements < 1:
        raise NetsimError(f"elements must be a positive integer, got {elements!r}")
    if elements > 1 << 34:
        raise NetsimError(f"elements {elements} exceeds the model's bound of 2^34")


ENGINES = ("auto", "event", "sweep")


def simulate(schedule: Schedule, elements: int, timing: NicTiming = RTL,
             *, engine: str = "auto", tables: list | None = None,
             stalls=None) -> SimResult:
    """Simulate one all-reduce of ``elements`` float32 per node; see the module docstring.

    ``engine``: ``"event"`` (the event loop, any schedule), ``"sweep"`` (the vectorised
    form of the same model, :mod:`.fast`; only where links are private — an error
    otherwise) or ``"auto"`` (sweep where it applies). ``SimResult.engine`` says which ran.
    ``tables``: per-node entries already derived for this schedule and element count.
    ``stalls``: a :class:`~.stalls.LinkStalls` whose links stall cycle by cycle as that
    schedule says (an RTL fabric's LFSR stalls, :func:`~.stalls.fabric_stalls`) instead of
    the mean rate ``timing.stall`` prices; it needs the event engine."""
    _check(schedule, elements)
    if engine not in ENGINES:
        raise NetsimError(f"engine must be one of {ENGINES}, not {engine!r}")
    t_wall = time.perf_counter()
    from treenic.firmware.image import lockstep_estimate

    from . import fast
    n = schedule.n
    if stalls is not None and timing.stall:
        raise NetsimError("give either a replayed stall schedule or timing.stall, not both")
    links = _Links(schedule, timing, stalls)
    lockstep = timing.lockstep_cycles
    if lockstep is None:
        lockstep = lockstep_estimate(schedule, elements, timing.flit_bytes * 8)
    if engine == "sweep" and stalls is not None:
        raise NetsimError("engine 'sweep' cannot replay a stall schedule; use 'event'")
    private = fast.applies(schedule) if engine != "event" and stalls is None else False
    if engine == "sweep" and not private:
        raise NetsimError(f"engine 'sweep' needs one-hop transfers on a direct network; "
                          f"{schedule.algorithm} on {schedule.topology.spec} has shared links")
    if private:
        out = fast.sweep(schedule, elements, timing, lockstep, links)
        return SimResult(cycles=out["cycles"], seconds=out["cycles"] / timing.clock_hz,
                         elements=int(elements), nodes=n, messages=out["messages"],
                         flits=out["flits"], head_flits=out["head_flits"],
                         step_cycles_node0=out["step_cycles_node0"],
                         node_done=out["node_done"],
                         wall_seconds=time.perf_counter() - t_wall, timing=timing,
                         engine="sweep")
    tables = tables if tables is not None else _tables(schedule, elements)
    sim = _Sim(schedule, timing, links, lockstep, tables)
    sim.run()
    cycles = max(sim.nodes[u].done for u in range(n)) + timing.done_cycles
    return SimResult(cycles=cycles, seconds=cycles / timing.clock_hz, elements=int(elements),
                     nodes=n, messages=sim.messages, flits=sim.flits, head_flits=sim.heads,
                     step_cycles_node0=sim.nodes[0].steplog,
                     node_done=[sim.nodes[u].done for u in range(n)],
                     wall_seconds=time.perf_counter() - t_wall, timing=timing,
                     engine="event")


class _Sim:
    """The event loop. When every directed link has one sender and every message one hop
    (direct networks, neighbour schedules), no link is shared, so a node's issue order is
    its links' order and nodes may run in any order (a work list); otherwise wake-ups are
    processed in time order from a heap, which is what makes links first come, first
    served. Both give the same times where both apply (a test checks)."""

    def __init__(self, schedule, timing, links, lockstep, tables):
        self.s, self.t, self.links, self.lockstep = schedule, timing, links, lockstep
        self.n = schedule.n
        self.routes = {(t.src, t.dst, t.op, t.step): t.route for t in schedule.transfers
                       if t.route is not None}
        self.flit_cache = {}
        #: (dst, flow, src) -> (step, rx_port) of a REDUCE contribution: the order in which
        #: the receiver's order gate accumulates them (numeric contract)
        self.order = {(t.dst, c, t.src): (t.step, schedule.rx_port(t))
                      for t in schedule.transfers if t.op == Op.REDUCE for c in t.chunks}
        self.shared = False
        self.nodes = [self._compile(u, tables[u]) for u in range(self.n)]
        owners = defaultdict(set)
        for u, nd in enumerate(self.nodes):
            for e in nd.entries:
                for _, _, path, _ in e[3]:
                    if len(path) != 2:
                        self.shared = True
                    for ln in zip(path, path[1:]):
                        owners[ln].add(u)
        self.shared = self.shared or any(len(o) > 1 for o in owners.values())
        self.arr = {}                 # arrival key -> (first, full) ready cycles
        self.waiters = defaultdict(list)
        self.heap, self.seq = [], 0
        self.messages = self.flits = self.heads = 0

    def key(self, dst, op, flow, src):
        return ((flow * 2 + (op == Op.GATHER)) * self.n + dst) * self.n + src

    def _flits(self, words):
        f = self.flit_cache.get(words)
        if f is None:
            f = self.flit_cache[words] = message_flits(words, self.t)
        return f

    def _compile(self, u, entries) -> _Node:
        """Table entries -> (step, kind, dependency keys, sends, flits, head flits); a send
        is (local port, arrival key it produces, route, None)."""
        key, topo, out, expect = self.key, self.s.topology, [], []
        red_in = defaultdict(list)
        for e in entries:
            if e.size == 0:
                continue              # empty chunk: nothing is sent, counted as arrived
            if e.op == Op.REDUCE:
                red_in[e.flow] += [(self.order[(u, e.flow, k)], key(u, Op.REDUCE, e.flow, k))
                                   for k in e.children]
            elif e.op == Op.GATHER and e.parent is not None:
                expect.append(key(u, Op.GATHER, e.flow, e.parent))
        for ks in red_in.values():
            expect += [k for _, k in ks]
        for e in entries:
            kind, deps, sends = _NOP if e.op == Op.NOP else _RETIRE, (), ()
            # (an empty chunk's entries retire: the NIC counts them as arrived at FINISH)
            gated = False
            if e.op == Op.REDUCE and e.parent is not None and e.size:
                kind, gated, dsts = _SEND, True, [e.parent]
                deps = tuple(key(u, Op.REDUCE, e.flow, k) for k in
                             sorted(e.children, key=lambda k: self.order[(u, e.flow, k)]))
            elif e.op == Op.GATHER and e.children and e.size:
                kind = _SEND
                dsts = sorted(e.children)
                if e.parent is not None:
                    deps = (key(u, Op.GATHER, e.flow, e.parent),)
                else:
                    gated = True
                    deps = tuple(k for _, k in sorted(red_in[e.flow]))
            if kind == _SEND:
                sends = []
                for d in dsts:
                    path = self.links.route(self.s, u, d, self.routes.get((u, d, e.op, e.step)))
                    sends.append((topo.port_to(u, path[1]), key(d, e.op, e.flow, u), path, None))
                sends = tuple(sends)
            flits, heads = self._flits(e.size) if kind == _SEND else (0, 0)
            out.append((e.step, kind, deps, sends, flits, heads, gated))
        return _Node(out, tuple(dict.fromkeys(expect)))

    def push(self, when, u):
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, u))

    def run(self):
        t = self.t
        for u, node in enumerate(self.nodes):
            start = len(node.entries) + t.scan_overhead
            node.head_ready = start + t.run_start
            node.lk_zero = node.step_start = float(start)
            node.tx_idle = [float(start)] * len(self.s.topology.ports(u))
            self.push(node.head_ready, u)
        if self.shared:
            while self.heap:
                now, _, u = heapq.heappop(self.heap)
                self._step(u, now)
        else:
            work = [u for _, _, u in self.heap]
            while work:
                self._step(work.pop(), math.inf)
                work.extend(self.heap and [w for _, _, w in self.heap] or ())
                self.heap.clear()
        stuck = [u for u, nd in enumerate(self.nodes) if nd.done is None]
        if stuck:
            raise NetsimError(f"model deadlocked: nodes {stuck[:8]} never finished "
                              f"(a dependency was never sent)")

    def _step(self, u, now):
        node, t = self.nodes[u], self.t
        entries, arr = node.entries, self.arr
        while node.hp < len(entries):
            step, kind, deps, sends, flits, heads, gated = entries[node.hp]
            if step > node.ts:                         # advance the timestep
                a = max(node.head_ready, node.lk_zero, max(node.tx_idle, default=0.0) + 1)
                node.steplog.append(a - node.step_start)
                node.step_start = a
                node.ts += 1
                node.head_ready = a + t.due_cycles
                continue
            if kind != _SEND:                          # NOP or sends nothing: retires
                x = node.head_ready
                if kind == _NOP:
                    node.lk_zero = x + 1 + self.lockstep
                node.hp += 1
                node.head_ready = x + t.entry_cycles
                continue
            ready = full = -math.inf
            lag = t.gate_lag if gated else 0.0
            for k in deps:                             # in the order gate's order
                a = arr.get(k)
                if a is None:                          # its sender has not issued yet
                    self.waiters[k].append(u)
                    return
                ready = max(a[0], ready + lag)
                full = max(a[1], full + lag)
            ready, full = max(ready, 0.0), max(full, 0.0)
            x = max(node.head_ready, ready + t.dep_cycles,
                    max(node.tx_idle[p] for p, _, _, _ in sends) + t.idle_cycles)
            if x > now:
                self.push(x, u)
                return
            self._issue(node, x, sends, flits, heads, full)
            node.hp += 1
            node.head_ready = x + t.entry_cycles
        self._finish(u, node)

    def _issue(self, node, x, sends, flits, heads, dep_full):
        t, links = self.t, self.links
        cut = t.forward == "cut-through"
        # cut-through forwarding: the send may not finish before the data it forwards is in
        not_before = dep_full + t.start_cycles if cut else 0.0
        for p, k, path, _ in sends:
            tx_end, last_in, first_in = links.send(path, x + t.start_cycles, flits, not_before)
            node.tx_idle[p] = tx_end + t.tx_tail
            full = last_in + t.rx_done
            first = full
            if cut:
                sub = min(flits, 1 + math.ceil(t.sub_words / t.lanes))
                first = min(full, first_in + sub * links.cpf[(path[-2], path[-1])] + t.rx_done)
            self.arr[k] = (first, full)
            for w in self.waiters.pop(k, ()):
                self.push(first, w)
        self.messages += len(sends)
        self.flits += flits * len(sends)
        self.heads += heads * len(sends)

    def _finish(self, u, node):
        if node.done is not None:
            return
        last_rx = 0.0
        for k in node.expect:
            a = self.arr.get(k)
            if a is None:
                self.waiters[k].append(u)
                return
            last_rx = max(last_rx, a[1])
        end = max(node.head_ready, max(node.tx_idle, default=0.0) + 1, last_rx + 1)
        node.steplog.append(end - node.step_start)
        node.done = end
