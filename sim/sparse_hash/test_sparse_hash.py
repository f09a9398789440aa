"""``make sim`` entry for the MurmurHash3 hash unit (W = 4 lanes; 16 partitions, and 12 through the modulo)."""
from harness import run_bench, sim_name
from treenic.hdl.sparse.hash import Murmur3HashUnit


def test_sparse_hash_bench():
    n = 2000 if sim_name() == "verilator" else 300
    run_bench(Murmur3HashUnit(lanes=4, partition_bits=4), name="sparse_hash",
              test_module="sparse_hash_tb", params={"lanes": 4, "partition_bits": 4, "n_beats": n})


def test_sparse_hash_any_workers_bench():
    """12 workers: the partition is murmur3 mod 12 through the multiply-high modulo."""
    n = 2000 if sim_name() == "verilator" else 300
    run_bench(Murmur3HashUnit(lanes=4, workers=12), name="sparse_hash_mod12",
              test_module="sparse_hash_tb",
              params={"lanes": 4, "partition_bits": 0, "workers": 12, "n_beats": n})
