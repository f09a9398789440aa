"""``make bench`` section ``sparse_units``: the sparse hardware units on Verilator.

Every figure comes from the Verilated RTL (``treenic.hdl.cosim``: Verilator, C++ stream pump)
and every run is compared with its golden function in the same call; ``bit_exact`` is that
comparison. Top-k: selection cycles for C = 4096 and 65536, density 1 % and 10 %, W = 2, 8, 16
(EXACT mode, full input rate, no output backpressure) against ``dense_stream_cycles`` = C/2,
the cycles to stream the chunk densely over one 64-bit link; the same figures for the SEARCH
mode (RedSync binary search replayed in RTL, ``topk.redsync_search``). Hash and scatter: sustained
items per cycle over long runs, and bit-exactness under random stalls.

    python -m treenic.bench --only sparse_units --json
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

SIMULATOR = "verilator (treenic.hdl.cosim, VPI-free C++ stream pump)"
CHUNKS = (4096, 65536)
DENSITIES = (0.01, 0.10)
LANES = (2, 8, 16)
#: TREENIC_SPARSE_LANES=2,8 restricts the top-k lane counts (each width is its own Verilator
#: build); the JSON lists the lane counts actually measured
LANES_ENV = "TREENIC_SPARSE_LANES"
SEARCH_DEPTH, SEARCH_BITS = 16, 3       # the RedSync search measured (golden defaults: depth 16)


def _lib(unit, name):
    from ..cosim import build_cosim
    return build_cosim(unit, name=name)


def topk_run(lib, x, k, lanes) -> dict:
    """One EXACT selection on the Verilated unit; compares indices and value bits."""
    from .topk import PASSES, Mode, chunk_words, command_word, decode_pairs
    from treenic.sparse import select
    gold = select.topk(x, k)
    beats_per_pass = -(-x.size // lanes)
    out_beats = np.unique(gold // lanes).size
    if gold.size == 0 or gold[-1] // lanes != beats_per_pass - 1:
        out_beats += 1                                  # the closing beat carries no pair
    sim = lib.new()
    sim.reset()
    sim["cmd__payload"] = command_word(Mode.EXACT, k=k)
    sim["cmd__valid"] = 1
    sim.step()                                          # taken in IDLE
    sim["cmd__valid"] = 0
    res = sim.run_streams(inputs={"i": chunk_words(x, lanes, PASSES[Mode.EXACT])},
                          outputs={"o": out_beats})
    from ..cosim import unpack_words
    idx, val = decode_pairs(unpack_words(res.outputs["o"]), lanes)
    exact = bool(np.array_equal(idx, gold) and np.array_equal(val, x.view(np.uint32)[gold]))
    sim.close()
    return {"cycles": res.cycles + 1, "bit_exact": exact, "selected": int(gold.size)}


def bench_topk(quick: bool) -> dict:
    from .topk import PASSES, Mode, TopKUnit
    rows, search = [], []
    chunks = CHUNKS[:1] if quick else CHUNKS
    lanes_list = tuple(int(w) for w in os.environ[LANES_ENV].split(",")) \
        if os.environ.get(LANES_ENV) else LANES
    for lanes in lanes_list:
        lib = _lib(TopKUnit(lanes=lanes, max_chunk=max(chunks), search_bits=SEARCH_BITS),
                   f"sparse_topk_w{lanes}")
        for C in chunks:
            x = _topk_chunk(np.random.default_rng((2026, C)), C)   # same chunk at every W
            for density in DENSITIES:
                k = max(1, int(C * density))
                r = topk_run(lib, x, k, lanes)
                rows.append({"C": C, "density": density, "W": lanes, "k": k,
                             "passes": PASSES[Mode.EXACT], "cycles": r["cycles"],
                             "dense_stream_cycles": C // 2,
                             "faster_than_dense": r["cycles"] < C // 2,
                             "bit_exact": r["bit_exact"]})
                # the same chunk and k through the RedSync search replayed in RTL
                r = search_run(lib, x, k, lanes, SEARCH_BITS)
                search.append({"C": C, "density": density, "W": lanes, "k": k, **r,
                               "dense_stream_cycles": C // 2,
                               "faster_than_dense": r["cycles"] < C // 2})
    return {"bit_exact": all(r["bit_exact"] for r in rows + search),
            "mode": "EXACT", "lanes_measured": list(lanes_list), "runs": rows,
            "redsync_search": {"bit_exact": all(r["bit_exact"] for r in search),
                               "mode": "SEARCH", "golden": "select.binary_search_histogram",
                               "depth": SEARCH_DEPTH, "search_bits": SEARCH_BITS,
                               "threshold_source": "answers at once (golden grid thresholds "
                                                   "queued on thr)", "runs": search}}


def _topk_chunk(rng, C):
    x = rng.standard_normal(C).astype(np.float32)
    x[rng.random(C) < 0.05] = 0
    x[rng.integers(0, C, C // 8)] = np.float32(0.5)        # ties at many magnitudes
    return x


def search_run(lib, x, k, lanes, search_bits, depth=SEARCH_DEPTH) -> dict:
    """One SEARCH selection (RedSync binary search replayed in RTL) on the Verilated unit;
    compares indices, value bits and every threshold request with
    ``select.binary_search_histogram``. The threshold source answers at once (its answers
    are queued on ``thr``: the golden grid thresholds of the golden's requests)."""
    from ..cosim import unpack_words
    from .topk import (Mode, chunk_words, command_word, decode_pairs, grid_thresholds,
                       search_passes, search_requests)
    from treenic.sparse import select
    gold = select.binary_search_histogram(x, k, depth=depth, hist_bits=search_bits)
    keys = select.magnitude_keys(x)
    requests = search_requests(gold, keys, depth, search_bits)
    answers = [t for r in requests for t in grid_thresholds(x, *r, depth=depth)]
    passes = search_passes(gold, keys)
    beats_per_pass = -(-x.size // lanes)
    out_beats = np.unique(gold.indices // lanes).size
    if gold.indices.size == 0 or gold.indices[-1] // lanes != beats_per_pass - 1:
        out_beats += 1
    sim = lib.new()
    sim.reset()
    sim["cmd__payload"] = command_word(Mode.SEARCH, k=k, depth=depth)
    sim["cmd__valid"] = 1
    sim.step()
    sim["cmd__valid"] = 0
    res = sim.run_streams(inputs={"i": chunk_words(x, lanes, passes),
                                  "thr": np.array(answers, np.uint32)},
                          outputs={"o": out_beats, "grid": len(requests)})
    idx, val = decode_pairs(unpack_words(res.outputs["o"]), lanes)
    got_req = [(w & 0x7FFFFFFF, (w >> 31) & 0x7FFFFFFF, (w >> 62) & 0x1F)
               for w in unpack_words(res.outputs["grid"])]
    exact = bool(np.array_equal(idx, gold.indices) and
                 np.array_equal(val, x.view(np.uint32)[gold.indices]) and got_req == requests)
    sim.close()
    return {"cycles": res.cycles + 1, "bit_exact": exact, "selected": int(gold.indices.size),
            "passes": passes, "count_passes": gold.passes, "converged": bool(gold.converged)}


def bench_hash(quick: bool) -> dict:
    """Hash unit with 16 partitions (the mask) and 12 workers (the multiply-high modulo)."""
    res = {"pow2_16": _bench_hash(quick, 16), "mod_12": _bench_hash(quick, 12)}
    return {"bit_exact": all(v["bit_exact"] for v in res.values()), **res["pow2_16"],
            "workers_12": res["mod_12"]}


def _bench_hash(quick: bool, workers: int) -> dict:
    import mmh3
    from .hash import Murmur3HashUnit
    from treenic.sparse.zen import murmur3_32, partition_of
    lanes, seed = 4, 0x9747B28C
    unit = Murmur3HashUnit(lanes=lanes, workers=workers)
    pbits = unit.partition_bits
    lib = _lib(unit, f"sparse_hash_w4_n{workers}")
    n = 20_000 if quick else 250_000
    keys = np.random.default_rng(7).integers(0, 2**32, n * lanes, dtype=np.uint64).astype(np.uint32)
    beats = keys.reshape(n, lanes)
    out = {}
    for tag, pv, pr in (("full_rate", 1.0, 1.0), ("stalls", 0.7, 0.6)):
        sim = lib.new()
        sim.reset()
        sim["seed"] = seed
        res = sim.run_streams(inputs={"i": beats}, outputs={"o": n}, valid_prob=pv,
                              ready_prob=pr, seed=3)
        words = res.outputs["o"]
        h = words[:, :lanes].reshape(-1)
        part_word = words[:, lanes]
        part = np.stack([(part_word >> (pbits * l)) & ((1 << pbits) - 1) for l in range(lanes)],
                        axis=1).reshape(-1)
        ok = np.array_equal(h, murmur3_32(keys, seed)) and \
            np.array_equal(part, partition_of(keys, workers, seed))
        sample = [mmh3.hash(int(k).to_bytes(4, "little"), seed, signed=False) for k in keys[:2000]]
        ok &= bool(np.array_equal(h[:2000], np.array(sample, np.uint32)))
        out[tag] = {"keys": int(keys.size), "cycles": res.cycles, "bit_exact": bool(ok),
                    "keys_per_lane_per_cycle": round(n / res.cycles, 4)}
        sim.close()
    return {"bit_exact": all(v["bit_exact"] for v in out.values()), "lanes": lanes,
            "workers": workers, "partition_bits": pbits, "latency": unit.latency, **out}


def bench_threshold(quick: bool) -> dict:
    """The RTL grid-threshold source (``threshold.GridThresholdSource``): random float32
    base/top keys over the finite range and random depths, each served a full first-pass
    grid (2**3 - 1 points) and a band request, with random stalls; every key compared with
    the golden ``select._grid_threshold``. ``request_cycles``: a 7-point request at full
    rate, request offered to last answer."""
    from .search import GRID_LAYOUT
    from .threshold import GridThresholdSource
    from treenic.sparse import select
    lib = _lib(GridThresholdSource(), "sparse_threshold")
    rng = np.random.default_rng(17)
    trials = 40 if quick else 400
    keys = np.concatenate([rng.integers(0, 0x7F800000, (trials, 2)),
                           rng.integers(0, 0x01000000, (trials, 2)),
                           rng.integers(0x3F000000, 0x3F900000, (trials, 2))])
    depths = rng.integers(3, 31, len(keys))
    sim, ok, cycles = lib.new(), True, []
    for (base, top), depth in zip(keys.tolist(), depths.tolist()):
        step = 1 << (depth - 3)
        lo = int(rng.integers(0, (1 << depth)))
        reqs = [(step, step, 7), (lo, 1, 2)]
        words = [GRID_LAYOUT.const({"start": a, "step": b, "count": c}).as_value().value
                 for a, b, c in reqs]
        sim.reset()
        sim["base"], sim["top"], sim["depth"] = base, top, depth
        full = not cycles
        res = sim.run_streams(inputs={"grid": [words[0]] if full else words},
                              outputs={"thr": 7 if full else 9},
                              valid_prob=1.0 if full else 0.7, ready_prob=1.0 if full else 0.6,
                              seed=len(cycles))
        if full:
            cycles.append(res.cycles)
            reqs = reqs[:1]
        b, t = select.key_to_float(base), select.key_to_float(top)
        want = [int(select._grid_threshold(b, t, a + j * st, depth)) for a, st, c in reqs
                for j in range(c)]
        ok &= res.outputs["thr"][:, 0].tolist() == want
    sim.close()
    return {"bit_exact": bool(ok), "configurations": len(keys), "request_points": 7,
            "request_cycles": int(cycles[0])}


def bench_scatter(quick: bool) -> dict:
    from .scatter import ScatterAccumulate
    from treenic.sparse.base import scatter_accumulate
    depth = 4096
    rng = np.random.default_rng(11)
    dense = rng.standard_normal(depth).astype(np.float32)
    lib = _lib(ScatterAccumulate(depth=depth, init=dense.view(np.uint32).tolist()),
               "sparse_scatter_4k")
    out = {}
    one = [(np.arange(depth), rng.standard_normal(depth).astype(np.float32))]
    many = [(np.sort(rng.choice(depth, depth // 10, replace=False)),
             rng.standard_normal(depth // 10).astype(np.float32)) for _ in range(5 if quick else 40)]
    for tag, msgs, pv, pr in (("one_message_full_rate", one, 1.0, 1.0),
                              ("messages_stalls", many, 0.7, 0.6)):
        words = np.array([[i, v] for idx, val in msgs
                          for i, v in zip(idx, val.view(np.uint32))], np.uint32)
        sim = lib.new()
        sim.reset()
        res = sim.run_streams(inputs={"i": words}, outputs={"o": len(words)}, valid_prob=pv,
                              ready_prob=pr, seed=5)
        _, writes = scatter_accumulate(dense, msgs)
        gold = np.array([[i, np.float32(v).view(np.uint32)] for i, v in writes], np.uint32)
        out[tag] = {"pairs": len(words), "messages": len(msgs), "cycles": res.cycles,
                    "pairs_per_cycle": round(len(words) / res.cycles, 4),
                    "bit_exact": bool(np.array_equal(res.outputs["o"], gold))}
        sim.close()
    return {"bit_exact": all(v["bit_exact"] for v in out.values()), "depth": depth, **out}


def bench_codec(quick: bool) -> dict:
    """Encoder and decoder on a run of messages of both formats (C = 4096), with random
    stalls; words and pairs compared with the golden ``treenic.sparse.codec``."""
    from .codec import SparseDecoder, SparseEncoder
    from treenic.sparse import codec
    chunk = 4096
    rng = np.random.default_rng(13)
    counts = [0, 1, 128, 129, 409, 4096] + [int(c) for c in rng.integers(0, 800, 4 if quick else 30)]
    msgs = [(np.sort(rng.choice(chunk, c, replace=False)), rng.standard_normal(c).astype(np.float32))
            for c in counts]
    pairs, words = [], []
    for idx, val in msgs:
        v = val.view(np.uint32)
        pairs += [[i, x, int(n == idx.size - 1)] for n, (i, x) in enumerate(zip(idx, v))] \
            or [[0, 0, 3]]                              # last + none: the empty message
        w = codec.encode_message(idx, val, chunk)
        words += [[x, int(n == w.size - 1)] for n, x in enumerate(w)]
    pairs, words = np.array(pairs, np.uint32), np.array(words, np.uint32)
    out = {"chunk": chunk, "messages": len(msgs),
           "bitmap_messages": sum(codec.message_format(c, chunk) for c in counts)}
    enc = _lib(SparseEncoder(max_chunk=chunk), "sparse_encoder_4k").new()
    enc.reset()
    enc["chunk"] = chunk
    r = enc.run_streams(inputs={"i": pairs}, outputs={"o": len(words)}, valid_prob=0.8,
                        ready_prob=0.7, seed=1)
    out["encoder"] = {"words": len(words), "cycles": r.cycles,
                      "bit_exact": bool(np.array_equal(r.outputs["o"], words))}
    enc.close()
    dec = _lib(SparseDecoder(max_chunk=chunk), "sparse_decoder_4k").new()
    dec.reset()
    dec["chunk"] = chunk
    r = dec.run_streams(inputs={"i": words}, outputs={"o": len(pairs)}, valid_prob=0.8,
                        ready_prob=0.7, seed=2)
    got = r.outputs["o"]
    out["decoder"] = {"pairs": len(pairs), "cycles": r.cycles,
                      "bit_exact": bool(np.array_equal(got[:, :2][pairs[:, 2] != 3],
                                                       pairs[:, :2][pairs[:, 2] != 3])
                                        and np.array_equal(got[:, 2], pairs[:, 2]))}
    dec.close()
    out["bit_exact"] = out["encoder"]["bit_exact"] and out["decoder"]["bit_exact"]
    return out


def run(out_dir: Path, quick: bool = False) -> dict:
    from ..cosim import cosim_available
    if not cosim_available():
        raise RuntimeError("sparse_units needs Verilator (treenic.hdl.cosim); none found")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {"simulator": SIMULATOR, "hash": bench_hash(quick), "topk": bench_topk(quick),
           "scatter": bench_scatter(quick)}
    res["codec"] = bench_codec(quick)
    res["threshold_source"] = bench_threshold(quick)
    res["bit_exact"] = all(v["bit_exact"] for k, v in res.items() if isinstance(v, dict))
    (out_dir / "sparse_units.json").write_text(json.dumps(res, indent=1))
    md = ["Sparse units on Verilator (`python -m treenic.bench --only sparse_units`).", "",
          "| C | density | W | k | passes | cycles | dense C/2 | faster | bit-exact |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['C']} | {r['density']:.0%} | {r['W']} | {r['k']} | {r['passes']} | "
           f"{r['cycles']} | {r['dense_stream_cycles']} | {r['faster_than_dense']} | "
           f"{r['bit_exact']} |" for r in res["topk"]["runs"]]
    md += ["", "RedSync threshold binary search (SEARCH, depth 16, H = 3 grid bits per pass):", "",
           "| C | density | W | k | passes (count) | converged | selected | cycles | dense C/2 "
           "| bit-exact |", "|---|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['C']} | {r['density']:.0%} | {r['W']} | {r['k']} | {r['passes']} "
           f"({r['count_passes']}) | {r['converged']} | {r['selected']} | {r['cycles']} | "
           f"{r['dense_stream_cycles']} | {r['bit_exact']} |"
           for r in res["topk"]["redsync_search"]["runs"]]
    (out_dir / "section.md").write_text("\n".join(md) + "\n")
    return res
