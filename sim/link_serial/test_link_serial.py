"""Bench of the serial link PHY (:mod:`treenic.hdl.link.serial`): one PHY with its lanes
looped through a cable model (per-lane skew, bit errors, a receive clock of its own
phase), random flit traffic under the credit protocol and random credit-return delays;
the RTL's received flits, credits and dropped words are compared bit for bit with the
golden receiver (:meth:`SerialFraming.decode_streams`) run on the same lane bits."""
from harness import run_bench

from treenic.boards.boardsim import SIM_NIC
from treenic.hdl.link.serial import SerialFraming, SerialLinkPhy
from treenic.hdl.nic import NicParams


def _bench(testcase, **params):
    fmt = NicParams(**SIM_NIC).fmt
    run_bench(SerialLinkPhy(SerialFraming(fmt, lanes=3), tx_depth=32),
              name="link_serial", test_module="link_serial_tb", testcase=testcase,
              params={"nic": SIM_NIC, "lanes": 3, **params})


def test_serial_link_skew_and_backpressure():
    """Lane skews up to more than one frame, random stalls: every flit and credit
    arrives, in order, exactly."""
    _bench("clean_link", flits=300, skews=[0, 13, 41])


def test_serial_link_bit_errors():
    """Random bit errors after training: damaged words are dropped and counted, never
    delivered; the rest matches the golden receiver bit for bit."""
    _bench("bit_errors", flits=300, skews=[5, 0, 2], ber=4e-4)
