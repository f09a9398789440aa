"""cocotb bench of the scatter-accumulate unit (``treenic.hdl.sparse.scatter``): messages of
ascending (index, value) pairs with overlapping indices, random valid gaps and backpressure;
every buffer write compared bit for bit with ``treenic.sparse.base.scatter_accumulate``."""
import random

import cocotb
import numpy as np

from harness import bench_params, bench_seed, start_clock_and_reset
from sparse_streams import drive_collect, init_streams
from treenic.hdl.sparse.scatter import LATENCY
from treenic.sparse.base import scatter_accumulate


def _messages(rng, p, dense):
    msgs = []
    for _ in range(p["messages"]):
        idx = np.sort(rng.choice(p["depth"], int(rng.integers(1, p["depth"] // 2)), replace=False))
        val = (rng.standard_normal(idx.size) * 2.0 ** rng.integers(-20, 20, idx.size)).astype(np.float32)
        cancel = rng.random(idx.size) < 0.1
        val[cancel] = -dense[idx[cancel]]
        msgs.append((idx, val))
    return msgs


async def _run(dut, msgs, dense, *, rng, p_valid, p_ready):
    words = [int(i) | (int(v) << 32) for idx, val in msgs for i, v in zip(idx, val.view(np.uint32))]
    out, cycles = await drive_collect(dut, words, rng=rng, p_valid=p_valid, p_ready=p_ready)
    buf, writes = scatter_accumulate(dense, msgs)
    gold = [(i, int(np.float32(v).view(np.uint32))) for i, v in writes]
    got = [(w & 0xFFFFFFFF, w >> 32) for w in out]
    bad = [n for n, (a, b) in enumerate(zip(got, gold)) if a != b]
    assert not bad, f"write {bad[0]}: got {got[bad[0]]}, golden {gold[bad[0]]}"
    return buf, cycles


def _init(dut):
    init_streams(dut)
    dut.set.value = 0          # every pair adds (set mode is the sparse engine's ZERO/COPY)


@cocotb.test()
async def messages_random_stalls(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    nprng = np.random.default_rng(p["init_seed"])
    dense = np.array(p["init"], np.uint32).view(np.float32)
    await start_clock_and_reset(dut, init=_init)
    await _run(dut, _messages(nprng, p, dense), dense, rng=rng, p_valid=0.7, p_ready=0.6)


@cocotb.test()
async def one_pair_per_cycle(dut):
    """A fresh reset does not clear the buffer: start from what the first test left."""
    p = bench_params()
    rng = random.Random(bench_seed())
    nprng = np.random.default_rng(p["init_seed"])
    dense = np.array(p["init"], np.uint32).view(np.float32)
    buf, _ = scatter_accumulate(dense, _messages(nprng, p, dense))
    await start_clock_and_reset(dut, init=_init)
    idx = np.arange(p["depth"])
    val = np.random.default_rng(9).standard_normal(idx.size).astype(np.float32)
    _, cycles = await _run(dut, [(idx, val)], buf, rng=rng, p_valid=1.0, p_ready=1.0)
    assert cycles <= idx.size + LATENCY + 1, f"{idx.size} pairs took {cycles} cycles"
