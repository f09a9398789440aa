"""Bench section ``sparse_fabric``: MultiTree-Sparse on the Verilated sparse NIC fabric
against the dense MultiTree all-reduce on the Verilated dense NIC fabric, same topology and
buffers (``python -m treenic.bench --only sparse_fabric --json``).

Default: torus:4x4, 64 KiB per node (16384 float32), densities 1 %, 5 %, 10 %, 3
error-feedback iterations each, every iteration bit-exact vs the golden (results and
residuals of every node). ``--quick``: ring:4, 4096 elements, 1 %.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .sparse_sim import dense_report, sparse_allreduce_report

SIMULATOR = "Verilator (treenic.hdl.cosim)"


def run(out_dir: Path, quick: bool = False, topk_units: int = 2) -> dict:
    from ..cosim import cosim_available
    if not cosim_available():
        raise RuntimeError("sparse_fabric needs Verilator (treenic.hdl.cosim); none found")
    topology, elements, densities = (("ring:4", 4096, (0.01,)) if quick else
                                     ("torus:4x4", 16384, (0.01, 0.05, 0.10)))
    out = Path(out_dir) / "sparse_fabric.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"simulator": SIMULATOR, "topology": topology, "elements": elements,
           "bytes_per_node": 4 * elements, "topk_units": topk_units, "runs": []}
    # every sparse density first on one build (sized for the largest), then the dense
    # reference (a second, long build): each finished part is written as it completes
    for d in densities:
        res["runs"].append(sparse_allreduce_report(topology, elements, d, iterations=3,
                                                   dense=False, topk_units=topk_units,
                                                   size_density=max(densities)))
        out.write_text(json.dumps(res, indent=1))
    P = res["runs"][0]["nodes"]
    first = np.random.default_rng(0).standard_normal((P, elements)).astype(np.float32)
    dense = dense_report(topology, first)     # the first iteration's gradients (seed 0)
    for r in res["runs"]:
        r.update(dense)
        r["cycles_over_dense"] = r["cycles"] / r["dense_cycles"]
        r["link_bytes_over_dense"] = r["link_bytes"] / r["dense_link_bytes"]
    res.update(dense, bit_exact=all(r["bit_exact"] for r in res["runs"])
               and dense["dense_bit_exact"])
    out.write_text(json.dumps(res, indent=1))
    return res
