"""Bench section ``sparse_fabric``: MultiTree-Sparse against the dense MultiTree all-reduce
of the same buffers on one Verilated fabric of combined NICs (the sparse engine inside each
NIC, :mod:`.sparse_nic_sim`): same NICs, same links (``python -m treenic.bench --only
sparse_fabric --json``).

Default: torus:4x4, 64 KiB per node (16384 float32), densities 1 %, 5 %, 10 %, 3
error-feedback iterations each, every iteration bit-exact vs the golden (results and
residuals of every node). ``--quick``: ring:4, 4096 elements, 1 %.

The section first writes ``model`` (seconds): the same cases through the validated sparse
engine model (:mod:`treenic.netsim.sparse`, within 5 % of every recorded sparse fabric run)
for 1, 2 and 4 top-k units, against the recorded Verilated dense run of the same topology
and size (:mod:`treenic.netsim.rtl_runs`), each row labelled with what produced it; then the
Verilated runs (one 16-node build for the three densities).
"""
from __future__ import annotations

import json
from pathlib import Path

from .sparse_nic_sim import ENGINE

SIMULATOR = "Verilator (treenic.hdl.cosim)"
MODEL = "treenic.netsim.sparse.predict (validated sparse engine model, not the RTL)"
#: recorded Verilated dense runs (treenic.netsim.rtl_runs) the model rows compare with
DENSE_RECORDS = {("torus:4x4", 16384): "torus4x4_64KiB_bound"}


def model_rows(topology: str, elements: int, densities, units=(1, 2, 4)) -> list[dict]:
    """MultiTree-Sparse cycles from the sparse engine model for each density and number of
    top-k units, link bytes from the compiled program (head + pairs + tail per message at
    full budgets, 8 bytes a flit), against the recorded Verilated dense run (cycles) and the
    dense schedule's payload bytes."""
    from treenic.algorithms import build
    from treenic.netsim import rtl_runs, sparse
    from treenic.schedule.sparse_table import SparseOp, compile_sparse, unpack_row
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    from treenic.topology import parse
    P = parse(topology).n
    name = DENSE_RECORDS.get((topology, elements))
    dense = rtl_runs.load().get(name) if name else None
    sched = build("multitree", topology)
    dense_bytes = sum(sched.bytes_of(t, elements) for t in sched.transfers)
    rows = []
    for d in densities:
        prog = compile_sparse(MultiTreeSparse(P, elements, d, seed=0, topology=topology))
        msgs = sum(unpack_row(w)["op"] in (SparseOp.SEND, SparseOp.GSEND)
                   for r in prog.rows for w in r)
        link_bytes = 8 * (prog.link_pairs + 2 * msgs)
        for t in units:
            c = sparse.predict(prog, sparse.SPARSE_RTL.with_(topk_units=t))
            row = {"density": d, "topk_units": t, "cycles": c, "source": MODEL,
                   "link_bytes": link_bytes, "dense_payload_bytes": dense_bytes,
                   "link_bytes_over_dense": link_bytes / dense_bytes}
            if dense:
                row.update(dense_cycles=dense["cycles"], cycles_over_dense=c / dense["cycles"],
                           dense_source=f"Verilated dense NIC fabric, recorded run {name} "
                                        f"(rtl_cycles.json, commit {dense.get('commit')})")
            rows.append(row)
    return rows


def run(out_dir: Path, quick: bool = False, topk_units: int = 2) -> dict:
    """Per density, :func:`~.sparse_nic_sim.combined_report` on one Verilated fabric of
    combined NICs sized for the largest density (one build): the dense all-reduce of the
    first iteration's gradients, 3 error-feedback iterations, the dense all-reduce again,
    every run against its golden. Each finished density is written as it completes."""
    from ..cosim import cosim_available
    from .sparse_nic_sim import combined_report
    if not cosim_available():
        raise RuntimeError("sparse_fabric needs Verilator (treenic.hdl.cosim); none found")
    topology, elements, densities = (("ring:4", 4096, (0.01,)) if quick else
                                     ("torus:4x4", 16384, (0.01, 0.05, 0.10)))
    out = Path(out_dir) / "sparse_fabric.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"simulator": SIMULATOR, "engine": ENGINE, "topology": topology,
           "elements": elements, "bytes_per_node": 4 * elements, "topk_units": topk_units,
           "model": model_rows(topology, elements, densities), "runs": []}
    out.write_text(json.dumps(res, indent=1))
    for d in densities:
        res["runs"].append(combined_report(topology, elements, d, iterations=3,
                                           topk_units=topk_units,
                                           size_density=max(densities)))
        out.write_text(json.dumps(res, indent=1))
    first = res["runs"][0]
    res.update({k: first[k] for k in ("dense_engine", "dense_cycles", "dense_link_bytes")},
               bit_exact=all(r["bit_exact"] for r in res["runs"]))
    out.write_text(json.dumps(res, indent=1))
    return res
