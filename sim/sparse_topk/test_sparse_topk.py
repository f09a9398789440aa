"""``make sim`` entry for the streaming top-k unit (W = 4, chunks of 64 values)."""
from harness import run_bench, sim_name
from treenic.hdl.sparse.topk import TopKUnit


def test_sparse_topk_bench():
    trials = 30 if sim_name() == "verilator" else 8
    run_bench(TopKUnit(lanes=4, max_chunk=1024, search_bits=3), name="sparse_topk",
              test_module="sparse_topk_tb",
              params={"lanes": 4, "chunk": 64, "trials": trials, "search_bits": 3})
