"""``make sim`` entry for the banked gradient buffer (``treenic.hdl.nic.buffer``): random
read requests (arbitration refusals are the buffer's backpressure), random writes and
idle cycles, every grant, read word and conflict pulse compared cycle by cycle with the
golden model ``BankedBufferModel``; the NIC's shape (1 host + RX write-back + TX readers)
and a colliding-writers configuration."""
import pytest

from harness import run_bench, sim_name
from treenic.hdl.nic.buffer import BankedBuffer

SHAPES = {
    # name: (depth, banks, lanes, readers, writers, write_back, conflicts)
    "nic": (128, 16, 2, 9, 5, (1, 2, 3, 4), False),
    "conflicts": (64, 8, 2, 5, 3, (), True),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_buffer_bench(shape):
    depth, banks, lanes, readers, writers, write_back, conflicts = SHAPES[shape]
    cycles = 4000 if sim_name() == "verilator" else 800
    run_bench(BankedBuffer(depth=depth, banks=banks, lanes=lanes, readers=readers,
                           writers=writers, write_back=write_back),
              name=f"buffer_{shape}", test_module="buffer_tb",
              params={"depth": depth, "banks": banks, "lanes": lanes, "readers": readers,
                      "writers": writers, "write_back": list(write_back),
                      "conflicts": conflicts, "cycles": cycles})
