"""``make sim`` entry for the banked gradient buffer (``treenic.hdl.nic.buffer.BankedBuffer``):
random reads (some write-only) from every reader and random writes every cycle, grants,
read data and the conflict flag compared bit for bit, every cycle, with the cycle-level
golden model ``BankedBufferModel``; then a full read-back."""
from dataclasses import asdict, dataclass

import pytest

from harness import run_bench, sim_name
from treenic.hdl.nic.buffer import BankedBuffer


@dataclass(frozen=True)
class Shape:
    depth: int
    banks: int
    lanes: int
    readers: int
    writers: int
    write_back: tuple
    conflicts: bool           # let writers collide (rows/words ORed, conflict flagged)


CASES = {
    # the NIC core's shape at a small depth: host + 4 RX (write back) + 4 TX readers,
    # 4 RX write-backs + host writer, 16 banks, two lanes
    "nic_shape": Shape(256, 16, 2, 9, 5, (1, 2, 3, 4), False),
    "colliding_writers": Shape(64, 8, 2, 4, 3, (1,), True),
    "lanes_eq_banks": Shape(40, 4, 4, 3, 2, (), False),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_buffer_bench(case):
    s = CASES[case]
    cycles = 20_000 if sim_name() == "verilator" else 2_000
    run_bench(BankedBuffer(depth=s.depth, banks=s.banks, lanes=s.lanes, readers=s.readers,
                           writers=s.writers, write_back=s.write_back),
              name=f"buffer_{case}", test_module="buffer_tb",
              params={**asdict(s), "cycles": cycles})
