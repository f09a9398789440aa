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
       "allreduce ring:4 --algorithm multitree --engine rtl --elements 256",
       "allreduce ring:4 --algorithm topka --engine rtl --elements 256",
       "allreduce switch:4 --algorithm multitree-sparse --density 0.1 --engine rtl "
       "--elements 256",
       "allreduce torus:5x5 --algorithm multitree-sparse --density 0.1 --engine rtl "
       "--elements 256"]


@pytest.mark.parametrize("line", BAD)
def test_bad_sparse_allreduce(line):
    rc, out, err = run_cli(line)
    assert rc == 2 and out == "", (rc, err)
    assert len(err.strip().splitlines()) == 1 and "error:" in err


def test_program_the_combined_nic_cannot_hold_is_one_line(monkeypatch):
    """A program whose rows do not fit the NIC's head flits (an offset beyond 20 bits) is
    refused in one line naming the fabric and the field, before anything is built."""
    import treenic.hdl.cosim as cosim
    import treenic.hdl.nic.sparse_nic_sim as sn

    def no_build(*a, **kw):
        raise AssertionError("a fabric was built")
    monkeypatch.setattr(cosim, "cosim_available", lambda: True)
    monkeypatch.setattr(sn, "FabricSim", no_build)
    rc, out, err = run_cli("allreduce ring:2 --algorithm multitree-sparse --density 0.0001 "
                           "--engine rtl --elements 2097152 --iterations 1")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "fabric of combined NICs cannot run this program" in err
    assert "lo=1048576 does not fit the head's 20 bits" in err


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
    from treenic.hdl.nic.sparse_nic_sim import ENGINE
    assert rc == 0 and r["bit_exact"] is True and r["engine"] == r["dense_engine"] == ENGINE
    assert r["bit_exact_per_iteration"] == [True] * 3 and r["malformed"] == 0
    assert r["dense_bit_exact"] is True and r["link_bytes"] < r["dense_link_bytes"]
    assert r["ideal_cycles"] <= r["cycles"] < r["dense_cycles"]
    assert r["dense_cycles_after_sparse"] == r["dense_cycles"]


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
    from treenic.driver import fabric as F
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
        assert got.info["engine"] == F.RTL_SPARSE_DESCRIPTION
    # hash flows (Zen's h0, seed 3): element order on the host, the engines place it
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


@pytest.mark.slow
@needs_verilator
def test_server_runs_the_loaded_sparse_program():
    """Issue 17, what the driver loads is what the NIC runs: four ranks over the fabric
    server's rtl engine load the MultiTree-Sparse image set (compile_images, density 0.01)
    and run two error-feedback steps on the Verilated fabric of combined NICs loaded from
    that set -- bit-exact vs a fresh golden model of each step's accumulators -- and then a
    dense all-reduce on the same fabric (the set's dense part is the MultiTree schedule's
    dense set: no reload), bit-exact vs the executor; status() names the set's config id
    and the fabric. Then a START at another density against the same loaded set is
    refused (CONFIG_MISMATCH) and nothing runs or is built."""
    import socket
    import zlib

    import numpy as np

    import driver_helpers
    from treenic import algorithms
    from treenic.driver import fabric as F
    from treenic.driver import open_nic
    from treenic.driver import protocol as P
    from treenic.driver.server import FabricServer
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    world, n, mt = 4, 4096, "multitree-sparse"
    srv = FabricServer(world, "rtl", collective_timeout=900.0, idle_timeout=900.0)
    srv.start_thread()
    sched = algorithms.build("multitree", "ring:4")
    rng = np.random.default_rng(11)
    grads = [rng.standard_normal((world, n)).astype(np.float32) for _ in range(2)]
    dense = rng.standard_normal((world, n)).astype(np.float32)

    def rank(r):
        with open_nic("rtl", r, world, algorithm=sched, **srv.endpoint, timeout=900) as c:
            res, steps = np.zeros(n, np.float32), []
            for g in grads:
                acc = g[r] + res                       # what the driver sends
                t = g[r].copy()
                out = c.sparse_allreduce(t, 0.01, scheme=mt, residual=res)
                res = out.residual
                steps.append((acc, t, res))
            t = dense[r].copy()
            c.allreduce(t)
            return steps, c.status(), t
    try:
        out, errs = driver_helpers.run_threads(rank, world, timeout=1800)
        assert errs == [None] * world, errs
        cid = zlib.crc32(F.sparse_image_set("ring:4", mt, n, 0.01, 0, {
            "residual": "local", "flow_assignment": "contiguous"}).to_bytes())
        for i in range(2):
            accs = np.stack([out[r][0][i][0] for r in range(world)])
            want = MultiTreeSparse(world, n, 0.01, seed=0, topology="ring:4").step(accs)
            for r in range(world):
                _, result, residual = out[r][0][i]
                assert np.array_equal(result.view(np.uint32), want.result[r].view(np.uint32))
                assert np.array_equal(residual.view(np.uint32),
                                      want.residuals[r].view(np.uint32))
        from treenic.schedule.execute import execute
        want_dense = execute(sched, dense)
        for r in range(world):
            st = out[r][1]
            assert np.array_equal(out[r][2].view(np.uint32), want_dense[r].view(np.uint32))
            assert st["dense_collectives_by_set"] == {"dense set": 0, "sparse set": 1}
            assert st["sparse_engine"] == st["dense_engine"] == F.RTL_SPARSE_DESCRIPTION
            assert st["sparse_image"] == f"{cid:#010x}"
            assert st["sparse_images"][0]["collectives"] == 2 and st["counters"]["cycles"] > 0
        engine = srv.configs[cid][2]
        sims = list(engine._sims.values())
        assert engine.combined and len(sims) == 1 and sims[0].program is engine.sparse_program
        assert srv.rendezvous.completed == 3 and len(srv.configs) == 1
        # the same set loaded, a START at another density: refused, nothing runs
        with socket.create_connection(srv.address, timeout=10) as s:
            hello = P.HELLO.pack(P.PROTOCOL_VERSION, 0, world, 0, bytes.fromhex(srv.secret))
            assert driver_helpers.req(s, P.Msg.HELLO, hello)[0] == P.Msg.HELLO_ACK
            reply = driver_helpers.load(s, srv.configs[cid][0])
            assert reply[0] == P.Msg.CONFIG_ACK
            wr = P.BUFFER.pack(1, P.DTYPE_FLOAT32, P.BUF_GRADIENT, 0, n) + bytes(4 * n)
            assert driver_helpers.req(s, P.Msg.WRITE_BUFFER, wr)[0] == P.Msg.WRITE_ACK
            name = mt.encode()
            text = driver_helpers.expect_error(driver_helpers.req(s, P.Msg.START, P.START.pack(
                1, P.MODE_SPARSE, 0, len(name), 0.02, 0) + name), P.ErrorCode.CONFIG_MISMATCH)
        assert "they differ in density" in text and f"{cid:#010x}" in text
        assert srv.rendezvous.completed == 3 and len(engine._sims) == 1
    finally:
        srv.stop()
