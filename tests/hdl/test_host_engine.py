"""Host protocol engine vs its golden model (Amaranth simulator), random traffic with
malformed datagrams, random input gaps and output backpressure; plus the codec itself."""
import random

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import Out
from amaranth.sim import Simulator

from treenic.hdl.host import model
from treenic.hdl.host.engine import HostEngine, datagram_layout
from treenic.hdl.host.model import Op, encode_request
from treenic.hdl.nic.core import HostSignature

ADDR_BITS, LATENCY, MAX_WORDS = 8, 5, 32
STATUS_REGS, START = (2, 3), (1, 1)


class BusTarget(wiring.Component):
    """A word memory on the host bus answering reads ``latency`` cycles after ``re``."""

    def __init__(self, addr_bits, latency):
        self.latency = latency
        self.mem = memory.Memory(shape=32, depth=1 << addr_bits, init=[])
        super().__init__({"host": Out(HostSignature(addr_bits))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = self.mem
        wp, rp = self.mem.write_port(), self.mem.read_port()
        h = self.host
        m.d.comb += [wp.addr.eq(h.addr), wp.data.eq(h.wdata), wp.en.eq(h.we),
                     rp.addr.eq(h.addr)]
        data = rp.data
        for k in range(self.latency - 1):
            nxt = Signal(32, name=f"rdata_d{k}")
            m.d.sync += nxt.eq(data)
            data = nxt
        m.d.comb += h.rdata.eq(data)
        return m


class Dut(wiring.Component):
    def __init__(self):
        self.eng = HostEngine(addr_bits=ADDR_BITS, read_latency=LATENCY, max_words=MAX_WORDS,
                              status_regs=STATUS_REGS, start=START)
        self.bus = BusTarget(ADDR_BITS, LATENCY)
        sig = stream.Signature(datagram_layout())
        super().__init__({"rx": wiring.In(sig), "tx": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.eng, m.submodules.bus = self.eng, self.bus
        wiring.connect(m, self.eng.host, self.bus.host)
        wiring.connect(m, wiring.flipped(self.rx), self.eng.rx)
        wiring.connect(m, self.eng.tx, wiring.flipped(self.tx))
        return m


def _valid_request(rng, seq):
    op = rng.choice(list(Op))
    if op == Op.READ:
        n = rng.randint(1, MAX_WORDS)
        return encode_request(op, seq, rng.randrange((1 << ADDR_BITS) - n + 1), n)
    if op == Op.WRITE:
        n = rng.randint(1, MAX_WORDS)
        return encode_request(op, seq, rng.randrange((1 << ADDR_BITS) - n + 1),
                              payload=[rng.getrandbits(32) for _ in range(n)])
    if op == Op.WRITE_PAIRS:
        n = rng.randint(1, MAX_WORDS // 2)
        pl = []
        for _ in range(n):
            pl += [rng.randrange(1 << ADDR_BITS), rng.getrandbits(32)]
        return encode_request(op, seq, 0, payload=pl)
    return encode_request(op, seq)


def _malformed(rng, good: bytes) -> bytes:
    kind = rng.randrange(7)
    b = bytearray(good)
    if kind == 0:                                   # random junk
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4 * (MAX_WORDS + 8))))
    if kind == 1:                                   # truncated
        return bytes(b[:rng.randrange(len(b))]) or b"\x00"
    if kind == 2:                                   # one flipped bit (header or payload)
        i = rng.randrange(len(b) * 8)
        b[i // 8] ^= 1 << (i % 8)
        return bytes(b)
    if kind == 3:                                   # trailing bytes (whole words or not)
        return bytes(b) + bytes(rng.randint(1, 9))
    if kind == 4:                                   # longer than the packet memory
        return encode_request(Op.WRITE, 7, 0, payload=range(MAX_WORDS + 3))
    if kind == 5:                                   # count beyond the host bus
        return encode_request(Op.READ, 9, (1 << ADDR_BITS) - 2, 5)
    return encode_request(Op.WRITE_PAIRS, 11, 0, payload=[1 << ADDR_BITS, 5])   # bad pair


def traffic(seed, n):
    rng = random.Random(seed)
    out, seq, last_mut = [], rng.getrandbits(32), None
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            out.append(_malformed(rng, _valid_request(rng, seq)))
        elif r < 0.35 and last_mut is not None:
            out.append(last_mut)                    # a retry of the last mutating request
        else:
            seq = (seq + 1) & 0xFFFFFFFF
            d = _valid_request(rng, seq)
            if d[3] in (Op.WRITE, Op.WRITE_PAIRS, Op.START):
                last_mut = d
            out.append(d)
    return out


def golden(datagrams):
    mem, rd, wr = model.memory_bus(ADDR_BITS)
    g = model.HostEngineModel(rd, wr, ADDR_BITS, MAX_WORDS, STATUS_REGS, START)
    replies = [g.process(d) for d in datagrams]
    golden.answered = [k for k, r in enumerate(replies) if r is not None]
    return [r for r in replies if r is not None], mem, g.counters


def run_engine(datagrams, seed, p_valid=0.7, p_ready=0.6):
    dut = Dut()
    rng = random.Random(seed)
    expect, mem, counters = golden(datagrams)
    got, peers, hw = [], [], {}

    async def source(ctx):
        for k, d in enumerate(datagrams):
            words = np.frombuffer(d + bytes(-len(d) % 4), "<u4")
            for i, w in enumerate(words):
                while rng.random() > p_valid:
                    ctx.set(dut.rx.valid, 0)
                    await ctx.tick()
                ctx.set(dut.rx.valid, 1)
                ctx.set(dut.rx.payload, {"data": int(w), "last": i == len(words) - 1,
                                         "length": len(d), "peer": 0x1000 + k})
                await ctx.tick().until(dut.rx.ready)
            ctx.set(dut.rx.valid, 0)
        hw["sent"] = True

    async def sink(ctx):
        words = []
        while len(got) < len(expect):
            ready = rng.random() < p_ready
            ctx.set(dut.tx.ready, ready)
            valid, p = ctx.get(dut.tx.valid), ctx.get(dut.tx.payload)
            await ctx.tick()
            if valid and ready:
                words.append(int(p.data))
                if p.last:
                    got.append(np.array(words, "<u4").tobytes())
                    assert p.length == 4 * len(words)
                    peers.append(int(p.peer))
                    words = []
        while "sent" not in hw:
            await ctx.tick()
        await ctx.tick().repeat(LATENCY + 4)     # the last (dropped) datagram's check
        hw["mem"] = [ctx.get(dut.bus.mem.data[a]) for a in range(1 << ADDR_BITS)]
        hw["cnt"] = (ctx.get(dut.eng.accepted), ctx.get(dut.eng.dropped),
                     ctx.get(dut.eng.duplicates))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run_until(2e-3 + 4e-6 * len(datagrams))
    return hw, got, expect, mem, counters, peers


@pytest.mark.parametrize("seed", [1, 2])
def test_engine_matches_golden_under_random_traffic(seed):
    dgs = traffic(seed, 70)
    hw, got, expect, mem, counters, peers = run_engine(dgs, seed)
    assert len(got) == len(expect)
    for i, (g, e) in enumerate(zip(got, expect)):
        assert g == e, f"reply {i}: {model.decode_reply(g)} != {model.decode_reply(e)}"
    assert counters["dropped"] >= 5 and counters["duplicates"] >= 2   # both paths exercised
    # replies go back to the peer each request came from (dropped ones get none)
    assert peers == [0x1000 + k for k in golden.answered]
    assert hw["mem"] == [int(v) for v in mem]
    assert hw["cnt"] == tuple(counters[k] for k in model.ENGINE_COUNTERS)


def test_full_rate_without_stalls():
    """No gaps, no backpressure: a WRITE of max_words streams one word per cycle."""
    dgs = [encode_request(Op.WRITE, 5, 0, payload=range(MAX_WORDS)),
           encode_request(Op.READ, 6, 0, MAX_WORDS)]
    _, got, expect, _, _, _ = run_engine(dgs, 0, p_valid=1.0, p_ready=1.0)
    assert got == expect
    assert model.decode_reply(got[1]).payload == tuple(range(MAX_WORDS))


def test_codec_roundtrip_and_rejections():
    d = encode_request(Op.WRITE, 42, 0x10, payload=[1, 2, 3])
    r = model.decode_request(d, addr_bits=8, max_words=8)
    assert (r.op, r.seq, r.addr, r.count, r.payload) == (Op.WRITE, 42, 0x10, 3, (1, 2, 3))
    rep = model.Reply(Op.READ, 42, 0x10, 2, model.Flag.DUP, (7, 8))
    assert model.decode_reply(model.encode_reply(rep)) == rep
    for bad, why in [(d[:-1], "whole number"), (d[:12], "header"),
                     (d[:-4], "expected"), (b"\0" * 20, "magic"),
                     (encode_request(Op.READ, 1, 250, 8), "beyond"),
                     (encode_request(Op.START, 1, 4), "addr must be 0"),
                     (encode_request(Op.READ, 1, 0, 0), "count 0")]:
        with pytest.raises(model.Malformed, match=why):
            model.decode_request(bad, addr_bits=8, max_words=8)
    with pytest.raises(model.Malformed, match="REPLY bit"):
        model.decode_reply(d)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match="max_words"):
        HostEngine(addr_bits=8, read_latency=5, max_words=1)
    with pytest.raises(ValueError, match="beyond the host bus"):
        HostEngine(addr_bits=4, read_latency=5, status_regs=(99,))
