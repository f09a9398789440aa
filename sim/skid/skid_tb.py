"""cocotb bench of the skid buffer: every transfer out equals the golden function's (the
identity: nothing lost, duplicated or reordered) under random valid stalls and random
ready backpressure; one transfer per cycle when nothing stalls; ``i.ready`` never follows
``o.ready`` within a cycle (it is a register)."""
import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge, Timer

from harness import bench_params, bench_seed, start_clock_and_reset


def golden(transfers):
    """What the skid buffer must deliver: the same transfers in the same order."""
    return list(transfers)


def _init(dut):
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.o__ready.value = 0


async def drive_and_check(dut, data, *, p_valid, p_ready, rng):
    expect = golden(data)
    n, sent, got, cycles, offering = len(data), 0, [], 0, False
    while len(got) < n:
        if not offering and sent < n and rng.random() < p_valid:
            offering = True
            dut.i__payload.value = data[sent]
        dut.i__valid.value = int(offering)
        await Timer(1, "ns")                     # i.ready before o.ready changes ...
        ready_before = int(dut.i__ready.value)
        ready = int(rng.random() < p_ready)
        dut.o__ready.value = ready
        await ReadOnly()                         # ... and after: a register, so equal
        assert int(dut.i__ready.value) == ready_before, f"cycle {cycles}: i.ready followed o.ready"
        if offering and int(dut.i__ready.value):
            sent += 1
            offering = False
        if ready and int(dut.o__valid.value):
            v = int(dut.o__payload.value)
            k = len(got)
            assert v == expect[k], f"transfer {k}: {v:#x}, golden {expect[k]:#x}"
            got.append(v)
        await RisingEdge(dut.clk)
        cycles += 1
        assert cycles < 20 * n + 100, f"stuck: sent {sent}, got {len(got)} of {n}"
    dut.i__valid.value = 0
    dut.o__ready.value = 0
    return cycles


@cocotb.test()
async def random_with_stalls_and_backpressure(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    q = p["n_random"] // 4
    # stalls and backpressure together, backpressure only, stalls only, both at half rate
    for p_valid, p_ready in [(0.7, 0.6), (1.0, 0.3), (0.3, 1.0), (0.5, 0.5)]:
        data = [rng.getrandbits(p["width"]) for _ in range(q)]
        await drive_and_check(dut, data, p_valid=p_valid, p_ready=p_ready, rng=rng)


@cocotb.test()
async def full_throughput(dut):
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    data = [rng.getrandbits(bench_params()["width"]) for _ in range(500)]
    cycles = await drive_and_check(dut, data, p_valid=1.0, p_ready=1.0, rng=rng)
    assert cycles <= len(data) + 2, f"{len(data)} transfers took {cycles} cycles"
