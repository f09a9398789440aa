"""cocotb bench of the pipelined binary32 adder (``treenic.hdl.fp32.FP32Adder``).

Every result is compared bit for bit with ``fp32_add_golden`` (numpy float32, canonical
NaN); tags check ordering (no loss, duplication or reordering under stalls)."""
import random

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.hdl.fp32 import DIRECTED_CASES, LATENCY, fp32_add_golden, random_operand_pairs

TAG_BITS = 8


def _init(dut):
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.o__ready.value = 0


async def drive_and_check(dut, a, b, *, p_valid, p_ready, rng, max_cycles=None):
    """Offer (a[k], b[k], tag k) on ``i`` with probability *p_valid* per cycle, accept
    ``o`` with probability *p_ready*; compare every result with the golden.
    Returns the number of cycles taken."""
    a = [int(x) for x in a]
    b = [int(x) for x in b]
    n = len(a)
    expect = [int(x) for x in fp32_add_golden(np.array(a, np.uint32), np.array(b, np.uint32))]
    sent = got = cycles = 0
    limit = max_cycles or (20 * n + 100)
    offering = False
    while got < n:
        # drive this cycle (just after the previous rising edge)
        if not offering and sent < n and rng.random() < p_valid:
            offering = True
            dut.i__payload.value = a[sent] | (b[sent] << 32) | ((sent % 256) << 64)
        dut.i__valid.value = int(offering)
        ready = int(rng.random() < p_ready)
        dut.o__ready.value = ready
        await ReadOnly()
        if offering and int(dut.i__ready.value):
            sent += 1
            offering = False
        if ready and int(dut.o__valid.value):
            p = int(dut.o__payload.value)
            s, tag = p & 0xFFFFFFFF, p >> 32
            assert tag == got % 256, f"result {got}: tag {tag} (reordered/lost item)"
            assert s == expect[got], (f"result {got}: {a[got]:#010x} + {b[got]:#010x} = "
                                      f"{s:#010x}, golden {expect[got]:#010x}")
            got += 1
        await RisingEdge(dut.clk)
        cycles += 1
        assert cycles < limit, f"stuck: sent {sent}, got {got} of {n} after {cycles} cycles"
    dut.i__valid.value = 0
    dut.o__ready.value = 0
    return cycles


@cocotb.test()
async def directed_corner_cases(dut):
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    a, b = zip(*DIRECTED_CASES)
    # both operand orders, with random stalls and backpressure
    await drive_and_check(dut, a + b, b + a, p_valid=0.6, p_ready=0.6, rng=rng)


@cocotb.test()
async def random_with_stalls_and_backpressure(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    a, b = random_operand_pairs(p.get("n_random", 5000), seed=bench_seed())
    await drive_and_check(dut, a, b, p_valid=0.7, p_ready=0.6, rng=rng)


@cocotb.test()
async def full_throughput(dut):
    """No stalls: n results in n + LATENCY cycles (one per cycle)."""
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    n = 300
    a, b = random_operand_pairs(n, seed=bench_seed() + 1)
    cycles = await drive_and_check(dut, a, b, p_valid=1.0, p_ready=1.0, rng=rng)
    assert cycles <= n + LATENCY + 1, f"{n} ops took {cycles} cycles"


@cocotb.test()
async def backpressure_holds_output(dut):
    """With ready low the output stays valid and stable; nothing is dropped."""
    await start_clock_and_reset(dut, init=_init)
    dut.i__payload.value = 0x3F800000 | (0x40000000 << 32) | (7 << 64)   # 1 + 2 = 3
    dut.i__valid.value = 1
    await RisingEdge(dut.clk)
    dut.i__valid.value = 0
    for _ in range(LATENCY + 5):
        await RisingEdge(dut.clk)
    for _ in range(5):
        await ReadOnly()
        assert int(dut.o__valid.value) == 1
        assert int(dut.o__payload.value) == 0x40400000 | (7 << 32)
        await RisingEdge(dut.clk)
    dut.o__ready.value = 1
    await RisingEdge(dut.clk)
    await ReadOnly()
    assert int(dut.o__valid.value) == 0
