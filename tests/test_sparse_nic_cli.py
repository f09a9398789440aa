"""``treenic allreduce ... --density D --engine rtl``: bad input is one line and exit 2
(before any Verilator build); the real run (slow, Verilated) is bit-exact vs the golden."""
import json
import os
import shutil

import pytest

from test_cli_bad_input import run_cli

BAD = ["allreduce ring:4 --algorithm gtopk --density 0.01 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm topka --density 0.1 --engine rtl --elements 256 "
       "--residual global",
       "allreduce ring:4 --algorithm topka --density 0.001 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 0.01 --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 0 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 1.5 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 0.1 --engine rtl --elements 2",
       "allreduce ring:4 --algorithm multitree-sparse --density 0.1 --engine rtl "
       "--elements 256 --iterations 0",
       "allreduce ring:4 --algorithm multitree --engine rtl --elements 256"]


@pytest.mark.parametrize("line", BAD)
def test_bad_sparse_allreduce(line):
    rc, out, err = run_cli(line)
    assert rc == 2 and out == "", (rc, err)
    assert len(err.strip().splitlines()) == 1 and "error:" in err


# the Check size: one Verilated build shared by the tests below (cached)
CHECK = "allreduce ring:4 --algorithm multitree-sparse --density 0.01 --engine rtl " \
        "--elements 4096 --iterations 3 --json"
TOPKA = CHECK.replace("multitree-sparse", "topka")
needs_verilator = pytest.mark.skipif(
    shutil.which("verilator") is None or os.environ.get("TREENIC_RTL_TESTS") != "1",
    reason="Verilated fabric: needs verilator and TREENIC_RTL_TESTS=1 (make test sets it)")


@pytest.mark.slow
@needs_verilator
def test_sparse_allreduce_rtl_check():
    rc, out, err = run_cli(CHECK)
    r = json.loads(out)
    assert rc == 0 and r["bit_exact"] is True and r["engine"].startswith("Verilated sparse")
    assert r["bit_exact_per_iteration"] == [True] * 3 and r["malformed"] == 0
    assert r["dense_bit_exact"] is True and r["link_bytes"] < r["dense_link_bytes"]
    assert r["ideal_cycles"] <= r["cycles"]


@pytest.mark.slow
@needs_verilator
def test_topka_allreduce_rtl():
    rc, out, err = run_cli(TOPKA)
    r = json.loads(out)
    assert rc == 0 and r["bit_exact"] is True and r["algorithm"] == "topka"
    assert r["malformed"] == 0 and r["dense_bit_exact"] is True


@pytest.mark.slow
@needs_verilator
def test_rtl_engine_run_sparse_is_the_golden():
    """The fabric server's rtl engine: fresh all-reduce per call (the NIC residual cleared
    between calls), equal to a fresh golden model on the same topology bit for bit."""
    import numpy as np
    from treenic import algorithms
    from treenic.driver.errors import FabricError
    from treenic.driver.fabric import RTLEngine
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    eng = RTLEngine(algorithms.build("multitree", "ring:4"))
    rng = np.random.default_rng(1)
    for _ in range(2):
        accs = rng.standard_normal((4, 4096)).astype(np.float32)
        got = eng.run_sparse("multitree-sparse", accs, 0.01, 0)
        want = MultiTreeSparse(4, 4096, 0.01, seed=0, topology="ring:4").step(accs)
        assert np.array_equal(got.result.view(np.uint32), want.result.view(np.uint32))
        assert np.array_equal(got.residuals.view(np.uint32), want.residuals.view(np.uint32))
        assert got.info["engine"].startswith("Verilated sparse")
    # hash flows (Zen's h0, seed 3): the host lays the buffer out in flow order
    accs = rng.standard_normal((4, 4096)).astype(np.float32)
    got = eng.run_sparse("multitree-sparse", accs, 0.01, 3, {"flow_assignment": "hash"})
    want = MultiTreeSparse(4, 4096, 0.01, seed=3, topology="ring:4",
                           flow_assignment="hash").step(accs)
    assert np.array_equal(got.result.view(np.uint32), want.result.view(np.uint32))
    assert np.array_equal(got.residuals.view(np.uint32), want.residuals.view(np.uint32))
    # TopkA and the global residual run on the RTL too (fresh golden each call)
    from treenic.sparse.topk_family import TopkA
    for _ in range(2):
        accs = rng.standard_normal((4, 4096)).astype(np.float32)
        got = eng.run_sparse("topka", accs, 0.01, 0)
        want = TopkA(4, 4096, 0.01, seed=0).step(accs)
        assert np.array_equal(got.result.view(np.uint32), want.result.view(np.uint32))
        assert np.array_equal(got.residuals.view(np.uint32), want.residuals.view(np.uint32))
    got = eng.run_sparse("multitree-sparse", accs, 0.01, 0, {"residual": "global"})
    want = MultiTreeSparse(4, 4096, 0.01, seed=0, topology="ring:4",
                           residual="global").step(accs)
    assert np.array_equal(got.result.view(np.uint32), want.result.view(np.uint32))
    assert np.array_equal(got.residuals.view(np.uint32), want.residuals.view(np.uint32))
    with pytest.raises(FabricError, match="does not run sparse scheme 'gtopk'"):
        eng.run_sparse("gtopk", accs, 0.01, 0)
