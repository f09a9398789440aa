"""A Verilated fabric of combined NICs (the sparse engine inside ``Nic``,
``NicParams.sparse``): the dense MultiTree all-reduce and then MultiTree-Sparse / TopkA
error-feedback iterations over the same links, everything through the NICs' host
registers (:mod:`.sparse_host`), each run checked bit for bit against its golden.

``python -m treenic.hdl.nic.sparse_nic_sim ring:4 --elements 4096 --density 0.01
--iterations 3 --json`` prints the report of :func:`combined_report`.
"""
from __future__ import annotations

import numpy as np

from treenic.schedule.sparse_table import SparseProgram, program_golden, sparse_model

from .fabric_sim import FabricError, FabricSim
from .host import check_sparse_fits, sparse_dump_writes, sparse_load_writes
from .params import Reg, SparseOut, SparseParams, SparseStatus
from .sparse_fabric import decode_program_dump

__all__ = ["combined_fabric", "set_sparse_mode", "run_sparse", "combined_report", "ENGINE"]

ENGINE = "Verilated fabric of combined NICs (treenic.hdl.nic.sparse_nic_sim)"


def combined_fabric(topology: str, program: SparseProgram, elements: int, *, lanes: int = 16,
                    topk_units: int = 2, stall: int = 0, seed: int = 1) -> FabricSim:
    """The Verilated fabric of ``topology`` whose NICs run the dense MultiTree schedule of
    ``elements`` and hold a sparse engine sized for ``program``."""
    from treenic.firmware.image import compile_images
    from .host import params_for_images
    images = compile_images(topology, "multitree", elements)
    sparse = SparseParams.for_program(program, lanes=lanes, topk_units=topk_units)
    params = params_for_images(images, sparse=sparse)
    check_sparse_fits(params, program)
    return FabricSim(topology, "multitree", elements, images=images, params=params,
                     stall=stall, seed=seed)


def set_sparse_mode(fs: FabricSim, on: bool) -> None:
    """Give every NIC's links to its sparse engine (``on``) or its dense datapath: first
    every NIC DRAINED, then SP_MODE on all (the two-phase switch of :mod:`.sparse_host`)."""
    status = fs.read_all([int(Reg.SP_STATUS)])[0]
    if not all(int(s) & SparseStatus.DRAINED for s in status):
        raise FabricError(f"links not drained, SP_STATUS {[hex(int(s)) for s in status]}")
    fs.write_bulk([[(int(Reg.SP_MODE), int(on))]] * fs.nodes)
    mode = fs.read_all([int(Reg.SP_MODE)])[0]
    if list(mode) != [int(on)] * fs.nodes:
        raise FabricError(f"SP_MODE refused: {list(mode)}")


def _wait_done(fs: FabricSim, max_cycles: int) -> int:
    sim = fs.sim
    sim["start"] = 1
    sim.step(1)
    sim["start"] = 0
    c0 = sim.cycle
    while not sim["done"]:
        sim.step_until(256, "done", "error")
        if sim["error"] or sim.cycle - c0 > max_cycles:
            raise FabricError(f"sparse run: error={int(sim['error'])} after "
                              f"{sim.cycle - c0} cycles ({fs.diagnose()})")
    return int(sim["cycles"])


def _dump(fs: FabricSim, program: SparseProgram, batch: int = 256) -> list[list[int]]:
    """Every NIC's DUMP words (``HOST_OUT`` packed) through SP_OUT_POP / INDEX / VALUE."""
    fs.write_bulk([[(a, v) for a, v in sparse_dump_writes(program)]] * fs.nodes)
    words: list[list[int]] = [[] for _ in range(fs.nodes)]
    ended = [False] * fs.nodes
    triple = [int(Reg.SP_OUT_POP), int(Reg.SP_OUT_INDEX), int(Reg.SP_OUT_VALUE)]
    for _ in range(1 + 4 * (program.dump_words + program.chunks * program.max_k) // batch):
        rows = fs.read_all(triple * batch).astype(np.uint64)
        for t in range(batch):
            flags, index, value = rows[3 * t:3 * t + 3]
            for u in range(fs.nodes):
                f = int(flags[u])
                if ended[u] or not f & SparseOut.VALID:
                    continue
                ended[u] = bool(f & SparseOut.END)
                if not ended[u]:
                    final = 1 if f & SparseOut.FINAL else 0
                    words[u].append(int(index[u]) | int(value[u]) << 32 | final << 64)
        if all(ended):
            return words
    raise FabricError("sparse DUMP: no END word from every NIC")


def run_sparse(fs: FabricSim, program: SparseProgram, grads: np.ndarray, *, rows: bool,
               max_cycles: int = 10_000_000) -> dict:
    """One sparse run (the NICs in sparse mode): push the program rows (``rows``) and the
    gradients, START, wait for DONE, read the engine counters and DUMP; returns the
    residuals and results (P x N float32), the fabric's cycles and the engines' counters."""
    p = fs.params
    fs.write_bulk([sparse_load_writes(p, program, u, grads[u], rows=rows)
                   for u in range(fs.nodes)])
    cycles = _wait_done(fs, max_cycles)
    regs = [Reg.SP_STATUS, Reg.SP_CYCLES, Reg.SP_FLITS, Reg.SP_MALFORMED]
    vals = dict(zip(regs, fs.read_all([int(r) for r in regs]).astype(np.int64)))
    if any(int(s) & SparseStatus.HOST_REFUSED for s in vals[Reg.SP_STATUS]):
        raise FabricError("a sparse host write was refused (HOST_IN FIFO full?)")
    dumps = [decode_program_dump(w, program) for w in _dump(fs, program)]
    return {"residuals": np.stack([d[0] for d in dumps]),
            "results": np.stack([d[1] for d in dumps]), "cycles": cycles,
            "engine_cycles": [int(c) for c in vals[Reg.SP_CYCLES]],
            "flits": [int(f) for f in vals[Reg.SP_FLITS]],
            "malformed": int(vals[Reg.SP_MALFORMED].sum())}


def _same(a, b) -> bool:
    return bool(np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                               np.asarray(b, np.float32).view(np.uint32)))


