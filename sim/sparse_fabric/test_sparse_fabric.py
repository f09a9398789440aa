"""``make sim`` entry for the sparse NIC fabric: MultiTree-Sparse on ring:4 (64 elements
per node, W = 2, links stalled 64/256) for 3 error-feedback iterations vs the golden."""
from harness import run_bench
from treenic.hdl.nic.sparse_fabric import SparseFabric
from treenic.schedule.sparse_table import compile_sparse
from treenic.sparse.multitree_sparse import MultiTreeSparse

PARAMS = {"topology": "ring:4", "workers": 4, "elements": 64, "density": 0.25, "seed": 5,
          "iterations": 3, "flow_assignment": "contiguous"}


def _program(p):
    golden = MultiTreeSparse(p["workers"], p["elements"], p["density"], seed=p["seed"],
                             topology=p["topology"], flow_assignment=p["flow_assignment"])
    return compile_sparse(golden)


def test_sparse_fabric_bench():
    run_bench(SparseFabric(_program(PARAMS), lanes=2, stall=64, seed=7), name="sparse_fabric",
              test_module="sparse_fabric_tb", params=PARAMS)
