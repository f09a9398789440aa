"""Fault injector for a CRC-protected link (fault campaigns; never part of a real NIC).

::

    i (from CrcAppender) ─► FIFO ─► fault stage ─► o (to LinkChannel)
    i.credit ◄──────────── credit fix-up ◄──────── o.credit

Every flit passes through a small FIFO (one cycle of latency) so that the fault stage can
hold the link or replay a sub-packet while the sender keeps sending.  One fault per arming
(``arm`` high with a ``mode``; the fault acts on the next flit that leaves the FIFO, or on
the next sub-packet start for the sub-packet faults):

* ``FLIP``: XOR ``mask`` into that flit and its CRC sideband;
* ``DROP``: drop one whole sub-packet (from a sub-packet start to its end flit); its
  credits are returned to the sender, so only the data are lost;
* ``DUP``: send one sub-packet, then send it again; the receiver's credits for the copy
  are not passed back to the sender (its credit count stays right);
* ``STALL``: send nothing for ``length`` cycles (flow control must absorb it);
* ``KILL``: from then on, drop every flit and return no credit (a dead link).

``fired`` rises (sticky) with the first flit the fault touches (``STALL``: when the stall
starts).  ``overflow`` (sticky) would mean the FIFO was too small for the traffic.
"""
from __future__ import annotations

import enum

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import fifo, memory, wiring
from amaranth.lib.wiring import In, Out

from .crc import END_TYPES, CrcLinkSignature
from .flit import FlitFormat

__all__ = ["FaultMode", "FaultInjector", "apply_fault"]


class FaultMode(enum.IntEnum):
    NONE = 0
    FLIP = 1
    DROP = 2
    DUP = 3
    STALL = 4
    KILL = 5


def apply_fault(fmt: FlitFormat, beats, mode: int, *, at: int, mask: int = 0):
    """Golden injector: the ``(flit, crc)`` beats delivered when the fault is armed just
    before beat ``at`` leaves (timing aside; ``STALL`` delivers everything)."""
    beats = list(beats)
    ends = {int(t.value) for t in END_TYPES}
    is_end = [((f >> fmt.width) & 7) in ends for f, _ in beats]
    if at >= len(beats):
        return beats
    if mode == FaultMode.FLIP:
        f, c = beats[at]
        beats[at] = (f ^ (mask & ((1 << fmt.flit_bits) - 1)), c ^ (mask >> fmt.flit_bits))
    elif mode == FaultMode.KILL:
        beats = beats[:at]
    elif mode in (FaultMode.DROP, FaultMode.DUP):
        s = next((k for k in range(at, len(beats)) if k == 0 or is_end[k - 1]), None)
        if s is None:
            return beats
        e = next(k for k in range(s, len(beats)) if is_end[k])
        sp = beats[s:e + 1]
        beats[s:e + 1] = [] if mode == FaultMode.DROP else sp + sp
    return beats


