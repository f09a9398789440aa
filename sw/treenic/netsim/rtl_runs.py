"""The RTL fabric runs the network model is validated against, and how to re-measure them.

Each :data:`RUNS` entry is one Verilated fabric configuration (topology, algorithm, elements
per node, flow-control mode, NIC parameters, link register stages). The measured cycle counts
live in ``rtl_cycles.json`` next to this file, written by::

    python -m treenic.netsim.rtl_runs --measure [--only NAME,...]

which builds each fabric with :class:`treenic.hdl.nic.fabric_sim.FabricSim` (Verilator),
runs one all-reduce of random float32 data (link stalls as the run names them), checks the
result bit for bit against the golden executor and records the fabric's ``cycles`` (START to
the last NIC's DONE), node 0's per-step cycle log and ``lfsr_steps_at_start`` (how far the
links' stall LFSRs ran before START, which fixes every link's stall cycles: the model
replays them, :mod:`.stalls`). MultiTree-Sparse runs (``algorithm="multitree-sparse"``)
run on the Verilated sparse fabric (:class:`treenic.hdl.nic.sparse_sim.SparseFabricSim`):
each sample is checked bit for bit (results and residuals) against the golden
``MultiTreeSparse.step`` and records every engine's cycles. Tests read the recorded file;
they never build RTL.
``TREENIC_COSIM_OPT=-O0`` compiles the 16-NIC fabric several times faster on a loaded
machine (the runs are a few thousand cycles).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DATA_FILE = Path(__file__).with_name("rtl_cycles.json")
COMMAND = "python -m treenic.netsim.rtl_runs --measure"


@dataclass(frozen=True)
class RtlRun:
    """One fabric configuration (NIC parameters as :func:`FabricSim`/``sim/fabric`` use)."""
    name: str
    topology: str
    algorithm: str
    elements: int
    mode: str = "message"
    latency: int = 1
    credits: int = 16
    sub_words: int = 16
    packet_words: int = 64
    #: link stall probability (1/256) and LFSR seed, as the sim/fabric benches use them
    stall: int = 0
    seed: int = 1
    #: 64 KiB runs take ~20 min to build on two shared cores
    slow: bool = False
    #: all-reduces run back to back on the one build (stalled runs: each starts at a
    #: later point of the links' LFSRs, so each is another sample of the stall process)
    samples: int = 1
    #: MultiTree construction (``multitree.build``'s ``variant``): the records were measured
    #: with Algorithm 1 as printed ("paper"), before "bound" became the default
    variant: str | None = None
    #: MultiTree-Sparse runs (``algorithm="multitree-sparse"``): top-k density, lanes W and
    #: top-k units of the sparse engine (:class:`treenic.hdl.nic.sparse_sim.SparseFabricSim`)
    density: float | None = None
    lanes: int = 16
    topk_units: int = 2
    #: the NIC's forwarding at step boundaries (``NicParams.forward``): "store" or
    #: "cut-through"; the model runs with the same (``NicTiming.forward``)
    forward: str = "store"
    #: the gradient buffer's reader priority order (``NicParams.arbiter``): "fixed",
    #: "rotating" or "age"; the model has no bank arbitration, so the other orders are
    #: not validation rows (:func:`treenic.netsim.bench.validation`)
    arbiter: str = "fixed"

    @property
    def sparse(self) -> bool:
        return self.algorithm == "multitree-sparse"

    def schedule(self):
        """The Schedule this run executes (the one compiler, with the run's variant)."""
        from treenic.algorithms import build
        return build(self.algorithm, self.topology,
                     **({"variant": self.variant} if self.variant else {}))


RUNS = [
    RtlRun("ring8_1000", "ring:8", "ring", 1000, latency=2, credits=8),
    RtlRun("mesh2x2_1000", "mesh:2x2", "multitree", 1000, latency=3, credits=8, variant="paper"),
    RtlRun("torus4x4_1000", "torus:4x4", "multitree", 1000, latency=1, credits=8, variant="paper"),
    RtlRun("mesh2x2_packet_1000", "mesh:2x2", "multitree", 1000, mode="packet", latency=2,
           credits=8, packet_words=16, variant="paper"),
    RtlRun("torus4x4_64KiB", "torus:4x4", "multitree", 16384, slow=True, variant="paper"),
    RtlRun("torus4x4_64KiB_bound", "torus:4x4", "multitree", 16384, slow=True),
    # cut-through forwarding (issue 20 item 2), the same fabrics as their store twins
    RtlRun("ring8_1000_cut", "ring:8", "ring", 1000, latency=2, credits=8,
           forward="cut-through"),
    RtlRun("torus4x4_1000_cut", "torus:4x4", "multitree", 1000, latency=1, credits=8,
           variant="paper", forward="cut-through"),
    RtlRun("torus4x4_64KiB_bound_cut", "torus:4x4", "multitree", 16384, slow=True,
           forward="cut-through"),
    # ... with the rotating and the age-based bank arbiter (issue 20 item 2)
    RtlRun("ring8_1000_cut_rotating", "ring:8", "ring", 1000, latency=2, credits=8,
           forward="cut-through", arbiter="rotating"),
    RtlRun("ring8_1000_cut_age", "ring:8", "ring", 1000, latency=2, credits=8,
           forward="cut-through", arbiter="age"),
    RtlRun("torus4x4_1000_cut_rotating", "torus:4x4", "multitree", 1000, latency=1,
           credits=8, variant="paper", forward="cut-through", arbiter="rotating"),
    RtlRun("torus4x4_1000_cut_age", "torus:4x4", "multitree", 1000, latency=1, credits=8,
           variant="paper", forward="cut-through", arbiter="age"),
    RtlRun("torus4x4_64KiB_bound_cut_rotating", "torus:4x4", "multitree", 16384, slow=True,
           forward="cut-through", arbiter="rotating"),
    # the sim/fabric benches (make sim SIM=verilator), random link stalls
    RtlRun("bench_ring8_stall40", "ring:8", "ring", 1000, latency=2, credits=8,
           packet_words=16, stall=40, seed=7, slow=True, samples=4),
    RtlRun("bench_mesh2x2_stall60", "mesh:2x2", "multitree", 2000, latency=3, credits=8,
           packet_words=16, stall=60, seed=7, slow=True, samples=4, variant="paper"),
    RtlRun("bench_torus4x4_stall30", "torus:4x4", "multitree", 1000, latency=1, credits=8,
           packet_words=16, stall=30, seed=7, slow=True, samples=4, variant="paper"),
    RtlRun("bench_mesh2x2_packet_stall40", "mesh:2x2", "multitree", 2000, mode="packet",
           latency=2, credits=8, packet_words=16, stall=40, seed=7, slow=True, samples=4, variant="paper"),
    # MultiTree-Sparse on the Verilated sparse fabric (contiguous flows, local residual)
    # (held out: the sparse model's constants come from one engine, :mod:`.sparse`)
    RtlRun("sparse_ring2_1000_d10", "ring:2", "multitree-sparse", 1000, density=0.10,
           samples=2),
    RtlRun("sparse_mesh2x2_1000_d5", "mesh:2x2", "multitree-sparse", 1000, density=0.05,
           samples=2),
    RtlRun("sparse_ring4_4096_d1", "ring:4", "multitree-sparse", 4096, density=0.01,
           samples=2),
    RtlRun("sparse_ring8_1000_d5", "ring:8", "multitree-sparse", 1000, density=0.05,
           samples=2),
]
BY_NAME = {r.name: r for r in RUNS}


def nic_params(run: RtlRun, schedule):
    """The NicParams the fabric is built with (FabricSim's sizing rule, run's link knobs)."""
    from treenic.firmware.image import compile_images
    from treenic.hdl.nic.host import params_for_images
    return params_for_images(compile_images(None, schedule, run.elements), mode=run.mode,
                             sub_words=run.sub_words, credits=run.credits,
                             packet_words=run.packet_words, forward=run.forward,
                             arbiter=run.arbiter)


def measure(run: RtlRun) -> dict:
    """Build and run ``run`` on the Verilated fabric; returns the record stored in the file."""
    import numpy as np

    from treenic.hdl.nic.fabric_sim import FabricSim
    from treenic.schedule.execute import execute

    if run.sparse:
        return measure_sparse(run)
    sched = run.schedule()
    params = nic_params(run, sched)
    t0 = time.time()
    fs = FabricSim(run.topology, sched, run.elements, mode=run.mode, latency=run.latency,
                   stall=run.stall, seed=run.seed, params=params)
    build_s = time.time() - t0
    bufs = np.random.default_rng(1).standard_normal((sched.n, run.elements)).astype(np.float32)
    res, cycles = fs.run(bufs)
    gold = execute(fs.schedule, bufs)
    if not np.array_equal(res.view(np.uint32), gold.view(np.uint32)):
        raise RuntimeError(f"{run.name}: RTL result differs from the golden executor")
    cnt = fs.counters()
    steps = fs.last_timing["lfsr_steps_at_start"]
    more = []
    for _ in range(run.samples - 1):
        res, c = fs.run(bufs)
        if not np.array_equal(res.view(np.uint32), gold.view(np.uint32)):
            raise RuntimeError(f"{run.name}: RTL result differs from the golden executor")
        more.append({"cycles": int(c), "lfsr_steps_at_start":
                     fs.last_timing["lfsr_steps_at_start"]})
    return {"cycles": int(cycles), "bit_exact": True, "lfsr_steps_at_start": steps,
            "step_cycles_node0": [int(c) for c in cnt[0]["step_cycles"]],
            **({"more_samples": more} if more else {}),
            "verilator_build_s": round(build_s, 1), "commit": _commit()}


def measure_sparse(run: RtlRun) -> dict:
    """Build and run a MultiTree-Sparse ``run`` on the Verilated sparse fabric; every sample
    is checked bit for bit (results and residuals) against the golden model's step."""
    import numpy as np

    from treenic.hdl.nic.sparse_sim import SparseFabricSim

    t0 = time.time()
    fs = SparseFabricSim(run.topology, run.elements, run.density, lanes=run.lanes,
                         topk_units=run.topk_units, latency=run.latency, stall=run.stall)
    build_s = time.time() - t0
    rng = np.random.default_rng(1)
    samples = []
    for _ in range(run.samples):
        r = fs.run_checked(rng.standard_normal((fs.P, run.elements)).astype(np.float32))
        if not r.bit_exact or r.malformed:
            raise RuntimeError(f"{run.name}: RTL differs from the golden MultiTree-Sparse step")
        samples.append({"cycles": r.cycles, "link_bytes": r.link_bytes,
                        "node_cycles": [int(fs.sim[f"cycles__{u}"]) for u in range(fs.P)]})
    first = samples[0]
    return {"cycles": first["cycles"], "bit_exact": True, "node_cycles": first["node_cycles"],
            "topk_units": run.topk_units,
            "link_bytes": first["link_bytes"],
            **({"more_samples": samples[1:]} if samples[1:] else {}),
            "verilator_build_s": round(build_s, 1), "commit": _commit()}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load() -> dict:
    """name -> recorded measurement (empty when nothing was recorded)."""
    if not DATA_FILE.exists():
        return {}
    return json.loads(DATA_FILE.read_text())["runs"]


def save(records: dict) -> None:
    DATA_FILE.write_text(json.dumps({
        "what": "Verilated NIC fabric cycles (START to last DONE); link stalls and seed as "
                "each run names them (rtl_runs.RUNS); lfsr_steps_at_start: cycles the links' "
                "stall LFSRs ran before START",
        "command": COMMAND, "runs": records}, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="build and run on Verilator")
    ap.add_argument("--only", help=f"comma list of runs ({', '.join(BY_NAME)})")
    ap.add_argument("--skip-slow", action="store_true", help="leave out the 64 KiB runs")
    a = ap.parse_args(argv)
    names = a.only.split(",") if a.only else [r.name for r in RUNS
                                              if not (a.skip_slow and r.slow)]
    bad = [n for n in names if n not in BY_NAME]
    if bad:
        ap.error(f"unknown run(s) {bad}; known: {list(BY_NAME)}")
    if not a.measure:
        print(json.dumps({n: load().get(n) for n in names}, indent=1))
        return 0
    for n in names:
        rec = measure(BY_NAME[n])
        records = load()                    # re-read: keep what other runs recorded
        records[n] = rec
        save(records)
        print(n, json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
