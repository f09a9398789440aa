"""Multi-process driver tests: 4 spawned processes (gloo, loopback) run the same collectives
through the ``torch``, ``model`` and ``rtl`` (fabric server) backends; every result must be
bit-identical to the golden executor / golden sparse model. One world for everything (each
spawn of 4 torch processes costs seconds)."""
import numpy as np
import pytest

from treenic import algorithms
from treenic.driver.launch import run_world
from treenic.driver.server import ServerProcess
from treenic.schedule.execute import execute

WORLD = 4
CASES = [("ring", "ring:4"), ("multitree", "ring:4"), ("multitree", "torus:2x2"),
         ("multitree", "switch:4")]
SIZES = [1, 5, 4099]                    # fewer elements than chunks; non-divisible; larger


def data(seed, n):
    g = np.random.default_rng(seed).standard_normal((WORLD, n)).astype(np.float32)
    if n >= 3:
        g[:, :3] = np.float32([1e-40, -0.0, 1e38])    # subnormals, signed zero, large
    return g


def butterfly():
    """Hand-built schedule in which every node sends and receives the same chunk in the same
    step (pairwise exchange, then exchange across): the per-step snapshot rule matters, so
    sends must not see receives applied in the same step."""
    from treenic.schedule.ir import Op, Schedule, Transfer
    from treenic.topology import parse
    pairs = [((0, 1), (2, 3)), ((1, 2), (3, 0))]
    ts = [Transfer(step, a, b, Op.REDUCE, (0,), 0) for step, ps in enumerate(pairs, 1)
          for u, v in ps for a, b in ((u, v), (v, u))]
    return Schedule("butterfly", parse("ring:4"), 1, ts, 2, 0)


def _world(rank, world, endpoint):
    import torch
    from treenic.driver import DriverError, FabricError, open_nic
    out = {}
    for name, backend, opts in (("torch", "torch", {}),
                                ("torch-stepwise", "torch", {"executor": "stepwise"}),
                                ("torch-simplex", "torch", {"duplex": False}),
                                ("model", "model", {}), ("rtl", "rtl", endpoint)):
        for alg, topo in CASES:
            comm = open_nic(backend, rank, world, topo, alg, **opts)
            for n in SIZES:
                t = torch.from_numpy(data(n, n)[rank].copy())
                if n == 4099:                                   # a strided view works too
                    t = torch.from_numpy(np.repeat(t.numpy(), 2))[::2]
                    assert not t.is_contiguous()
                comm.allreduce(t)
                out[(name, alg, topo, n)] = t.numpy().copy()
            if alg == "ring":
                # sparse TopkA with error feedback, two iterations
                res = None
                for it in range(2):
                    g = torch.from_numpy(data(100 + it, 3000)[rank].copy())
                    o = comm.sparse_allreduce(g, 0.02, scheme="topka", residual=res)
                    res = o.residual
                    out[(name, "topka", it)] = (g.numpy().copy(), res.numpy().copy(),
                                                o.bytes_sent)
                # ranks disagreeing on the size: every rank gets an error naming them
                try:
                    comm.allreduce(torch.zeros(10 + (rank == 1)))
                    out[(name, "mismatch")] = None
                except FabricError as e:
                    out[(name, "mismatch")] = str(e)
                out[(name, "status")] = comm.status()
                # a bad dtype on rank 2 only: every rank fails, naming rank 2 (issue 19)
                try:
                    comm.allreduce(torch.zeros(10, dtype=torch.float64 if rank == 2
                                               else torch.float32))
                    out[(name, "bad_dtype")] = None
                except DriverError as e:
                    out[(name, "bad_dtype")] = str(e)
                # an integer tensor on rank 3 only: the same, naming rank 3 and int64
                try:
                    comm.allreduce(torch.zeros(10, dtype=torch.int64 if rank == 3
                                               else torch.float32))
                    out[(name, "int_dtype")] = None
                except DriverError as e:
                    out[(name, "int_dtype")] = str(e)
            comm.close()
    for piece in (7, 1 << 18):                      # tiny pieces: overlap is exercised
        for executor in ("pipelined", "stepwise"):
            comm = open_nic("torch", rank, world, algorithm=butterfly(), piece_elements=piece,
                            executor=executor)
            for n in SIZES:
                t = torch.from_numpy(data(n, n)[rank].copy())
                comm.allreduce(t)
                out[("butterfly", piece, executor, n)] = t.numpy().copy()
    for bad in ({"executor": "stepwise", "duplex": True}, {"duplex": "yes"}):
        try:                                        # refused on every rank, before any I/O
            open_nic("torch", rank, world, "ring:4", "ring", **bad)
            out[("duplex-refused", str(bad))] = None
        except DriverError as e:
            out[("duplex-refused", str(bad))] = str(e)
    for alg, topo in CASES:                         # tiny pieces through the real schedules
        comm = open_nic("torch", rank, world, topo, alg, piece_elements=5)
        t = torch.from_numpy(data(4099, 4099)[rank].copy())
        comm.allreduce(t)
        out[("torch-piece5", alg, topo, 4099)] = t.numpy().copy()
    return out


