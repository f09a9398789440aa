"""cocotb bench of ``SkidBuffer``: the output sequence must equal the input sequence
(the golden model of a register slice: the identity on transfers) under random valid
stalls and ready backpressure; with both sides always ready it moves one transfer per
cycle; ``i.ready`` and ``o.valid`` come from registers (they do not follow the other
side within a cycle)."""
import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset


def _init(dut):
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.o__ready.value = 0


async def stream(dut, items, *, p_valid, p_ready, rng):
    """Offer ``items`` on ``i`` and take ``o``; returns (received, cycles)."""
    sent, got, cycles = 0, [], 0
    offering = False
    while len(got) < len(items):
        if not offering and sent < len(items) and rng.random() < p_valid:
            offering = True
            dut.i__payload.value = items[sent]
        dut.i__valid.value = int(offering)
        ready = int(rng.random() < p_ready)
        dut.o__ready.value = ready
        await ReadOnly()
        if offering and int(dut.i__ready.value):
            sent += 1
            offering = False
        if ready and int(dut.o__valid.value):
            got.append(int(dut.o__payload.value))
        await RisingEdge(dut.clk)
        cycles += 1
        assert cycles < 50 * len(items) + 100, f"stuck after {len(got)} of {len(items)}"
    dut.i__valid.value = 0
    dut.o__ready.value = 0
    return got, cycles


@cocotb.test()
async def random_stalls_and_backpressure(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    n, width = p["n"], p["width"]
    for p_valid, p_ready in [(0.9, 0.3), (0.3, 0.9), (0.6, 0.6), (1.0, 0.5)]:
        items = [rng.getrandbits(width) for _ in range(n // 4)]
        got, _ = await stream(dut, items, p_valid=p_valid, p_ready=p_ready, rng=rng)
        assert got == items, f"sequence changed (p_valid {p_valid}, p_ready {p_ready})"


@cocotb.test()
async def full_rate(dut):
    p = bench_params()
    rng = random.Random(bench_seed() + 1)
    await start_clock_and_reset(dut, init=_init)
    items = [rng.getrandbits(p["width"]) for _ in range(500)]
    got, cycles = await stream(dut, items, p_valid=1.0, p_ready=1.0, rng=rng)
    assert got == items
    assert cycles <= len(items) + 2, f"{cycles} cycles for {len(items)} transfers"
