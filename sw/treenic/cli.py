"""``treenic`` command line.

    treenic schedule TOPOLOGY --algorithm ALGO [--variant V] [--json] [--table NODE] [--export FILE] [--msccl-xml FILE]
    treenic allreduce TOPOLOGY --algorithm ALGO [--variant V] --elements N [--seed S] [--json]
    treenic allreduce TOPOLOGY --algorithm multitree-sparse --density D --engine rtl
                      --elements N [--iterations T] [--json]   # sparse, Verilated NIC fabric
    treenic image TOPOLOGY [--algorithm ALGO] --elements N [--density D ...] -o FILE
    treenic image --dump FILE [--rows NODE] [--json]  # configuration image sets
    treenic compare [TOPOLOGY] [--elements N]        # all dense algorithms side by side
    treenic sparse --algorithm ALGO --workers P --elements N --density D [...]
    treenic train [--backend rtl|model|torch] [--variant V] [...]   # data-parallel training

``--variant`` picks a construction variant of an algorithm that has them: MultiTree's
``bound`` (default; Algorithm 1 with the paper's latitude used to reach the link lower bound)
or ``paper`` (Algorithm 1 as printed).
    treenic demo                                      # what `make demo` runs

Bad input (unknown algorithm, malformed, disconnected or oversized topology, N < 2, bad
parameters, sizes beyond the available memory, an unwritable output path) is rejected before
any work starts: one line ``treenic: error: ...`` and exit status 2. Anything else that goes
wrong prints one line ``treenic: internal error: ...`` and exits with status 1 (set
``TREENIC_DEBUG=1`` for the traceback).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from . import algorithms
from .schedule import check, cost
from .schedule.execute import run_and_check
from .schedule.ir import ScheduleError
from .schedule.table import format_table
from .topology import Topology, TopologyError, parse

DEFAULT_TOPOLOGY = "torus:4x4"
#: Largest topology the CLI compiles: a schedule of N nodes holds O(N^2) transfers.
MAX_NODES = 4096
#: Bytes the golden executor's check needs per node and element (state, payload copies and
#: the independent replay in float32, the fp64 reference in float64).
BYTES_PER_NODE_ELEMENT = 32
#: Training processes the demo spawns at most.
MAX_WORKERS = 64


class CLIError(Exception):
    pass


def topology_arg(spec: str) -> Topology:
    """Parse a user's topology spec, bounded before anything is built; every failure is a
    one-line CLIError naming the spec."""
    text = str(spec).strip()
    if not text.startswith("file:") and Path(text).suffix == "":
        # every parameter multiplies into (or bounds) the end-node count
        params = [int(x) for x in re.findall(r"[0-9]+", text.partition(":")[2])]
        if params and math.prod(params) > MAX_NODES:
            raise CLIError(f"topology {text!r} is too large: the CLI compiles topologies of "
                           f"at most {MAX_NODES} nodes")
    try:
        topo = parse(text)
    except TopologyError:
        raise
    except Exception as e:        # malformed graph files: XML/JSON/edge-list parse errors
        raise CLIError(f"cannot read topology {text!r}: {type(e).__name__}: {e}") from None
    if topo.n > MAX_NODES:
        raise CLIError(f"topology {text!r} has {topo.n} nodes; the CLI compiles topologies of "
                       f"at most {MAX_NODES}")
    return topo


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable), or physical memory if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(needed: int, what: str) -> None:
    """Refuse a run that needs more than half the available memory."""
    have = available_memory()
    if needed > have // 2:
        raise CLIError(f"{what} needs about {needed / 2**30:.1f} GiB; only "
                       f"{have / 2**30:.1f} GiB of memory is available (limit: half of it)")


def check_elements(elements: int, nodes: int, flag: str = "--elements") -> None:
    if elements < 1:
        raise CLIError(f"{flag} must be >= 1, got {elements}")
    check_memory(nodes * elements * BYTES_PER_NODE_ELEMENT,
                 f"{flag} {elements} on {nodes} nodes")


def check_output_path(path: str, flag: str) -> Path:
    """An output file whose directory exists and which is not a directory itself."""
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{flag} {path}: is a directory")
    if not p.parent.is_dir():
        raise CLIError(f"{flag} {path}: directory {p.parent} does not exist")
    if not os.access(p.parent, os.W_OK):
        raise CLIError(f"{flag} {path}: directory {p.parent} is not writable")
    return p


def check_output_dir(path: str, flag: str) -> None:
    """A directory that exists or can be created (its nearest existing ancestor is a
    writable directory)."""
    p = Path(path).absolute()
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise CLIError(f"{flag} {path}: {q} is not a directory")
            if not os.access(q, os.W_OK):
                raise CLIError(f"{flag} {path}: {q} is not writable")
            return


def build_schedule(algorithm: str, topology, variant: str | None = None):
    """``algorithms.build`` with a user's ``--variant`` checked (None: the default)."""
    return algorithms.build(algorithm, topology, **algorithms.variant_options(algorithm, variant))


