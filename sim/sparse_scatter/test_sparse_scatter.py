"""``make sim`` entry for the scatter-accumulate unit (256-word buffer)."""
import numpy as np

from harness import run_bench, sim_name
from treenic.hdl.sparse.scatter import ScatterAccumulate


def test_sparse_scatter_bench():
    depth = 256
    init = np.random.default_rng(3).standard_normal(depth).astype(np.float32).view(np.uint32)
    messages = 40 if sim_name() == "verilator" else 10
    run_bench(ScatterAccumulate(depth=depth, init=init.tolist()), name="sparse_scatter",
              test_module="sparse_scatter_tb",
              params={"depth": depth, "init": init.tolist(), "init_seed": 11,
                      "messages": messages})
