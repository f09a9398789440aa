"""Flits in Ethernet frames (treenic.hdl.link.ethernet): golden codec, argument checks,
and two boards' DatagramLinks (with the link CRC) talking through a bridged stream in the
Amaranth simulator."""
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from treenic.boards.colorlight import link_peers
from treenic.hdl.link.crc import CrcAppender, CrcChecker
from treenic.hdl.link.ethernet import (MAX_FLITS, DatagramLinks, _ip, decode_datagram,
                                       encode_datagram)
from treenic.hdl.link.flit import FlitFormat, FlitType

FMT = FlitFormat(width=64, vcs=1, ports=4, nodes=4, flows=4, steps=18, offset_bits=14,
                 length_bits=14)


def test_codec_round_trip_and_checks():
    flits = [(FMT.make_flit(FlitType.SUB_BODY, 0, k * 77), k) for k in range(5)]
    words = encode_datagram(FMT, dst_port=1, src_port=0, credits=[3], flits=flits)
    peers = [("10.0.0.9", 3), ("10.0.0.2", 0)]
    d = decode_datagram(FMT, words, length=4 * len(words), src_ip="10.0.0.2", peers=peers,
                        max_flits=8)
    assert d == (1, [3], flits)
    for bad in ({"src_ip": "10.0.0.3"}, {"length": 4 * len(words) + 4}):
        kw = dict(length=4 * len(words), src_ip="10.0.0.2", peers=peers, max_flits=8) | bad
        assert decode_datagram(FMT, words, **kw) is None
    assert decode_datagram(FMT, words, length=4 * len(words), src_ip="10.0.0.2",
                           peers=peers, max_flits=4) is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="IPv4"):
        DatagramLinks(FMT, peers=[("10.0.0", 0)])
    with pytest.raises(ValueError, match="max_flits"):
        DatagramLinks(FMT, peers=[("10.0.0.1", 0)], max_flits=MAX_FLITS + 1, tx_depth=256)
    with pytest.raises(ValueError, match="peer port"):
        DatagramLinks(FMT, peers=[("10.0.0.1", 16)])
    with pytest.raises(ValueError, match="needs 3 ports"):
        link_peers("torus:2x3", 0, 2)


class _TwoBoards(wiring.Component):
    """Board 0 port 0 <-> board 1 port 0 (ring:2 through a 'switch' that forwards each
    datagram with its source address)."""

    def __init__(self):
        self.links = [DatagramLinks(FMT, peers=[("10.0.0.2", 0)]),
                      DatagramLinks(FMT, peers=[("10.0.0.1", 0)])]
        self.app = [CrcAppender(FMT), CrcAppender(FMT)]
        self.chk = [CrcChecker(FMT), CrcChecker(FMT)]
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        for b in range(2):
            m.submodules[f"links{b}"] = self.links[b]
            m.submodules[f"app{b}"], m.submodules[f"chk{b}"] = self.app[b], self.chk[b]
            wiring.connect(m, self.app[b].o, self.links[b].i[0])
            wiring.connect(m, self.links[b].o[0], self.chk[b].i)
        for a, b in ((0, 1), (1, 0)):                  # the switch
            tx, rx = self.links[a].tx, self.links[b].rx
            m.d.comb += [rx.valid.eq(tx.valid), tx.ready.eq(rx.ready),
                         rx.payload.data.eq(tx.payload.data),
                         rx.payload.last.eq(tx.payload.last),
                         rx.payload.length.eq(tx.payload.length),
                         rx.payload.peer.eq(_ip(f"10.0.0.{a + 1}"))]
        return m


def test_two_boards_through_a_switch():
    dut = _TwoBoards()
    head = FMT.make_flit(FlitType.SUB_HEAD, 0, FMT.pack_sub_head(flow=1, op=1, length=14))
    body = [FMT.make_flit(FlitType.SUB_BODY, 0, i * 0x1_0000_0003) for i in range(3)]
    msg = ([head] + body + [FMT.make_flit(FlitType.SUB_TAIL, 0, 7)] + body +
           [FMT.make_flit(FlitType.MSG_TAIL, 0, 9)])
    got, credits = [], []

    async def bench(ctx):
        for f in msg:
            ctx.set(dut.app[0].i.valid, 1)
            ctx.set(dut.app[0].i.flit.as_value(), f)
            await ctx.tick()
        ctx.set(dut.app[0].i.valid, 0)
        for _ in range(400):
            if ctx.get(dut.chk[1].o.valid):
                got.append(ctx.get(dut.chk[1].o.flit.as_value()))
                ctx.set(dut.chk[1].o.credit, 1)       # board 1's NIC frees the slot
            else:
                ctx.set(dut.chk[1].o.credit, 0)
            credits.append(ctx.get(dut.app[0].i.credit))
            await ctx.tick()
        assert ctx.get(dut.chk[1].errors) == 0
        assert ctx.get(dut.links[0].dropped) == 0 and ctx.get(dut.links[1].dropped) == 0

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    assert got == msg
    assert sum(credits) == len(msg)       # returned in board 1's credit-only datagram


def test_link_peers_follow_the_wiring_plan():
    """ring:4 node 1: port 0 -> node 0's port 0, port 1 -> node 2's port 0 (the same
    pairs the fabric's wiring plan cables)."""
    assert link_peers("ring:4", 1, 2) == [("192.168.2.50", 0), ("192.168.2.52", 0)]
    assert link_peers("ring:4", 3, 2) == [("192.168.2.50", 1), ("192.168.2.52", 1)]
    with pytest.raises(ValueError, match="not in ring:4"):
        link_peers("ring:4", 4, 2)
