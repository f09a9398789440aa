"""cocotb bench of the streaming top-k unit (``treenic.hdl.sparse.topk``): random chunks
(heavy ties, signed zeros, subnormals), random valid gaps on the chunk stream and random
backpressure on the pair stream; every selection compared bit for bit (indices and value
bits, in order) with the golden selectors of ``treenic.sparse.select``."""
import random

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from sparse_streams import drive_collect, init_streams
from treenic.hdl.sparse.topk import (PASSES, Mode, chunk_beats, command_word, decode_pairs,
                                     output_is_last, search_command)
from treenic.sparse import select


def _init(dut):
    init_streams(dut)
    dut.cmd__valid.value = 0
    dut.cmd__payload.value = 0


async def _select(dut, x, cmd, mode, *, rng, p_valid, p_ready):
    lanes = bench_params()["lanes"]
    dut.cmd__payload.value = cmd
    dut.cmd__valid.value = 1
    while True:
        await ReadOnly()
        taken = int(dut.cmd__ready.value)
        await RisingEdge(dut.clk)
        if taken:
            break
    dut.cmd__valid.value = 0
    out, cycles = await drive_collect(dut, chunk_beats(x, lanes, PASSES[Mode(mode)]), rng=rng,
                                      p_valid=p_valid, p_ready=p_ready, n_out=1 << 30,
                                      until=lambda w: output_is_last(w, lanes))
    return decode_pairs(out, lanes)


def _chunk(rng, n):
    kind = rng.choice(["ties", "normal", "subnormal"])
    if kind == "ties":
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.25], np.float32), n)
    else:
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.random(n) < 0.5] = 0
        if kind == "subnormal":
            sub = rng.integers(1, 1 << 23, n).astype(np.uint32).view(np.float32)
            x = np.where(rng.random(n) < 0.5, sub, x).astype(np.float32)
    return x.astype(np.float32)


@cocotb.test()
async def exact_topk_random(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    nprng = np.random.default_rng(bench_seed())
    await start_clock_and_reset(dut, init=_init)
    for trial in range(p["trials"]):
        x = _chunk(nprng, p["chunk"])
        k = int(nprng.choice([1, 2, 5, p["chunk"] // 10, p["chunk"]]))
        sign = int(nprng.choice([0, 0, 1, -1]))
        idx, val = await _select(dut, x, command_word(Mode.EXACT, k=k, sign=sign), Mode.EXACT,
                                 rng=rng, p_valid=0.7, p_ready=0.5)
        gold = select.topk(x, k, sign=sign)
        assert np.array_equal(idx, gold), f"trial {trial} k={k}: {idx[:8]} vs golden {gold[:8]}"
        assert np.array_equal(val, x.view(np.uint32)[gold]), f"trial {trial}: value bits"


@cocotb.test()
async def threshold_modes_random(dut):
    p = bench_params()
    rng = random.Random(bench_seed() + 1)
    nprng = np.random.default_rng(bench_seed() + 1)
    await start_clock_and_reset(dut, init=_init)
    for trial in range(p["trials"]):
        x = _chunk(nprng, p["chunk"])
        k = int(nprng.integers(1, p["chunk"] // 4))
        cmd, gold = search_command(x, k, depth=int(nprng.choice([3, 16])), hist_bits=4)
        mode = Mode.THRESHOLD if gold.converged else Mode.BAND
        idx, _ = await _select(dut, x, cmd, mode, rng=rng, p_valid=0.7, p_ready=0.5)
        assert np.array_equal(idx, gold.indices), f"search trial {trial} ({mode})"
        reuse = select.ThresholdReuse(k, interval=100, cap_factor=2)
        reuse.cached, reuse.iteration = np.uint32(gold.threshold_key), 1
        g2 = reuse.select(x)
        idx, _ = await _select(dut, x, command_word(Mode.THRESHOLD, threshold=g2.threshold_key,
                                                    limit=2 * k), Mode.THRESHOLD,
                               rng=rng, p_valid=0.7, p_ready=0.5)
        assert np.array_equal(idx, g2.indices), f"reuse trial {trial}"
