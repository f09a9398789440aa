"""Amaranth top levels for the link benches (elaborated by the pytest entries)."""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from treenic.hdl.link.flit import FlitFormat
from treenic.hdl.link.packetiser import Packetiser, PacketiserStatusSignature
from treenic.hdl.link.depacketiser import Depacketiser, DepacketiserStatusSignature
from treenic.hdl.link.link import LinkChannel


class LoopbackTop(wiring.Component):
    """packetiser -> LinkChannel (latency, LFSR stalls) -> depacketiser."""

    def __init__(self, fmt: FlitFormat, *, mode, sub_words, packet_words, credits, latency,
                 stall, seed):
        self.fmt = fmt
        self._p = Packetiser(fmt, mode=mode, sub_words=sub_words, packet_words=packet_words,
                             credits=credits)
        self._l = LinkChannel(fmt, latency=latency, stall=stall, seed=seed,
                            depth=credits * fmt.vcs + latency + 2)
        self._d = Depacketiser(fmt, sub_words=sub_words, credits=credits)
        super().__init__({
            "hdr": In(stream.Signature(fmt.header)),
            "data": In(stream.Signature(fmt.words)),
            "o_hdr": Out(stream.Signature(fmt.header)),
            "o_data": Out(stream.Signature(fmt.out_beat)),
            "flow_enable": In(fmt.flows),
            "tx_status": Out(PacketiserStatusSignature()),
            "rx_status": Out(DepacketiserStatusSignature()),
            "link_overflow": Out(1),
            "link_stalls": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        p, l, d = self._p, self._l, self._d
        m.submodules.packetiser, m.submodules.link, m.submodules.depacketiser = p, l, d
        wiring.connect(m, wiring.flipped(self.hdr), p.hdr)
        wiring.connect(m, wiring.flipped(self.data), p.data)
        wiring.connect(m, p.tx, l.i)
        wiring.connect(m, l.o, d.rx)
        wiring.connect(m, d.hdr, wiring.flipped(self.o_hdr))
        wiring.connect(m, d.data, wiring.flipped(self.o_data))
        wiring.connect(m, wiring.flipped(self.rx_status), d.status)
        wiring.connect(m, wiring.flipped(self.tx_status), p.status)
        m.d.comb += [d.flow_enable.eq(self.flow_enable),
                     self.link_overflow.eq(l.overflow), self.link_stalls.eq(l.stalls)]
        return m


class EfficiencyTop(wiring.Component):
    """A packetiser sending to an ideal receiver (every flit's credit comes back the next
    cycle) with an always-valid payload stream: counts the flits of one long message."""

    def __init__(self, fmt: FlitFormat, *, mode, sub_words, packet_words, credits=4):
        self.fmt = fmt
        self._p = Packetiser(fmt, mode=mode, sub_words=sub_words, packet_words=packet_words,
                             credits=credits)
        super().__init__({
            "hdr": In(stream.Signature(fmt.header)),
            "status": Out(PacketiserStatusSignature()),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self._p
        m.submodules.packetiser = p
        wiring.connect(m, wiring.flipped(self.hdr), p.hdr)
        wiring.connect(m, wiring.flipped(self.status), p.status)
        word = Signal(32)
        with m.If(p.data.ready):
            m.d.sync += word.eq(word + 2)
        m.d.comb += [p.data.valid.eq(1), p.data.payload[0].eq(word)]
        for i in range(1, self.fmt.lanes):
            m.d.comb += p.data.payload[i].eq(word + i)
        for v in range(self.fmt.vcs):
            m.d.sync += p.tx.credit[v].eq(p.tx.valid & (p.tx.flit.vc == v))
        m.d.comb += self.busy.eq(~p.hdr.ready | p.tx.valid)
        return m
