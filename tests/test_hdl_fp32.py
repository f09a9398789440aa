"""Amaranth-simulator unit tests of the binary32 adder and its golden models."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from treenic.hdl.fp32 import (CANONICAL_NAN, DIRECTED_CASES, LATENCY, FP32Adder,
                              fp32_add_exact, fp32_add_golden, random_operand_pairs)

PZ, NZ, INF, NINF = 0x00000000, 0x80000000, 0x7F800000, 0xFF800000
DIRECTED = DIRECTED_CASES


def test_exact_model_matches_numpy_directed():
    for a, b in DIRECTED:
        assert fp32_add_exact(a, b) == fp32_add_golden(a, b), (hex(a), hex(b))


def test_exact_model_matches_numpy_random():
    a, b = random_operand_pairs(3000, seed=7)
    g = fp32_add_golden(a, b)
    for x, y, r in zip(a.tolist(), b.tolist(), g.tolist()):
        assert fp32_add_exact(x, y) == r, (hex(x), hex(y))


def test_golden_signed_zero_and_nan():
    assert fp32_add_golden(PZ, NZ) == PZ
    assert fp32_add_golden(NZ, NZ) == NZ
    assert fp32_add_golden(INF, NINF) == CANONICAL_NAN
    assert fp32_add_golden(0xFFFFFFFF, PZ) == CANONICAL_NAN
    out = fp32_add_golden(np.array([1, 2], np.uint32), np.array([3, 4], np.uint32))
    assert out.dtype == np.uint32 and out.shape == (2,)


def _run(ops, *, stall_in=0.0, stall_out=0.0, seed=1, tag_width=8):
    dut = FP32Adder(tag_width=tag_width)
    rng = np.random.default_rng(seed)
    got = []

    async def producer(ctx):
        for n, (a, b) in enumerate(ops):
            while rng.random() < stall_in:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload.a, a)
            ctx.set(dut.i.payload.b, b)
            ctx.set(dut.i.payload.tag, n & 0xFF)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cycles = 0
        while len(got) < len(ops):
            ready = int(rng.random() >= stall_out)
            ctx.set(dut.o.ready, ready)
            _, _, valid, s, t = await ctx.tick().sample(dut.o.valid, dut.o.payload.sum,
                                                        dut.o.payload.tag)
            if valid and ready:
                got.append((s, t))
            cycles += 1
        consumer.cycles = cycles

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return got, consumer.cycles


def test_rtl_directed():
    got, _ = _run(DIRECTED)
    exp = [fp32_add_golden(a, b) for a, b in DIRECTED]
    assert [hex(g) for g, _ in got] == [hex(e) for e in exp]
    assert [t for _, t in got] == [n & 0xFF for n in range(len(DIRECTED))]


def test_rtl_random_with_stalls_and_backpressure():
    a, b = random_operand_pairs(600, seed=3)
    ops = list(zip(a.tolist(), b.tolist()))
    got, _ = _run(ops, stall_in=0.3, stall_out=0.4)
    assert [g for g, _ in got] == fp32_add_golden(a, b).tolist()
    assert [t for _, t in got] == [n & 0xFF for n in range(len(ops))]


def test_rtl_full_throughput():
    ops = [(i * 0x01010101, 0x3F800000) for i in range(200)]
    got, cycles = _run(ops)
    assert len(got) == 200
    # one result per cycle after the pipeline fills
    assert cycles <= 200 + LATENCY + 2


def test_random_vectors_cover_corner_classes():
    a, b = random_operand_pairs(20000, seed=0)
    r = fp32_add_golden(a, b)
    exp = (r >> 23) & 0xFF
    assert np.count_nonzero((exp == 0) & ((r & 0x7FFFFF) != 0)) > 100   # subnormal out
    assert np.count_nonzero((r & 0x7FFFFFFF) == 0) > 20                  # exact zeros
    assert np.count_nonzero(r == 0x7F800000) + np.count_nonzero(r == 0xFF800000) > 100
    assert np.count_nonzero(r == CANONICAL_NAN) > 100
