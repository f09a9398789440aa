"""Banked gradient buffer (hdl/nic/buffer.py) against its cycle-level golden model: random
read requests (grants and data bit for bit, every cycle), random writes incl. bank
conflicts, a sequential fill before and a full read-back after.  Directed tests pin the
contract itself (read latency, write visibility, conflict timing) without the model."""
import random

import pytest
from amaranth.sim import Simulator

from treenic.hdl.nic.buffer import (ARBITERS, BankedBuffer, BankedBufferModel,
                                    CONFLICT_LATENCY, READ_LATENCY, WRITE_VISIBLE)


def run_random(depth, banks, lanes, readers, writers, cycles, seed, conflicts,
               write_back=(), arbiter="fixed"):
    dut = BankedBuffer(depth=depth, banks=banks, lanes=lanes, readers=readers,
                       writers=writers, write_back=write_back, arbiter=arbiter)
    model = BankedBufferModel(depth=depth, banks=banks, lanes=lanes, write_back=write_back,
                              arbiter=arbiter)
    rnd = random.Random(seed)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    # overtaken: a grant to a reader while a lower-index contending reader on a common
    # bank was refused (never under "fixed")
    stats = {"grants": 0, "blocked": 0, "conflicts": 0, "checked": 0, "overtaken": 0}

    def word():
        return rnd.getrandbits(32)

    def drive(ctx, reads, writes):
        for (req, addr, *wo), rd in zip(reads, dut.rd):
            ctx.set(rd.req, req)
            ctx.set(rd.addr, addr)
            ctx.set(rd.write_only, bool(wo and wo[0]))
        for wr, w in zip(dut.wr, writes + [(0, 0, [0] * lanes)] * (writers - len(writes))):
            addr, en, words = w
            ctx.set(wr.addr, addr)
            ctx.set(wr.en, en)
            ctx.set(wr.data, sum(v << (32 * k) for k, v in enumerate(words)))
        return model.cycle(reads, writes)

    def check(ctx, grants, outs, conflict):
        for r, rd in enumerate(dut.rd):
            assert ctx.get(rd.grant) == grants[r], f"reader {r} grant"
            assert ctx.get(rd.valid) == (outs[r] is not None), f"reader {r} valid"
            if outs[r] is not None:
                got = ctx.get(rd.data)
                for k in range(lanes):
                    if outs[r][k] is not None:      # None: past the end, don't-care
                        assert (got >> (32 * k)) & 0xFFFFFFFF == outs[r][k], \
                            f"reader {r} lane {k}"
                stats["checked"] += 1
        assert ctx.get(dut.conflict) == conflict

    async def tb(ctx):
        idle = [(0, 0)] * readers
        # fill through writer 0, lanes words at a time
        for a in range(0, depth, lanes):
            en = sum(1 << k for k in range(lanes) if a + k < depth)
            check(ctx, *drive(ctx, idle, [(a, en, [word() for _ in range(lanes)])]))
            await ctx.tick()
        for _ in range(cycles):
            # write_only on every reader: the buffer must ignore it on the plain readers
            reads = [(rnd.random() < 0.7, rnd.randrange(depth), rnd.random() < 0.4)
                     for _ in range(readers)]
            writes = []
            used = set()
            for _ in range(writers):
                addr, en = rnd.randrange(depth), rnd.getrandbits(lanes)
                en &= sum(1 << k for k in range(lanes) if addr + k < depth)
                banks_hit = {(addr + k) % banks for k in range(lanes) if en >> k & 1}
                if not conflicts and banks_hit & used:
                    en = 0
                used |= banks_hit if en else set()
                writes.append((addr, en, [word() for _ in range(lanes)]))
            grants, outs, conflict = drive(ctx, reads, writes)
            check(ctx, grants, outs, conflict)
            stats["grants"] += sum(grants)
            stats["blocked"] += sum(q and not g for (q, *_), g in zip(reads, grants))
            stats["overtaken"] += overtaken(model, reads, grants)
            stats["conflicts"] += conflict
            await ctx.tick()
        # read everything back through reader 0 (highest priority: always granted)
        for a in list(range(0, depth, lanes)) + [None] * READ_LATENCY:
            reads = [(1, a)] + idle[1:] if a is not None else idle
            check(ctx, *drive(ctx, reads, []))
            await ctx.tick()

    sim.add_testbench(tb)
    sim.run()
    return stats


