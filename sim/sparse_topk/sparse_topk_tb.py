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
                                     grid_thresholds, output_is_last, search_command,
                                     search_passes, search_requests)
from treenic.sparse import select


def _init(dut):
    init_streams(dut)
    dut.cmd__valid.value = 0
    dut.cmd__payload.value = 0
    dut.thr__valid.value = 0
    dut.thr__payload.value = 0
    dut.grid__ready.value = 0


async def _command(dut, cmd):
    dut.cmd__payload.value = cmd
    dut.cmd__valid.value = 1
    while True:
        await ReadOnly()
        taken = int(dut.cmd__ready.value)
        await RisingEdge(dut.clk)
        if taken:
            break
    dut.cmd__valid.value = 0


async def _select(dut, x, cmd, mode, *, rng, p_valid, p_ready):
    lanes = bench_params()["lanes"]
    await _command(dut, cmd)
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


async def _search(dut, x, k, *, depth, strict, sign, rng, p_valid, p_ready, p_thr):
    """SEARCH in one per-cycle coroutine: the chunk is re-streamed while the unit runs (random
    gaps), each ``grid`` request is answered with the golden's grid thresholds (random gaps),
    the pairs are taken under random backpressure. Returns (pairs, requests, passes)."""
    lanes = bench_params()["lanes"]
    await _command(dut, command_word(Mode.SEARCH, k=k, sign=sign, depth=depth, strict=strict))
    beats = chunk_beats(x, lanes, 1)
    sent, passes, out, requests, answers = 0, 0, [], [], []
    offering = thr_offering = False
    for _ in range(400_000):
        if not offering and rng.random() < p_valid:
            offering, dut.i__payload.value = True, beats[sent % len(beats)]
        if not thr_offering and answers and rng.random() < p_thr:
            thr_offering, dut.thr__payload.value = True, answers[0]
        dut.i__valid.value, dut.thr__valid.value = int(offering), int(thr_offering)
        ready = int(rng.random() < p_ready)
        dut.o__ready.value, dut.grid__ready.value = ready, int(not answers)
        await ReadOnly()
        if offering and int(dut.i__ready.value):
            offering, sent = False, sent + 1
            passes += sent % len(beats) == 0
        if thr_offering and int(dut.thr__ready.value):
            thr_offering = False
            answers.pop(0)
        if not answers and int(dut.grid__valid.value):
            word = int(dut.grid__payload.value)
            req = (word & 0x7FFFFFFF, (word >> 31) & 0x7FFFFFFF, (word >> 62) & 0x1F)
            requests.append(req)
            answers = grid_thresholds(x, *req, depth=depth, sign=sign)
        last = False
        if ready and int(dut.o__valid.value):
            out.append(int(dut.o__payload.value))
            last = output_is_last(out[-1], lanes)
        await RisingEdge(dut.clk)
        if last:
            break
    else:
        raise AssertionError(f"SEARCH stuck: {len(requests)} requests, {passes} passes")
    dut.i__valid.value = dut.thr__valid.value = dut.o__ready.value = dut.grid__ready.value = 0
    return decode_pairs(out, lanes), requests, passes


@cocotb.test()
async def search_mode_random(dut):
    """SEARCH (the binary search replayed in RTL) against select.binary_search_histogram:
    selection, value bits, every threshold request, pass count."""
    p = bench_params()
    rng = random.Random(bench_seed() + 2)
    nprng = np.random.default_rng(bench_seed() + 2)
    await start_clock_and_reset(dut, init=_init)
    H = p["search_bits"]
    for trial in range(p["trials"]):
        x = _chunk(nprng, p["chunk"]) if trial % 2 else \
            nprng.standard_t(3, p["chunk"]).astype(np.float32)
        k = int(nprng.integers(1, p["chunk"] // 3))
        depth, strict = int(nprng.choice([2, 7, 16])), bool(nprng.integers(0, 2))
        sign = int(nprng.choice([0, 0, 1, -1]))
        gold = select.binary_search_histogram(x, k, depth=depth, hist_bits=H, strict=strict,
                                              sign=sign)
        keys = select.signed_keys(x, sign)
        (idx, val), requests, passes = await _search(
            dut, x, k, depth=depth, strict=strict, sign=sign, rng=rng, p_valid=0.7,
            p_ready=0.5, p_thr=0.6)
        tag = f"trial {trial} k={k} depth={depth} strict={strict} sign={sign}"
        assert np.array_equal(idx, gold.indices), f"{tag}: {idx[:8]} vs golden {gold.indices[:8]}"
        assert np.array_equal(val, x.view(np.uint32)[gold.indices]), f"{tag}: value bits"
        assert requests == search_requests(gold, keys, depth, H), f"{tag}: {requests}"
        assert passes == search_passes(gold, keys), f"{tag}: {passes} passes"
        if keys.size and keys.max():
            assert int(dut.converged.value) == gold.converged, tag
            assert int(dut.search_threshold.value) == gold.threshold_key, tag
            assert int(dut.search_passes.value) == gold.passes, tag
