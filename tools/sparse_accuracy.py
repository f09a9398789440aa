"""Sparse-training accuracy table: dense vs MultiTree-Sparse at 1 % with and without each
technique (momentum correction, momentum factor masking, local clipping, warm-up, residual
mode, flow assignment), several seeds, the golden ``model`` backend (no RTL needed).

    .venv/bin/python tools/sparse_accuracy.py --seeds 0 1 2 --json build/sparse_accuracy.json

Prints a Markdown table (final test accuracy per seed, mean, difference to dense) — the
table in docs/training.md. All configs of all seeds train in one spawned world.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from treenic import train

#: (row name, _config overrides); the first row is the dense reference
VARIANTS = [
    ("dense (MultiTree all-reduce)", dict(density=None)),
    ("sparse, no technique (residual only, optimizer momentum)",
     dict(momentum_correction=False, momentum_masking=False)),
    ("+ momentum correction", dict(momentum_masking=False)),
    ("+ momentum correction + masking (default)", dict()),
    ("default + local clipping (clip-norm 1.0)", dict(clip_norm=1.0)),
    ("default, warm-up ramp (DGC) instead of dense", dict(warmup="ramp")),
    ("default, 44 dense warm-up iterations (2 epochs)", dict(warmup_iters=44)),
    ("default, residual global (SparDL GRC)", dict(residual="global")),
    ("default, flow assignment hash (Zen)", dict(flow_assignment="hash")),
    ("hash + warm-up ramp", dict(flow_assignment="hash", warmup="ramp")),
    ("hash + 44 dense warm-up iterations", dict(flow_assignment="hash", warmup_iters=44)),
    ("hash + residual global", dict(flow_assignment="hash", residual="global")),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--scheme", default="multitree-sparse")
    ap.add_argument("--only", type=int, nargs="*", help="variant row numbers (0 = dense)")
    ap.add_argument("--json", help="also write the raw summaries here")
    a = ap.parse_args(argv)
    rows = [v for i, v in enumerate(VARIANTS) if a.only is None or i in a.only]
    cfgs, keys = [], []
    for name, over in rows:
        for seed in a.seeds:
            kw = dict(density=a.density, scheme=a.scheme, epochs=a.epochs, seed=seed,
                      progress=False, label=f"{name} seed {seed}")
            kw.update(over)
            cfgs.append(train._config("model", "multitree", **kw))
            keys.append((name, seed))
    t0 = time.perf_counter()
    out = train.run_many(cfgs, timeout=7200, log=lambda *x: print(*x, file=sys.stderr))
    wall = time.perf_counter() - t0
    acc = {k: s["final_accuracy"] for k, s in zip(keys, out)}
    dense = {s: acc.get((VARIANTS[0][0], s)) for s in a.seeds}
    print(f"| run | " + " | ".join(f"seed {s}" for s in a.seeds) + " | mean | vs dense |")
    print("|---|" + "---|" * (len(a.seeds) + 2))
    for name, _ in rows:
        vals = [acc[(name, s)] for s in a.seeds]
        mean = sum(vals) / len(vals)
        diffs = [acc[(name, s)] - dense[s] for s in a.seeds if dense[s] is not None]
        d = f"{100 * sum(diffs) / len(diffs):+.2f} pt" if diffs else "-"
        print(f"| {name} | " + " | ".join(f"{100 * v:.2f}" for v in vals)
              + f" | {100 * mean:.2f} | {d} |")
    print(f"\n{len(cfgs)} runs, {a.epochs} epochs each, wall {wall:.0f} s", file=sys.stderr)
    if a.json:
        for s in out:
            s.pop("params", None)
        with open(a.json, "w") as f:
            json.dump({"keys": keys, "summaries": out}, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
