"""The network model for traffic that is not a NIC schedule: host-driven sparse all-reduces.

The sparse golden models (:mod:`treenic.sparse`) account their traffic through
:class:`treenic.sparse.base.TrafficLog` (``step()``, ``send(src, dst, nbytes)``).
:func:`record` captures those messages while a model runs; :func:`simulate_messages` prices
them on a topology with the same links as :mod:`.sim` (bandwidth, latency, routes, first come
first served with cut-through, credit-bounded rate, head flits): each worker starts its
step-``s`` sends once its step-``s−1`` sends are out and its step-``s−1`` receives are in
(bulk-synchronous host code), plus ``host_overhead`` seconds per step.
"""
from __future__ import annotations

import contextlib
import math


from .sim import NetsimError, _Links
from .timing import NicTiming

__all__ = ["record", "simulate_messages"]


@contextlib.contextmanager
def record():
    """Capture every TrafficLog message as ``steps[s] = [(src, dst, nbytes), ...]``."""
    from treenic.sparse.base import TrafficLog
    steps: list[list] = []
    orig_step, orig_send = TrafficLog.step, TrafficLog.send

    def step(self):
        steps.append([])
        orig_step(self)

    def send(self, src, dst, nbytes):
        if not steps:
            steps.append([])
        steps[-1].append((int(src), int(dst), int(nbytes)))
        orig_send(self, src, dst, nbytes)

    TrafficLog.step, TrafficLog.send = step, send
    try:
        yield steps
    finally:
        TrafficLog.step, TrafficLog.send = orig_step, orig_send


class _TopoOnly:
    """What :class:`~.sim._Links` needs of a schedule: its topology."""

    def __init__(self, topology):
        self.topology = topology


def simulate_messages(topology, steps, timing: NicTiming, *,
                      host_overhead: float = 0.0) -> dict:
    """Seconds to run ``steps`` (lists of (src, dst, bytes)) on ``topology``."""
    n = topology.n
    for s in steps:
        for src, dst, b in s:
            if not (0 <= src < n and 0 <= dst < n) or b < 0:
                raise NetsimError(f"message {src}->{dst} of {b} bytes outside {n} workers")
    links = _Links(_TopoOnly(topology), timing)
    ready = [0.0] * n
    overhead = host_overhead * timing.clock_hz
    total_bytes = 0
    for msgs in steps:
        if not msgs:
            continue
        nxt = list(ready)
        # links are granted in the order the senders are ready (ties: worker id)
        for src, dst, b in sorted(msgs, key=lambda m: (ready[m[0]], m[0], m[1])):
            if src == dst or b == 0:
                continue
            flits = math.ceil(b / timing.flit_bytes) + _heads(b, timing)
            path = links.route(None, src, dst, None)
            tx_end, last_in, _ = links.send(path, ready[src] + overhead + timing.tx_start, flits)
            nxt[src] = max(nxt[src], tx_end + timing.tx_tail)
            nxt[dst] = max(nxt[dst], last_in + timing.rx_done)
            total_bytes += b
        ready = nxt
    cycles = max(ready)
    return {"seconds": cycles / timing.clock_hz, "cycles": cycles, "bytes": total_bytes,
            "steps": sum(1 for s in steps if s)}


def _heads(nbytes: int, timing: NicTiming) -> int:
    if timing.mode == "message":
        return 1
    return math.ceil(nbytes / (4 * timing.packet_words))
