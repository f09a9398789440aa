"""Packetiser: message (header + binary32 word stream) -> flits, with per-VC credits.

Two modes (a constructor parameter, for comparison):

* ``"message"`` (MultiTree message-based flow control, paper §IV-B): one SUB_HEAD flit per
  message, then the payload in sub-packets of ``sub_words`` words; every non-final
  sub-packet ends with a SUB_TAIL flit, the final one with MSG_TAIL (Table II);
* ``"packet"`` (conventional): packets of ``packet_words`` words (default 64 = 256 B), each
  HEAD, BODY..., TAIL; a zero-length message is one HEAD_TAIL flit.

The flit sequence is exactly :func:`treenic.hdl.link.model.packetise`.  A flit is sent
only with a credit for its VC; the credit counters start at ``credits`` (the downstream
buffer depth per VC) and are refilled by the ``tx.credit`` return pulses.
"""

from amaranth.hdl import Module, Signal, Mux, Cat
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .flit import FlitFormat, FlitType, LinkSignature
from .model import MESSAGE, DEFAULT_SUB_WORDS, _check_mode

__all__ = ["Packetiser", "PacketiserStatusSignature"]


class PacketiserStatusSignature(wiring.Signature):
    """Counters (free-running, wrap): flits sent, head flits sent, messages dropped
    (zero-length message in message mode -- Table II has no single-flit sub-packet)."""

    def __init__(self):
        super().__init__({"flits": Out(32), "heads": Out(32), "dropped": Out(16)})