@pytest.fixture(scope="module")
def world_results():
    with ServerProcess(WORLD, "golden", collective_timeout=20) as srv:
        return run_world(_world, WORLD, srv.endpoint, timeout=240)


@pytest.mark.parametrize("backend", ["torch", "torch-stepwise", "torch-simplex", "torch-piece5",
                                     "model", "rtl"])
def test_dense_bit_exact_across_backends(world_results, backend):
    for alg, topo in CASES:
        s = algorithms.build(alg, topo)
        for n in (SIZES if backend != "torch-piece5" else [4099]):
            ref = execute(s, data(n, n))
            for r in range(WORLD):
                got = world_results[r][(backend, alg, topo, n)]
                assert np.array_equal(got.view(np.uint32), ref[r].view(np.uint32)), \
                    (backend, alg, topo, n, r)


def test_same_step_send_and_receive_keeps_snapshot_semantics(world_results):
    s = butterfly()
    for n in SIZES:
        ref = execute(s, data(n, n))
        for piece in (7, 1 << 18):
            for executor in ("pipelined", "stepwise"):
                for r in range(WORLD):
                    got = world_results[r][("butterfly", piece, executor, n)]
                    assert np.array_equal(got.view(np.uint32), ref[r].view(np.uint32))


@pytest.mark.parametrize("backend", ["torch", "model", "rtl"])
def test_topka_matches_golden_model(world_results, backend):
    from treenic.sparse.base import make
    model = make("topka", workers=WORLD, elements=3000, density=0.02, seed=0)
    for it in range(2):
        ref = model.step(data(100 + it, 3000))
        for r in range(WORLD):
            res, resid, sent = world_results[r][(backend, "topka", it)]
            assert np.array_equal(res.view(np.uint32), ref.result[r].view(np.uint32))
            assert np.array_equal(resid.view(np.uint32), ref.residuals[r].view(np.uint32))
            # each rank ships only its own k pairs (8 bytes each) to the 3 others
            assert sent == 8 * 60 * (WORLD - 1)


@pytest.mark.parametrize("backend", ["torch", "model", "rtl"])
def test_size_mismatch_reported_on_every_rank(world_results, backend):
    for r in range(WORLD):
        msg = world_results[r][(backend, "mismatch")]
        assert msg is not None and "rank 1: " in msg and "11" in msg, msg


@pytest.mark.parametrize("backend", ["torch", "model", "rtl"])
def test_bad_dtype_on_one_rank_reported_on_every_rank(world_results, backend):
    for r in range(WORLD):
        msg = world_results[r][(backend, "bad_dtype")]
        assert msg is not None and "rank 2" in msg and "float64" in msg, msg
        msg = world_results[r][(backend, "int_dtype")]
        assert msg is not None and "rank 3" in msg and "int64" in msg, msg


def test_duplex_refusals_name_the_problem(world_results):
    for r in range(WORLD):
        msg = world_results[r][("duplex-refused", str({"executor": "stepwise", "duplex": True}))]
        assert msg is not None and "stepwise" in msg, msg
        msg = world_results[r][("duplex-refused", str({"duplex": "yes"}))]
        assert msg is not None and "duplex must be" in msg, msg


def test_counters(world_results):
    st = world_results[0][("torch", "status")]
    c = st["counters"]
    assert st["backend"] == "torch" and st["transport"] == "gloo"
    assert st["executor"] == "pipelined"
    assert world_results[0][("torch-stepwise", "status")]["executor"] == "stepwise"
    # duplex sockets: on by default (default group, pipelined), off when asked or stepwise
    assert st["duplex"] is True
    assert world_results[0][("torch-simplex", "status")]["duplex"] is False
    assert world_results[0][("torch-stepwise", "status")]["duplex"] is False
    assert c["collectives"] == len(SIZES) and c["sparse_collectives"] == 2
    rt = world_results[0][("rtl", "status")]
    assert rt["nic"]["collectives"] == len(SIZES) + 2
    assert rt["counters"]["host_bytes_sent"] > rt["counters"]["bytes_sent"] / 4
