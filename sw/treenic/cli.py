"""``treenic`` command line.

    treenic schedule TOPOLOGY --algorithm ALGO [--json] [--table NODE] [--export FILE]
    treenic allreduce TOPOLOGY --algorithm ALGO --elements N [--seed S] [--json]
    treenic compare [TOPOLOGY] [--elements N]        # all dense algorithms side by side
    treenic sparse --algorithm ALGO --workers P --elements N --density D [...]
    treenic train [--backend rtl|model|torch] [...]   # data-parallel training demo
    treenic demo                                      # what `make demo` runs

Errors (unknown algorithm, malformed or disconnected topology, N < 2, bad parameters) print
one line ``treenic: error: ...`` and exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np

from . import algorithms
from .schedule import check, cost
from .schedule.execute import run_and_check
from .schedule.ir import ScheduleError
from .schedule.table import format_table
from .topology import TopologyError

DEFAULT_TOPOLOGY = "torus:4x4"


class CLIError(Exception):
    pass


def _schedule(args):
    return algorithms.build(args.algorithm, args.topology)


def cmd_schedule(args) -> int:
    s = _schedule(args)
    conflicts = check.check_all(s)["link_conflicts"]
    if args.export:
        Path(args.export).write_text(s.dumps())
    if args.table is not None:
        print(format_table(s, args.table, args.elements))
        return 0
    info = {"topology": s.topology.spec, "nodes": s.n, "algorithm": s.algorithm,
            "steps": {"reduce_scatter": s.reduce_steps, "all_gather": s.gather_steps},
            "transfers": len(s.transfers), "link_conflicts": conflicts,
            "build_seconds": round(s.build_seconds, 6)}
    if args.json:
        print(json.dumps(info))
    else:
        print(f"{s.algorithm} on {s.topology.describe()}")
        print(f"  steps: {s.reduce_steps} reduce-scatter + {s.gather_steps} all-gather, "
              f"{len(s.transfers)} transfers, {conflicts} link conflicts, "
              f"built in {s.build_seconds * 1e3:.1f} ms")
        if args.export:
            print(f"  schedule JSON written to {args.export}")
    return 0


def allreduce_report(algorithm: str, topology, elements: int, seed: int = 0) -> dict:
    s = algorithms.build(algorithm, topology)
    check.check_postcondition(s)
    rng = np.random.default_rng(seed)
    bufs = rng.standard_normal((s.n, elements)).astype(np.float32)
    rep = run_and_check(s, bufs)
    return {"algorithm": algorithm, "topology": s.topology.spec, "nodes": s.n,
            "elements": elements, "steps": s.steps, "bit_exact": rep.bit_exact,
            "all_nodes_equal": rep.all_nodes_equal,
            "max_abs_err_vs_fp64": rep.max_abs_err_vs_fp64,
            "link_conflicts": check.link_conflicts(s),
            "alpha_beta_seconds": cost.alpha_beta(s, elements),
            "contention_seconds": cost.contention(s, elements)}


def cmd_allreduce(args) -> int:
    if args.elements < 1:
        raise CLIError(f"--elements must be >= 1, got {args.elements}")
    r = allreduce_report(args.algorithm, args.topology, args.elements, args.seed)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['algorithm']} all-reduce of {r['elements']} float32 on {r['topology']}: "
              f"bit-exact={r['bit_exact']}, max |err| vs fp64 = {r['max_abs_err_vs_fp64']:.3g}, "
              f"α–β {r['alpha_beta_seconds'] * 1e6:.1f} µs, "
              f"contention {r['contention_seconds'] * 1e6:.1f} µs")
    return 0 if r["bit_exact"] else 1


def compare_rows(topology: str, elements: int, seed: int = 0) -> list[dict]:
    rows = []
    for name in algorithms.ALGORITHMS:
        try:
            rows.append(allreduce_report(name, topology, elements, seed))
        except (ScheduleError, TopologyError) as e:
            rows.append({"algorithm": name, "skipped": str(e)})
    return rows


def print_compare(rows, topology, elements) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"dense all-reduce, {elements * 4 / 2**20:.2f} MiB float32 per node, "
                    f"{topology}")
    for col in ("algorithm", "steps", "conflicts", "bit-exact", "|err| vs fp64", "α–β µs",
                "contention µs"):
        t.add_column(col, justify="left" if col == "algorithm" else "right")
    skipped = []
    for r in rows:
        if "skipped" in r:
            skipped.append(f"{r['algorithm']}: {r['skipped']}")
            continue
        t.add_row(r["algorithm"], str(r["steps"]), str(r["link_conflicts"]),
                  "yes" if r["bit_exact"] else "NO", f"{r['max_abs_err_vs_fp64']:.1e}",
                  f"{r['alpha_beta_seconds'] * 1e6:.1f}", f"{r['contention_seconds'] * 1e6:.1f}")
    console = Console(width=max(100, Console().width))
    console.print(t)
    for line in skipped:
        console.print(f"  not applicable — {line}")


def cmd_compare(args) -> int:
    rows = compare_rows(args.topology, args.elements, args.seed)
    if args.json:
        print(json.dumps(rows))
    else:
        print_compare(rows, args.topology, args.elements)
    return 0


def _optional(module: str):
    """Subcommands whose modules other parts of treenic provide."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def cmd_demo(args) -> int:
    rows = compare_rows(DEFAULT_TOPOLOGY, args.elements, 0)
    print_compare(rows, DEFAULT_TOPOLOGY, args.elements)
    train = _optional("treenic.train")
    if train is not None and not args.schedules_only:
        return train.main(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="treenic", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("schedule", help="compile a topology into an all-reduce schedule")
    s.add_argument("topology")
    s.add_argument("--algorithm", "-a", default="multitree")
    s.add_argument("--json", action="store_true")
    s.add_argument("--table", type=int, metavar="NODE", help="print NODE's NIC schedule table")
    s.add_argument("--elements", type=int, default=0, help="buffer size for table start/size")
    s.add_argument("--export", metavar="FILE", help="write the schedule JSON")
    s.set_defaults(func=cmd_schedule)

    a = sub.add_parser("allreduce", help="run a value-level all-reduce on the golden executor")
    a.add_argument("topology")
    a.add_argument("--algorithm", "-a", default="multitree")
    a.add_argument("--elements", "-n", type=int, required=True)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_allreduce)

    c = sub.add_parser("compare", help="all dense algorithms side by side")
    c.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY)
    c.add_argument("--elements", "-n", type=int, default=1 << 16)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compare)

    sparse_cli = _optional("treenic.sparse.cli")
    if sparse_cli is not None:
        sp = sub.add_parser("sparse", help="sparse all-reduce golden models")
        sparse_cli.add_arguments(sp)
        sp.set_defaults(func=lambda args: _print_result(sparse_cli.run(args), args))

    train = _optional("treenic.train")
    if train is not None:
        tr = sub.add_parser("train", help="data-parallel training through treenic")
        train.add_arguments(tr)
        tr.set_defaults(func=train.main)

    boardsim = _optional("treenic.boards.boardsim")
    if boardsim is not None:
        bs = sub.add_parser("boardsim", help="simulated boards on loopback UDP (udp backend)")
        boardsim.add_arguments(bs)
        bs.set_defaults(func=boardsim.run)

    d = sub.add_parser("demo", help="the main job: schedules, then training (make demo)")
    d.add_argument("--elements", type=int, default=1 << 16)
    d.add_argument("--schedules-only", action="store_true")
    if train is not None:
        train.add_arguments(d)
        # the demo trains dense and sparse side by side (bytes on the wire, accuracy)
        d.set_defaults(density=0.01)
    d.set_defaults(func=cmd_demo)
    return p


def _print_result(result, args) -> int:
    if isinstance(result, int):
        return result
    if getattr(args, "json", False):
        print(json.dumps(result, default=float))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (TopologyError, ScheduleError, CLIError, ValueError) as e:
        print(f"treenic: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
