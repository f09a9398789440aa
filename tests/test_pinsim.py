"""treenic.boards.pinsim: the host's frames (against scapy, which the cocotb reference
bench uses) and, when the Verilated board is built, a board through the C++ RGMII
harness."""
import os

import numpy as np
import pytest

from treenic.boards import pinsim

scapy = pytest.importorskip("scapy.all")
from scapy.layers.inet import IP, UDP          # noqa: E402
from scapy.layers.l2 import ARP, Ether          # noqa: E402


@pytest.mark.parametrize("size", [0, 1, 37, 1044])
def test_udp_frame_is_scapys(size):
    payload = bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
    ref = (Ether(src="02:00:00:00:00:01", dst="10:e2:d5:00:00:00") /
           IP(src="192.168.1.100", dst="192.168.1.50") / UDP(sport=7411, dport=7411) / payload)
    assert pinsim.udp_frame(payload) == bytes(ref)
    kind, got, sport, dport = pinsim.parse_frame(bytes(ref) + bytes(max(0, 60 - len(ref))))
    assert (kind, got, sport, dport) == ("udp", payload, 7411, 7411)


def test_arp_reply_is_scapys():
    req = bytes(Ether(src="10:e2:d5:00:00:00", dst="ff:ff:ff:ff:ff:ff") /
                ARP(op=1, hwsrc="10:e2:d5:00:00:00", psrc="192.168.1.50",
                    pdst="192.168.1.100")) + bytes(18)
    ref = (Ether(src="02:00:00:00:00:01", dst="10:e2:d5:00:00:00") /
           ARP(op=2, hwsrc="02:00:00:00:00:01", psrc="192.168.1.100",
               hwdst="10:e2:d5:00:00:00", pdst="192.168.1.50"))
    assert pinsim.arp_reply(req) == bytes(ref)
    other = bytes(Ether() / ARP(op=1, pdst="192.168.1.7"))
    assert pinsim.arp_reply(other) is None
    assert pinsim.parse_frame(bytes(60))[0] == "other"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TREENIC_BOARD_BUILD_TESTS"),
                    reason="builds the Verilated board (minutes): TREENIC_BOARD_BUILD_TESTS=1")
def test_board_through_rgmii_harness():
    """ID, PARAMS and a buffer WRITE/READ through one board's RGMII pins (the request
    and reply wire format from the udp backend's own model)."""
    from treenic.boards.boardsim import SIM_NIC
    from treenic.hdl.host import model as wire
    from treenic.hdl.nic import NicParams
    from treenic.hdl.nic.params import ID_VALUE, Reg

    p = NicParams(**SIM_NIC)
    cl = pinsim.PinCluster("ring:4", p)
    cl.reset()

    def request(data: bytes):
        cl.push(0, pinsim.udp_frame(data))
        for _ in range(200):
            cl.run(5000)
            while (f := cl.pop(0)) is not None:
                kind, *rest = pinsim.parse_frame(f)
                if kind == "arp":
                    cl.push(0, pinsim.arp_reply(f))
                elif kind == "udp":
                    return wire.decode_reply(rest[0])
        raise AssertionError("no reply")

    rep = request(wire.encode_request(wire.Op.READ, 1, int(Reg.ID), 1))
    assert rep.payload[0] == ID_VALUE
    words = np.random.default_rng(3).integers(0, 1 << 32, 200, dtype=np.uint64).astype(np.uint32)
    request(wire.encode_request(wire.Op.WRITE, 2, p.buf_addr(0), payload=words))
    back = request(wire.encode_request(wire.Op.READ, 3, p.buf_addr(0), 200))
    assert np.array_equal(np.asarray(back.payload, dtype=np.uint32), words)
    s = cl.stats()
    assert s["fcs_errors"] == 0 and s["framing_errors"] == 0 and s["frames_out"] >= 3
    cl.close()
