"""Serial link PHY (treenic.hdl.link.serial): the golden framing, and two
SerialLinkPorts (link CRC + PHY) wired lane to lane in the Amaranth simulator."""
import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from treenic.hdl.link.flit import FlitFormat, FlitType
from treenic.hdl.link.serial import (HEADER_DATA, HEADER_TRAIN, SerialFraming,
                                     SerialLinkPhy, SerialLinkPort)

FMT = FlitFormat(width=64, vcs=1, ports=4, nodes=4, flows=4, steps=18, offset_bits=14,
                 length_bits=14)


def test_framing_geometry_and_roundtrip():
    fr = SerialFraming(FMT, lanes=3)
    assert (fr.frame_cycles, fr.lane_payload, fr.word_bits) == (17, 32, 96)
    assert fr.line_rate(125e6)["payload_bps"] == pytest.approx(64 * 125e6 / 17)
    rng = random.Random(1)
    for _ in range(200):
        kw = dict(valid=rng.getrandbits(1), flit=rng.getrandbits(FMT.flit_bits),
                  crc=rng.getrandbits(16), credits=[rng.randrange(8)])
        d = fr.decode_data(fr.encode_data(**kw))
        assert d["valid"] == kw["valid"] and d["credits"] == kw["credits"]
        if kw["valid"]:
            assert (d["flit"], d["crc"]) == (kw["flit"], kw["crc"])
    lanes = fr.lane_frames(fr.encode_data(valid=1, flit=5, crc=7))
    assert len(lanes) == 3 and all(f & 3 == HEADER_DATA for f in lanes)
    assert fr.train_frame(3, 1) & 3 == HEADER_TRAIN


def test_frame_check_catches_every_single_and_double_bit_error():
    fr = SerialFraming(FMT, lanes=3)
    w = fr.encode_data(valid=1, flit=0x123456789, crc=0xBEEF, credits=[3])
    for i in range(fr.word_bits):
        assert fr.decode_data(w ^ (1 << i)) is None
        for j in range(i + 1, fr.word_bits, 7):
            assert fr.decode_data(w ^ (1 << i) ^ (1 << j)) is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="lanes"):
        SerialFraming(FMT, lanes=0)
    with pytest.raises(TypeError, match="SerialFraming"):
        SerialLinkPhy(FMT)
    with pytest.raises(ValueError, match="credit count"):
        SerialFraming(FMT).encode_data(valid=0, credits=[8])


class _Pair(wiring.Component):
    """Port A's lanes into port B and back (B's receive clock is A's, and vice versa)."""

    def __init__(self, fr):
        self.a = SerialLinkPort(fr, rx_domain="a_rx")
        self.b = SerialLinkPort(fr, rx_domain="b_rx")
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.a, m.submodules.b = self.a, self.b
        m.d.comb += [self.b.rx_lanes.eq(self.a.tx_lanes), self.a.rx_lanes.eq(self.b.tx_lanes)]
        return m


def _message(n_words):
    """A two-sub-packet all-reduce message (head, bodies, sub-tail, bodies, tail)."""
    head = FMT.make_flit(FlitType.SUB_HEAD, 0, FMT.pack_sub_head(flow=1, op=1, length=n_words))
    body = [FMT.make_flit(FlitType.SUB_BODY, 0, i * 0x1_0000_0001) for i in range(3)]
    return ([head] + body + [FMT.make_flit(FlitType.SUB_TAIL, 0, 7)] + body +
            [FMT.make_flit(FlitType.MSG_TAIL, 0, 9)])


def test_two_ports_lane_to_lane():
    """A trains with B, sends a message under B's credits; B's depacketiser side gets it
    bit for bit (a failed link CRC would have poisoned a flit type) and B's credits
    return to A."""
    fr = SerialFraming(FMT, lanes=3)
    dut = _Pair(fr)
    flits = _message(14)
    got, credits = [], []

    async def bench(ctx):
        ctx.set(dut.b.rx.credit, 0)
        for _ in range(4000):
            await ctx.tick()
            if ctx.get(dut.a.up) and ctx.get(dut.b.up):
                break
        assert ctx.get(dut.a.up) and ctx.get(dut.b.up), "links did not train"
        for f in flits:                                # 8 flits < 16 credits
            ctx.set(dut.a.tx.valid, 1)
            ctx.set(dut.a.tx.flit.as_value(), f)
            await ctx.tick()
        ctx.set(dut.a.tx.valid, 0)
        for _ in range(20 * 17):
            if ctx.get(dut.b.rx.valid):
                got.append(ctx.get(dut.b.rx.flit.as_value()))
                ctx.set(dut.b.rx.credit, 1)
            else:
                ctx.set(dut.b.rx.credit, 0)
            credits.append(ctx.get(dut.a.tx.credit))
            await ctx.tick()
        assert ctx.get(dut.b.crc_errors) == 0 and ctx.get(dut.b.frame_errors) == 0

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_clock(8e-9, domain="a_rx", phase=3e-9)
    sim.add_clock(8e-9, domain="b_rx", phase=5e-9)
    sim.add_testbench(bench)
    sim.run()
    assert got == flits
    assert sum(credits) == len(flits)