class FaultInjector(wiring.Component):
    """One link's fault injector.

    Parameters
    ----------
    fmt : FlitFormat
        Flit format of the link.
    crc_width : int
        Width of the CRC sideband.
    depth : int
        FIFO depth (flits); at least the sender's credits plus a sub-packet.
    max_sub_flits : int
        Longest sub-packet (flits, head included) a ``DUP`` can replay.

    Members
    -------
    i : In(CrcLinkSignature)
    o : Out(CrcLinkSignature)
    arm, mode, mask, length : In
        Fault control (see the module docstring); ``mask`` covers flit then CRC bits.
    fired, overflow : Out(1)
    """

    def __init__(self, fmt: FlitFormat, *, crc_width: int, depth: int = 32,
                 max_sub_flits: int = 64):
        self.fmt, self.crc_width = fmt, crc_width
        self.depth, self.max_sub_flits = depth, max_sub_flits
        self.beat_bits = fmt.flit_bits + crc_width
        sig = CrcLinkSignature(fmt, crc_width)
        super().__init__({"i": In(sig), "o": Out(sig), "arm": In(1), "mode": In(3),
                          "mask": In(self.beat_bits), "length": In(16),
                          "fired": Out(1), "overflow": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fmt, V = self.fmt, self.fmt.vcs
        m.submodules.q = q = fifo.SyncFIFO(width=self.beat_bits, depth=self.depth)
        m.d.comb += [q.w_data.eq(Cat(self.i.flit.as_value(), self.i.crc)),
                     q.w_en.eq(self.i.valid)]
        with m.If(self.i.valid & ~q.w_rdy):
            m.d.sync += self.overflow.eq(1)
        m.submodules.rep = rep = memory.Memory(shape=self.beat_bits,
                                               depth=self.max_sub_flits, init=[])
        rw, rr = rep.write_port(), rep.read_port(domain="comb")

        head = q.r_data
        head_type = head[fmt.width:fmt.width + 3]
        head_vc = head[fmt.width + 3:fmt.width + 3 + fmt.vc_bits]
        is_end = Cat(*[head_type == t.value for t in END_TYPES]).any()
        at_start = Signal(init=1)         # the FIFO head starts a sub-packet
        mode = self.mode
        armed = Signal()
        m.d.comb += armed.eq(self.arm & ~self.fired)
        dropping, recording, replaying, killed = Signal(), Signal(), Signal(), Signal()
        stall_left = Signal(16)
        n_rec = Signal(range(self.max_sub_flits + 1))
        r_idx = Signal(range(self.max_sub_flits + 1))
        give = Signal(V)                  # credits to hand the sender for dropped flits
        swallow = Signal(V)               # receiver credits of replayed flits to withhold

        pop = Signal()
        out_v, out_beat = Signal(), Signal(self.beat_bits)
        m.d.comb += [out_beat.eq(head), self.o.valid.eq(out_v),
                     self.o.flit.eq(out_beat[:fmt.flit_bits]),
                     self.o.crc.eq(out_beat[fmt.flit_bits:]), q.r_en.eq(pop),
                     rr.addr.eq(r_idx)]
        with m.If(pop):
            m.d.sync += at_start.eq(is_end)

        start_stall = armed & (mode == FaultMode.STALL) & q.r_rdy
        with m.If(killed):
            m.d.comb += pop.eq(q.r_rdy)            # lost, credits too
        with m.Elif(replaying):
            m.d.comb += [out_v.eq(1), out_beat.eq(rr.data)]
            m.d.sync += r_idx.eq(r_idx + 1)
            with m.If(r_idx + 1 == n_rec):
                m.d.sync += replaying.eq(0)
        with m.Elif(stall_left != 0):
            m.d.sync += stall_left.eq(stall_left - 1)
        with m.Elif(start_stall):
            m.d.sync += [stall_left.eq(self.length), self.fired.eq(1)]
        with m.Elif(q.r_rdy):
            m.d.comb += pop.eq(1)
            drop_now = dropping | (armed & (mode == FaultMode.DROP) & at_start)
            m.d.comb += out_v.eq(~drop_now)
            with m.If(armed & (mode == FaultMode.FLIP)):
                m.d.comb += out_beat.eq(head ^ self.mask)
                m.d.sync += self.fired.eq(1)
            with m.If(armed & (mode == FaultMode.KILL)):
                m.d.comb += out_v.eq(0)
                m.d.sync += [killed.eq(1), self.fired.eq(1)]
            with m.If(drop_now):
                m.d.sync += [dropping.eq(~is_end), self.fired.eq(1)]
                m.d.comb += give.eq(1 << head_vc if V > 1 else 1)
            rec_now = recording | (armed & (mode == FaultMode.DUP) & at_start)
            with m.If(rec_now):
                m.d.comb += [rw.addr.eq(n_rec), rw.data.eq(head), rw.en.eq(1)]
                m.d.sync += [n_rec.eq(n_rec + 1), recording.eq(~is_end), self.fired.eq(1)]
                with m.If(is_end):
                    m.d.sync += [replaying.eq(1), r_idx.eq(0)]
        with m.If(replaying):
            rvc = rr.data[fmt.width + 3:fmt.width + 3 + fmt.vc_bits]
            m.d.comb += swallow.eq(1 << rvc if V > 1 else 1)

        # credits back to the sender: the receiver's, less those owed for replayed flits,
        # plus one per dropped flit (counted, since both may fall in one cycle)
        for v in range(V):
            owe = Signal(8, name=f"owe{v}")        # replayed credits still to withhold
            extra = Signal(8, name=f"extra{v}")    # dropped-flit credits still to give
            c_in = self.o.credit[v]
            hold = c_in & ((owe != 0) | swallow[v])
            send_rx = c_in & ~hold
            send_x = ~send_rx & ((extra != 0) | give[v])
            m.d.comb += self.i.credit[v].eq(~killed & (send_rx | send_x))
            m.d.sync += [owe.eq(owe + swallow[v] - hold),
                         extra.eq(extra + give[v] - send_x)]
        return m