def overtaken(model, reads, grants):
    """Granted readers that went before a lower-index reader they clash with."""
    wb = model.write_back

    def clash(j, r):
        (_, a, wo_j), (_, b, wo_r) = reads[j], reads[r]
        wo_j, wo_r = bool(wo_j) and j in wb, bool(wo_r) and r in wb
        both = (j in wb and r in wb) or (not wo_j and not wo_r)
        return both and model._banks(a) & model._banks(b)
    return sum(1 for r, g in enumerate(grants) if g for j in range(1, r)
               if reads[j][0] and not grants[j] and clash(j, r))


@pytest.mark.parametrize("depth,banks,lanes,readers,writers,conflicts", [
    (64, 8, 2, 4, 2, False),
    (96, 16, 2, 8, 4, False),
    (40, 4, 4, 3, 2, False),      # lanes == banks: every request touches every bank
    (64, 8, 1, 5, 3, True),       # colliding writers: rows and words ORed, conflict flagged
    (48, 16, 2, 9, 5, True),      # ... with two lanes (incl. a lane wrapped to the next row)
    (128, 32, 2, 9, 5, False),    # the NIC's shape: 32 banks, 1 + 4 + 4 readers, 4 + 1 writers
])
@pytest.mark.parametrize("write_back", [(), (1, 2, 3)], ids=["plain", "write_back"])
def test_banked_buffer_matches_model(depth, banks, lanes, readers, writers, conflicts,
                                     write_back):
    write_back = tuple(r for r in write_back if r < readers)
    s = run_random(depth, banks, lanes, readers, writers, cycles=400, seed=depth + banks,
                   conflicts=conflicts, write_back=write_back)
    assert s["checked"] > 100 and s["blocked"] > 0      # arbitration was exercised
    assert (s["conflicts"] > 0) == conflicts
    assert s["overtaken"] == 0                          # lower index first


@pytest.mark.parametrize("depth,banks,lanes,readers,writers,conflicts", [
    (40, 4, 4, 3, 2, False),      # two readers take turns; every request on every bank
    (48, 16, 2, 9, 5, True),      # colliding writers, wrapped lanes
    (128, 32, 2, 9, 5, False),    # the NIC's shape: 1 host + 4 RX (write back) + 4 TX
])
@pytest.mark.parametrize("arbiter", [a for a in ARBITERS if a != "fixed"])
def test_arbiters_match_model(depth, banks, lanes, readers, writers, conflicts, arbiter):
    """The rotating and age orders, write-back readers 1..3 (the NIC's RX ports): grants
    and data bit for bit against the model, and some grants overtake a lower index."""
    s = run_random(depth, banks, lanes, readers, writers, cycles=400, seed=depth + 7,
                   conflicts=conflicts, write_back=(1, 2, 3)[:readers - 1], arbiter=arbiter)
    assert s["checked"] > 100 and s["blocked"] > 0
    assert (s["conflicts"] > 0) == conflicts
    assert s["overtaken"] > 0


