"""Bench section ``hash_load``: what the hash placer (:mod:`.sparse_place`) costs on the
sparse engine's load path (``python -m treenic.bench --only hash_load --json``).

One engine (node 0 of the program) on the Amaranth simulator, the host stream always
valid: the cycles from the first host word after the PROG rows (the first GRAD, or the
HASH word of a hash-flow program) until the engine starts the run (``busy`` rises after the
START word that follows the gradients: every gradient is in the buffer), for the same
topology, size and density with contiguous and with hash flows. The run itself (START to
END) does not change: the placer only works during the load.

Default: ring:4, 4096 elements, 1 % (the issue's Check size); ``--quick``: 1000 elements.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SIMULATOR = "Amaranth simulator (amaranth.sim), one SparseEngine, W = 2"


def load_cycles(topology: str, elements: int, density: float, flow_assignment: str,
                seed: int = 0) -> int:
    """Load cycles of node 0 (see the module docstring)."""
    from amaranth.sim import Simulator
    from treenic.hdl.link.flit import FlitFormat
    from .sparse_engine import SparseEngine
    from .sparse_fabric import engine_sizes, load_words, start_word
    from .sparse_sim import imaged_model
    _, _, prog = imaged_model("multitree-sparse", topology, elements, density, seed=seed,
                              flow_assignment=flow_assignment)
    eng = SparseEngine(fmt=FlitFormat(), **engine_sizes(prog, lanes=2))
    grads = np.random.default_rng(seed).standard_normal(elements).astype(np.float32)
    words = load_words(prog, 0, grads) + [start_word()]
    rows = len(prog.rows[0])
    got = {}

    async def host(ctx):
        hi = eng.host_i
        for n, w in enumerate(words):
            if n == rows:
                got["first"] = ctx.get(cycle)
            ctx.set(hi.payload.as_value(), w)
            ctx.set(hi.valid, 1)
            await ctx.tick().until(hi.ready)
        ctx.set(hi.valid, 0)
        await ctx.tick().until(eng.busy == 1)
        got["started"] = ctx.get(cycle)

    from amaranth import Module, Signal
    top = Module()
    top.submodules.engine = eng
    cycle = Signal(32)
    top.d.sync += cycle.eq(cycle + 1)
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(host)
    sim.run()
    return got["started"] - got["first"]


def run(out_dir: Path, quick: bool = False) -> dict:
    topology, elements, density = "ring:4", (1000 if quick else 4096), 0.01
    cycles = {f: load_cycles(topology, elements, density, f) for f in ("contiguous", "hash")}
    res = {"simulator": SIMULATOR, "topology": topology, "elements": elements,
           "density": density, "node": 0,
           "load_cycles": cycles, "hash_extra_cycles": cycles["hash"] - cycles["contiguous"],
           "hash_unit_latency": _hash_latency(topology),
           "what": "cycles from the first host word after the PROG rows to the run's start "
                   "(every gradient in the buffer)"}
    out = Path(out_dir) / "hash_load.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    return res


def _hash_latency(topology: str) -> int:
    """The latency of the hash unit inside the placer for the topology's flow count."""
    from treenic.sparse.multitree_sparse import build_schedule
    from treenic.topology import parse
    from ..sparse.hash import LATENCY, MOD_STAGES
    flows = build_schedule(parse(topology).n, topology).num_chunks
    return LATENCY + (0 if flows & (flows - 1) == 0 else MOD_STAGES)
