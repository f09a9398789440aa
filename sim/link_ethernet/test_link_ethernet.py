"""Bench of the flits-in-Ethernet-frames links (:mod:`treenic.hdl.link.ethernet`): a
2-port DatagramLinks with the bench playing both peer boards, random traffic under
credits, random stream backpressure and gaps, malformed datagrams; every datagram and
delivered flit is compared bit for bit with the golden encoder/decoder."""
from harness import run_bench

from treenic.boards.boardsim import SIM_NIC
from treenic.hdl.link.ethernet import DatagramLinks
from treenic.hdl.nic import NicParams

PEERS = [["10.0.0.2", 1], ["10.0.0.3", 0]]


def _bench(testcase, **params):
    fmt = NicParams(**SIM_NIC).fmt
    run_bench(DatagramLinks(fmt, peers=PEERS, tx_depth=32, max_flits=12, credit_delay=64),
              name="link_ethernet", test_module="link_ethernet_tb", testcase=testcase,
              params={"nic": SIM_NIC, "peers": PEERS, "max_flits": 12, **params})


def test_datagram_links_send():
    _bench("send", flits=400)


def test_datagram_links_receive():
    _bench("receive", datagrams=300)
