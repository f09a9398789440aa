"""cocotb bench of the order-preserving reduction engine (``treenic.hdl.reduce``).

Random commands (chunk size, ordered contributing ports, repeats allowed), the local
stream and every port's messages are driven by independent coroutines with random start
skew and random valid stalls; ``result`` sees random backpressure.  The output is
compared bit for bit with ``reduce_engine_golden``."""
import random

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.hdl.reduce import (command_layout, element_layout, random_reduce_traffic,
                                reduce_engine_golden)


def _bits(layout, value):
    return int(layout.const(value).as_value().value)


def _init(dut, P):
    for s in ["cmd", "local"] + [f"contrib__{p}" for p in range(P)]:
        getattr(dut, f"{s}__valid").value = 0
        getattr(dut, f"{s}__payload").value = 0
    dut.result__ready.value = 0


async def drive(dut, name, words, *, p_valid, delay, rng):
    valid, payload, ready = (getattr(dut, f"{name}__{f}") for f in ("valid", "payload", "ready"))
    for _ in range(delay):
        await RisingEdge(dut.clk)
    k = 0
    while k < len(words):
        if rng.random() < p_valid:
            payload.value = words[k]
            valid.value = 1
            await ReadOnly()
            fire = int(ready.value)
            await RisingEdge(dut.clk)
            if fire:
                k += 1
        else:
            valid.value = 0
            await RisingEdge(dut.clk)
    valid.value = 0


async def run_traffic(dut, P, D, commands, local, streams, *, p_valid, p_ready, skew, rng):
    el, cl = element_layout(D), command_layout(P, D)
    cmd_words = [_bits(cl, {"size": s, "count": len(o), "order": o + [0] * (P - len(o))})
                 for s, o in commands]
    tasks = [cocotb.start_soon(drive(dut, "cmd", cmd_words, p_valid=p_valid,
                                     delay=rng.randrange(skew + 1), rng=rng)),
             cocotb.start_soon(drive(dut, "local",
                                     [_bits(el, {"index": i, "value": v}) for i, v in local],
                                     p_valid=p_valid, delay=rng.randrange(skew + 1), rng=rng))]
    for p in range(P):
        words = [_bits(el, {"index": i, "value": v}) for i, v in streams[p]]
        tasks.append(cocotb.start_soon(drive(dut, f"contrib__{p}", words, p_valid=p_valid,
                                             delay=rng.randrange(skew + 1), rng=rng)))
    golden = reduce_engine_golden(commands, local, streams)
    expect = [(i, int(v)) for chunk in golden for i, v in enumerate(chunk.tolist())]
    got = 0
    cycles = 0
    limit = 50 * (len(local) + sum(map(len, streams.values())) + len(expect)) + 1000
    while got < len(expect):
        r = int(rng.random() < p_ready)
        dut.result__ready.value = r
        await ReadOnly()
        assert int(dut.error.value) == 0, "engine flagged an error"
        if r and int(dut.result__valid.value):
            d = el.from_bits(int(dut.result__payload.value))
            ei, ev = expect[got]
            assert (int(d.index), int(d.value)) == (ei, ev), (
                f"result {got}: index {int(d.index)} value {int(d.value):#010x}, "
                f"golden index {ei} value {ev:#010x}")
            got += 1
        await RisingEdge(dut.clk)
        cycles += 1
        assert cycles < limit, f"stuck after {cycles} cycles with {got}/{len(expect)} results"
    dut.result__ready.value = 0
    for t in tasks:
        await t
    await RisingEdge(dut.clk)
    await ReadOnly()
    assert int(dut.busy.value) == 0, "engine still busy after the last result"
    return cycles


@cocotb.test()
async def random_skew_stalls_backpressure(dut):
    p = bench_params()
    P, D = p["ports"], p["depth"]
    rng = random.Random(bench_seed())
    nrng = np.random.default_rng(bench_seed())
    await start_clock_and_reset(dut, init=lambda d: _init(d, P))
    commands, local, streams = random_reduce_traffic(nrng, P, D, p.get("n_cmds", 20))
    await run_traffic(dut, P, D, commands, local, streams, p_valid=0.6, p_ready=0.6,
                      skew=3 * D, rng=rng)


@cocotb.test()
async def simultaneous_arrivals_full_rate(dut):
    """Every port offers data every cycle from the start; output always ready."""
    p = bench_params()
    P, D = p["ports"], p["depth"]
    rng = random.Random(bench_seed() + 1)
    nrng = np.random.default_rng(bench_seed() + 1)
    await start_clock_and_reset(dut, init=lambda d: _init(d, P))
    commands, local, streams = random_reduce_traffic(nrng, P, D, 6, allow_repeat=False)
    await run_traffic(dut, P, D, commands, local, streams, p_valid=1.0, p_ready=1.0,
                      skew=0, rng=rng)


@cocotb.test()
async def late_first_port(dut):
    """The first port of the order arrives last (all others are already buffered or
    backpressured): the engine must wait for it, not add in arrival order."""
    p = bench_params()
    P, D = p["ports"], p["depth"]
    rng = random.Random(bench_seed() + 2)
    nrng = np.random.default_rng(bench_seed() + 2)
    await start_clock_and_reset(dut, init=lambda d: _init(d, P))
    size = D
    order = list(range(P))
    vals = nrng.standard_normal(size * (P + 1)).astype(np.float32).view(np.uint32)
    local = [(i, int(vals[i])) for i in range(size)]
    streams = {q: [(i, int(vals[size * (q + 1) + i])) for i in range(size)] for q in range(P)}
    el, cl = element_layout(D), command_layout(P, D)
    tasks = [cocotb.start_soon(drive(dut, "cmd", [_bits(cl, {"size": size, "count": P,
                                                             "order": order})],
                                     p_valid=1.0, delay=0, rng=rng)),
             cocotb.start_soon(drive(dut, "local", [_bits(el, {"index": i, "value": v})
                                                    for i, v in local],
                                     p_valid=1.0, delay=0, rng=rng))]
    for q in range(P):
        tasks.append(cocotb.start_soon(drive(
            dut, f"contrib__{q}", [_bits(el, {"index": i, "value": v}) for i, v in streams[q]],
            p_valid=1.0, delay=(4 * D if q == 0 else 0), rng=rng)))
    golden = reduce_engine_golden([(size, order)], local, streams)[0]
    dut.result__ready.value = 1
    got = []
    for _ in range(20 * D + 200):
        await ReadOnly()
        if int(dut.result__valid.value):
            d = el.from_bits(int(dut.result__payload.value))
            got.append((int(d.index), int(d.value)))
        await RisingEdge(dut.clk)
        if len(got) == size:
            break
    assert got == [(i, int(v)) for i, v in enumerate(golden.tolist())]
    for t in tasks:
        await t
