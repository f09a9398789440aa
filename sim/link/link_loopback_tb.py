"""cocotb bench: packetiser -> link model (latency, LFSR stalls) -> depacketiser, random
messages on all VCs, random gaps on both inputs, random backpressure on both outputs;
fragments bit-exact vs golden depacketise(packetise(...))."""
import random

import cocotb

from harness import bench_params, bench_seed, start_clock_and_reset
from link_common import (kick_comb, FragmentAssembler, Sink, Source, by_vc, fmt_from, rand_messages,
                         run_cycles, status_counts, u)
from treenic.hdl.link import model


@cocotb.test()
async def loopback_vs_golden(dut):
    p = bench_params()
    fmt = fmt_from(p)
    rng = random.Random(bench_seed())
    mode = p["mode"]

    def init(d):
        kick_comb(d)
        d.hdr__valid.value = 0
        d.data__valid.value = 0
        d.o_hdr__ready.value = 0
        d.o_data__ready.value = 0
        d.flow_enable.value = (1 << fmt.flows) - 1

    await start_clock_and_reset(dut, init=init)
    msgs = rand_messages(rng, p["n_msgs"], p["max_words"], fmt,
                         min_words=0 if mode == "packet" else 1)
    kw = dict(sub_words=p["sub_words"], packet_words=p["packet_words"])
    flits = [f for h, w in msgs for f in model.packetise(h, w, mode, fmt, **kw)]
    gold, errs = model.depacketise(flits, fmt, sub_words=p["sub_words"])
    assert not any(errs.values())
    beats = [fmt.pack_words(w[i:i + fmt.lanes]) for _, w in msgs
             for i in range(0, len(w), fmt.lanes)]
    hsrc = Source(dut, "hdr", [fmt.pack_header(**h) for h, _ in msgs], rng, p["p_idle"])
    dsrc = Source(dut, "data", beats, rng, p["p_idle"])
    hs = Sink(dut, "o_hdr", rng, p["p_stall"])
    ds = Sink(dut, "o_data", rng, p["p_stall"])
    nbeats = sum(-(-len(f.words) // fmt.lanes) for f in gold)
    cycles = await run_cycles(dut.clk, [hsrc, dsrc, hs, ds],
                              lambda: len(hs.got) >= len(gold) and len(ds.got) >= nbeats,
                              max_cycles=40 * len(flits) + 1000, settle=8)
    got, extra = FragmentAssembler(fmt, hs, ds).fragments()
    assert extra == 0 and len(got) == len(gold)
    g_rtl, g_gold = by_vc(got, fmt), by_vc(gold, fmt)
    for vc in g_gold:
        for i, (a, b) in enumerate(zip(g_rtl[vc], g_gold[vc])):
            assert a == b, f"VC {vc} fragment {i}:\n RTL    {a}\n golden {b}"
    assert status_counts(dut, "rx_status") == [0] * len(status_counts(dut, "rx_status"))
    assert u(dut.link_overflow) == 0
    assert u(dut.tx_status__flits) == len(flits)
    if p["stall"]:
        assert u(dut.link_stalls) > 0
    dut._log.info(f"{mode}: {len(msgs)} messages, {len(flits)} flits, {len(gold)} fragments "
                  f"bit-exact in {cycles} cycles, {u(dut.link_stalls)} link stall cycles")
