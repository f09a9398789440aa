"""``make sim`` entry for the skid buffer (``treenic.hdl.skid.SkidBuffer``): random
transfers with random stalls and backpressure, compared with its golden function (the
identity on the sequence of transfers), plus full throughput and a registered ``i.ready``."""
from harness import run_bench, sim_name
from treenic.hdl.skid import SkidBuffer

WIDTH = 24


def test_skid_bench():
    n = 20_000 if sim_name() == "verilator" else 3_000
    run_bench(SkidBuffer(WIDTH), name="skid", test_module="skid_tb",
              params={"n_random": n, "width": WIDTH})
