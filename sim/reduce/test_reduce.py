"""``make sim`` entry for the reduction engine (cocotb bench ``reduce_tb`` on ``$SIM``)."""
from harness import run_bench, sim_name
from treenic.hdl.reduce import ReduceEngine

PORTS, DEPTH, FIFO = 4, 32, 8


def test_reduce_bench():
    n_cmds = 60 if sim_name() == "verilator" else 16
    run_bench(ReduceEngine(ports=PORTS, depth=DEPTH, fifo_depth=FIFO), name="reduce",
              test_module="reduce_tb",
              params={"ports": PORTS, "depth": DEPTH, "n_cmds": n_cmds})
