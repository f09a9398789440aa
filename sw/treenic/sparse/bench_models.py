"""Step time of the Zen / SparCML / OmniReduce / RedSync golden models at a given size.

    python -m treenic.sparse.bench_models                  # P=16, N=2^22, density 1 %
    python -m treenic.sparse.bench_models --workers 8 --elements 1000000 zen sparcml

Reports, per model, the best of ``--repeat`` steps in CPU seconds of this process (robust on a
shared machine) and wall seconds, with the self-checks on (default) and off
(``check_invariants=False``). Gradients are i.i.d. standard normal float32.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from .base import make
from .redsync import RedSync


def models(P: int, N: int, d: float) -> dict:
    out = {name: (lambda name=name, **o: make(name, workers=P, elements=N, density=d, **o))
           for name in ("zen", "sparcml", "omnireduce")}
    for sel in ("trimmed", "binary", "histogram", "reuse"):
        out[f"redsync-{sel}"] = lambda sel=sel, **o: RedSync(P, N, d, selection=sel, **o)
    out["redsync-trimmed-quantized"] = lambda **o: RedSync(P, N, d, selection="trimmed",
                                                           quantize=True, **o)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models to time (default: all)")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--elements", type=int, default=4 << 20)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    P, N = args.workers, args.elements
    grads = np.random.default_rng(0).standard_normal((P, N), dtype=np.float32)
    print(f"P={P} N={N} density={args.density}")
    for name, ctor in models(P, N, args.density).items():
        if args.names and name not in args.names:
            continue
        cells = []
        for checks in (True, False):
            algo = ctor(check_invariants=checks)
            if hasattr(algo, "candidate_sets"):
                algo.candidate_sets()            # Zen's one-time U_j tables, not per step
            cpu = wall = float("inf")
            for _ in range(args.repeat):
                c0, w0 = time.process_time(), time.perf_counter()
                res = algo.step(grads)
                cpu = min(cpu, time.process_time() - c0)
                wall = min(wall, time.perf_counter() - w0)
                if not all(res.info["invariants"].values()):
                    raise SystemExit(f"{name}: invariant failed: {res.info['invariants']}")
            cells.append(f"{cpu:5.2f} s CPU / {wall:5.2f} s wall")
        print(f"{name:26s} checks on: {cells[0]}   checks off: {cells[1]}", flush=True)


if __name__ == "__main__":
    main()
