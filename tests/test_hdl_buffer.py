"""Banked gradient buffer (hdl/nic/buffer.py) against its cycle-level golden model: random
read requests (grants and data bit for bit, every cycle), random writes incl. bank
conflicts, a sequential fill before and a full read-back after."""
import random

import pytest
from amaranth.sim import Simulator

from treenic.hdl.nic.buffer import BankedBuffer, BankedBufferModel, READ_LATENCY


def run_random(depth, banks, lanes, readers, writers, cycles, seed, conflicts):
    dut = BankedBuffer(depth=depth, banks=banks, lanes=lanes, readers=readers,
                       writers=writers)
    model = BankedBufferModel(depth=depth, banks=banks, lanes=lanes)
    rnd = random.Random(seed)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    stats = {"grants": 0, "blocked": 0, "conflicts": 0, "checked": 0}

    def word():
        return rnd.getrandbits(32)

    def drive(ctx, reads, writes):
        for (req, addr), rd in zip(reads, dut.rd):
            ctx.set(rd.req, req)
            ctx.set(rd.addr, addr)
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
            reads = [(rnd.random() < 0.7, rnd.randrange(depth)) for _ in range(readers)]
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
            stats["blocked"] += sum(q and not g for (q, _), g in zip(reads, grants))
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


@pytest.mark.parametrize("depth,banks,lanes,readers,writers,conflicts", [
    (64, 8, 2, 4, 2, False),
    (96, 16, 2, 8, 4, False),
    (40, 4, 4, 3, 2, False),      # lanes == banks: every request touches every bank
    (64, 8, 1, 5, 3, True),       # colliding writers: lowest index wins, conflict flagged
])
def test_banked_buffer_matches_model(depth, banks, lanes, readers, writers, conflicts):
    s = run_random(depth, banks, lanes, readers, writers, cycles=400, seed=depth + banks,
                   conflicts=conflicts)
    assert s["checked"] > 100 and s["blocked"] > 0      # arbitration was exercised
    assert (s["conflicts"] > 0) == conflicts


@pytest.mark.parametrize("kw,msg", [
    (dict(depth=64, banks=6, lanes=2), "power of two"),
    (dict(depth=64, banks=2, lanes=4), "lanes"),
    (dict(depth=4, banks=8, lanes=2), "depth"),
])
@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_banked_buffer_rejects_bad_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        BankedBuffer(readers=1, writers=1, **kw)
