"""cocotb bench: Depacketiser vs golden ``depacketise``: random mixed-mode traffic on all
VCs interleaved flit by flit, random faults injected, random input gaps (sender honours
credits), random backpressure on both outputs; directed malformed-only traffic."""
import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly

from harness import bench_params, bench_seed, start_clock_and_reset
from link_common import (kick_comb, FragmentAssembler, Sink, by_vc, check_error_counts, fmt_from,
                         interleave, rand_messages, run_cycles, status_counts, u)
from treenic.hdl.link import model
from treenic.hdl.link.flit import ErrorCause, FlitType as T


class FlitDriver:
    """Sends flits in order, each only with a credit for its VC; random idle cycles."""

    def __init__(self, dut, fmt, flits, rng, credits, p_idle):
        self.dut, self.fmt, self.flits, self.rng = dut, fmt, list(flits), rng
        self.cred = [credits] * fmt.vcs
        self.credits, self.p_idle = credits, p_idle
        self.i = 0
        self.sending = False
        self.min_cred = credits
        dut.rx__valid.value = 0

    @property
    def done(self):
        return self.i >= len(self.flits) and self.cred == [self.credits] * self.fmt.vcs

    def drive(self):
        self.sending = False
        if self.i < len(self.flits):
            vc = self.fmt.split_flit(self.flits[self.i])[1]
            if self.cred[vc] > 0 and self.rng.random() >= self.p_idle:
                self.sending = True
                self.dut.rx__flit.value = self.flits[self.i]
        self.dut.rx__valid.value = int(self.sending)

    def sample(self):
        ret = u(self.dut.rx__credit)
        if self.sending:
            vc = self.fmt.split_flit(self.flits[self.i])[1]
            self.cred[vc] -= 1
            self.min_cred = min(self.min_cred, self.cred[vc])
            self.i += 1
        for v in range(self.fmt.vcs):
            self.cred[v] += (ret >> v) & 1
            assert self.cred[v] <= self.credits, "more credits returned than flits sent"


def init(d):
    kick_comb(d)
    d.rx__valid.value = 0
    d.hdr__ready.value = 0
    d.data__ready.value = 0
    d.status__clear.value = 0


