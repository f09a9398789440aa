"""``make sim`` entry for the skid buffer (``treenic.hdl.skid.SkidBuffer``): random
valid stalls and ready backpressure; the golden model is the identity on the sequence of
transfers (nothing lost, duplicated or reordered), plus one transfer per cycle when
neither side stalls."""
from harness import run_bench, sim_name
from treenic.hdl.skid import SkidBuffer

WIDTH = 24


def test_skid_bench():
    n = 20_000 if sim_name() == "verilator" else 4_000
    run_bench(SkidBuffer(WIDTH), name="skid", test_module="skid_tb",
              params={"n": n, "width": WIDTH})
