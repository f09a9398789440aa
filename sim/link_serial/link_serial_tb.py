"""cocotb side of sim/link_serial (see test_link_serial.py)."""
import random
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge, Timer

from harness import bench_params, bench_seed
from treenic.hdl.link.serial import SerialFraming
from treenic.hdl.nic import NicParams

PERIOD_NS = 8                  # 125 MHz, the NIC clock; the receive clock has its own phase


class Cable:
    """tx_lanes -> per-lane delay (skew, in bits) and bit flips -> rx_lanes."""

    def __init__(self, dut, lanes, skews, rng):
        self.dut, self.lanes, self.rng = dut, lanes, rng
        self.q = [deque(rng.getrandbits(1) for _ in range(8 + s)) for s in skews]
        self.seen = [[] for _ in range(lanes)]        # bits as the receiver got them
        self.ber, self.flips = 0.0, 0

    async def sender(self):
        while True:
            await FallingEdge(self.dut.clk)
            v = int(self.dut.tx_lanes.value)
            for k in range(self.lanes):
                for b in (v >> (2 * k)) & 1, (v >> (2 * k + 1)) & 1:
                    if self.ber and self.rng.random() < self.ber:
                        b ^= 1
                        self.flips += 1
                    self.q[k].append(b)

    async def receiver(self):
        while True:
            await FallingEdge(self.dut.link_rx_clk)
            v = 0
            for k in range(self.lanes):
                for j in range(2):
                    b = self.q[k].popleft()
                    self.seen[k].append(b)
                    v |= b << (2 * k + j)
            self.dut.rx_lanes.value = v


class Nic:
    """Both NIC sides of the looped link: a credit-honouring sender on ``i`` and a
    receiver on ``o`` that returns each credit after a random delay."""

    def __init__(self, dut, fmt, credits, rng):
        self.dut, self.fmt, self.rng = dut, fmt, rng
        self.credits, self.credit_pulses = credits, 0
        self.sent, self.got, self.owed = [], [], []

    def random_flit(self):
        return (self.rng.getrandbits(self.fmt.width + 3), self.rng.getrandbits(16))

    async def run(self, n_flits, rate):
        dut = self.dut
        while True:
            await FallingEdge(dut.clk)
            self.credits += int(dut.i__credit.value)
            self.credit_pulses += int(dut.i__credit.value)
            if int(dut.o__valid.value):
                self.got.append((int(dut.o__flit.value), int(dut.o__crc.value)))
                self.owed.append(self.rng.randrange(0, 24))
            self.owed = [d - 1 for d in self.owed]
            ret = any(d < 0 for d in self.owed)
            if ret:
                self.owed.remove(min(self.owed))
            dut.o__credit.value = int(ret)
            go = (len(self.sent) < n_flits and self.credits > 0 and self.rng.random() < rate)
            dut.i__valid.value = int(go)
            if go:
                f = self.random_flit()
                dut.i__flit.value, dut.i__crc.value = f
                self.sent.append(f)
                self.credits -= 1


async def setup(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    params = NicParams(**p["nic"])
    fr = SerialFraming(params.fmt, lanes=p["lanes"])
    for s in ("i__valid", "i__flit", "i__crc", "o__credit", "rx_lanes"):
        getattr(dut, s).value = 0
    dut.rst.value = dut.link_rx_rst.value = 1
    cocotb.start_soon(Clock(dut.clk, PERIOD_NS, unit="ns").start())
    await Timer(rng.randrange(1, PERIOD_NS * 1000 - 1), unit="ps")   # cable delay / phase
    cocotb.start_soon(Clock(dut.link_rx_clk, PERIOD_NS, unit="ns").start())
    cable = Cable(dut, fr.lanes, p["skews"], rng)
    cocotb.start_soon(cable.sender())
    cocotb.start_soon(cable.receiver())
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = dut.link_rx_rst.value = 0
    nic = Nic(dut, params.fmt, params.credits, rng)
    return p, rng, fr, cable, nic


async def wait_up(dut, fr, limit):
    for t in range(limit):
        await RisingEdge(dut.clk)
        if int(dut.up.value):
            return t
    raise AssertionError(f"link not up after {limit} cycles "
                         f"(lanes locked {int(dut.lane_locked.value):b})")


async def drain(dut, nic, quiet=3000):
    """Run until nothing changed for *quiet* cycles."""
    last, still = None, 0
    while still < quiet:
        await RisingEdge(dut.clk)
        now = (len(nic.sent), len(nic.got), nic.credit_pulses)
        still = still + 1 if now == last else 0
        last = now


def golden_check(dut, fr, cable, nic):
    gold = fr.decode_streams(cable.seen)
    want = [(d["flit"], d["crc"]) for d in gold["data"] if d["valid"]]
    first = next((i for i, (a, b) in enumerate(zip(nic.got, want)) if a != b),
                 min(len(nic.got), len(want)))
    assert nic.got == want, (f"RTL delivered {len(nic.got)} flits, golden receiver "
                             f"{len(want)}; first difference at flit {first}")
    credits = sum(sum(d["credits"]) for d in gold["data"])
    assert nic.credit_pulses == credits, f"credits {nic.credit_pulses} != golden {credits}"
    assert int(dut.frame_errors.value) == gold["bad"], (
        f"frame_errors {int(dut.frame_errors.value)} != golden {gold['bad']}")
    assert int(dut.overflow.value) == 0
    return gold


@cocotb.test()
async def clean_link(dut):
    p, rng, fr, cable, nic = await setup(dut)
    t_up = await wait_up(dut, fr, 8000)
    dut._log.info(f"link up after {t_up} cycles, lanes skewed {p['skews']} bits")
    cocotb.start_soon(nic.run(p["flits"], rate=0.7))
    await drain(dut, nic)
    assert nic.got == nic.sent, f"sent {len(nic.sent)}, got {len(nic.got)} (or reordered)"
    assert len(nic.sent) == p["flits"]
    assert nic.credits == NicParams(**p["nic"]).credits, "credits not all returned"
    golden_check(dut, fr, cable, nic)
    assert int(dut.frame_errors.value) == 0


@cocotb.test()
async def bit_errors(dut):
    p, rng, fr, cable, nic = await setup(dut)
    await wait_up(dut, fr, 8000)
    cable.ber = p["ber"]
    cocotb.start_soon(nic.run(p["flits"], rate=0.7))
    await drain(dut, nic)
    cable.ber = 0.0
    gold = golden_check(dut, fr, cable, nic)
    it = iter(nic.sent)
    assert all(f in it for f in nic.got), "a delivered flit was not sent in that order"
    assert cable.flips > 0 and gold["bad"] > 0, "no errors were injected"
    assert int(dut.up.value) == 1, "bit errors at this rate must not unlock the link"
    dut._log.info(f"{cable.flips} bit flips: {gold['bad']} words dropped, "
                  f"{len(nic.got)}/{len(nic.sent)} flits delivered")