def _schedule(args):
    return build_schedule(args.algorithm, topology_arg(args.topology), args.variant)


def cmd_schedule(args) -> int:
    export = check_output_path(args.export, "--export") if args.export else None
    if args.elements < 0:
        raise CLIError(f"--elements must be >= 0, got {args.elements}")
    s = _schedule(args)
    conflicts = check.check_all(s)["link_conflicts"]
    msccl = check_output_path(args.msccl_xml, "--msccl-xml") if args.msccl_xml else None
    try:
        if export:
            export.write_text(s.dumps())
        if msccl:
            from .schedule.msccl import to_xml
            msccl.write_text(to_xml(s))
    except OSError as e:
        raise CLIError(f"{e.filename}: {e.strerror}") from None
    if args.table is not None:
        print(format_table(s, args.table, args.elements))
        return 0
    info = {"topology": s.topology.spec, "nodes": s.n, "algorithm": s.algorithm,
            **variant_fields(s), "steps": {"reduce_scatter": s.reduce_steps, "all_gather": s.gather_steps},
            "transfers": len(s.transfers), "link_conflicts": conflicts,
            "build_seconds": round(s.build_seconds, 6)}
    if args.json:
        print(json.dumps(info))
    else:
        print(f"{describe(s)} on {s.topology.describe()}")
        print(f"  steps: {s.reduce_steps} reduce-scatter + {s.gather_steps} all-gather, "
              f"{len(s.transfers)} transfers, {conflicts} link conflicts, "
              f"built in {s.build_seconds * 1e3:.1f} ms")
        if args.export:
            print(f"  schedule JSON written to {args.export}")
        if getattr(args, "msccl_xml", None):
            print(f"  MSCCL algorithm XML written to {args.msccl_xml}")
    return 0


def variant_fields(s) -> dict:
    """``variant`` and ``construction`` of a schedule built with variants (else nothing)."""
    return {k: s.meta[k] for k in ("variant", "construction") if k in s.meta}


def describe(s) -> str:
    """``multitree (variant bound: algorithm1/root/geometric)`` or the algorithm's name."""
    v = variant_fields(s)
    if not v:
        return s.algorithm
    return f"{s.algorithm} (variant {v['variant']}" + (
        f": {v['construction']})" if "construction" in v else ")")


def allreduce_report(algorithm: str, topology, elements: int, seed: int = 0,
                     variant: str | None = None) -> dict:
    s = build_schedule(algorithm, topology, variant)
    check.check_postcondition(s)
    rng = np.random.default_rng(seed)
    bufs = rng.standard_normal((s.n, elements)).astype(np.float32)
    rep = run_and_check(s, bufs)
    return {"algorithm": algorithm, **variant_fields(s), "topology": s.topology.spec,
            "nodes": s.n, "elements": elements, "steps": s.steps, "bit_exact": rep.bit_exact,
            "all_nodes_equal": rep.all_nodes_equal,
            "max_abs_err_vs_fp64": rep.max_abs_err_vs_fp64,
            "link_conflicts": check.link_conflicts(s),
            "alpha_beta_seconds": cost.alpha_beta(s, elements),
            "contention_seconds": cost.contention(s, elements)}


