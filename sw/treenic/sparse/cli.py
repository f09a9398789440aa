"""``treenic sparse``: run any registered sparse all-reduce golden model on seeded synthetic
gradients and report traffic, invariants and model time.

    treenic sparse --algorithm ALGO --workers P --elements N --density D [--seed S]
                   [--iterations T] [--workload gaussian|zipf] [--json]
                   [--spardl-sag r|b] [--teams d] [--topology SPEC] [--flow-assignment F]
                   [--opt KEY=VALUE ...]

Algorithm-specific flags are passed only to the algorithm they belong to (``--spardl-sag``
and ``--teams``: spardl; ``--topology`` and ``--flow-assignment``: multitree-sparse); giving
one to another algorithm is an error. ``--opt KEY=VALUE`` passes any constructor option
(values parse as int, float, true/false/none, else string).

Gradients (:mod:`treenic.sparse.synthetic`), fresh every iteration with seed ``S + t``:
``gaussian`` — :func:`gaussian_shared_grads` (shared = 0.5, 4 layers with per-layer scales);
``zipf`` — :func:`zipf_embedding_grads`, an embedding table of N/16 rows × 16 columns whose
touched-row fraction per worker is the density (natural sparsity with skew; N must be a
multiple of 16).

The returned dict: ``algorithm, workers, elements, density, k, iterations, steps`` (traffic
steps of one iteration, the maximum over iterations), ``bytes_sent_per_worker`` and
``bytes_received_per_worker`` (``max`` and ``mean`` over workers of the per-iteration average),
``invariants`` (name → bool, AND over iterations), ``iteration_seconds`` (wall time of each
``step``), ``options``.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from .base import REGISTRY, SparseError, make

ZIPF_DIM = 16
SPECIFIC = {  # CLI dest -> (algorithm, constructor option)
    "spardl_sag": ("spardl", "sag"),
    "teams": ("spardl", "teams"),
    "topology": ("multitree-sparse", "topology"),
    "flow_assignment": ("multitree-sparse", "flow_assignment"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algorithm", "-a", required=True,
                        help=f"one of: {', '.join(REGISTRY)}")
    parser.add_argument("--workers", "-P", type=int, required=True)
    parser.add_argument("--elements", "-N", type=int, required=True)
    parser.add_argument("--density", "-d", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", "-T", type=int, default=1)
    parser.add_argument("--workload", choices=("gaussian", "zipf"), default="gaussian")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--spardl-sag", choices=("r", "b"), default=None,
                        help="spardl: Spar-All-Gather flavour when --teams > 1")
    parser.add_argument("--teams", type=int, default=None, help="spardl: team count d (d | P)")
    parser.add_argument("--topology", default=None,
                        help="multitree-sparse: topology spec with P nodes (default torus)")
    parser.add_argument("--flow-assignment", choices=("contiguous", "hash"), default=None,
                        help="multitree-sparse: contiguous chunks or Zen's first-level hash")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="any constructor option of the algorithm (repeatable)")


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def options_from_args(args) -> dict:
    """Constructor options for ``args.algorithm`` from the CLI flags."""
    algo = args.algorithm
    if algo not in REGISTRY:
        raise SparseError(f"unknown sparse algorithm {algo!r}; known: {', '.join(REGISTRY)}")
    opts = {}
    for dest, (owner, key) in SPECIFIC.items():
        val = getattr(args, dest, None)
        if val is None:
            continue
        if owner != algo:
            flag = "--" + dest.replace("_", "-")
            raise SparseError(f"{flag} applies to {owner}, not {algo}")
        opts[key] = val
    for item in getattr(args, "opt", []) or []:
        if "=" not in item:
            raise SparseError(f"--opt needs KEY=VALUE, got {item!r}")
        key, val = item.split("=", 1)
        opts[key.strip().replace("-", "_")] = _parse_value(val.strip())
    return opts


def gradients(workload: str, workers: int, elements: int, density: float, seed: int) -> np.ndarray:
    from . import synthetic
    if workload == "gaussian":
        return synthetic.gaussian_shared_grads(workers, elements, shared=0.5,
                                               layers=min(4, elements), seed=seed)
    if elements % ZIPF_DIM:
        raise SparseError(f"zipf workload needs elements divisible by {ZIPF_DIM}")
    rows = elements // ZIPF_DIM
    tokens = synthetic.tokens_for_density(rows, min(density, 0.99))
    return synthetic.zipf_embedding_grads(workers, rows, ZIPF_DIM, tokens, seed=seed)


def _jsonable(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, str) or v is None:
        return v
    if isinstance(v, (list, tuple)) and len(v) <= 64:
        items = [_jsonable(x) for x in v]
        return items if all(x is not _SKIP for x in items) else _SKIP
    if isinstance(v, dict):
        return {str(k): x for k, x in ((k, _jsonable(x)) for k, x in v.items()) if x is not _SKIP}
    return _SKIP


_SKIP = object()


def run(args) -> dict:
    """Run ``args.iterations`` steps; returns the report dict (see module docstring)."""
    if args.iterations < 1:
        raise SparseError(f"--iterations must be >= 1, got {args.iterations}")
    opts = options_from_args(args)
    algo = make(args.algorithm, workers=args.workers, elements=args.elements,
                density=args.density, seed=args.seed, **opts)
    sent = np.zeros(args.workers, np.float64)
    recv = np.zeros(args.workers, np.float64)
    invariants: dict[str, bool] = {}
    seconds, steps, info = [], 0, {}
    for t in range(args.iterations):
        g = gradients(args.workload, args.workers, args.elements, args.density, args.seed + t)
        t0 = time.perf_counter()
        res = algo.step(g)
        seconds.append(time.perf_counter() - t0)
        sent += res.bytes_sent_per_worker()
        recv += res.bytes_received_per_worker()
        steps = max(steps, res.steps)
        for name, ok in res.info.get("invariants", {}).items():
            invariants[name] = invariants.get(name, True) and bool(ok)
        info = res.info
    sent /= args.iterations
    recv /= args.iterations
    extra = _jsonable({k: v for k, v in info.items() if k != "invariants"})
    return {
        "algorithm": args.algorithm, "workers": args.workers, "elements": args.elements,
        "density": args.density, "k": int(getattr(algo, "k", 0)), "seed": args.seed,
        "workload": args.workload, "iterations": args.iterations, "steps": int(steps),
        "bytes_sent_per_worker": {"max": float(sent.max()), "mean": float(sent.mean())},
        "bytes_received_per_worker": {"max": float(recv.max()), "mean": float(recv.mean())},
        "invariants": invariants,
        "iteration_seconds": seconds,
        "options": _jsonable(opts),
        "info": extra if extra is not _SKIP else {},
    }


def main(argv=None) -> int:
    """Stand-alone entry: ``python -m treenic.sparse.cli ...``."""
    parser = argparse.ArgumentParser(prog="treenic sparse", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        out = run(args)
    except SparseError as e:
        parser.exit(2, f"treenic sparse: error: {e}\n")
    if args.json:
        print(json.dumps(out))
    else:
        for key, val in out.items():
            print(f"{key}: {val}")
    return 0 if all(out["invariants"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
