"""Per-sub-packet link CRC (hdl/link/crc.py): golden functions against an independent
bit-serial CRC, fault detection by the golden chain, and the RTL appender/checker against
the golden functions bit for bit on random traffic with random idles and random bit flips."""
import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from treenic.hdl.link import model
from treenic.hdl.link.crc import (LINK_CRC, SEQ_BITS, CrcAppender, CrcChecker, append_crc,
                                  check_crc, poison_type, subpacket_crc)
from treenic.hdl.link.flit import FlitFormat, FlitType

FMT = FlitFormat(vcs=2)


def bitserial_crc16_ccitt_false(bits):
    """Reference: MSB-first shift register, poly 0x1021, init 0xFFFF, no reflection."""
    reg = 0xFFFF
    for b in bits:
        top = ((reg >> 15) & 1) ^ b
        reg = ((reg << 1) & 0xFFFF) ^ (0x1021 if top else 0)
    return reg


def word_bits(words, width):
    return [(w >> (width - 1 - i)) & 1 for w in words for i in range(width)]


def test_catalogue_check_value():
    assert LINK_CRC(8).compute(b"123456789") == 0x29B1
    assert bitserial_crc16_ccitt_false(word_bits(b"123456789", 8)) == 0x29B1


def test_subpacket_crc_matches_bitserial_reference():
    rng = random.Random(1)
    W = FMT.flit_bits + SEQ_BITS
    for _ in range(30):
        flits = [rng.getrandbits(FMT.flit_bits) for _ in range(rng.randint(1, 9))]
        seq = rng.randrange(1 << SEQ_BITS)
        ref = bitserial_crc16_ccitt_false(word_bits([f | seq << FMT.flit_bits for f in flits], W))
        assert subpacket_crc(FMT, flits, seq) == ref


def traffic(rng, n_msgs, fmt=FMT, mode="message", sub_words=8):
    out = []
    for _ in range(n_msgs):
        n = rng.randint(1, 40)
        h = dict(vc=rng.randrange(fmt.vcs), flow=rng.randrange(4), op=rng.choice([1, 2]),
                 step=rng.randrange(8), offset=rng.randrange(1000), length=n)
        out.append((h, [rng.getrandbits(32) for _ in range(n)]))
    flits = []
    for h, w in out:
        flits += model.packetise(h, w, mode, fmt, sub_words=sub_words, packet_words=8)
    return out, flits


def delivered_keys(flits, sub_words=8):
    frags, _ = model.depacketise(flits, FMT, sub_words=sub_words)
    return [f.key() for f in frags]


def test_golden_depacketise_drops_what_the_checker_poisons():
    """A checked-and-failed sub-packet (any position) never reaches the depacketiser's
    output, and the rest of its message is discarded."""
    rng = random.Random(5)
    _, flits = traffic(rng, 6)
    beats = append_crc(FMT, flits)
    for i, (f, c) in enumerate(beats):
        if FMT.split_flit(f)[0] in (FlitType.SUB_TAIL, FlitType.MSG_TAIL):
            bad = list(beats)
            bad[i] = (f, c ^ 1)
            out, errors = check_crc(FMT, bad)
            assert errors == 1
            got, good = delivered_keys(out), delivered_keys(flits)
            assert set(got) < set(good)


@pytest.mark.parametrize("mode", ["message", "packet"])
def test_golden_clean_link_passes_everything(mode):
    _, flits = traffic(random.Random(2), 12, mode=mode)
    out, errors = check_crc(FMT, append_crc(FMT, flits))
    assert errors == 0 and out == flits


