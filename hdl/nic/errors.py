"""Error collection of a NIC: sticky ERR_FLAGS, the ERR_COUNT event counter and the
``error`` pin.

Every event is registered once before it is flagged, and the event count once more before
the 32-bit add (the events come out of deep logic: header checks, the crossbar, host-bus
decode).  A host read is decoded a cycle after ``re``, so a read right after a rejected
host write still sees its flag.  A clear drops the events of its own cycle and of the
cycle before.  Golden model: :func:`error_collect_model`.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .params import ErrBit, NicParams

__all__ = ["ErrorCollect", "EventLayout", "event_sources", "error_collect_model"]


def event_sources(params: NicParams) -> dict[ErrBit, int]:
    """How many event wires feed each error bit (LINK is a level, not an event)."""
    P = params.ports
    return {ErrBit.TABLE_INDEX: 1, ErrBit.HOST_RANGE: 1, ErrBit.BAD_OP: 1,
            ErrBit.ENTRY_RANGE: 1, ErrBit.FRAG_RANGE: P, ErrBit.UNEXPECTED: P,
            ErrBit.SEQUENCE: P, ErrBit.LINK: 0, ErrBit.BANK_CONFLICT: 1,
            ErrBit.WATCHDOG: 1, ErrBit.LINK_CRC: P}


def error_collect_model(params: NicParams, trace):
    """Golden model: ``trace`` is a list of per-cycle inputs ``(events, link_error,
    clear)`` with ``events`` {ErrBit: int bit vector}; yields ``(err_flags, err_count)``
    as the registers read after each cycle's clock edge."""
    src = event_sources(params)
    flags = count = pending = 0
    q = {b: 0 for b in ErrBit}                 # registered events
    for events, link_error, clear in trace:
        q_next = {b: (events.get(b, 0) if not clear else 0) for b in ErrBit}
        n_next = 0 if clear else sum(bin(q[b]).count("1") for b in ErrBit if src[b])
        seen = 0
        for b in ErrBit:
            if (src[b] and q[b]) or (b == ErrBit.LINK and link_error):
                seen |= 1 << b
        if clear:
            flags, count = 0, 0
        else:
            flags, count = flags | seen, (count + pending) & 0xFFFFFFFF
        q, pending = q_next, n_next
        yield flags, count


def EventLayout(params: NicParams) -> data.StructLayout:
    """The event wires of :class:`ErrorCollect`, a field per error bit with sources."""
    return data.StructLayout({b.name.lower(): n for b, n in event_sources(params).items()
                              if n})


class ErrorCollect(wiring.Component):
    """Sticky error flags and the event counter.

    Parameters
    ----------
    params : NicParams

    Members
    -------
    events : ``In(EventLayout(params))``
        Events (pulses): a field per :class:`ErrBit` with event sources, named in lower
        case, as wide as its sources (``frag_range``: one wire per port; ``watchdog``: the
        watchdog fired; ``link_crc``: per port, its link CRC checker failed a sub-packet).
    link_error : ``In(1)``
        A level: some depacketiser counted an error (flags LINK, is not counted).
    clear : ``In(1)``
        Zero flags and count.
    err_flags : ``Out(len(ErrBit))``;  err_count : ``Out(32)``;  error : ``Out(1)``
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        self.params = params
        super().__init__({"events": In(EventLayout(params)), "link_error": In(1),
                          "clear": In(1),
                          "err_flags": Out(len(ErrBit)), "err_count": Out(32),
                          "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        clear = self.clear
        # number of events last cycle (registered)
        err_n = Signal(range(sum(event_sources(self.params).values()) + 1))
        ev_flat = []
        flag_bits = []
        for bit, n in event_sources(self.params).items():
            lst = [self.events[bit.name.lower()][k] for k in range(n)]
            lst_q = [Signal(name=f"ev_{bit.name.lower()}_q{k}") for k in range(n)]
            m.d.sync += [d.eq(v & ~clear) for d, v in zip(lst_q, lst)]
            ev_flat += lst_q
            flag_bits.append(Cat(Const(0, 1), *lst_q).any() |
                             (self.link_error if bit == ErrBit.LINK else 0))
        m.d.sync += err_n.eq(Mux(clear, 0, sum(ev_flat)))
        with m.If(clear):
            m.d.sync += [self.err_flags.eq(0), self.err_count.eq(0)]
        with m.Else():
            m.d.sync += [self.err_count.eq(self.err_count + err_n),
                         self.err_flags.eq(self.err_flags | Cat(*flag_bits))]
        m.d.comb += self.error.eq(self.err_flags.any())
        return m
