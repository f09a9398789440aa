"""The Colorlight board's NIC build (32-bit flits, 2 ports, 1 Ki elements) runs its
ring:4 schedules bit-exact with the golden executor on the Verilated fabric."""
import os

import numpy as np
import pytest

from treenic.algorithms import build as build_schedule
from treenic.boards.colorlight import COLORLIGHT_NIC
from treenic.firmware.image import compile_images
from treenic.hdl.cosim import cosim_available
from treenic.hdl.nic import NicParams
from treenic.schedule.execute import execute


@pytest.mark.slow
@pytest.mark.skipif(not (os.environ.get("TREENIC_BOARD_BUILD_TESTS") and cosim_available()),
                    reason="builds a Verilated fabric (minutes): TREENIC_BOARD_BUILD_TESTS=1")
@pytest.mark.parametrize("algorithm", ["multitree", "ring"])
def test_colorlight_nic_ring4(algorithm):
    from treenic.hdl.nic.fabric_sim import FabricSim
    sched = build_schedule(algorithm, "ring:4")
    fs = FabricSim("ring:4", sched, 1000, params=NicParams(**COLORLIGHT_NIC),
                   images=compile_images(None, sched, 1000))
    bufs = np.random.default_rng(7).standard_normal((4, 1000)).astype(np.float32)
    res, _ = fs.run(bufs)
    assert np.array_equal(res.view(np.uint32), execute(sched, bufs).view(np.uint32))