def check_seed(seed: int) -> None:
    if not 0 <= seed < 2**63:
        raise CLIError(f"--seed must be in 0..2^63-1, got {seed}")


from .driver.fabric import RTL_SPARSE    # sparse schemes the RTL implements (docs/sparse-nic.md)


def cmd_sparse_allreduce(args, topo) -> int:
    """``allreduce --density D --engine rtl``: MultiTree-Sparse or TopkA on one Verilated
    fabric of combined NICs (the sparse engine inside each NIC,
    :mod:`treenic.hdl.nic.sparse_nic_sim`): the dense all-reduce of the same buffers and
    every sparse iteration on the same NICs and links, each checked against its golden."""
    if args.engine != "rtl":
        raise CLIError("a sparse all-reduce needs --engine rtl here (the golden sparse "
                       "models run under `treenic sparse`)")
    if args.density is None:
        raise CLIError(f"--algorithm {args.algorithm} is sparse: give --density D in (0, 1]")
    from .hdl.nic.host import NicImageError
    from .hdl.nic.sparse_nic_sim import check_run_args, combined_report
    try:
        check_run_args(topo.spec, args.elements, args.density, args.iterations,
                       algorithm=args.algorithm, residual=args.residual,
                       flow_assignment=args.flow_assignment)
    except ValueError as e:
        raise CLIError(str(e)) from None
    from .hdl.cosim import cosim_available
    if not cosim_available():
        raise CLIError("--engine rtl needs verilator and a C++ compiler on PATH")
    try:
        r = combined_report(topo.spec, args.elements, args.density,
                            iterations=args.iterations, seed=args.seed,
                            algorithm=args.algorithm, residual=args.residual,
                            flow_assignment=args.flow_assignment, codec=args.codec)
    except NicImageError as e:
        raise CLIError(f"the fabric of combined NICs cannot run this program: {e}") from None
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['algorithm']} all-reduce ({r['residual']} residual, "
              f"{r['flow_assignment']} flows) of {r['elements']} float32 at density "
              f"{r['density']} on {r['topology']} ({r['engine']}), {r['iterations']} "
              f"iterations: bit-exact={r['bit_exact']}, {r['cycles']} cycles (ideal "
              f"{r['ideal_cycles']}, dense {r['dense_cycles']} on the same fabric), link "
              f"bytes {r['link_bytes']} (dense {r['dense_link_bytes']})")
    return 0 if r["bit_exact"] else 1