def run_directed(dut, lanes, script, cycles):
    """Drive ``script[c] = (reads {r: addr}, writes {w: (addr, en, words)})`` in cycle c
    (idle otherwise); return per cycle (grants, {r: [words] if valid}, conflict)."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    log = []

    async def tb(ctx):
        for c in range(cycles):
            reads, writes = script.get(c, ({}, {}))
            for r, rd in enumerate(dut.rd):
                addr, wo = reads.get(r, 0), False
                if isinstance(addr, tuple):
                    addr, wo = addr
                ctx.set(rd.req, r in reads)
                ctx.set(rd.addr, addr)
                ctx.set(rd.write_only, wo)
            for w, wr in enumerate(dut.wr):
                addr, en, words = writes.get(w, (0, 0, [0] * lanes))
                ctx.set(wr.addr, addr)
                ctx.set(wr.en, en)
                ctx.set(wr.data, sum(v << (32 * k) for k, v in enumerate(words)))
            outs = {r: [ctx.get(rd.data) >> (32 * k) & 0xFFFFFFFF for k in range(lanes)]
                    for r, rd in enumerate(dut.rd) if ctx.get(rd.valid)}
            log.append(([ctx.get(rd.grant) for rd in dut.rd], outs, ctx.get(dut.conflict)))
            await ctx.tick()

    sim.add_testbench(tb)
    sim.run()
    return log


def test_contract_constants():
    # what the NIC core is built around (host read latency, RX beat pipeline, TX credits)
    assert (READ_LATENCY, WRITE_VISIBLE, CONFLICT_LATENCY) == (5, 1, 2)


@pytest.mark.parametrize("addr", [18, 23])      # 23: lane 1 wraps to bank 0, next row
def test_read_latency_and_write_visibility(addr):
    """A write presented in cycle T is seen by reads requested in T + WRITE_VISIBLE or
    later, not before; every granted read answers exactly READ_LATENCY cycles later."""
    lanes = 2
    dut = BankedBuffer(depth=64, banks=8, lanes=lanes, readers=2, writers=2)
    old, new = [0x11111111, 0x22222222], [0xAAAAAAAA, 0xBBBBBBBB]
    T = 10
    script = {0: ({}, {1: (addr, 0b11, old)}),
              T: ({}, {1: (addr, 0b11, new)})}
    req_cycles = range(T - 3, T + 4)
    for c in req_cycles:
        script.setdefault(c, ({}, {}))[0][0] = addr
    log = run_directed(dut, lanes, script, T + 4 + READ_LATENCY + 2)
    for c, (grants, outs, _) in enumerate(log):
        assert grants[0] == (c in req_cycles)
        asked = c - READ_LATENCY in req_cycles
        assert (0 in outs) == asked, f"cycle {c}: valid"
        if asked:
            want = new if c - READ_LATENCY >= T + WRITE_VISIBLE else old
            assert outs[0] == want, f"read requested in cycle {c - READ_LATENCY}"


def test_write_conflict_timing_and_result():
    """Two writers in one bank: ``conflict`` pulses CONFLICT_LATENCY cycles later, that
    bank writes the OR of the rows and words, the other lanes write normally."""
    lanes, banks = 2, 8
    dut = BankedBuffer(depth=64, banks=banks, lanes=lanes, readers=1, writers=3)
    w0, w2 = [0x01020304, 0x00F000F0], [0x0F000F00, 0x30405060]
    T = 3
    # writer 0: elements 11, 12 (banks 3, 4; row 1); writer 2: 20, 21 (banks 4, 5; row 2)
    script = {T: ({}, {0: (11, 0b11, w0), 2: (20, 0b11, w2)})}
    expect = {e: 0 for e in range(64)}
    expect.update({11: w0[0], 21: w2[1], 3 * banks + 4: w0[1] | w2[0]})   # bank 4, row 1|2
    base = T + WRITE_VISIBLE
    for i, e in enumerate(range(0, 64, lanes)):
        script[base + i] = ({0: e}, {})
    log = run_directed(dut, lanes, script, base + 32 + READ_LATENCY + 1)
    assert [c for c, (_, _, x) in enumerate(log) if x] == [T + CONFLICT_LATENCY]
    for i, e in enumerate(range(0, 64, lanes)):
        assert log[base + i + READ_LATENCY][1][0] == [expect[e], expect[e + 1]], f"element {e}"


def test_write_only_requests_share_banks_with_readers_only():
    """Reader 0 plain, readers 1 and 2 write back, all three asking for banks 2 and 3.
    A write-only request contends only with the other write-back reader; a reading one
    with both; a write-only grant returns no data and does not disturb the plain read."""
    lanes = 2
    dut = BankedBuffer(depth=64, banks=8, lanes=lanes, readers=3, writers=1,
                       write_back=(1, 2))
    fill = {e: 0x1000 + e for e in range(64)}
    script = {c: ({}, {0: (e, 0b11, [fill[e], fill[e + 1]])})
              for c, e in enumerate(range(0, 64, lanes))}
    T = 40
    script[T] = ({0: 2, 1: (10, True), 2: (18, True)}, {})        # -> grants 1, 1, 0
    # reader 1 reads: refused (reader 0 reads there), and as the rule is "no
    # higher-priority *request* on my banks", it still keeps reader 2 out
    script[T + 1] = ({0: 2, 1: (10, False), 2: (18, True)}, {})   # -> 1, 0, 0
    script[T + 2] = ({0: 3, 2: (18, True)}, {})                   # -> 1, -, 1
    script[T + 3] = ({0: 3, 2: (18, False)}, {})                  # -> 1, -, 0
    log = run_directed(dut, lanes, script, T + 4 + READ_LATENCY + 1)
    assert [log[T + i][0] for i in range(4)] == [[1, 1, 0], [1, 0, 0], [1, 0, 1], [1, 0, 0]]
    for i, e in enumerate((2, 2, 3, 3)):
        outs = log[T + i + READ_LATENCY][1]
        assert outs == {0: [fill[e], fill[e + 1]]}, f"cycle {T + i}: only reader 0 reads"


@pytest.mark.parametrize("kw,msg", [
    (dict(depth=64, banks=8, lanes=2, write_back=(1,)), "write_back"),
    (dict(depth=64, banks=6, lanes=2), "power of two"),
    (dict(depth=64, banks=2, lanes=4), "lanes"),
    (dict(depth=4, banks=8, lanes=2), "depth"),
    (dict(depth=64, banks=8, lanes=2, arbiter="lru"), "arbiter"),
])
@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_banked_buffer_rejects_bad_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        BankedBuffer(readers=1, writers=1, **kw)


@pytest.mark.parametrize("arbiter,expect", [
    ("fixed", [[1, 1, 0]] * 6),
    ("rotating", [[1, 1, 0], [1, 0, 1]] * 3),     # two readers take turns: alternate
    ("age", [[1, 1, 0], [1, 0, 1]] * 3),          # the refused one goes first next cycle
])
def test_arbiter_orders_starving_reader(arbiter, expect):
    """Reader 1 (write back) and reader 2 read the same banks every cycle, reader 0 reads
    elsewhere: the fixed order starves reader 2, the rotating and age orders alternate."""
    lanes = 2
    dut = BankedBuffer(depth=64, banks=8, lanes=lanes, readers=3, writers=1,
                       write_back=(1,), arbiter=arbiter)
    script = {c: ({0: 0, 1: 4, 2: 5}, {}) for c in range(6)}
    log = run_directed(dut, lanes, script, 6)
    assert [g for g, _, _ in log] == expect


def _two_streams(arbiter, offset, beats=64):
    """An RX (write-back reader 1) and a TX stream (reader 2), each asking for its next
    two elements every cycle, TX ``offset`` banks ahead: the cycle each one finishes."""
    m = BankedBufferModel(depth=4096, banks=16, lanes=2, write_back=(1,), arbiter=arbiter)
    pos, left, done, c = [0, 0, offset], [0, beats, beats], {}, 0
    while left[1] or left[2]:
        grants, _, _ = m.cycle([(0, 0)] + [(left[r] > 0, pos[r]) for r in (1, 2)], [])
        c += 1
        for r in (1, 2):
            if left[r] and grants[r]:
                pos[r], left[r] = pos[r] + 2, left[r] - 1
                done[r] = c
    return done[1], done[2]


@pytest.mark.parametrize("arbiter,expect", [
    ("fixed", (64, 66)),          # TX yields twice, then the windows no longer overlap
    ("rotating", (127, 128)),     # two readers: the order flips every cycle
    ("age", (127, 128)),          # the refused one always goes first next cycle
])
def test_alternating_order_locks_equal_rate_streams(arbiter, expect):
    """Why the age order slows the fabric (docs/performance.md §4): two streams at one
    beat per cycle whose two-bank windows are one bank apart clash every cycle unless
    one of them yields twice in a row.  An order that alternates on every refusal keeps
    them in step, both at half rate."""
    assert _two_streams(arbiter, 1) == expect
    assert _two_streams(arbiter, 2) == (64, 64)        # disjoint windows: no clash
