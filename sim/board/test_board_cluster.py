"""System bench: an all-reduce over 4 simulated boards (``treenic boardsim``: 4 Verilated
BoardCores, NIC links pin to pin through the serial link PHY) driven by the unchanged
``udp`` backend over loopback UDP, bit-exact against the golden executor -- on both board
simulators: ``pins`` (RGMII PHY in C++) and ``cocotb`` (cocotbext-eth RGMII models, the
reference).  The first run builds each simulation (long: see docs/boards.md)."""
import json
import threading

import numpy as np
import pytest

pytest.importorskip("liteeth")
pytest.importorskip("cocotbext.eth")

from treenic.boards.boardsim import SIM_NIC, BoardSim          # noqa: E402
from treenic.driver import open_nic                             # noqa: E402
from treenic.driver.core import schedule_for                    # noqa: E402
from treenic.schedule.execute import execute                    # noqa: E402


def allreduce_on_boards(addresses, topology="ring:4", elements=300, seed=7):
    world = len(addresses)
    data = np.random.default_rng(seed).standard_normal((world, elements)).astype(np.float32)
    want = execute(schedule_for("multitree", topology, world), data.copy())
    got = data.copy()
    barrier = threading.Barrier(world)
    errors, status = [], {}

    def rank(r):
        try:
            with open_nic("udp", r, world, topology, boards=addresses, local_port=0,
                          nic_params=SIM_NIC, barrier=barrier.wait, timeout=30.0,
                          retries=3, run_timeout=1800.0) as comm:
                comm.allreduce(got[r])
                status[r] = comm.status()
        except Exception as e:                  # noqa: BLE001 - reported below
            errors.append(f"rank {r}: {type(e).__name__}: {e}")
            barrier.abort()
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got, np.asarray(want, np.float32), errors, status


@pytest.mark.slow
@pytest.mark.parametrize("simulator", ["pins", "cocotb"])
def test_allreduce_over_four_simulated_boards_is_bit_exact(simulator):
    with BoardSim("ring:4", idle_s=300, sim=simulator) as sim:
        got, want, errors, status = allreduce_on_boards(sim.addresses)
    assert not errors, errors
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    print(json.dumps({"engine": sim.describe(),
                      "cycles": [s["last_run"].get("cycles") for s in status.values()]}))
