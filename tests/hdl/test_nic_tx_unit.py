"""TxUnit (hdl/nic/tx.py): a descriptor becomes exactly the golden packetiser's flits for
the chunk in the gradient buffer, under random credit return (backpressure), in message
and packet mode; ``idle`` and the counters follow."""
import random

import numpy as np
import pytest

from treenic.hdl.link.model import packetise
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.tx import TxUnit

from nic_unit_helpers import SMALL, UnitWithBuffer, buffer_fill, simulate


def send(params, port, desc, words, seed, credit_p):
    tx = TxUnit(params=params, port=port)
    top = UnitWithBuffer(tx, params)
    rnd = random.Random(seed)
    out = {"flits": []}

    async def tb(ctx):
        await buffer_fill(ctx, top.buf, words)
        ctx.set(tx.peer, 3)
        ctx.set(tx.node_id, 1)
        for k, v in desc.items():
            ctx.set(tx.desc[k], v)
        assert ctx.get(tx.idle)
        ctx.set(tx.go, 1)
        await ctx.tick()
        ctx.set(tx.go, 0)
        owed = 0                            # credits the receiver still has to return
        credits_left = params.credits
        for _ in range(2000):
            ret = owed and rnd.random() < credit_p
            ctx.set(tx.link.credit, 1 if ret else 0)
            owed -= bool(ret)
            await ctx.tick()
            credits_left += bool(ret)
            if ctx.get(tx.link.valid):
                out["flits"].append(ctx.get(tx.link.flit.as_value()))
                owed += 1
                credits_left -= 1
                assert credits_left >= 0, "sent without a credit"
            if ctx.get(tx.idle) and not owed:
                break
        out.update(idle=ctx.get(tx.idle), flits_n=ctx.get(tx.flits),
                   heads=ctx.get(tx.heads), words=ctx.get(tx.words))

    simulate(top, tb)
    return out


@pytest.mark.parametrize("mode,credit_p,seed", [("message", 1.0, 1), ("message", 0.3, 2),
                                                ("packet", 0.5, 3)])
def test_tx_unit_sends_golden_flits(mode, credit_p, seed):
    p = NicParams(ports=2, depth=64, max_nodes=4, max_entries=16, max_steps=8, sub_words=8,
                  credits=8, mode=mode, packet_words=8)
    words = np.random.default_rng(seed).integers(0, 1 << 32, p.depth, dtype=np.uint64)
    desc = {"flow": 2, "op": 2, "step": 5, "start": 6, "size": 21}
    o = send(p, 1, desc, words, seed, credit_p)
    hdr = {"vc": 0, "next": 1, "eject": 1, "dest": 3, "src": 1, "flow": 2, "op": 2,
           "step": 5, "offset": 6}
    gold = packetise(hdr, words[6:27].tolist(), mode, p.fmt, sub_words=p.sub_words,
                     packet_words=p.packet_words)
    assert o["flits"] == gold
    assert o["idle"] and o["flits_n"] == len(gold) and o["words"] == 21
    heads = sum(1 for f in gold if p.fmt.split_flit(f)[0].name in ("SUB_HEAD", "HEAD"))
    assert o["heads"] == heads


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_tx_unit_rejects_bad_port():
    with pytest.raises(ValueError, match="port 2"):
        TxUnit(params=SMALL, port=2)
