"""A Verilated fabric of combined NICs (the sparse engine inside ``Nic``,
``NicParams.sparse``): dense MultiTree all-reduces and MultiTree-Sparse / TopkA runs over
the same links, everything through the NICs' host registers (:mod:`.sparse_host`).

:class:`CombinedFabricSim` is one such fabric loaded with one configuration image set (the
dense MultiTree tables and the sparse program of a sparse set, version 3): its
:meth:`~CombinedFabricSim.dense` and :meth:`~CombinedFabricSim.sparse` switch the links
between the dense datapath and the engine (SP_MODE) as needed. ``treenic allreduce ...
--engine rtl`` (:func:`combined_report`) and the fabric server's ``rtl`` engine
(:meth:`~CombinedFabricSim.run_fresh`) run on it.

``python -m treenic.hdl.nic.sparse_nic_sim ring:4 --elements 4096 --density 0.01
--iterations 3 --json`` prints the report of :func:`combined_report`.
"""
from __future__ import annotations

import numpy as np

from treenic.schedule.sparse_table import SparseProgram, program_golden

from .fabric_sim import FabricError, FabricSim
from .host import check_sparse_fits, sparse_dump_writes, sparse_push_writes
from .params import Reg, SparseOut, SparseParams, SparseStatus
from .sparse_fabric import clear_word, decode_program_dump, load_words

__all__ = ["combined_fabric", "set_sparse_mode", "run_sparse", "combined_report", "ENGINE",
           "CombinedFabricSim"]

ENGINE = "Verilated fabric of combined NICs (treenic.hdl.nic.sparse_nic_sim)"


def combined_fabric(topology: str, program: SparseProgram, elements: int, *, images=None,
                    lanes: int = 16, topk_units: int = 2, stall: int = 0, seed: int = 1,
                    sizing: SparseProgram | None = None) -> FabricSim:
    """The Verilated fabric of ``topology`` whose NICs run the dense tables of ``images``
    (default: the MultiTree schedule of ``elements``) and hold a sparse engine sized for
    ``sizing`` (default ``program``; a larger program's sizes let one build run several
    densities). A program the build cannot run is a
    :class:`~treenic.hdl.nic.host.NicImageError` naming what does not fit."""
    from treenic.firmware.image import compile_images
    from .host import params_for_images
    images = images if images is not None else compile_images(topology, "multitree", elements)
    sparse = SparseParams.for_program(sizing or program, lanes=lanes, topk_units=topk_units)
    params = params_for_images(images, sparse=sparse)
    check_sparse_fits(params, program)
    return FabricSim(topology, None, None, images=images, params=params, stall=stall,
                     seed=seed)


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


def _host_in_level(status: int) -> int:
    """The HOST_IN FIFO level in an SP_STATUS word (bits 15..8, :mod:`.sparse_host`)."""
    return (int(status) >> 8) & 0xFF


def _wait_taken(fs: FabricSim, max_cycles: int = 10_000_000) -> None:
    """Until every NIC's engine has taken every word pushed into its HOST_IN FIFO."""
    waited = 0
    while True:
        status = fs.read_all([int(Reg.SP_STATUS)])[0]
        if not any(map(_host_in_level, status)):
            return
        if waited > max_cycles:
            raise FabricError(f"sparse engines did not take their host words in {waited} "
                              f"cycles (SP_STATUS {[hex(int(s)) for s in status]})")
        fs.sim.step(64)
        waited += 64


def _push(fs: FabricSim, words: list[list[int]]) -> None:
    """Every NIC's ``HOST_IN`` words (packed) through SP_IN / SP_PUSH, all NICs at once."""
    fs.write_bulk([[w for word in ws for w in sparse_push_writes(word)] for ws in words])


