"""Replay of the RTL fabric's link stalls in the network model.

Every :class:`~treenic.hdl.link.link.LinkChannel` of a fabric withholds its output in the
cycles its LFSR's low byte is below ``stall`` (1/256 units); the LFSR runs from reset
release with a per-link seed (:func:`~treenic.hdl.nic.fabric.link_seed`). A fabric run
therefore has one fixed stall schedule per link, which this module rebuilds from the same
two functions the RTL is built with (:func:`~treenic.hdl.link.link.stall_pattern`, the
golden model a test holds equal to the RTL cycle for cycle) and the number of cycles the
LFSRs ran before START (``lfsr_steps_at_start``, recorded by
:class:`~treenic.hdl.nic.fabric_sim.FabricSim`).

The model then moves a message over such a link flit by flit (:meth:`LinkStalls.transmit`):
the sender puts out one flit per cycle while it holds a credit; a flit reaches the link's
elastic buffer ``latency`` cycles later and leaves it in the first cycle, after the flit
before it, in which the link does not stall; its credit is back at the sender
``latency + credit_return`` cycles after it left. Without stalls this is the credit loop
the message-level model prices as ``min(1, credits / (2·latency + credit_return))`` flits
per cycle.
"""
from __future__ import annotations

import math
from collections import deque

__all__ = ["LinkStalls", "fabric_stalls"]


class LinkStalls:
    """Per directed link ``(u, v)``, one period of its stall enable from START (cycle 0 =
    the first cycle after the START edge), and each link's flit-level state (last
    delivery cycle, credits in flight) across the messages the model sends on it.

    Parameters
    ----------
    patterns:
        ``{(u, v): sequence of bool}``, one LFSR period from START.
    latency, credits, credit_return:
        The link's register stages each way, the sender's credits, and the cycles a credit
        spends inside the receiver (:class:`~treenic.netsim.timing.NicTiming`).
    """

    def __init__(self, patterns: dict, *, latency: int, credits: int, credit_return: int):
        self.patterns = {ln: bytes(bool(x) for x in p) for ln, p in patterns.items()}
        self.latency, self.credits = int(latency), int(credits)
        self.back = int(latency) + int(credit_return)
        self._last = {ln: -1 for ln in self.patterns}
        self._credit = {ln: deque(maxlen=self.credits) for ln in self.patterns}

    def __contains__(self, link) -> bool:
        return link in self.patterns

    def transmit(self, link, start: float, flits: int) -> tuple[int, int, int]:
        """Send ``flits`` flits on ``link``, the first no earlier than cycle ``start``.
        Returns (cycle after the sender's last flit, first flit's delivery cycle, last
        flit's delivery cycle)."""
        stalled, period = self.patterns[link], len(self.patterns[link])
        credit, last = self._credit[link], self._last[link]
        t = math.ceil(start)
        first = None
        for _ in range(flits):
            if len(credit) == self.credits:       # wait for the oldest flit's credit
                t = max(t, credit[0])
            d = max(t + self.latency, last + 1)
            while stalled[d % period]:
                d += 1
            credit.append(d + self.back)
            last = d
            first = d if first is None else first
            t += 1
        self._last[link] = last
        return t, first, last


def fabric_stalls(topology, *, ports: int, seed: int, stall: int, lfsr_steps_at_start: int,
                  latency: int, credits: int, credit_return: int) -> LinkStalls:
    """The stall schedule of every NIC-to-NIC link of a Verilated
    :class:`~treenic.hdl.nic.fabric.Fabric` built with ``stall``/``seed`` and NICs of
    ``ports`` ports, started ``lfsr_steps_at_start`` cycles after reset release."""
    from treenic.hdl.link.link import LFSR16_PERIOD, stall_pattern
    from treenic.hdl.nic.fabric import link_seed, wiring_plan
    patterns = {}
    for u, i, v, _ in wiring_plan(topology):
        if topology.port_to(u, v) != i:
            continue        # a parallel link: the model sends on the pair's first port
        patterns[(u, v)] = stall_pattern(link_seed(seed, u, i, ports), stall,
                                         lfsr_steps_at_start, LFSR16_PERIOD)
    return LinkStalls(patterns, latency=latency, credits=credits, credit_return=credit_return)
