"""Shared gradient-buffer ports: several clients on one :class:`.buffer.BankedBuffer`
reader (and writer), for boards whose links carry far less than a flit a cycle.

The NIC gives each RX and TX port its own buffer reader, so that every port can move
``lanes`` words a cycle: 2·ports + 1 readers and ports + 1 writers, each reaching every
bank.  On the ECPIX-5 the PMOD links carry one flit in 17 cycles, and that crossbar is
what the router cannot fit (docs/boards.md).  With ``NicParams(shared_ports=True)`` the
TX units share one reader and the RX units another, and the RX write-backs share one
writer: 3 readers and 2 writers.  Every client keeps the buffer's contract (a request is
granted or refused in its cycle, data ``READ_LATENCY`` cycles after a grant), so the
units are unchanged; they are refused more often.

::

    client 0..N-1 ─req/addr─► pick (rotating: the first requester at or after ``first``)
                                 │ addr, write_only of the picked one
                                 ▼
                              buffer reader ─grant─► grant of the picked client only
                                 │ valid, data (data: to every client)
    pick, registered READ_LATENCY times ──► valid of the client that was granted

One RX unit is granted per cycle, and every RX unit writes its beat back the same fixed
time after its grant, so at most one of them writes in a cycle: :class:`WriteMerge` ORs
their writes into one writer and reports two in one cycle as a ``conflict`` (never
expected; the NIC flags it like a bank conflict).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .buffer import READ_LATENCY, BufferReadSignature, BufferWriteSignature

__all__ = ["ReadShare", "WriteMerge"]


class ReadShare(wiring.Component):
    """``clients`` buffer read clients on one reader, in rotating priority.

    Parameters
    ----------
    abits, lanes : int
        The buffer's address bits and lanes (:class:`.buffer.BankedBuffer`).
    clients : int
        Number of clients (at least 1).

    Members
    -------
    clients : ``In(BufferReadSignature(abits, lanes)).array(clients)``
        The clients' ports (the units connect here as they would to the buffer).
    port : ``Out(BufferReadSignature(abits, lanes))``
        To one buffer reader.
    """

    def __init__(self, *, abits: int, lanes: int, clients: int):
        for name, v in (("abits", abits), ("lanes", lanes), ("clients", clients)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        self.n = clients
        sig = BufferReadSignature(abits, lanes)
        super().__init__({"clients": In(sig).array(clients), "port": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        n, port = self.n, self.port
        first = Signal(range(n), name="first")       # a free-running rotation
        m.d.sync += first.eq(Mux(first == n - 1, 0, first + 1))
        reqs = Cat(*[c.req for c in self.clients])
        pick = Signal(range(n), name="pick")
        # the first requester in first, first + 1, ... (mod n): a rotated priority encoder
        with m.Switch(first):
            for f in range(n):
                with m.Case(f):
                    for i in reversed(range(n)):
                        j = (f + i) % n
                        with m.If(reqs[j]):
                            m.d.comb += pick.eq(j)
        addr = Signal.like(port.addr)
        write_only = Signal()
        with m.Switch(pick):
            for j, c in enumerate(self.clients):
                with m.Case(j):
                    m.d.comb += [addr.eq(c.addr), write_only.eq(c.write_only)]
        m.d.comb += [port.req.eq(reqs.any()), port.addr.eq(addr),
                     port.write_only.eq(write_only)]
        # who gets the data: the pick of the granted read, READ_LATENCY cycles later
        tags = [Signal(range(n), name=f"tag{i}") for i in range(READ_LATENCY)]
        m.d.sync += [tags[0].eq(pick), *[tags[i].eq(tags[i - 1])
                                         for i in range(1, READ_LATENCY)]]
        for j, c in enumerate(self.clients):
            m.d.comb += [c.grant.eq(port.grant & (pick == j) & c.req),
                         c.valid.eq(port.valid & (tags[-1] == j)), c.data.eq(port.data)]
        return m


class WriteMerge(wiring.Component):
    """``clients`` buffer writers on one, for clients that never write in the same cycle.

    Parameters
    ----------
    abits, lanes : int
        The buffer's address bits and lanes.
    clients : int
        Number of clients (at least 1).

    Members
    -------
    clients : ``In(BufferWriteSignature(abits, lanes)).array(clients)``
        The writers.
    port : ``Out(BufferWriteSignature(abits, lanes))``
        To one buffer writer: the OR of the clients' writes (each masked by its enables).
    conflict : ``Out(1)``
        Two clients wrote in this cycle (their words are ORed: garbage).
    """

    def __init__(self, *, abits: int, lanes: int, clients: int):
        for name, v in (("abits", abits), ("lanes", lanes), ("clients", clients)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        self.n, self.lanes = clients, lanes
        sig = BufferWriteSignature(abits, lanes)
        super().__init__({"clients": In(sig).array(clients), "port": Out(sig),
                          "conflict": Out(1)})

    def elaborate(self, platform):
        m = Module()
        port, L = self.port, self.lanes
        active = [c.en.any() for c in self.clients]
        addr = Const(0, len(port.addr))
        en = Const(0, L)
        data = Const(0, 32 * L)
        for c, a in zip(self.clients, active):
            lane_mask = Cat(*[c.en[k].replicate(32) for k in range(L)])
            addr = addr | Mux(a, c.addr, 0)
            en = en | c.en
            data = data | (c.data & lane_mask)
        seen, two = Const(0, 1), Const(0, 1)
        for a in active:
            seen, two = seen | a, two | (seen & a)
        m.d.comb += [port.addr.eq(addr), port.en.eq(en), port.data.eq(data),
                     self.conflict.eq(two)]
        return m