async def run_traffic(dut, fmt, flits, flow_enable, rng, p):
    gold, errs = model.depacketise(flits, fmt, sub_words=p["sub_words"],
                                   flow_enable=flow_enable)
    await FallingEdge(dut.clk)
    dut.flow_enable.value = flow_enable
    drv = FlitDriver(dut, fmt, flits, rng, p["credits"], p["p_idle"])
    hs = Sink(dut, "hdr", rng, p["p_stall"])
    ds = Sink(dut, "data", rng, p["p_stall"])
    nbeats = sum(-(-len(f.words) // fmt.lanes) for f in gold)
    cycles = await run_cycles(
        dut.clk, [drv, hs, ds],
        lambda: drv.done and len(hs.got) >= len(gold) and len(ds.got) >= nbeats,
        max_cycles=30 * len(flits) + 1000, settle=8)
    got, extra = FragmentAssembler(fmt, hs, ds).fragments()
    assert extra == 0, f"{extra} data beats beyond the fragments"
    assert len(got) == len(gold), f"{len(got)} fragments, golden {len(gold)}"
    g_rtl, g_gold = by_vc(got, fmt), by_vc(gold, fmt)
    for vc in g_gold:
        for i, (a, b) in enumerate(zip(g_rtl[vc], g_gold[vc])):
            assert a == b, f"VC {vc} fragment {i}:\n RTL    {a}\n golden {b}"
    check_error_counts(dut, errs)
    assert u(dut.status__frags) == len(gold)
    return gold, errs, cycles, drv


@cocotb.test()
async def random_traffic_with_faults(dut):
    p = bench_params()
    fmt = fmt_from(p)
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=init)
    total_err = 0
    exhausted = 0
    for rnd, p_stall in enumerate(p["p_stalls"]):
        q = dict(p, p_stall=p_stall)
        streams = [[] for _ in range(fmt.vcs)]
        msgs = rand_messages(rng, p["n_msgs"], p["max_words"], fmt, min_words=0)
        for h, w in msgs:
            mode = rng.choice(["message", "packet"])
            if mode == "message" and not w:
                continue
            streams[h["vc"]] += model.packetise(h, w, mode, fmt, sub_words=p["sub_words"],
                                                packet_words=p["packet_words"])
        flits = model.mutate_flits(interleave(streams, rng), rng, fmt,
                                   n=rng.randint(0, p["max_faults"]))
        flow_enable = (1 << fmt.flows) - 1
        if rnd % 2:        # a flow in use is unknown to the receiver
            flow_enable &= ~(1 << rng.choice(msgs)[0]["flow"])
        gold, errs, cycles, drv = await run_traffic(dut, fmt, flits, flow_enable, rng, q)
        total_err += sum(errs[c] for c in ErrorCause if c != ErrorCause.NONE)
        exhausted += drv.min_cred == 0
        dut._log.info(f"round {rnd} (output stall {p_stall}): {len(flits)} flits, "
                      f"{len(gold)} fragments, credits exhausted: {drv.min_cred == 0}, "
                      f"errors {dict((c.name, n) for c, n in errs.items() if n and c != 'dropped')}"
                      f", dropped {errs['dropped']}, {cycles} cycles")
        # clear the counters between rounds
        await FallingEdge(dut.clk)
        dut.status__clear.value = 1
        await FallingEdge(dut.clk)
        dut.status__clear.value = 0
        await ReadOnly()
        assert status_counts(dut) == [0] * len(ErrorCause) and u(dut.status__code) == 0
    assert total_err > 0, "no fault was injected: weak bench"
    assert exhausted > 0, "credits never exhausted: weak bench"


@cocotb.test()
async def malformed_only_reaches_no_output(dut):
    p = bench_params()
    fmt = fmt_from(p)
    rng = random.Random(bench_seed() + 1)
    await start_clock_and_reset(dut, init=init)
    F = fmt.make_flit
    good = model.packetise({"flow": 1, "op": 1, "length": 20, "vc": 1}, list(range(20)), "message",
                           fmt, sub_words=8)
    seq = []
    seq += good[1:]                                          # ORPHAN: body before head
    seq += good[:4] + [F(T.SUB_BODY, 1, 0)] + good[5:]       # SEQ: missing sub-tail
    seq += [F(T.SUB_HEAD, 0, fmt.pack_sub_head(flow=1, op=3, length=4)),
            F(T.SUB_BODY, 0, 1), F(T.MSG_TAIL, 0, 2)]        # OP
    seq += [F(T.SUB_HEAD, 0, fmt.pack_sub_head(flow=9, op=1, length=4)),
            F(T.SUB_BODY, 0, 1), F(T.MSG_TAIL, 0, 2)]        # FLOW (9 disabled)
    seq += [F(T.HEAD, 1, fmt.pack_pkt_head(flow=1, op=2, length=4)),
            F(T.BODY, 1, 1), F(T.BODY, 1, 2)]                # SEQ: missing tail, then
    seq += [F(T.HEAD, 1, fmt.pack_pkt_head(flow=1, op=2, length=70)),
            F(T.TAIL, 1, 2)]                                  # LENGTH (> 64 words)
    seq += [F(T.SUB_HEAD, 0, fmt.pack_sub_head(flow=1, op=1, length=0)), F(T.MSG_TAIL, 0, 0)]
    seq += [F(T.MSG_TAIL, 0, 5), F(T.TAIL, 1, 6)]            # 2 orphan tails
    flow_enable = ((1 << fmt.flows) - 1) & ~(1 << 9)
    q = dict(p, sub_words=8, p_stall=0.3)
    gold, errs, _, _ = await run_traffic(dut, fmt, seq, flow_enable, rng, q)
    assert gold == []
    want = {ErrorCause.ORPHAN: 3, ErrorCause.SEQ: 2, ErrorCause.FLOW: 1, ErrorCause.OP: 1,
            ErrorCause.LENGTH: 2}
    counts = status_counts(dut)
    assert {c: counts[int(c)] for c in want} == want
    assert counts[0] == sum(want.values())
    assert u(dut.status__frags) == 0
