"""cocotb bench of the grid-threshold source (``treenic.hdl.sparse.threshold``): random
float32 base/top keys over the whole finite range (subnormals, wide spans, base above top),
random depths and grid requests, random request gaps and ``thr`` backpressure; every
answer compared bit for bit with the golden ``select._grid_threshold``."""
import random

import cocotb

from harness import bench_params, bench_seed, start_clock_and_reset
from sparse_streams import drive_collect, init_streams
from treenic.hdl.sparse.search import GRID_LAYOUT
from treenic.sparse import select

MAX_FINITE = 0x7F7FFFFF


def _key(rng):
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randrange(MAX_FINITE + 1)              # anywhere finite
    if kind == 1:
        return rng.randrange(0x01000000)                  # subnormal and tiny
    if kind == 2:
        return rng.randrange(0x3F000000, 0x3F900000)      # around 1
    return rng.choice([0, 1, 0x00800000, MAX_FINITE])


def _requests(rng, depth):
    out = []
    for _ in range(rng.randrange(1, 4)):
        count = rng.randrange(1, min(7, (1 << depth) + 1) + 1)
        step = rng.randrange(1, max(1, (1 << depth) // count) + 1)
        start = rng.randrange((1 << depth) - step * (count - 1) + 1)
        out.append((start, step, count))
    return out


@cocotb.test()
async def random_grids_gaps_backpressure(dut):
    rng = random.Random(bench_seed())
    await start_clock_and_reset(dut, init=lambda d: init_streams(d, i="grid", o="thr"))
    for trial in range(bench_params()["trials"]):
        base, top, depth = _key(rng), _key(rng), rng.randrange(1, 31)
        dut.base.value, dut.top.value, dut.depth.value = base, top, depth
        reqs = _requests(rng, depth)
        words = [GRID_LAYOUT.const({"start": s, "step": st, "count": c}).as_value().value
                 for s, st, c in reqs]
        got, _ = await drive_collect(dut, words, rng=rng, p_valid=0.6, p_ready=0.6,
                                     i="grid", o="thr", n_out=sum(c for *_, c in reqs))
        b, t = select.key_to_float(base), select.key_to_float(top)
        want = [int(select._grid_threshold(b, t, s + j * st, depth))
                for s, st, c in reqs for j in range(c)]
        assert got == want, f"trial {trial}: base {base:#x} top {top:#x} depth {depth} {reqs}"
