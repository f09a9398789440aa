"""Link layer: flit format, golden models, and Amaranth-simulator tests of the packetiser,
depacketiser and packetiser -> link -> depacketiser against the golden models."""

import gc
import random
import traceback

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from treenic.hdl.link import model
from treenic.hdl.link.flit import ErrorCause, FlitFormat, FlitType
from treenic.hdl.link.packetiser import Packetiser
from treenic.hdl.link.depacketiser import Depacketiser
from treenic.hdl.link.link import LinkChannel, lfsr16_next, stall_pattern
from treenic.schedule.ir import Op as IrOp

FMT = FlitFormat()
ALL_FLOWS = (1 << FMT.flows) - 1
T = FlitType


def rand_header(rng, n, fmt=FMT, vc=None):
    return dict(vc=rng.randrange(fmt.vcs) if vc is None else vc,
                next=rng.randrange(fmt.ports), eject=rng.randrange(fmt.ports),
                dest=rng.randrange(fmt.nodes), src=rng.randrange(fmt.nodes),
                flow=rng.randrange(fmt.flows), op=rng.choice([1, 2]),
                step=rng.randrange(fmt.steps), offset=rng.randrange(1 << fmt.offset_bits),
                length=n)


def rand_messages(rng, count, max_words, fmt=FMT, min_words=1):
    out = []
    for _ in range(count):
        n = rng.randint(min_words, max_words)
        out.append((rand_header(rng, n, fmt), [rng.getrandbits(32) for _ in range(n)]))
    return out


def types(flits, fmt=FMT):
    return [fmt.split_flit(f)[0] for f in flits]


# ------------------------------------------------------------------------ format / golden

def test_table_ii_codes_and_layout():
    assert [t.value for t in (T.HEAD, T.BODY, T.TAIL, T.HEAD_TAIL)] == [4, 5, 6, 7]
    assert [t.value for t in (T.SUB_HEAD, T.SUB_BODY, T.SUB_TAIL, T.MSG_TAIL)] == [0, 1, 2, 3]
    # ops share the Schedule IR codes
    assert (model.Op.REDUCE.value, model.Op.GATHER.value) == (IrOp.REDUCE, IrOp.GATHER)
    pos = {n: (f.offset, f.offset + f.width) for n, f in FMT.sub_head}
    assert pos == {"next": (0, 4), "eject": (4, 8), "flow": (8, 14), "op": (14, 16),
                   "step": (16, 24), "offset": (24, 44), "length": (44, 64)}
    pos = {n: (f.offset, f.offset + f.width) for n, f in FMT.pkt_head}
    assert pos == {"dest": (0, 6), "src": (6, 12), "flow": (12, 18), "op": (18, 20),
                   "step": (20, 28), "offset": (28, 48), "length": (48, 55)}
    assert FMT.flit_bits == 64 + 3 + 1
    f = FMT.make_flit(T.SUB_TAIL, 1, 0x1234)
    assert f == 0x1234 | (2 << 64) | (1 << 67)
    assert FMT.split_flit(f) == (T.SUB_TAIL, 1, 0x1234)
    with pytest.raises(ValueError):
        FlitFormat(width=64, ports=256, flows=256, steps=1 << 12)   # head does not fit
    with pytest.raises(ValueError):
        FlitFormat(width=48)


@pytest.mark.parametrize("n,sub", [(1, 8), (2, 8), (3, 8), (8, 8), (9, 8), (16, 8),
                                   (17, 8), (100, 16), (64, 64)])