@pytest.mark.parametrize("mode", ["message", "packet"])
def test_golden_no_corrupted_fragment_is_ever_delivered(mode):
    """Random 1..3-bit flips, dropped / duplicated / swapped sub-packets: every fragment the
    golden depacketiser delivers after the checker is one the clean link delivers."""
    rng = random.Random(3)
    for trial in range(150):
        _, flits = traffic(rng, 4, mode=mode)
        good = set(delivered_keys(flits))
        beats = append_crc(FMT, flits)
        kind = trial % 4
        ends = [i for i, (f, _) in enumerate(beats)
                if FMT.split_flit(f)[0] in (FlitType.SUB_TAIL, FlitType.MSG_TAIL,
                                            FlitType.TAIL, FlitType.HEAD_TAIL)]
        if kind == 0:                                   # bit flips in one flit or its crc
            i = rng.randrange(len(beats))
            f, c = beats[i]
            for _ in range(rng.randint(1, 3)):
                b = rng.randrange(FMT.flit_bits + 16)
                if b < FMT.flit_bits:
                    f ^= 1 << b
                else:
                    c ^= 1 << (b - FMT.flit_bits)
            # (the sideband of a flit that ends no sub-packet carries nothing)
            changed = f != beats[i][0] or (c != beats[i][1] and i in ends)
            beats[i] = (f, c)
        else:                                           # whole sub-packets
            k = rng.randrange(len(ends))
            lo = ends[k - 1] + 1 if k else 0
            sp = beats[lo:ends[k] + 1]
            if kind == 1:
                del beats[lo:ends[k] + 1]
            elif kind == 2:
                beats[ends[k] + 1:ends[k] + 1] = sp
            elif k + 1 < len(ends):
                nxt = beats[ends[k] + 1:ends[k + 1] + 1]
                beats[lo:ends[k + 1] + 1] = nxt + sp
            changed = beats != append_crc(FMT, flits)
            if kind == 1:
                # the loss of a VC's last sub-packet leaves no later one to fail: that is
                # the watchdog's case (the message never completes)
                vc = FMT.split_flit(sp[0][0])[1]
                changed = any(FMT.split_flit(f)[1] == vc for f, _ in beats[lo:])
            elif kind == 3 and changed:
                # sub-packets of different VCs may pass each other (VCs are independent)
                changed = FMT.split_flit(sp[0][0])[1] == FMT.split_flit(nxt[0][0])[1]
        out, errors = check_crc(FMT, beats)
        got = delivered_keys(out)
        assert set(got) <= good, (trial, kind)
        if changed:
            # caught by the CRC, or (a flip that turns the last end flit into a body) the
            # receiver misses fragments: never silently complete
            assert errors > 0 or len(got) < len(good), (trial, kind)


def test_poison_type_is_never_a_head_and_switches_family():
    heads = {FlitType.SUB_HEAD.value, FlitType.HEAD.value, FlitType.HEAD_TAIL.value}
    for t in range(8):
        p = poison_type(t)
        assert p not in heads and (p & 4) != (t & 4)


class _Pair(Elaboratable):
    """appender -> (xor injection) -> checker."""

    def __init__(self, fmt):
        self.app = CrcAppender(fmt)
        self.chk = CrcChecker(fmt)
        self.flip_f = Signal(fmt.flit_bits)
        self.flip_c = Signal(16)

    def elaborate(self, platform):
        m = Module()
        m.submodules.app, m.submodules.chk = self.app, self.chk
        a, c = self.app.o, self.chk.i
        m.d.comb += [c.valid.eq(a.valid), c.flit.eq(a.flit.as_value() ^ self.flip_f),
                     c.crc.eq(a.crc ^ self.flip_c), a.credit.eq(c.credit)]
        return m


def test_rtl_matches_golden_with_random_flips():
    rng = random.Random(4)
    _, flits = traffic(rng, 10)
    flips = {}
    for i in rng.sample(range(len(flits)), 6):
        flips[i] = (rng.getrandbits(FMT.flit_bits) & rng.getrandbits(FMT.flit_bits) &
                    rng.getrandbits(FMT.flit_bits), rng.choice([0, 0, 1 << rng.randrange(16)]))
    dut = _Pair(FMT)
    app_out, chk_out, errs = [], [], []

    async def drive(ctx):
        for i, f in enumerate(flits):
            while rng.random() < 0.3:
                ctx.set(dut.app.i.valid, 0)
                await ctx.tick()
            ff, fc = flips.get(i, (0, 0))
            ctx.set(dut.app.i.valid, 1)
            ctx.set(dut.app.i.flit.as_value(), f)
            # the injection acts on the appender's output, one cycle later
            await ctx.tick()
            ctx.set(dut.app.i.valid, 0)
            ctx.set(dut.flip_f, ff)
            ctx.set(dut.flip_c, fc)
            await ctx.tick()
            ctx.set(dut.flip_f, 0)
            ctx.set(dut.flip_c, 0)
        for _ in range(4):
            await ctx.tick()

    async def watch(ctx):
        async for _, _, av, af, ac, cv, cf, ce in ctx.tick().sample(
                dut.app.o.valid, dut.app.o.flit.as_value(), dut.app.o.crc, dut.chk.o.valid,
                dut.chk.o.flit.as_value(), dut.chk.error):
            if av:
                app_out.append((af, ac))
            if cv:
                chk_out.append(cf)
                errs.append(ce)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive)
    sim.add_process(watch)
    sim.run_until(1e-8 * (3 * len(flits) * 2 + 200))
    assert app_out == append_crc(FMT, flits)
    injected = [(f ^ flips.get(i, (0, 0))[0], c ^ flips.get(i, (0, 0))[1])
                for i, (f, c) in enumerate(app_out)]
    gold, n_err = check_crc(FMT, injected)
    assert chk_out == gold
    assert sum(errs) == n_err and n_err > 0


