"""``make sim`` entry for the sparse NIC fabric vs the golden models, 3 (2) error-feedback
iterations with the links stalled 64/256, W = 2: MultiTree-Sparse on ring:4 (64 elements per
node), TopkA on ring:4, and MultiTree-Sparse with hash flows and the global residual on a
non-power-of-two ring:6 (54 elements, uneven flows)."""
import pytest

from harness import run_bench
from treenic.hdl.nic.sparse_fabric import SparseFabric
from treenic.hdl.nic.sparse_sim import imaged_model

PARAMS = {"topology": "ring:4", "workers": 4, "elements": 64, "density": 0.25, "seed": 5,
          "iterations": 3, "flow_assignment": "contiguous"}
CASES = {"multitree_sparse": PARAMS,
         "topka": dict(PARAMS, algorithm="topka", density=0.1),
         "ring6_hash_global": dict(PARAMS, topology="ring:6", workers=6, elements=54,
                                   density=0.15, iterations=2, flow_assignment="hash",
                                   residual="global")}


def _program(p):
    return imaged_model(p.get("algorithm", "multitree-sparse"), p["topology"], p["elements"],
                        p["density"], seed=p["seed"], flow_assignment=p["flow_assignment"],
                        residual=p.get("residual", "local"))[2]


@pytest.mark.parametrize("case", CASES)
def test_sparse_fabric_bench(case):
    p = CASES[case]
    run_bench(SparseFabric(_program(p), lanes=2, stall=64, seed=7),
              name="sparse_fabric" + ("" if case == "multitree_sparse" else f"_{case}"),
              test_module="sparse_fabric_tb", params=p)
