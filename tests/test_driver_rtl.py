"""The ``rtl`` backend with the real RTL engine: the fabric server runs the Verilated NIC
fabric (treenic.hdl.nic.fabric_sim) and every rank's result must equal the golden executor
bit for bit. A first Verilator build of the fabric takes minutes, so this runs only when
asked for (TREENIC_RTL_TESTS=1) and the fabric builds in this checkout."""
import os
import threading

import numpy as np
import pytest

from treenic import algorithms
from treenic.driver import open_nic, rtl_unavailable_reason
from treenic.driver.server import FabricServer
from treenic.schedule.execute import execute

pytestmark = pytest.mark.slow
E = 64


@pytest.mark.skipif(os.environ.get("TREENIC_RTL_TESTS") != "1",
                    reason="set TREENIC_RTL_TESTS=1 to build and run the Verilated fabric")
def test_rtl_engine_through_server_bit_exact():
    s = algorithms.build("multitree", "ring:4")
    reason = rtl_unavailable_reason(s, elements=E)
    if reason:
        pytest.skip(reason)
    srv = FabricServer(4, "rtl", collective_timeout=600)
    srv.start_thread()
    g = np.random.default_rng(3).standard_normal((4, E)).astype(np.float32)
    out, status = [None] * 4, [None] * 4

    def rank(r):
        with open_nic("rtl", r, 4, algorithm=s, **srv.endpoint, timeout=600) as c:
            t = g[r].copy()
            c.allreduce(t)
            out[r], status[r] = t, c.status()
    try:
        ts = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(900)
    finally:
        srv.stop()
    ref = execute(s, g)
    for r in range(4):
        assert np.array_equal(out[r].view(np.uint32), ref[r].view(np.uint32))
        assert status[r]["counters"]["cycles"] > 0
        assert status[r]["engine"].startswith("Verilated NIC fabric")