def run_sparse(fs: FabricSim, program: SparseProgram, grads: np.ndarray, *, rows: bool,
               clear: bool = False, max_cycles: int = 10_000_000) -> dict:
    """One sparse run (the NICs in sparse mode): push the program rows (``rows``) and the
    gradients, START, wait for DONE, read the engine counters and DUMP; returns the
    residuals and results (P x N float32), the fabric's cycles and the engines' counters.
    ``clear``: first set every engine's buffer to +0 (a CLEAR word), so the run is a fresh
    all-reduce of ``grads``; the engine takes no host word while it clears (``dump_words``
    cycles), so the first FIFO-full of the load waits for it."""
    check_sparse_fits(fs.params, program)
    words = [load_words(program, u, grads[u])[0 if rows else len(program.rows[u]):]
             for u in range(fs.nodes)]
    if clear:
        _push(fs, [[clear_word(program.dump_words)]] * fs.nodes)
        _wait_taken(fs)
        first = fs.params.sparse.host_fifo - 1
        _push(fs, [w[:first] for w in words])
        _wait_taken(fs)
        words = [w[first:] for w in words]
    _push(fs, words)
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


class CombinedFabricSim:
    """One Verilated fabric of combined NICs loaded with one configuration image set: the
    dense all-reduce of the set's tables (:meth:`dense`) and runs of its sparse program
    (:meth:`sparse`, :meth:`run_fresh`) on the same NICs and links, the links switched
    (SP_MODE, two phases) only when the next run needs the other owner; the program rows
    are pushed once.

    Parameters
    ----------
    images : ImageSet
        The set the NICs run: its dense tables (the MultiTree schedule of a sparse set)
        and, through ``program``, its sparse section.
    program : SparseProgram
        The sparse program the engines run (sizes the engines).
    lanes, topk_units : int
        Top-k lanes W and units per engine.
    stall, seed : int
        Link stall probability (/256) and LFSR seed.
    sizing : SparseProgram or None
        The program the engines are sized for (default ``program``).
    """

    engine = ENGINE

    def __init__(self, images, program: SparseProgram, *, lanes: int = 16,
                 topk_units: int = 2, stall: int = 0, seed: int = 1,
                 sizing: SparseProgram | None = None):
        self.images, self.program = images, program
        self.fs = combined_fabric(program.topology, program, images.elements, images=images,
                                  lanes=lanes, topk_units=topk_units, stall=stall, seed=seed,
                                  sizing=sizing)
        self.nodes, self.elements = self.fs.nodes, images.elements
        self._sparse_mode = False
        self._rows_loaded = False
        self._ran = False              # the engines' buffers hold a run's residual
        self._flits = 0                # SP_FLITS of all engines after the last run

    def _mode(self, sparse: bool) -> None:
        if self._sparse_mode != sparse:
            set_sparse_mode(self.fs, sparse)
            self._sparse_mode = sparse

    def dense(self, buffers: np.ndarray) -> tuple[np.ndarray, int]:
        """The dense all-reduce of ``buffers`` (P x E float32): (result, fabric cycles)."""
        self._mode(False)
        out, cycles = self.fs.run(np.asarray(buffers, np.float32))
        return np.asarray(out), int(cycles)

    def dense_link_bytes(self) -> int:
        """Data bytes (8 a flit) the dense TX units sent since the fabric was built."""
        return 8 * int(sum(port["tx_flits"] for node in self.fs.counters().values()
                           for port in node["ports"].values()))

    def sparse(self, grads: np.ndarray, *, fresh: bool = False) -> dict:
        """One run of the program on ``grads`` (P x N float32): error feedback in the NICs
        (each engine's residual stays in its buffer), or, with ``fresh``, a fresh
        all-reduce of ``grads`` (the buffers cleared to +0 first). :func:`run_sparse`'s
        dict plus ``link_bytes``, the run's sparse link data bytes."""
        self._mode(True)
        r = run_sparse(self.fs, self.program, np.asarray(grads, np.float32),
                       rows=not self._rows_loaded, clear=fresh and self._ran)
        self._rows_loaded = self._ran = True
        flits = sum(r["flits"])
        r["link_bytes"], self._flits = 8 * (flits - self._flits), flits
        return r

    def run_fresh(self, accs: np.ndarray, seed: int = 0):
        """The fabric server's sparse collective: one fresh all-reduce of ``accs`` (the
        driver keeps error feedback on the host). Returns (the
        :class:`~treenic.sparse.base.SparseResult` with the RTL's results and residuals and
        the traffic log and info of a fresh golden model of the program, fabric cycles)."""
        from treenic.sparse.base import SparseResult
        accs = np.ascontiguousarray(accs, np.float32)
        r = self.sparse(accs, fresh=True)
        want = program_golden(self.program, seed).step(accs)   # traffic log; values: RTL's
        info = dict(want.info, engine=ENGINE, cycles=r["cycles"],
                    engine_cycles=max(r["engine_cycles"]), link_bytes=r["link_bytes"],
                    malformed=r["malformed"])
        return SparseResult(self.program.algorithm, r["results"], r["residuals"], want.sent,
                            want.received, info), r["cycles"]


