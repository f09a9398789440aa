"""``make sim`` entry for the RedSync grid-threshold source (float64 grid thresholds)."""
from harness import run_bench, sim_name
from treenic.hdl.sparse.threshold import GridThresholdSource


def test_sparse_threshold_bench():
    trials = 60 if sim_name() == "verilator" else 15
    run_bench(GridThresholdSource(), name="sparse_threshold", test_module="sparse_threshold_tb",
              params={"trials": trials})