def combined_report(topology: str, elements: int, density: float, *, iterations: int = 3,
                    seed: int = 0, lanes: int = 16, topk_units: int = 2, stall: int = 0,
                    algorithm: str = "multitree-sparse") -> dict:
    """On one Verilated fabric of combined NICs: the dense MultiTree all-reduce of the
    first iteration's gradients (vs the golden executor), then ``iterations``
    error-feedback iterations of ``algorithm`` (residuals kept in the NICs; results and
    residuals vs the golden model), then the dense all-reduce again."""
    from treenic.algorithms import build
    from treenic.schedule.execute import execute
    _, prog = sparse_model(algorithm, topology, elements, density, seed=seed)
    fs = combined_fabric(topology, prog, elements, lanes=lanes, topk_units=topk_units,
                         stall=stall, seed=seed + 1)
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal((fs.nodes, elements)).astype(np.float32)
             for _ in range(iterations)]
    want_dense = execute(build("multitree", topology), grads[0])
    dense, dense_cycles = fs.run(grads[0])
    set_sparse_mode(fs, True)
    runs, exact = [], []
    golden = program_golden(prog, seed)
    for it, g in enumerate(grads):
        r = run_sparse(fs, prog, g, rows=it == 0)
        want = golden.step(g)
        exact.append(_same(r["results"], want.result) and _same(r["residuals"], want.residuals))
        runs.append(r)
    set_sparse_mode(fs, False)
    dense2, dense2_cycles = fs.run(grads[0])
    flits = [sum(r["flits"]) for r in runs]
    return {"algorithm": algorithm, "topology": topology, "nodes": fs.nodes,
            "elements": elements, "density": density, "iterations": iterations,
            "lanes": lanes, "topk_units": topk_units, "link_stall": stall, "engine": ENGINE,
            "bit_exact": all(exact) and _same(dense, want_dense) and _same(dense2, want_dense),
            "sparse_bit_exact_per_iteration": exact,
            "cycles_per_iteration": [r["cycles"] for r in runs],
            "engine_cycles_per_iteration": [max(r["engine_cycles"]) for r in runs],
            "link_bytes_per_iteration": [8 * (b - a) for a, b in zip([0] + flits, flits)],
            "malformed": sum(r["malformed"] for r in runs),
            "dense_cycles": int(dense_cycles), "dense_cycles_after_sparse": int(dense2_cycles),
            "dense_bit_exact": _same(dense, want_dense) and _same(dense2, want_dense),
            "build_seconds": round(fs.build_seconds, 1)}


#: the largest fabric this entry point builds (the NIC's default ``max_nodes``): a
#: Verilated fabric of combined NICs takes minutes to build at 4 nodes
MAX_FABRIC_NODES = 16


def _check_args(a) -> None:
    """Bounds before anything is built; a ValueError names the bad argument."""
    from treenic.cli import CLIError, check_elements, check_seed, topology_arg
    try:
        topo = topology_arg(a.topology)
        if topo.n > MAX_FABRIC_NODES:
            raise CLIError(f"{a.topology}: {topo.n} nodes, at most {MAX_FABRIC_NODES} here")
        check_elements(a.elements, topo.n)
        check_seed(a.seed)
    except CLIError as e:
        raise ValueError(str(e)) from None
    if a.elements < topo.n:
        raise ValueError(f"--elements {a.elements}: need at least one per flow ({topo.n})")
    if not 0 < a.density <= 1:
        raise ValueError(f"--density must be in (0, 1], got {a.density}")
    for name in ("iterations", "lanes", "topk_units"):
        if not 1 <= getattr(a, name) <= 100:
            raise ValueError(f"--{name.replace('_', '-')} must be in 1..100, "
                             f"got {getattr(a, name)}")
    if a.stall < 0:
        raise ValueError(f"--stall must be >= 0, got {a.stall}")


def main(argv=None) -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("topology")
    ap.add_argument("--elements", type=int, default=4096)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--algorithm", default="multitree-sparse",
                    choices=["multitree-sparse", "topka"])
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--topk-units", type=int, default=2)
    ap.add_argument("--stall", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        _check_args(a)
    except ValueError as e:
        ap.error(str(e))
    rep = combined_report(a.topology, a.elements, a.density, iterations=a.iterations,
                          seed=a.seed, lanes=a.lanes, topk_units=a.topk_units,
                          stall=a.stall, algorithm=a.algorithm)
    print(json.dumps(rep, indent=None if a.json else 2))
    return 0 if rep["bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
