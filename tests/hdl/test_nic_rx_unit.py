"""RxUnit (hdl/nic/rx.py) with its OrderGate and Accumulate: a REDUCE contribution and a
GATHER message arrive as the golden packetiser's flits with random link gaps; the chunk
in the gradient buffer must become ``fp32_add_golden(old, received)`` (REDUCE) or the
received words (GATHER) and nothing else may change; the arrived bit, the counters and
the credits follow.  A fragment outside its flow's chunk is rejected (FRAG_RANGE event)
and writes nothing.  The order gate holds a REDUCE while another port owes an earlier
contribution (ORDER table) and lets it through once that one has arrived."""
import random

import numpy as np
import pytest

from treenic.hdl.fp32 import fp32_add_golden
from treenic.hdl.link.model import packetise
from treenic.hdl.nic.rx import RxUnit, order_step_nil

from nic_unit_helpers import (SMALL, UnitWithBuffer, buffer_dump, buffer_fill, simulate)

P = SMALL
FLOW, START, SIZE = 1, 6, 20


def run_rx(op, *, offset=START, seed=1, order_block=False):
    rx = RxUnit(params=P, port=0)
    top = UnitWithBuffer(rx, P, unit_reads=True, unit_writes=True)
    rng = np.random.default_rng(seed)
    rnd = random.Random(seed)
    old = rng.standard_normal(P.depth).astype(np.float32).view(np.uint32)
    new = rng.standard_normal(SIZE).astype(np.float32).view(np.uint32)
    flits = packetise({"vc": 0, "next": 0, "eject": 0, "flow": FLOW, "op": op, "step": 3,
                       "offset": offset}, new.tolist(), "message", P.fmt,
                      sub_words=P.sub_words)
    out = {"held": None}

    async def tb(ctx):
        await buffer_fill(ctx, top.buf, old.tolist())
        t = rx.tables
        nil = order_step_nil(P)
        for q in range(P.ports):
            for f in range(P.max_nodes):
                ctx.set(t.order_step[q][f], nil)
        ctx.set(t.start[FLOW], START)
        ctx.set(t.size[FLOW], SIZE)
        ctx.set(t.end[FLOW], START + SIZE)
        if op == 1:
            ctx.set(t.expect[FLOW], 0b01 | (0b10 if order_block else 0))
            if order_block:                 # port 1's contribution comes first (step 2)
                ctx.set(t.order_step[1][FLOW], 2)
        else:
            ctx.set(t.gather_port[FLOW], 0)
        ctx.set(rx.flow_enable, (1 << P.max_nodes) - 1)
        ctx.set(rx.running, 1)
        credits, pos = P.credits, 0
        for c in range(1500):
            go = pos < len(flits) and credits > 0 and rnd.random() < 0.7
            ctx.set(rx.link.valid, go)
            ctx.set(rx.link.flit.as_value(), flits[pos] if go else 0)
            if order_block and c == 400:
                out["held"] = ctx.get(rx.state.reduce_done)
                ctx.set(rx.peers[1].reduce_done, 1 << FLOW)   # port 1's arrived
            await ctx.tick()
            credits += ctx.get(rx.link.credit) - go
            pos += go
        ctx.set(rx.link.valid, 0)
        out.update(credits=credits, frags=ctx.get(rx.frags), words=ctx.get(rx.words),
                   bad=ctx.get(rx.bad), reduce_done=ctx.get(rx.state.reduce_done),
                   gather_done=ctx.get(rx.state.gather_done),
                   buf=await buffer_dump(ctx, top.buf, P.depth))

    ev = {"range": 0}

    async def watch_events(ctx):
        async for _clk, _rst, ev_range in ctx.tick().sample(rx.ev_range):
            ev["range"] += ev_range

    simulate(top, tb, processes=[watch_events])
    return out, old, new, ev


@pytest.mark.parametrize("op", [1, 2], ids=["reduce", "gather"])
def test_rx_unit_accumulates_golden(op):
    o, old, new, ev = run_rx(op)
    want = old.copy()
    chunk = slice(START, START + SIZE)
    want[chunk] = fp32_add_golden(old[chunk], new) if op == 1 else new
    assert o["buf"] == want.tolist()
    assert o["credits"] == P.credits                 # every flit's credit came back
    assert (o["frags"], o["words"], o["bad"]) == (SIZE // P.sub_words + bool(SIZE % P.sub_words),
                                                  SIZE, 0)
    done = o["reduce_done"] if op == 1 else o["gather_done"]
    assert done == 1 << FLOW and ev["range"] == 0


def test_rx_unit_rejects_fragment_outside_chunk():
    o, old, _, ev = run_rx(1, offset=START + 4)
    assert o["buf"] == old.tolist()                  # nothing written
    assert o["bad"] >= 1 and ev["range"] >= 1 and o["reduce_done"] == 0


def test_order_gate_holds_until_earlier_contribution():
    o, old, new, _ = run_rx(1, order_block=True)
    assert o["held"] == 0                            # held while port 1 owed step 2
    want = old.copy()
    want[START:START + SIZE] = fp32_add_golden(old[START:START + SIZE], new)
    assert o["buf"] == want.tolist() and o["reduce_done"] == 1 << FLOW
