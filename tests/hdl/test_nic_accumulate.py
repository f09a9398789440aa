"""Accumulate (hdl/nic/rx.py): random beats (REDUCE and GATHER, partial lane masks, random
gaps) against the adder's golden function (``fp32_add_golden``: binary32, round to nearest
even) -- the buffer write of every beat, bit for bit, and the fragment-end events."""
import random

import numpy as np

from treenic.hdl.fp32 import fp32_add_golden
from treenic.hdl.nic.buffer import READ_LATENCY
from treenic.hdl.nic.rx import Accumulate

from nic_unit_helpers import SMALL, simulate


def test_accumulate_writes_golden_sums():
    p = SMALL
    W = p.lanes
    dut = Accumulate(params=p)
    rnd = random.Random(7)
    rng = np.random.default_rng(7)
    beats = []
    for _ in range(120):
        if rnd.random() < 0.3:
            beats.append(None)                         # a gap
            continue
        old = rng.standard_normal(W).astype(np.float32)
        new = rng.standard_normal(W).astype(np.float32)
        nlanes = rnd.randint(1, W)
        beats.append({"addr": rnd.randrange(0, p.depth - W), "mask": (1 << nlanes) - 1,
                      "red": rnd.random() < 0.6, "flast": rnd.random() < 0.3,
                      "mlast": rnd.random() < 0.5, "flow": rnd.randrange(p.max_nodes),
                      "old": old, "new": new})
    expect = []
    for b in beats:
        if b is None:
            continue
        new = b["new"].view(np.uint32)
        res = fp32_add_golden(b["old"].view(np.uint32), new) if b["red"] else new
        expect.append((b["addr"], b["mask"], [int(x) for x in res]))
    seen_writes, seen_last = [], []

    def word(arr):
        return sum(int(x) << (32 * k) for k, x in enumerate(arr.view(np.uint32)))

    async def tb(ctx):
        for t in range(len(beats) + READ_LATENCY + 20):
            b = beats[t] if t < len(beats) else None
            ctx.set(dut.beat.v, b is not None)
            if b is not None:
                ctx.set(dut.beat.data, word(b["new"]))
                for k in ("addr", "mask", "red", "flast", "flow"):
                    ctx.set(dut.beat[k], int(b[k]))
                ctx.set(dut.beat.mlast, int(b["mlast"] and b["flast"]))
            # the read data of the beat presented READ_LATENCY cycles ago
            r = beats[t - READ_LATENCY] if 0 <= t - READ_LATENCY < len(beats) else None
            ctx.set(dut.read_data, word(r["old"]) if r is not None else 0)
            await ctx.tick()
            en = ctx.get(dut.write.en)
            if en:
                d = ctx.get(dut.write.data)
                seen_writes.append((ctx.get(dut.write.addr), en,
                                    [(d >> (32 * k)) & 0xFFFFFFFF for k in range(W)]))
            if ctx.get(dut.last_valid):
                seen_last.append((ctx.get(dut.last_addr_end), ctx.get(dut.last_mlast),
                                  ctx.get(dut.last_red), ctx.get(dut.last_flow)))
        words = sum(bin(b["mask"]).count("1") for b in beats if b is not None)
        assert ctx.get(dut.words) == words

    simulate(dut, tb)
    got = [(a, en, [w if en >> k & 1 else None for k, w in enumerate(ws)])
           for a, en, ws in seen_writes]
    want = [(a, en, [w if en >> k & 1 else None for k, w in enumerate(ws)])
            for a, en, ws in expect]
    assert got == want
    last = [(b["addr"] + bin(b["mask"]).count("1"), int(b["mlast"]), int(b["red"]), b["flow"])
            for b in beats if b is not None and b["flast"]]
    assert seen_last == last
