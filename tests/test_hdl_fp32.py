"""Amaranth-simulator unit tests of the binary32 adder and its golden models."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from treenic.hdl.fp32 import (CANONICAL_NAN, LATENCY, FP32Adder, fp32_add_exact,
                              fp32_add_golden)

# directed corner cases (bits)
PZ, NZ = 0x00000000, 0x80000000
INF, NINF = 0x7F800000, 0xFF800000
MAXF, MINSUB, MINNORM = 0x7F7FFFFF, 0x00000001, 0x00800000
DIRECTED = [
    (PZ, NZ), (NZ, NZ), (PZ, PZ), (NZ, PZ),
    (0x3F800000, 0xBF800000),               # 1 + -1 = +0
    (MINSUB, MINSUB), (MINSUB, 0x80000001), (0x007FFFFF, MINSUB),   # subnormal -> normal
    (MINNORM, 0x80000001),                  # normal -> subnormal
    (0x00400000, 0x00400000), (0x80123456, 0x00654321),
    (MAXF, MAXF), (MAXF, 0x73800000), (MAXF, 0x73000000), (0xFF7FFFFF, 0xFF7FFFFF),
    (INF, 0x3F800000), (INF, NINF), (NINF, NINF), (INF, INF), (0x7FC00000, 0x3F800000),
    (0x7F800001, INF), (0xFFFFFFFF, PZ),
    (0x3F800000, 0x33800000),               # 1 + 2^-24: tie, even -> 1
    (0x3F800001, 0x33800000),               # tie, odd -> up
    (0x3F800000, 0x33800001),               # just above tie -> up
    (0x4B800000, 0xBF800000),               # 2^24 - 1 -> exact
    (0x3F800000, 0xB3800000),               # 1 - 2^-24, cancellation
    (0x3FFFFFFF, 0xBFFFFFFE), (0x00000003, 0x80000002),
]


def test_exact_model_matches_numpy_directed():
    for a, b in DIRECTED:
        assert fp32_add_exact(a, b) == fp32_add_golden(a, b), (hex(a), hex(b))


def test_exact_model_matches_numpy_random():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)
    # close exponents for cancellation / ties
    b = (a ^ rng.integers(0, 2**26, 3000, dtype=np.uint64).astype(np.uint32)) ^ np.uint32(0x80000000)
    b[::2] = rng.integers(0, 2**32, 1500, dtype=np.uint64).astype(np.uint32)
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
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**32, 600, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, 600, dtype=np.uint64).astype(np.uint32)
    b[::3] = a[::3] ^ np.uint32(0x80000000) ^ rng.integers(0, 64, 200).astype(np.uint32)
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