def test_packetise_message_structure(n, sub):
    words = list(range(n))
    fl = model.packetise({"flow": 3, "op": 1, "length": n}, words, "message", sub_words=sub)
    ts = types(fl)
    assert ts[0] == T.SUB_HEAD and ts.count(T.SUB_HEAD) == 1
    assert ts[-1] == T.MSG_TAIL and ts.count(T.MSG_TAIL) == 1
    nsub = -(-n // sub)
    assert ts.count(T.SUB_TAIL) == nsub - 1
    assert len(fl) == 1 + -(-n // 2)
    # every non-final sub-packet is exactly sub/2 flits ending with SUB_TAIL
    body = ts[1:]
    for s in range(nsub - 1):
        chunk = body[s * sub // 2:(s + 1) * sub // 2]
        assert chunk == [T.SUB_BODY] * (sub // 2 - 1) + [T.SUB_TAIL]
    got = []
    for f in fl[1:]:
        got += FMT.unpack_words(FMT.split_flit(f)[2])
    assert got[:n] == words and all(w == 0 for w in got[n:])
    h = FMT.unpack_sub_head(FMT.split_flit(fl[0])[2])
    assert h["length"] == n and h["flow"] == 3 and h["op"] == 1


def test_packetise_packet_structure():
    fl = model.packetise({"offset": 10, "op": 2, "length": 150}, list(range(150)), "packet")
    ts = types(fl)
    assert ts.count(T.HEAD) == 3                      # 64 + 64 + 22 words
    assert len(fl) == 3 + 32 + 32 + 11
    assert ts[:34] == [T.HEAD] + [T.BODY] * 31 + [T.TAIL] + [T.HEAD]
    heads = [FMT.unpack_pkt_head(FMT.split_flit(f)[2]) for f in fl
             if FMT.split_flit(f)[0] == T.HEAD]
    assert [(h["offset"], h["length"]) for h in heads] == [(10, 64), (74, 64), (138, 22)]
    assert types(model.packetise({"op": 1}, [], "packet")) == [T.HEAD_TAIL]
    assert types(model.packetise({"op": 1}, [7, 8], "packet")) == [T.HEAD, T.TAIL]
    with pytest.raises(ValueError):
        model.packetise({"op": 1}, [], "message")
    with pytest.raises(ValueError):
        model.packetise({"op": 1, "length": 3}, [1, 2], "message")


@pytest.mark.parametrize("mode", ["message", "packet"])
def test_golden_roundtrip_interleaved_vcs(mode):
    rng = random.Random(7)
    # two VCs, flits of each VC in order but interleaved at random between VCs
    streams = {0: [], 1: []}
    sent = {0: [], 1: []}
    for vc in (0, 1):
        for h, w in rand_messages(rng, 5, 40):
            h["vc"] = vc
            streams[vc] += model.packetise(h, w, mode, sub_words=8, packet_words=8)
            sent[vc].append((h, w))
    mixed = []
    a, b = list(streams[0]), list(streams[1])
    while a or b:
        src = a if (a and (not b or rng.random() < 0.5)) else b
        mixed.append(src.pop(0))
    frags, errs = model.depacketise(mixed, sub_words=8)
    assert all(v == 0 for v in errs.values())
    for vc in (0, 1):
        mine = [f for f in frags if f.header["vc"] == vc]
        # reassemble per message
        msgs, cur = [], []
        for f in mine:
            cur.append(f)
            if f.header["last"] and (mode == "message" or
                                     sum(len(x.words) for x in cur) ==
                                     sent[vc][len(msgs)][0]["length"]):
                msgs.append(cur)
                cur = []
        assert len(msgs) == len(sent[vc])
        for parts, (h, w) in zip(msgs, sent[vc]):
            words = sum((p.words for p in parts), [])
            assert words == w
            off = h["offset"]
            for p in parts:
                assert p.header["offset"] == off & ((1 << 20) - 1)
                assert p.header["flow"] == h["flow"] and p.header["step"] == h["step"]
                assert p.header["packet"] == (mode == "packet")
                off += len(p.words)
            assert len(parts) == -(-len(w) // 8)


def _errs(flits, **kw):
    frags, e = model.depacketise(flits, sub_words=8, **kw)
    return frags, {k.name if hasattr(k, "name") else k: v for k, v in e.items() if v}


def test_golden_malformed_sequences():
    F = FMT.make_flit
    good = model.packetise({"flow": 1, "op": 1, "length": 20}, list(range(20)), sub_words=8)
    # good: head, 3 body, subtail, 3 body, subtail, body, tail  (20 words = 10 flits)
    assert types(good) == [T.SUB_HEAD] + ([T.SUB_BODY] * 3 + [T.SUB_TAIL]) * 2 + \
        [T.SUB_BODY, T.MSG_TAIL]
    frags, e = _errs(good)
    assert [len(f.words) for f in frags] == [8, 8, 4] and not e
    # body before head: one ORPHAN, everything up to the tail dropped
    frags, e = _errs(good[1:])
    assert frags == [] and e == {"ORPHAN": 1, "dropped": 10}
    # missing tail: next head arrives -> SEQ, the open sub-packet (4 words) is not delivered
    frags, e = _errs(good[:-1] + good)
    assert [len(f.words) for f in frags] == [8, 8, 8, 8, 4] and e == {"SEQ": 1}
    # missing sub-tail (sub-packet too long): SEQ at the flit where SUB_TAIL was due
    bad = list(good)
    bad[4] = F(T.SUB_BODY, 0, FMT.split_flit(bad[4])[2])
    frags, e = _errs(bad)
    assert frags == [] and e == {"SEQ": 1, "dropped": 7}
    # early tail
    bad = list(good)
    bad[6] = F(T.MSG_TAIL, 0, FMT.split_flit(bad[6])[2])
    frags, e = _errs(bad)
    assert [len(f.words) for f in frags] == [8] and e == {"SEQ": 1, "ORPHAN": 1, "dropped": 5}
    # unknown flow, unknown op, zero length
    frags, e = _errs(good, flow_enable=0b1101)
    assert frags == [] and e == {"FLOW": 1, "dropped": 11}
    for op in (0, 3):
        h = model.packetise({"flow": 1, "op": op, "length": 2}, [1, 2], sub_words=8)
        frags, e = _errs(h)
        assert frags == [] and e == {"OP": 1, "dropped": 2}
    zero = F(T.SUB_HEAD, 0, FMT.pack_sub_head(flow=1, op=1, length=0))
    frags, e = _errs([zero, good[-1]])
    assert frags == [] and e == {"LENGTH": 1, "dropped": 2}
    # packet mode: length beyond max, head&tail with payload length, wrong mode flit
    big = F(T.HEAD, 0, FMT.pack_pkt_head(op=1, length=65))
    assert _errs([big, F(T.TAIL, 0, 0)])[1] == {"LENGTH": 1, "dropped": 2}
    assert _errs([F(T.HEAD_TAIL, 0, FMT.pack_pkt_head(op=1, length=1))])[1] == \
        {"LENGTH": 1, "dropped": 1}
    frags, e = _errs([F(T.HEAD_TAIL, 1, FMT.pack_pkt_head(op=2, flow=5, offset=9))])
    assert len(frags) == 1 and frags[0].words == [] and frags[0].header["offset"] == 9 and not e
    mixed = list(good)
    mixed[2] = F(T.BODY, 0, 0)
    assert _errs(mixed)[1] == {"SEQ": 1, "dropped": 9}


def test_efficiency_report_loads_rtl_results(tmp_path):
    import json
    (tmp_path / "efficiency_message_64.json").write_text(json.dumps(
        {"mode": "message", "width": 64, "n_bytes": 4096, "flits": 513, "heads": 1}))
    rows = model.efficiency_report(4096, widths=(64,), rtl_results_dir=str(tmp_path))
    rtl = [r for r in rows if r["source"] == "rtl"]
    assert len(rtl) == 1 and rtl[0]["efficiency"] == pytest.approx(512 / 513)
    assert "rtl" in model.format_report(rows)


def test_efficiency_report():
    assert model.efficiency(1 << 18, "message") >= 0.99
    assert model.efficiency(1 << 18, "packet") == pytest.approx(32 / 33)
    f128 = FlitFormat(width=128)
    # 16-byte flits, 256-byte packets: the paper's ~6 % head overhead
    assert 1 - model.efficiency(1 << 18, "packet", f128) == pytest.approx(1 / 17)
    for n in (1, 7, 64, 65, 1000):
        for mode in ("message", "packet"):
            fl = model.packetise({"op": 1}, [0] * n, mode)
            assert model.efficiency(n, mode) == pytest.approx(n * 32 / (len(fl) * 64))
    rows = model.efficiency_report(1 << 16, widths=(64,), rtl_counts={(64, "message"):
                                                                       (8193, 1)})
    eff = {(r["source"], r["mode"]): r["efficiency"] for r in rows}
    assert eff[("golden", "message")] == eff[("rtl", "message")] == pytest.approx(8192 / 8193)


def test_lfsr_model_and_link_params():
    x, seen = 1, set()
    for _ in range(1000):
        seen.add(x)
        x = lfsr16_next(x)
    assert len(seen) == 1000                    # no short cycle
    with pytest.raises(ValueError):
        LinkChannel(FMT, latency=0)


@pytest.mark.parametrize("seed,stall", [(0xACE1, 30), (7 * 7919 + 132, 60), (1, 200)])
def test_stall_pattern_equals_rtl(seed, stall):
    """The golden stall enable (what the network model replays) is the RTL's, cycle by
    cycle from reset: the link's stall counter equals the pattern's running sum."""
    lk = LinkChannel(FMT, stall=stall, seed=seed)
    n = 300
    want = np.cumsum(stall_pattern(seed, stall, 0, n))
    got = []

    async def tb(ctx):
        for _ in range(n):
            await ctx.tick()
            got.append(ctx.get(lk.stalls))

    run_sim(lk, [tb], n + 10)
    assert got == want.tolist()
    # the pattern after k steps is the tail of the pattern from 0 (one LFSR sequence)
    assert (stall_pattern(seed, stall, 17, 50) == stall_pattern(seed, stall, 0, 67)[17:]).all()
    with pytest.raises(ValueError, match="stall"):
        stall_pattern(seed, 257, 0, 1)


# ------------------------------------------------------------------------ RTL helpers

def _run(sim, until=None):
    # re-raise testbench failures with a short traceback (pytest's formatter chokes on
    # the simulator's deep coroutine stacks)
    try:
        sim.run() if until is None else sim.run_until(until)
    except Exception as e:
        tb = traceback.format_exc(limit=-4)
        raise AssertionError(f"{type(e).__name__}: {e}\n{tb}") from None
    finally:
        # finalise unfinished testbench coroutines now, not inside pytest's reporting
        del sim
        gc.collect()


def run_sim(dut, benches, cycles):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for b in benches:
        sim.add_testbench(b)
    _run(sim, 1e-8 * cycles)


async def send_messages(ctx, p, msgs, rng, p_idle=0.3, fmt=FMT):
    """Drive ``p.hdr`` / ``p.data`` with random gaps on valid."""
    for h, w in msgs:
        while rng.random() < p_idle:
            await ctx.tick()
        ctx.set(p.hdr.payload.as_value(), fmt.pack_header(**h))
        ctx.set(p.hdr.valid, 1)
        await ctx.tick().until(p.hdr.ready)
        ctx.set(p.hdr.valid, 0)
        for i in range(0, len(w), fmt.lanes):
            while rng.random() < p_idle:
                await ctx.tick()
            ctx.set(p.data.payload.as_value(), fmt.pack_words(w[i:i + fmt.lanes]))
            ctx.set(p.data.valid, 1)
            await ctx.tick().until(p.data.ready)
            ctx.set(p.data.valid, 0)


async def collect_fragments(ctx, d, out, n_frags, rng, p_stall=0.3, fmt=FMT):
    """Consume ``d.hdr`` / ``d.data`` with random backpressure."""
    while len(out) < n_frags:
        while rng.random() < p_stall:
            await ctx.tick()
        ctx.set(d.hdr.ready, 1)
        h, = await ctx.tick().sample(d.hdr.payload.as_value()).until(d.hdr.valid)
        ctx.set(d.hdr.ready, 0)
        hd = fmt.unpack_header(h)
        words = []
        nbeats = -(-hd["length"] // fmt.lanes)
        for i in range(nbeats):
            while rng.random() < p_stall:
                await ctx.tick()
            ctx.set(d.data.ready, 1)
            b, = await ctx.tick().sample(d.data.payload.as_value()).until(d.data.valid)
            ctx.set(d.data.ready, 0)
            assert (b >> fmt.width) & 1 == (i == nbeats - 1), "data.last misplaced"
            words += fmt.unpack_words(b)[:hd["length"] - len(words)]
        out.append(model.Fragment(hd, words))


def interleave(streams, rng):
    streams = [list(x) for x in streams]
    out = []
    while any(streams):
        s = rng.choice([x for x in streams if x])
        out.append(s.pop(0))
    return out


def by_vc(frags):
    return {vc: [f.key() for f in frags if f.header["vc"] == vc] for vc in range(FMT.vcs)}


# ------------------------------------------------------------------------ RTL tests

@pytest.mark.parametrize("mode", ["message", "packet"])
def test_packetiser_rtl_vs_golden(mode):
    rng = random.Random(11 if mode == "message" else 12)
    credits = 3
    dut = Packetiser(FMT, mode=mode, sub_words=8, packet_words=8, credits=credits)
    msgs = rand_messages(rng, 8, 30, min_words=0 if mode == "packet" else 1)
    gold = sum((model.packetise(h, w, mode, sub_words=8, packet_words=8) for h, w in msgs),
               [])
    got = []
    outstanding = [0] * FMT.vcs
    pending = []          # (release cycle, vc)

    async def tb_in(ctx):
        await send_messages(ctx, dut, msgs, rng)

    async def tb_link(ctx):
        cycle = 0
        while len(got) < len(gold) or pending:
            ret = 0
            for rel, vc in list(pending):
                if rel <= cycle and not (ret >> vc) & 1:
                    ret |= 1 << vc
                    pending.remove((rel, vc))
                    outstanding[vc] -= 1
            ctx.set(dut.tx.credit, ret)
            _, _, valid, flit = await ctx.tick().sample(dut.tx.valid, dut.tx.flit.as_value())
            cycle += 1
            if valid:
                got.append(flit)
                vc = FMT.split_flit(flit)[1]
                outstanding[vc] += 1
                assert outstanding[vc] <= credits, "sent without credit"
                pending.append((cycle + rng.randrange(1, 12), vc))
        ctx.set(dut.tx.credit, 0)
        for _ in range(5):
            await ctx.tick()
        assert ctx.get(dut.tx.valid) == 0
        assert ctx.get(dut.status.flits) == len(gold)
        assert ctx.get(dut.status.heads) == sum(t in (T.SUB_HEAD, T.HEAD, T.HEAD_TAIL)
                                                for t in types(gold))

    run_sim(dut, [tb_in, tb_link], 6000)
    assert got == gold


def test_packetiser_drops_zero_length_message():
    dut = Packetiser(FMT, mode="message", sub_words=8)
    rng = random.Random(3)
    h0 = rand_header(rng, 0)
    h1, w1 = rand_header(rng, 3), [1, 2, 3]
    gold = model.packetise(h1, w1, "message", sub_words=8)
    got = []

    async def tb(ctx):
        await send_messages(ctx, dut, [(h0, []), (h1, w1)], rng, p_idle=0)

    async def mon2(ctx):
        for _ in range(40):
            _, _, v, f = await ctx.tick().sample(dut.tx.valid, dut.tx.flit.as_value())
            if v:
                got.append(f)
                ctx.set(dut.tx.credit, 1 << FMT.split_flit(f)[1])
            else:
                ctx.set(dut.tx.credit, 0)
        assert ctx.get(dut.status.dropped) == 1

    run_sim(dut, [tb, mon2], 60)
    assert got == gold


async def drive_flits(ctx, d, flits, rng, credits, p_idle=0.3, fmt=FMT):
    """Send raw flits into ``d.rx`` honouring per-VC credits."""
    cred = [credits] * fmt.vcs
    i = 0
    while i < len(flits):
        vc = fmt.split_flit(flits[i])[1]
        send = cred[vc] > 0 and rng.random() >= p_idle
        ctx.set(d.rx.valid, send)
        ctx.set(d.rx.flit.as_value(), flits[i])
        _, _, ret = await ctx.tick().sample(d.rx.credit)
        if send:
            cred[vc] -= 1
            i += 1
        for v in range(fmt.vcs):
            cred[v] += (ret >> v) & 1
    ctx.set(d.rx.valid, 0)
    # all credits come back once the flits are consumed
    for _ in range(200):
        _, _, ret = await ctx.tick().sample(d.rx.credit)
        for v in range(fmt.vcs):
            cred[v] += (ret >> v) & 1
        if cred == [credits] * fmt.vcs:
            break
    assert cred == [credits] * fmt.vcs


ERR_KEYS = [c for c in ErrorCause if c not in (ErrorCause.NONE,)]


def check_status(ctx, d, errs):
    counts = [ctx.get(d.status.counts[i]) for i in range(len(ErrorCause))]
    for c in ErrorCause:
        if c not in (ErrorCause.NONE, ErrorCause.OVERFLOW):
            assert counts[int(c)] == errs[c], (c, counts, errs)
    assert counts[ErrorCause.OVERFLOW] == 0
    assert counts[0] == sum(errs[c] for c in ERR_KEYS)
    assert ctx.get(d.status.dropped) == errs["dropped"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_depacketiser_rtl_vs_golden(seed):
    rng = random.Random(seed)
    credits = 4
    dut = Depacketiser(FMT, sub_words=8, credits=credits)
    streams = [[] for _ in range(FMT.vcs)]
    for h, w in rand_messages(rng, 14, 26):
        mode = rng.choice(["message", "packet"])
        streams[h["vc"]] += model.packetise(h, w, mode, sub_words=8, packet_words=8)
    flits = interleave(streams, rng)          # VCs interleaved flit by flit
    flits = model.mutate_flits(flits, rng, n=6)
    flow_enable = ALL_FLOWS & ~(1 << rng.randrange(64)) & ~(1 << rng.randrange(64))
    gold, errs = model.depacketise(flits, sub_words=8, flow_enable=flow_enable)
    assert sum(errs[c] for c in ERR_KEYS) > 0
    got = []
    done = []

    async def tb_in(ctx):
        ctx.set(dut.flow_enable, flow_enable)
        await drive_flits(ctx, dut, flits, rng, credits)
        for _ in range(50):
            await ctx.tick()
        check_status(ctx, dut, errs)
        assert ctx.get(dut.status.frags) == len(gold)
        done.append(1)

    async def tb_out(ctx):
        await collect_fragments(ctx, dut, got, len(gold), rng)

    run_sim(dut, [tb_in, tb_out], 8000)
    assert done
    assert by_vc(got) == by_vc(gold)


def test_depacketiser_malformed_only_reaches_no_output():
    """Only malformed traffic: errors counted, not a single word on ``data``."""
    rng = random.Random(5)
    dut = Depacketiser(FMT, sub_words=8, credits=2)
    F = FMT.make_flit
    good = model.packetise({"flow": 1, "op": 1, "length": 20, "vc": 1}, list(range(20)),
                           sub_words=8)
    seq = []
    seq += good[1:]                                          # ORPHAN (no head)
    seq += good[:4] + [F(T.SUB_BODY, 1, 0)] + good[5:]       # missing sub-tail -> SEQ
    seq += [F(T.SUB_HEAD, 0, FMT.pack_sub_head(flow=1, op=3, length=4)),
            F(T.SUB_BODY, 0, 1), F(T.MSG_TAIL, 0, 2)]        # unknown op
    seq += [F(T.SUB_HEAD, 0, FMT.pack_sub_head(flow=9, op=1, length=4)),
            F(T.SUB_BODY, 0, 1), F(T.MSG_TAIL, 0, 2)]        # unknown flow (9 disabled)
    seq += [F(T.HEAD, 1, FMT.pack_pkt_head(flow=1, op=2, length=4)),
            F(T.BODY, 1, 1), F(T.BODY, 1, 2)]                # missing tail ...
    seq += [F(T.HEAD, 1, FMT.pack_pkt_head(flow=1, op=2, length=70)),
            F(T.TAIL, 1, 2)]                                  # ... SEQ, then LENGTH
    seq += [F(T.SUB_HEAD, 0, FMT.pack_sub_head(flow=1, op=1, length=0)), F(T.MSG_TAIL, 0, 0)]
    seq += [F(T.MSG_TAIL, 0, 5), F(T.TAIL, 1, 6)]            # 2 orphan tails
    gold, errs = model.depacketise(seq, sub_words=8, flow_enable=ALL_FLOWS & ~(1 << 9))
    assert gold == []
    expect = {ErrorCause.ORPHAN: 3, ErrorCause.SEQ: 2, ErrorCause.FLOW: 1, ErrorCause.OP: 1,
              ErrorCause.LENGTH: 2}
    assert {c: errs[c] for c in ERR_KEYS if errs[c]} == expect
    seen = []

    async def tb_in(ctx):
        ctx.set(dut.flow_enable, ALL_FLOWS & ~(1 << 9))
        await drive_flits(ctx, dut, seq, rng, 2)
        # the last credit comes back with the pop; the flit is checked a cycle later and
        # its error counted two cycles after that
        await ctx.tick().repeat(3)
        check_status(ctx, dut, errs)
        assert ctx.get(dut.status.code) != 0
        ctx.set(dut.status.clear, 1)
        await ctx.tick()
        ctx.set(dut.status.clear, 0)
        assert ctx.get(dut.status.counts[0]) == 0 and ctx.get(dut.status.code) == 0

    async def tb_watch(ctx):
        ctx.set(dut.data.ready, 1)
        ctx.set(dut.hdr.ready, 1)
        async for _, _, dv, hv in ctx.tick().sample(dut.data.valid, dut.hdr.valid):
            if dv or hv:
                seen.append(1)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb_in)
    sim.add_testbench(tb_watch, background=True)
    _run(sim)
    assert not seen


def test_depacketiser_counts_overflow():
    fmt = FlitFormat(max_packet_words=8)
    dut = Depacketiser(fmt, sub_words=8, credits=2, buf_flits=4)
    flits = model.packetise({"op": 1, "length": 24, "vc": 0}, list(range(24)), fmt=fmt,
                            sub_words=8)

    async def tb(ctx):
        ctx.set(dut.flow_enable, ALL_FLOWS)
        # ignore credits: 13 flits with the output blocked: the head, 4 flits in the buffer
        # region, 1 in the output register, 3 in the input FIFO (credits + 1: its RAM part
        # holds ``credits``, see Depacketiser) fit.  The flits come a few cycles apart so
        # that this counts room, not how soon a commit frees a slot (back to back, the
        # slot the output register frees comes only after the last flit)
        for f in flits:
            ctx.set(dut.rx.valid, 1)
            ctx.set(dut.rx.flit.as_value(), f)
            await ctx.tick()
            ctx.set(dut.rx.valid, 0)
            await ctx.tick().repeat(8)
        assert ctx.get(dut.status.counts[ErrorCause.OVERFLOW]) == 13 - 1 - 4 - 1 - 3
        assert ctx.get(dut.status.code) == ErrorCause.OVERFLOW

    run_sim(dut, [tb], 200)


@pytest.mark.parametrize("kind", ["head_tail", "sub_words_w"])
def test_depacketiser_full_rate_commit_per_flit(kind):
    """Output not backpressured: one flit per cycle even when every flit ends a fragment
    (the pop reserves descriptor FIFO room for the commits still in its pipeline)."""
    W = FMT.lanes
    if kind == "head_tail":
        sub, flits = 8, sum((model.packetise({"op": 1, "flow": 1, "offset": i}, [], "packet")
                             for i in range(200)), [])
    else:
        sub, flits = W, model.packetise({"op": 1, "flow": 1, "length": 400}, list(range(400)),
                                        "message", sub_words=W)
    gold, _ = model.depacketise(flits, sub_words=sub)
    credits = 4
    dut = Depacketiser(FMT, sub_words=sub, credits=credits)
    res = {}

    async def tb(ctx):
        ctx.set(dut.flow_enable, ALL_FLOWS)
        ctx.set(dut.hdr.ready, 1)
        ctx.set(dut.data.ready, 1)
        cred, i, waits = credits, 0, 0
        while i < len(flits):
            ctx.set(dut.rx.valid, cred > 0)
            ctx.set(dut.rx.flit.as_value(), flits[i])
            _, _, ret = await ctx.tick().sample(dut.rx.credit)
            if cred > 0:
                cred, i = cred - 1, i + 1
            else:
                waits += 1
            cred += ret & 1
        ctx.set(dut.rx.valid, 0)
        await ctx.tick().repeat(20)
        res.update(waits=waits, frags=ctx.get(dut.status.frags))

    run_sim(dut, [tb], 3 * len(flits) + 100)
    assert res == {"waits": 0, "frags": len(gold)}


class Loopback(wiring.Component):
    """packetiser -> link model -> depacketiser (used by the RTL tests and benches)."""

    def __init__(self, fmt=FMT, *, mode="message", sub_words=8, packet_words=8, credits=4,
                 latency=2, stall=64, seed=0xACE1):
        self.fmt = fmt
        self.p = Packetiser(fmt, mode=mode, sub_words=sub_words, packet_words=packet_words,
                            credits=credits)
        self.l = LinkChannel(fmt, latency=latency, stall=stall, seed=seed)
        self.d = Depacketiser(fmt, sub_words=sub_words, credits=credits)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.p, m.submodules.l, m.submodules.d = self.p, self.l, self.d
        wiring.connect(m, self.p.tx, self.l.i)
        wiring.connect(m, self.l.o, self.d.rx)
        return m


@pytest.mark.parametrize("mode,stall", [("message", 64), ("packet", 64), ("message", 0)])
def test_loopback_rtl(mode, stall):
    rng = random.Random(f"{mode}-{stall}")
    top = Loopback(mode=mode, stall=stall, credits=3)
    msgs = rand_messages(rng, 10, 40)
    flits = sum((model.packetise(h, w, mode, sub_words=8, packet_words=8) for h, w in msgs),
                [])
    gold, errs = model.depacketise(flits, sub_words=8)
    assert all(v == 0 for v in errs.values())
    got = []

    async def tb_in(ctx):
        ctx.set(top.d.flow_enable, ALL_FLOWS)
        await send_messages(ctx, top.p, msgs, rng, p_idle=0.2)

    async def tb_out(ctx):
        await collect_fragments(ctx, top.d, got, len(gold), rng, p_stall=0.2)
        assert ctx.get(top.l.overflow) == 0
        assert ctx.get(top.d.status.counts[0]) == 0
        if stall:
            assert ctx.get(top.l.stalls) > 0

    run_sim(top, [tb_in, tb_out], 8000)
    assert by_vc(got) == by_vc(gold)
    assert len(got) == len(gold)


def test_loopback_full_throughput_message_mode():
    """No stalls, enough credits for the round trip: one flit per cycle on the link."""
    top = Loopback(mode="message", stall=0, credits=8, latency=1, sub_words=64)  # RTT < 8
    n = 512
    words = list(range(n))
    h = dict(vc=0, flow=1, op=1, length=n)
    nflits = len(model.packetise(h, words, "message", sub_words=64))
    cycles = {}

    async def tb_in(ctx):
        ctx.set(top.d.flow_enable, ALL_FLOWS)
        ctx.set(top.d.hdr.ready, 1)
        ctx.set(top.d.data.ready, 1)
        ctx.set(top.p.hdr.payload.as_value(), FMT.pack_header(**h))
        ctx.set(top.p.hdr.valid, 1)
        await ctx.tick()
        ctx.set(top.p.hdr.valid, 0)
        ctx.set(top.p.data.valid, 1)
        first = None
        for c in range(4 * nflits):
            _, _, v = await ctx.tick().sample(top.p.tx.valid)
            if v and first is None:
                first = c
            if v:
                cycles[c] = 1
            if ctx.get(top.p.status.flits) == nflits:
                break
        cycles["span"] = c - first + 1

    run_sim(top, [tb_in], 4 * nflits + 100)
    assert cycles["span"] <= nflits + 2