def _same(a, b) -> bool:
    return bool(np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                               np.asarray(b, np.float32).view(np.uint32)))


def combined_report(topology: str, elements: int, density: float, *, iterations: int = 3,
                    seed: int = 0, lanes: int = 16, topk_units: int = 2, stall: int = 0,
                    algorithm: str = "multitree-sparse", residual: str = "local",
                    flow_assignment: str = "contiguous", codec: bool = False,
                    size_density: float | None = None) -> dict:
    """On one Verilated fabric of combined NICs loaded with the configuration image set of
    ``algorithm`` (:func:`~.sparse_sim.imaged_model`: the set's dense MultiTree tables and
    its sparse program, decoded from its bytes): the dense all-reduce of the first
    iteration's gradients (vs the golden executor of the schedule the set's tables hold),
    then ``iterations`` error-feedback iterations of ``algorithm`` (residuals kept in the
    NICs; results and residuals vs the golden model), then the dense all-reduce again.
    ``bit_exact``: every one of these runs bit for bit its golden. ``size_density``: size
    the engines for this (larger) density, so that one Verilated build serves several."""
    from treenic.firmware.image import decode_schedule
    from treenic.schedule.execute import execute
    from .sparse_sim import imaged_model
    kw = dict(seed=seed, flow_assignment=flow_assignment, residual=residual, codec=codec)
    golden, images, prog = imaged_model(algorithm, topology, elements, density, **kw)
    sizing = None if size_density is None else imaged_model(algorithm, topology, elements,
                                                            size_density, **kw)[2]
    sim = CombinedFabricSim(images, prog, lanes=lanes, topk_units=topk_units, stall=stall,
                            seed=seed + 1, sizing=sizing)
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal((sim.nodes, elements)).astype(np.float32)
             for _ in range(iterations)]
    want_dense = execute(decode_schedule(images), grads[0])
    dense, dense_cycles = sim.dense(grads[0])
    dense_bytes = sim.dense_link_bytes()
    runs, exact = [], []
    for g in grads:
        r = sim.sparse(g)
        want = golden.step(g)
        exact.append(_same(r["results"], want.result) and _same(r["residuals"], want.residuals))
        runs.append(r)
    dense2, dense2_cycles = sim.dense(grads[0])
    dense_exact = _same(dense, want_dense) and _same(dense2, want_dense)
    cycles = max(r["cycles"] for r in runs)
    link_bytes = max(r["link_bytes"] for r in runs)
    return {"algorithm": algorithm, "topology": prog.topology, "nodes": sim.nodes,
            "elements": elements, "density": density, "iterations": iterations,
            "flow_assignment": flow_assignment, "residual": residual,
            "messages": "codec (pairs or bitmap + values)" if codec else "pair flits",
            "lanes": lanes, "topk_units": topk_units, "link_stall": stall, "engine": ENGINE,
            "bit_exact": all(exact) and dense_exact,
            "bit_exact_per_iteration": exact,
            "sparse_bit_exact_per_iteration": exact,
            "cycles": cycles, "cycles_per_iteration": [r["cycles"] for r in runs],
            "engine_cycles_per_iteration": [max(r["engine_cycles"]) for r in runs],
            "ideal_cycles": prog.ideal_cycles, "link_flits_full_budget": prog.link_flits,
            "link_bytes": link_bytes,
            "link_bytes_per_iteration": [r["link_bytes"] for r in runs],
            "malformed": sum(r["malformed"] for r in runs), "budgets": sorted(set(prog.kb)),
            "dense_engine": ENGINE, "dense_cycles": dense_cycles,
            "dense_cycles_after_sparse": dense2_cycles, "dense_link_bytes": dense_bytes,
            "dense_bit_exact": dense_exact,
            "link_bytes_over_dense": link_bytes / dense_bytes,
            "cycles_over_dense": cycles / dense_cycles,
            "build_seconds": round(sim.fs.build_seconds, 1)}


