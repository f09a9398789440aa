"""cocotb bench of the MurmurHash3 hash unit (``treenic.hdl.sparse.hash``): random keys with
random valid gaps and backpressure, every lane's hash and partition compared bit for bit
with ``zen.murmur3_32`` / ``zen.partition_of`` (2**P workers: the mask; any other count:
the multiply-high modulo); full-rate throughput check."""
import random

import cocotb
import numpy as np

from harness import bench_params, bench_seed, start_clock_and_reset
from sparse_streams import drive_collect, init_streams
from treenic.hdl.sparse.hash import LATENCY, MOD_STAGES
from treenic.hdl.sparse.simdrive import pack, unpack
from treenic.sparse.zen import murmur3_32, partition_of


async def _check(dut, keys, seed, *, rng, p_valid, p_ready):
    p = bench_params()
    lanes, workers = p["lanes"], p.get("workers") or 1 << p["partition_bits"]
    pbits = max(1, (workers - 1).bit_length())
    dut.seed.value = seed
    words = [pack(keys[b:b + lanes], 32) for b in range(0, len(keys), lanes)]
    out, cycles = await drive_collect(dut, words, rng=rng, p_valid=p_valid, p_ready=p_ready)
    h = np.array([x for w in out for x in unpack(w, 32, lanes)], np.uint32)
    part = np.array([x for w in out for x in unpack(w >> (32 * lanes), pbits, lanes)])
    k = np.array(keys, np.uint32)
    bad = np.flatnonzero(h != murmur3_32(k, seed))
    assert bad.size == 0, f"hash mismatch at key {k[bad[0]]:#x}: {h[bad[0]]:#x}"
    assert np.array_equal(part, partition_of(k, workers, seed)), "partition mismatch"
    return cycles


@cocotb.test()
async def random_keys_stalls_backpressure(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=init_streams)
    nprng = np.random.default_rng(bench_seed())
    for seed in (0, 1, 0x9747B28C, int(nprng.integers(0, 2**32))):
        keys = nprng.integers(0, 2**32, p["n_beats"] * p["lanes"]).tolist()
        keys[:4] = [0, 1, 0xFFFFFFFE, 0xFFFFFFFF]
        await _check(dut, keys, seed, rng=rng, p_valid=0.7, p_ready=0.6)


@cocotb.test()
async def full_rate(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=init_streams)
    n = 200
    keys = np.random.default_rng(5).integers(0, 2**32, n * p["lanes"]).tolist()
    cycles = await _check(dut, keys, 42, rng=rng, p_valid=1.0, p_ready=1.0)
    latency = LATENCY + (MOD_STAGES if p.get("workers", 2) & (p.get("workers", 2) - 1) else 0)
    assert cycles == n + latency, f"{n} beats took {cycles} cycles (one beat a cycle: {n + latency})"
