"""cocotb bench: Packetiser vs golden ``packetise`` (random messages, random valid gaps on
both input streams, receiver returning credits after random delays so credits run out)."""
import random

import cocotb

from harness import bench_params, bench_seed, start_clock_and_reset
from link_common import kick_comb, Source, fmt_from, rand_messages, run_cycles, u
from treenic.hdl.link import model
from treenic.hdl.link.flit import FlitType


class CreditReturn:
    """Downstream buffer model: records flits, frees each slot after a random delay."""

    def __init__(self, dut, fmt, rng, credits, max_delay):
        self.dut, self.fmt, self.rng = dut, fmt, rng
        self.credits, self.max_delay = credits, max_delay
        self.flits, self.pending = [], []
        self.outstanding = [0] * fmt.vcs
        self.cycle = 0
        self.peak = 0
        dut.tx__credit.value = 0

    def drive(self):
        self.cycle += 1
        bits = 0
        for item in list(self.pending):
            due, vc = item
            if due <= self.cycle and not (bits >> vc) & 1:
                bits |= 1 << vc
                self.pending.remove(item)
                self.outstanding[vc] -= 1
        self.dut.tx__credit.value = bits

    def sample(self):
        if int(self.dut.tx__valid.value):
            f = u(self.dut.tx__flit)
            self.flits.append(f)
            vc = self.fmt.split_flit(f)[1]
            self.outstanding[vc] += 1
            self.peak = max(self.peak, self.outstanding[vc])
            assert self.outstanding[vc] <= self.credits, f"VC {vc}: flit sent without credit"
            self.pending.append((self.cycle + self.rng.randint(1, self.max_delay), vc))


@cocotb.test()
async def random_messages_vs_golden(dut):
    p = bench_params()
    fmt = fmt_from(p)
    rng = random.Random(bench_seed())
    mode = p["mode"]

    def init(d):
        kick_comb(d)
        d.hdr__valid.value = 0
        d.data__valid.value = 0
        d.tx__credit.value = 0

    await start_clock_and_reset(dut, init=init)
    msgs = rand_messages(rng, p["n_msgs"], p["max_words"], fmt,
                         min_words=0 if mode == "packet" else 1)
    kw = dict(sub_words=p["sub_words"], packet_words=p["packet_words"])
    gold = [f for h, w in msgs for f in model.packetise(h, w, mode, fmt, **kw)]
    beats = [fmt.pack_words(w[i:i + fmt.lanes]) for _, w in msgs
             for i in range(0, len(w), fmt.lanes)]
    hs = Source(dut, "hdr", [fmt.pack_header(**h) for h, _ in msgs], rng, p["p_idle"])
    ds = Source(dut, "data", beats, rng, p["p_idle"])
    cr = CreditReturn(dut, fmt, rng, p["credits"], p["max_credit_delay"])
    cycles = await run_cycles(dut.clk, [hs, ds, cr],
                              lambda: len(cr.flits) >= len(gold) and not cr.pending,
                              max_cycles=40 * len(gold) + 1000, settle=4)
    assert len(cr.flits) == len(gold), f"{len(cr.flits)} flits, golden {len(gold)}"
    for i, (a, b) in enumerate(zip(cr.flits, gold)):
        assert a == b, f"flit {i}: RTL {a:#x} golden {b:#x}"
    heads = sum(fmt.split_flit(f)[0] in (FlitType.SUB_HEAD, FlitType.HEAD, FlitType.HEAD_TAIL)
                for f in gold)
    assert u(dut.status__flits) == len(gold)
    assert u(dut.status__heads) == heads
    assert cr.peak == p["credits"], "credits were never exhausted: weak bench"
    dut._log.info(f"{mode}: {len(msgs)} messages, {len(gold)} flits bit-exact in {cycles} "
                  f"cycles")