#: the largest fabric this entry point builds (the NIC's default ``max_nodes``): a
#: Verilated fabric of combined NICs takes minutes to build at 4 nodes
MAX_FABRIC_NODES = 16


def check_run_args(topology: str, elements: int, density: float, iterations: int, *,
                   algorithm: str = "multitree-sparse", residual: str = "local",
                   flow_assignment: str = "contiguous") -> None:
    """What this fabric can run, checked before anything is compiled or built (the CLI's
    ``allreduce --engine rtl`` and this module's entry point): a ValueError names the bad
    argument in one line."""
    from treenic.cli import CLIError, topology_arg
    from .sparse_sim import RTL_ALGORITHMS
    try:
        topo = topology_arg(topology)
    except CLIError as e:
        raise ValueError(str(e)) from None
    if not topo.is_direct:
        raise ValueError(f"{topology} has switches; the fabric of combined NICs wires "
                         "direct networks only")
    if topo.n > MAX_FABRIC_NODES:
        raise ValueError(f"{topology}: {topo.n} nodes, at most {MAX_FABRIC_NODES} on the "
                         "fabric of combined NICs")
    if algorithm not in RTL_ALGORITHMS:
        raise ValueError(f"--algorithm {algorithm}: the RTL implements only "
                         f"{', '.join(RTL_ALGORITHMS)} (no golden fallback)")
    if not 0 < density <= 1:
        raise ValueError(f"--density must be in (0, 1], got {density}")
    if not 1 <= iterations <= 100:
        raise ValueError(f"--iterations must be in 1..100, got {iterations}")
    if elements < topo.n:
        raise ValueError(f"--elements {elements}: need at least one per flow ({topo.n})")
    if algorithm != "multitree-sparse" and (residual, flow_assignment) != (
            "local", "contiguous"):
        raise ValueError(f"--algorithm {algorithm} has no --residual / --flow-assignment "
                         "(only multitree-sparse has)")
    if algorithm == "topka" and round(density * elements) < 1:
        raise ValueError(f"--density {density} selects k = 0 of {elements} elements")


def _check_args(a) -> None:
    """Bounds before anything is built; a ValueError names the bad argument."""
    from treenic.cli import CLIError, check_elements, check_seed, topology_arg
    try:
        check_elements(a.elements, topology_arg(a.topology).n)
        check_seed(a.seed)
    except CLIError as e:
        raise ValueError(str(e)) from None
    check_run_args(a.topology, a.elements, a.density, a.iterations, algorithm=a.algorithm,
                   residual=a.residual, flow_assignment=a.flow_assignment)
    for name in ("lanes", "topk_units"):
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
    ap.add_argument("--residual", choices=("local", "global"), default="local")
    ap.add_argument("--flow-assignment", choices=("contiguous", "hash"), default="contiguous")
    ap.add_argument("--codec", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        _check_args(a)
    except ValueError as e:
        ap.error(str(e))
    rep = combined_report(a.topology, a.elements, a.density, iterations=a.iterations,
                          seed=a.seed, lanes=a.lanes, topk_units=a.topk_units,
                          stall=a.stall, algorithm=a.algorithm, residual=a.residual,
                          flow_assignment=a.flow_assignment, codec=a.codec)
    print(json.dumps(rep, indent=None if a.json else 2))
    return 0 if rep["bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