class Packetiser(wiring.Component):
    """Message -> flit stream.

    Ports:
        hdr: ``In(stream.Signature(fmt.header))`` -- one per message; uses ``vc, next,
            eject`` (message mode) or ``dest, src`` (packet mode), ``flow, op, step,
            offset, length`` (words).
        data: ``In(stream.Signature(fmt.words))`` -- ``ceil(length / lanes)`` beats of
            ``lanes`` (= width/32) words per message, word ``i`` of the message in lane
            ``i % lanes``; unused lanes of the last beat are ignored.
        tx: ``Out(LinkSignature(fmt))`` -- flits out, credits in.
        status: ``Out(PacketiserStatusSignature())``.
    """

    def __init__(self, fmt: FlitFormat | None = None, *, mode: str = MESSAGE,
                 sub_words: int = DEFAULT_SUB_WORDS, packet_words: int | None = None,
                 credits: int = 8):
        self.fmt = fmt = fmt or FlitFormat()
        self.mode = mode
        self.sub_words = sub_words
        self.packet_words = fmt.max_packet_words if packet_words is None else packet_words
        _check_mode(fmt, mode, sub_words, self.packet_words)
        if credits < 1:
            raise ValueError("credits must be >= 1")
        self.credits = credits
        super().__init__({
            "hdr": In(stream.Signature(fmt.header)),
            "data": In(stream.Signature(fmt.words)),
            "tx": Out(LinkSignature(fmt)),
            "status": Out(PacketiserStatusSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        W = fmt.lanes
        msg_mode = self.mode == MESSAGE

        h = Signal(fmt.header)
        done = Signal(fmt.length_bits)       # words sent of the message
        sub = Signal(fmt.length_bits)        # words sent in the current sub-packet/packet

        cbits = ceil_log2(self.credits + 1)
        cred = [Signal(cbits, init=self.credits, name=f"cred{v}") for v in range(fmt.vcs)]
        have_credit = Signal()
        for v in range(fmt.vcs):
            with m.If(h.vc == v):
                m.d.comb += have_credit.eq(cred[v] != 0)

        send = Signal()
        flit_type = Signal(FlitType)
        flit_data = Signal(fmt.width)

        # Words left, and whether the next payload flit ends the message / the sub-packet
        # (packet), are kept in registers set one flit ahead, so the send decision -- a
        # handshake with the TX FIFO -- reaches no subtract or compare (a timing path).
        rem = Signal(fmt.length_bits)        # words left of the message
        last_flit = Signal()                 # rem <= W
        sub_end = Signal()                   # the next payload flit ends a sub-packet/packet
        seg = self.sub_words if msg_mode else self.packet_words
        k = Signal(range(W + 1))
        m.d.comb += k.eq(Mux(last_flit, rem, W))

        # registered link output; the counters count the registered sends
        sent = Signal()
        head_sent = Signal()
        m.d.sync += [self.tx.valid.eq(send), sent.eq(send), head_sent.eq(0),
                     self.status.flits.eq(self.status.flits + sent),
                     self.status.heads.eq(self.status.heads + head_sent)]
        with m.If(send):
            m.d.sync += [self.tx.flit.type.eq(flit_type), self.tx.flit.vc.eq(h.vc),
                         self.tx.flit.data.eq(flit_data)]
        for v in range(fmt.vcs):
            used = send & (h.vc == v)
            m.d.sync += cred[v].eq(cred[v] + self.tx.credit[v] - used)

        # head info
        sub_head = Signal(fmt.sub_head)
        pkt_head = Signal(fmt.pkt_head)
        plen = Signal(fmt.plen_bits)
        m.d.comb += plen.eq(Mux(rem > self.packet_words, self.packet_words, rem))
        m.d.comb += [
            sub_head.next.eq(h.next), sub_head.eject.eq(h.eject), sub_head.flow.eq(h.flow),
            sub_head.op.eq(h.op), sub_head.step.eq(h.step), sub_head.offset.eq(h.offset),
            sub_head.length.eq(h.length),
            pkt_head.dest.eq(h.dest), pkt_head.src.eq(h.src), pkt_head.flow.eq(h.flow),
            pkt_head.op.eq(h.op), pkt_head.step.eq(h.step),
            pkt_head.offset.eq(h.offset + done), pkt_head.length.eq(plen),
        ]
        # payload with unused lanes zeroed
        lanes = []
        for i in range(W):
            lanes.append(Mux(k > i, self.data.payload[i], 0))
        payload = Cat(*lanes)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.hdr.ready.eq(1)
                with m.If(self.hdr.valid):
                    ln = self.hdr.payload.length
                    m.d.sync += [h.eq(self.hdr.payload), done.eq(0), sub.eq(0), rem.eq(ln),
                                 last_flit.eq(ln <= W), sub_end.eq(seg <= W)]
                    if msg_mode:
                        with m.If(self.hdr.payload.length == 0):
                            m.d.sync += self.status.dropped.eq(self.status.dropped + 1)
                        with m.Else():
                            m.next = "HEAD"
                    else:
                        m.next = "HEAD"
            with m.State("HEAD"):
                m.d.comb += send.eq(have_credit)
                m.d.sync += head_sent.eq(send)
                if msg_mode:
                    m.d.comb += [flit_type.eq(FlitType.SUB_HEAD), flit_data.eq(sub_head)]
                    with m.If(send):
                        m.next = "DATA"
                else:
                    m.d.comb += [flit_type.eq(Mux(h.length == 0, FlitType.HEAD_TAIL,
                                                  FlitType.HEAD)),
                                 flit_data.eq(pkt_head)]
                    with m.If(send):
                        m.next = "DATA"
                        with m.If(h.length == 0):
                            m.next = "IDLE"
            with m.State("DATA"):
                m.d.comb += [self.data.ready.eq(have_credit),
                             send.eq(have_credit & self.data.valid),
                             flit_data.eq(payload)]
                if msg_mode:
                    with m.If(last_flit):
                        m.d.comb += flit_type.eq(FlitType.MSG_TAIL)
                    with m.Elif(sub_end):
                        m.d.comb += flit_type.eq(FlitType.SUB_TAIL)
                    with m.Else():
                        m.d.comb += flit_type.eq(FlitType.SUB_BODY)
                    with m.If(send):
                        # (a flit that is not the message's last carries W words)
                        m.d.sync += [done.eq(done + k), rem.eq(rem - W),
                                     last_flit.eq(rem <= 2 * W),
                                     sub.eq(Mux(sub_end, 0, sub + W)),
                                     sub_end.eq(Mux(sub_end, seg <= W, sub >= seg - 2 * W))]
                        with m.If(last_flit):
                            m.next = "IDLE"
                else:
                    pkt_end = Signal()
                    m.d.comb += pkt_end.eq(last_flit | sub_end)
                    m.d.comb += flit_type.eq(Mux(pkt_end, FlitType.TAIL, FlitType.BODY))
                    with m.If(send):
                        m.d.sync += [done.eq(done + k), rem.eq(rem - W),
                                     last_flit.eq(rem <= 2 * W),
                                     sub.eq(Mux(pkt_end, 0, sub + W)),
                                     sub_end.eq(Mux(pkt_end, seg <= W, sub >= seg - 2 * W))]
                        with m.If(last_flit):
                            m.next = "IDLE"
                        with m.Elif(pkt_end):
                            m.next = "HEAD"
        return m
