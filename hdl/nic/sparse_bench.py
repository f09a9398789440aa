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

from .sparse_sim import sparse_allreduce_report

SIMULATOR = "Verilator (treenic.hdl.cosim)"


def run(out_dir: Path, quick: bool = False) -> dict:
    from ..cosim import cosim_available
    if not cosim_available():
        raise RuntimeError("sparse_fabric needs Verilator (treenic.hdl.cosim); none found")
    topology, elements, densities = (("ring:4", 4096, (0.01,)) if quick else
                                     ("torus:4x4", 16384, (0.01, 0.05, 0.10)))
    rows, dense = [], None
    for d in densities:
        r = sparse_allreduce_report(topology, elements, d, iterations=3, dense=dense is None,
                                    size_density=max(densities))
        if dense is None:
            dense = {k: r[k] for k in ("dense_cycles", "dense_link_bytes", "dense_bit_exact",
                                       "dense_engine")}
        r.update(dense)
        r["cycles_over_dense"] = r["cycles"] / r["dense_cycles"]
        r["link_bytes_over_dense"] = r["link_bytes"] / r["dense_link_bytes"]
        rows.append(r)
    res = {"simulator": SIMULATOR, "topology": topology, "elements": elements,
           "bytes_per_node": 4 * elements, "runs": rows,
           "bit_exact": all(r["bit_exact"] for r in rows) and dense["dense_bit_exact"],
           **dense}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sparse_fabric.json").write_text(json.dumps(res, indent=1))
    return res
