"""Transmit unit of one NIC port: DMA from the gradient buffer into a FIFO, the packetiser,
the link.

::

    go + descriptor ─► addr/left ─► buffer read (lanes words/grant) ─► FIFO ─► Packetiser ─► link
                   └─► header register (dest = PEER[port]) ──────────────────────┘

A descriptor (flow, op, step, start, size) sent with ``go`` becomes one message: the
header waits for the first data beat (no bubble on the link behind the header while the
buffer read is in flight), then ``ceil(size / lanes)`` beats follow at up to one per
cycle.  Golden model: the flits of :func:`treenic.hdl.link.model.packetise` for the same
message (``tests/hdl/test_tx_unit.py``).

Cut-through builds (``NicParams.forward == "cut-through"``): the issue logic starts a
message as soon as it is due, before the data it forwards is all in (``desc.paced``).  The
descriptor names the source ports (``src``: a REDUCE's children, a GATHER's parent, a
root GATHER's expected children) and whether they send REDUCE contributions or GATHER
data (``src_red``).  A paced unit requests the beat at ``addr`` only when every source
port has either finished the flow (its arrived bit) or has its open message on the flow
with ``done_to >= addr + lanes`` (written back through the beat).  That test is
registered (``pace_ok``) from the sources' state and ``addr + lanes`` (no grant taken)
or ``addr + 2·lanes`` (a grant taken this cycle), so the bank grant only sees one more
register in the request's AND (at ``go`` the first beat's test is made from the
descriptor).  ``done_to`` is set a cycle after the write-back it reports and the test
adds another, so the read always sees the written value (buffer contract: a write is
visible to reads requested a cycle later).  The head flit of a cut-through message leaves
without waiting for the first data beat: the link carries it during the buffer read.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..link.flit import LinkSignature, Op
from ..link.packetiser import Packetiser
from .buffer import READ_LATENCY, BufferReadSignature
from .params import NicParams

__all__ = ["TxUnit", "TxDescriptor", "TX_FIFO_DEPTH", "buffer_abits"]

#: TX unit FIFO (beats): covers the buffer's read latency plus the FIFO's own at full rate
TX_FIFO_DEPTH = 1 << ceil_log2(READ_LATENCY + 4)


def buffer_abits(params: NicParams) -> int:
    """Address bits of the :class:`~.buffer.BankedBuffer` the NIC builds for ``params``."""
    bank_depth = -(-params.depth // params.banks)
    return max(1, ceil_log2(bank_depth * params.banks))


def TxDescriptor(params: NicParams) -> data.StructLayout:
    """What the issue logic hands a TX unit: the head entry's flow, op, step, chunk; in
    cut-through builds also ``paced`` (issued before its data was all in), ``src`` (the
    source ports) and ``src_red`` (they send REDUCE contributions, else GATHER data)."""
    fields = {"flow": params.flow_bits, "op": Op, "step": params.step_bits,
              "start": params.abits, "size": params.abits}
    if params.cut_through:
        fields.update(paced=1, src=params.ports, src_red=1)
    return data.StructLayout(fields)


class TxUnit(wiring.Component):
    """DMA + FIFO + :class:`~treenic.hdl.link.packetiser.Packetiser` of one port.

    Parameters
    ----------
    params : NicParams
        The NIC build.
    port : int
        This unit's port index (the header's ``next``/``eject`` fields).

    Members
    -------
    link : ``Out(LinkSignature(params.fmt))``
        Flits out, credits in.
    read : ``Out(BufferReadSignature)``
        The unit's reader of the gradient buffer.
    go : ``In(1)``
        Load ``desc`` and start a message (only while ``idle``).
    desc : ``In(TxDescriptor(params))``
        The message to send.
    peer, node_id : ``In(16)``
        Packet-mode destination and source of the header.
    clear : ``In(1)``
        Zero the words counter.
    idle : ``Out(1)``
        Nothing loaded, in flight or queued, and the packetiser takes a header.
    flits, heads, words : ``Out(32)``
        Flits and head flits sent (the packetiser's), payload words issued.
    msg_flow, msg_step : ``Out``
        Flow and step of the message loaded last (the watchdog names a stuck unit's).
    sources : ``In(RxPortStateSignature(params)).array(ports)``, cut-through builds only
        Every receive unit's state (arrived bits, open message, ``done_to``).
    starved : ``Out(1)``, cut-through builds only
        A paced message waits for its sources' data (not for link credits).
    """

    def __init__(self, *, params: NicParams, port: int):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        if not 0 <= port < params.ports:
            raise ValueError(f"port {port} is not among the NIC's {params.ports} ports")
        self.params, self.port = params, port
        members = {
            "link": Out(LinkSignature(params.fmt)),
            "read": Out(BufferReadSignature(buffer_abits(params), params.lanes)),
            "go": In(1), "desc": In(TxDescriptor(params)),
            "peer": In(16), "node_id": In(16), "clear": In(1),
            "idle": Out(1), "flits": Out(32), "heads": Out(32), "words": Out(32),
            "msg_flow": Out(params.flow_bits), "msg_step": Out(params.step_bits)}
        if params.cut_through:
            # imported here: rx.py imports this module (buffer_abits)
            from .rx import RxPortStateSignature
            members.update(sources=In(RxPortStateSignature(params)).array(params.ports),
                           starved=Out(1))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p, W, AB = self.params, self.params.lanes, self.params.abits
        pk = Packetiser(p.fmt, mode=p.mode, sub_words=p.sub_words,
                        packet_words=p.packet_words, credits=p.credits)
        m.submodules.packetiser = pk
        wiring.connect(m, pk.tx, wiring.flipped(self.link))
        q = fifo.SyncFIFOBuffered(width=W * 32, depth=TX_FIFO_DEPTH)
        m.submodules.fifo = q
        brd = self.read
        addr = Signal(AB)
        left = Signal(AB)
        inflight = Signal(READ_LATENCY)        # reads in flight
        hdr_pend = Signal()
        hdr = Signal(p.fmt.header)
        issue = Signal()
        # FIFO slots not yet claimed by a read (in flight or written): all but one, more
        # than the read latency + the buffered FIFO's two cycles from write to output,
        # so a granted stream runs at one beat per cycle.  The request is an AND of
        # two registers (``room`` and ``left_nz``): it feeds the cross-port bank grant.
        room = Signal(range(TX_FIFO_DEPTH), init=TX_FIFO_DEPTH - 1)
        left_nz = Signal()
        pop = q.r_en & q.r_rdy
        pace_ok = self._pace(m, hdr.flow, issue, left_nz) if p.cut_through else 1
        # cut-through: the head flit leaves at once, while the first read is in flight
        # (it would otherwise cost the message two cycles on the link: the packetiser
        # takes a header, then sends its flit, then the data)
        early_head = int(p.cut_through)
        m.d.comb += [brd.req.eq(left_nz & (room != 0) & pace_ok), brd.addr.eq(addr),
                     issue.eq(brd.grant)]
        m.d.sync += [inflight.eq(Cat(issue, inflight[:-1])), room.eq(room - issue + pop)]
        with m.If(issue):
            m.d.sync += [addr.eq(addr + W), left.eq(Mux(left > W, left - W, 0)),
                         left_nz.eq(left > W)]
        m.d.comb += [q.w_data.eq(brd.data), q.w_en.eq(brd.valid),
                     pk.data.payload.eq(q.r_data), pk.data.valid.eq(q.r_rdy),
                     q.r_en.eq(pk.data.ready),
                     pk.hdr.payload.eq(hdr),
                     # the head flit waits for the first data beat: no bubble on the link
                     # behind it while the buffer read is in flight (``~left_nz``, not
                     # ``left == 0``: no wide compare in front of the packetiser's header
                     # load)
                     pk.hdr.valid.eq(hdr_pend & (q.r_rdy | (~left_nz & (inflight == 0)) |
                                                 early_head))]
        with m.If(pk.hdr.valid & pk.hdr.ready):
            m.d.sync += hdr_pend.eq(0)
        m.d.comb += self.idle.eq(~hdr_pend & ~left_nz & (inflight == 0) & ~q.r_rdy &
                                 pk.hdr.ready)
        d = self.desc
        with m.If(self.go):
            m.d.sync += [addr.eq(d.start), left.eq(d.size), left_nz.eq(d.size != 0),
                         hdr_pend.eq(1),
                         hdr.vc.eq(0), hdr.next.eq(self.port), hdr.eject.eq(self.port),
                         hdr.dest.eq(self.peer), hdr.src.eq(self.node_id),
                         hdr.flow.eq(d.flow), hdr.op.eq(d.op), hdr.step.eq(d.step),
                         hdr.offset.eq(d.start), hdr.length.eq(d.size),
                         self.words.eq(self.words + d.size)]
        with m.If(self.clear):
            m.d.sync += self.words.eq(0)
        m.d.comb += [self.flits.eq(pk.status.flits), self.heads.eq(pk.status.heads),
                     self.msg_flow.eq(hdr.flow), self.msg_step.eq(hdr.step)]
        return m

    def _pace(self, m, flow, issue, left_nz):
        """Cut-through: ``pace_ok``, the registered "the beat at ``addr`` is written back
        at every source port" (module docstring); 1 for a message issued with its data in."""
        p, W, AB, d = self.params, self.params.lanes, self.params.abits, self.desc
        paced, red = Signal(), Signal()
        src = Signal(p.ports)
        end1, end2 = Signal(AB + 1), Signal(AB + 1)    # addr + W, addr + 2W
        pace_ok = Signal()
        with m.If(issue):
            m.d.sync += [end1.eq(end1 + W), end2.eq(end2 + W)]
        m.d.sync += pace_ok.eq(~paced | Mux(issue, self._written(flow, red, src, end2),
                                            self._written(flow, red, src, end1)))
        with m.If(self.go):
            # the first beat's test from the descriptor itself (its registers load now)
            first = self._written(d.flow, d.src_red, d.src, d.start + W)
            m.d.sync += [paced.eq(d.paced), red.eq(d.src_red),
                         src.eq(d.src), end1.eq(d.start + W), end2.eq(d.start + 2 * W),
                         pace_ok.eq(~d.paced | first)]
        m.d.comb += self.starved.eq(left_nz & ~pace_ok)
        return pace_ok

    def _written(self, flow, red, src, end):
        """Every source port in ``src`` has finished ``flow`` (REDUCE contributions if
        ``red``, else GATHER data) or has its open message on it written back through
        ``end``."""
        ok = []
        for q, s in enumerate(self.sources):
            arrived = Mux(red, s.reduce_done, s.gather_done).bit_select(flow, 1)
            on_flow = s.msg_open & (s.msg_reduce == red) & (s.msg_flow == flow)
            ok.append(~src[q] | arrived | (on_flow & (s.done_to >= end)))
        return Cat(*ok).all()