class _CheckedRx(Elaboratable):
    """(beats with CRC) -> CrcChecker -> Depacketiser: the NIC's receive path."""

    def __init__(self, fmt):
        from treenic.hdl.link.depacketiser import Depacketiser
        self.chk = CrcChecker(fmt)
        self.dp = Depacketiser(fmt, sub_words=8, credits=64)

    def elaborate(self, platform):
        from amaranth.lib import wiring
        m = Module()
        m.submodules.chk, m.submodules.dp = self.chk, self.dp
        wiring.connect(m, self.chk.o, self.dp.rx)
        return m


@pytest.mark.parametrize("fault", ["flip", "drop", "dup"])
def test_rtl_depacketiser_never_delivers_a_failed_sub_packet(fault):
    """The RTL receive path (checker + depacketiser) delivers exactly what the golden
    chain (check_crc + depacketise) delivers, and nothing the clean link would not."""
    rng = random.Random({"flip": 21, "drop": 22, "dup": 23}[fault])
    _, flits = traffic(rng, 6)
    beats = append_crc(FMT, flits)
    ends = [i for i, (f, _) in enumerate(beats)
            if FMT.split_flit(f)[0] in (FlitType.SUB_TAIL, FlitType.MSG_TAIL)]
    k = rng.randrange(len(ends) - 1)
    lo, hi = ends[k] + 1, ends[k + 1] + 1           # a whole sub-packet, not the last
    if fault == "flip":
        i = rng.randrange(lo, hi)
        beats[i] = (beats[i][0] ^ (1 << rng.randrange(FMT.flit_bits)), beats[i][1])
    elif fault == "drop":
        del beats[lo:hi]
    else:
        beats[hi:hi] = beats[lo:hi]
    gold_flits, n_err = check_crc(FMT, beats)
    assert n_err > 0
    gold, _ = model.depacketise(gold_flits, FMT, sub_words=8)
    clean = set(delivered_keys(flits))
    assert {f.key() for f in gold} < clean
    dut = _CheckedRx(FMT)
    got = []

    async def drive(ctx):
        ctx.set(dut.dp.flow_enable, (1 << FMT.flows) - 1)
        for f, c in beats:
            while rng.random() < 0.3:
                ctx.set(dut.chk.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.chk.i.valid, 1)
            ctx.set(dut.chk.i.flit.as_value(), f)
            ctx.set(dut.chk.i.crc, c)
            await ctx.tick()
        ctx.set(dut.chk.i.valid, 0)
        await ctx.tick().repeat(80)

    async def collect(ctx):
        d = dut.dp
        ctx.set(d.hdr.ready, 1)
        ctx.set(d.data.ready, 1)
        # headers and data are separate streams: data beats belong to the oldest header
        # (in order) that has words
        heads, words = [], []
        async for _, _, hv, h, dv, b in ctx.tick().sample(
                d.hdr.valid, d.hdr.payload.as_value(), d.data.valid,
                d.data.payload.as_value()):
            if hv:
                heads.append(FMT.unpack_header(h))
            while heads and heads[0]["length"] == 0:
                got.append(model.Fragment(heads.pop(0), []))
            if dv:
                words += FMT.unpack_words(b)
                if (b >> FMT.width) & 1:
                    hd = heads.pop(0)
                    got.append(model.Fragment(hd, words[:hd["length"]]))
                    words = []

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive)
    sim.add_testbench(collect, background=True)
    sim.run()
    assert [f.key() for f in got] == [f.key() for f in gold]