def cmd_allreduce(args) -> int:
    topo = topology_arg(args.topology)
    check_elements(args.elements, topo.n)
    check_seed(args.seed)
    if args.density is not None or args.algorithm in RTL_SPARSE:
        return cmd_sparse_allreduce(args, topo)
    if args.engine != "golden":
        raise CLIError("--engine rtl runs the sparse all-reduce (--density); the dense RTL "
                       "all-reduce is `python -m treenic.bench --only nic`")
    r = allreduce_report(args.algorithm, topo, args.elements, args.seed, args.variant)
    if args.json:
        print(json.dumps(r))
    else:
        name = r["algorithm"] + (f" ({r['variant']})" if "variant" in r else "")
        print(f"{name} all-reduce of {r['elements']} float32 on {r['topology']}: "
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
    topo = topology_arg(args.topology)
    check_elements(args.elements, topo.n)
    check_seed(args.seed)
    rows = compare_rows(topo, args.elements, args.seed)
    if all("skipped" in r for r in rows):
        raise CLIError(f"no dense algorithm applies to {topo.spec}: "
                       + "; ".join(f"{r['algorithm']}: {r['skipped']}" for r in rows))
    if args.json:
        print(json.dumps(rows))
    else:
        print_compare(rows, topo.spec, args.elements)
    return 0


def _optional(module: str):
    """Subcommands whose modules other parts of treenic provide."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def check_train_args(args) -> None:
    """Everything `treenic train` (and the demo's training) needs, checked before any
    process is spawned: a bad scheme used to fail inside the workers after 20 s."""
    if not args.lr > 0:
        raise CLIError(f"--lr must be > 0, got {args.lr}")
    if not 2 <= args.workers <= MAX_WORKERS:
        raise CLIError(f"--workers must be in 2..{MAX_WORKERS}, got {args.workers}")
    if args.epochs < 1:
        raise CLIError(f"--epochs must be >= 1, got {args.epochs}")
    if args.warmup_iters < 0:
        raise CLIError(f"--warmup-iters must be >= 0, got {args.warmup_iters}")
    if args.density is not None:
        if not 0.0 < args.density <= 1.0:
            raise CLIError(f"--density must be in (0, 1], got {args.density}")
        from .sparse.base import REGISTRY
        if args.scheme not in REGISTRY:
            raise CLIError(f"unknown sparse --scheme {args.scheme!r}; known: "
                           f"{', '.join(REGISTRY)}")
        _check_sparse_train_args(args)
    topo = topology_arg(args.topology or f"ring:{args.workers}")
    if topo.n != args.workers:
        raise CLIError(f"--topology {topo.spec} has {topo.n} nodes but --workers is "
                       f"{args.workers}")
    # unknown algorithm or variant / not applicable
    build_schedule(args.algorithm, topo, getattr(args, "variant", None))
    check_output_dir(args.out, "--out")
    if getattr(args, "host_addresses", None) is not None:
        from .driver.errors import DriverError
        from .driver.udp import train_host_addresses
        try:
            train_host_addresses(args.host_addresses, args.workers, backend=args.backend,
                                 boards=getattr(args, "boards", None))
        except DriverError as e:
            raise CLIError(str(e)) from None


def _check_sparse_train_args(args) -> None:
    """The sparse-training options: NIC options only where the scheme has them, the
    MultiTree schedule under MultiTree-Sparse, a positive clipping norm."""
    from .driver.fabric import SCHEMES_WITH_OPTIONS, SPARSE_OPTIONS
    if args.clip_norm is not None and not args.clip_norm > 0:
        raise CLIError(f"--clip-norm must be > 0, got {args.clip_norm}")
    if args.scheme in SCHEMES_WITH_OPTIONS:
        if args.algorithm != "multitree":
            raise CLIError(f"--scheme {args.scheme} runs on the MultiTree schedule's trees; "
                           f"--algorithm is {args.algorithm!r}")
        return
    for key in SPARSE_OPTIONS:
        value = getattr(args, key)
        if value is not None:
            raise CLIError(f"--{key.replace('_', '-')} {value}: scheme {args.scheme!r} has no "
                           f"such option (only {', '.join(SCHEMES_WITH_OPTIONS)})")


def cmd_image(args) -> int:
    from . import image_cli

    def error(message):
        raise CLIError(message)
    return image_cli.run(args, error=error)


def cmd_train(args) -> int:
    check_train_args(args)
    return importlib.import_module("treenic.train").main(args)


def cmd_demo(args) -> int:
    t0 = time.perf_counter()
    rc = _demo(args)        # bad input raises: one error line, no timing line after it
    print(f"demo time: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return rc


def _demo(args) -> int:
    check_elements(args.elements, topology_arg(DEFAULT_TOPOLOGY).n)
    train = None if args.schedules_only else _optional("treenic.train")
    if train is not None:
        check_train_args(args)
    rows = compare_rows(DEFAULT_TOPOLOGY, args.elements, 0)
    print_compare(rows, DEFAULT_TOPOLOGY, args.elements)
    if train is None:
        if not args.schedules_only:     # no torch: say so, never skip the training silently
            print("NOTICE: treenic.train could not be imported (torch missing?); the demo "
                  "ran the schedule comparison only", file=sys.stderr)
        return 0
    return train.main(args)


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (argparse prints the usage block before them)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_variant_argument(parser) -> None:
    known = "; ".join(f"{name}: {', '.join(algorithms.variants(name))}"
                      for name in algorithms.VARIANT_ALGORITHMS)
    parser.add_argument("--variant", default=None, metavar="V",
                        help=f"construction variant of an algorithm that has them ({known}; "
                             "the first is the default)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="treenic", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("schedule", help="compile a topology into an all-reduce schedule")
    s.add_argument("topology")
    s.add_argument("--algorithm", "-a", default="multitree")
    add_variant_argument(s)
    s.add_argument("--json", action="store_true")
    s.add_argument("--table", type=int, metavar="NODE", help="print NODE's NIC schedule table")
    s.add_argument("--elements", type=int, default=0, help="buffer size for table start/size")
    s.add_argument("--export", metavar="FILE", help="write the schedule JSON")
    s.add_argument("--msccl-xml", metavar="FILE",
                   help="write the schedule as an MSCCL algorithm XML (in-place all-reduce)")
    s.set_defaults(func=cmd_schedule)

    a = sub.add_parser("allreduce", help="run a value-level all-reduce on the golden executor")
    a.add_argument("topology")
    a.add_argument("--algorithm", "-a", default="multitree")
    add_variant_argument(a)
    a.add_argument("--elements", "-n", type=int, required=True)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--density", type=float, default=None,
                   help="sparse all-reduce at this top-k density (with --engine rtl)")
    a.add_argument("--engine", choices=("golden", "rtl"), default="golden")
    a.add_argument("--iterations", type=int, default=3,
                   help="error-feedback iterations of a sparse run")
    a.add_argument("--residual", choices=("local", "global"), default="local",
                   help="multitree-sparse's error-feedback residual (sparse run)")
    a.add_argument("--flow-assignment", choices=("contiguous", "hash"), default="contiguous",
                   help="multitree-sparse's flows: contiguous chunks or Zen's hash")
    a.add_argument("--codec", action="store_true",
                   help="sparse run: codec messages (pairs or bitmap + values, whichever is "
                        "smaller) instead of one pair a flit")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_allreduce)

    im = sub.add_parser("image", help="compile a configuration image set to a file, or dump "
                                      "one (dense, or with a sparse program)")
    from . import image_cli
    image_cli.add_arguments(im)
    im.set_defaults(func=cmd_image)

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
        sp.set_defaults(func=lambda args: _print_result(sparse_cli.run(_checked_sparse(args)),
                                                        args))

    train = _optional("treenic.train")
    if train is not None:
        tr = sub.add_parser("train", help="data-parallel training through treenic")
        train.add_arguments(tr)
        tr.set_defaults(func=cmd_train)

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
        # the demo trains dense and sparse side by side (bytes on the wire, accuracy) with
        # the NIC's sparse scheme, both through the RTL: the sparse run's warm-up and sparse
        # steps on one Verilated fabric of combined NICs (about a second a step here);
        # `--sparse-engine golden` puts the sparse run on the golden models, labelled so
        d.set_defaults(density=0.01, scheme="multitree-sparse", sparse_fallback=True)
    d.set_defaults(func=cmd_demo)
    return p


def _checked_sparse(args):
    if args.workers >= 1 and args.elements >= 1:      # smaller: the sparse CLI's own errors
        check_memory(args.workers * args.elements * BYTES_PER_NODE_ELEMENT,
                     f"--workers {args.workers} x --elements {args.elements}")
    return args


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
        print(f"treenic: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"treenic: error: not enough memory ({_one_line(e)})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("treenic: interrupted", file=sys.stderr)
        return 130
    except Exception as e:                       # catch-all: still one line
        if os.environ.get("TREENIC_DEBUG"):
            raise
        print(f"treenic: internal error: {type(e).__name__}: {_one_line(e)} (set "
              "TREENIC_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
