"""cocotb bench of the sparse message codec (``treenic.hdl.sparse.codec``): random messages of
both formats (and the decision boundary), random valid gaps and backpressure; the encoder's
words and the decoder's pairs compared bit for bit with the golden ``treenic.sparse.codec``."""
import random

import cocotb
import numpy as np

from harness import bench_params, bench_seed, start_clock_and_reset
from sparse_streams import drive_collect, init_streams
from treenic.sparse import codec


def _messages(rng, chunk, n):
    bound = codec.bitmap_words(chunk)
    counts = [0, 1, bound, bound + 1, chunk] + [int(c) for c in rng.integers(0, chunk + 1, n)]
    for count in counts:
        idx = np.sort(rng.choice(chunk, count, replace=False))
        yield idx, rng.standard_normal(count).astype(np.float32)


@cocotb.test()
async def codec_random_messages(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    nprng = np.random.default_rng(bench_seed())
    chunk = p["chunk"]
    dut.chunk.value = chunk
    await start_clock_and_reset(dut, init=init_streams)
    for idx, val in _messages(nprng, chunk, p["messages"]):
        gold = codec.encode_message(idx, val, chunk)
        if p["unit"] == "encoder":
            v = val.view(np.uint32)
            words = [int(i) | (int(x) << 32) | (int(n == idx.size - 1) << 64)
                     for n, (i, x) in enumerate(zip(idx, v))] or [(1 << 64) | (1 << 65)]
            out, _ = await drive_collect(dut, words, rng=rng, p_valid=0.7, p_ready=0.6,
                                         n_out=1 << 30, until=lambda w: (w >> 32) & 1)
            got = np.array([w & 0xFFFFFFFF for w in out], np.uint32)
            assert np.array_equal(got, gold), f"L={idx.size}: header {got[0]:#x} vs {gold[0]:#x}"
        else:
            words = [int(w) | (int(n == gold.size - 1) << 32) for n, w in enumerate(gold)]
            out, _ = await drive_collect(dut, words, rng=rng, p_valid=0.7, p_ready=0.6,
                                         n_out=1 << 30, until=lambda w: (w >> 64) & 1)
            pairs = [(w & 0xFFFFFFFF, (w >> 32) & 0xFFFFFFFF) for w in out if not (w >> 65) & 1]
            assert [q[0] for q in pairs] == idx.tolist(), f"L={idx.size}: indices"
            assert [q[1] for q in pairs] == val.view(np.uint32).tolist(), f"L={idx.size}: values"
    assert int(dut.error.value) == 0
