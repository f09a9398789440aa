"""Issue 19, defect 9: one NaN rule in the numeric contract — every NaN an addition produces
is the canonical quiet NaN 0x7FC00000, as the RTL fp32 adder emits it — in the golden
executor and in every backend (model, rtl fabric server with the golden engine, torch, and
the Verilated RTL engine when TREENIC_RTL_TESTS=1). Inputs carry NaNs with payloads and both
signs, +-inf (so inf - inf and inf + inf occur), signed zeros and subnormals."""
import os

import numpy as np
import pytest
import driver_helpers

from treenic import algorithms
from treenic.driver import LocalFabric, open_nic, rtl_unavailable_reason
from treenic.driver.server import FabricServer
from treenic.schedule.execute import CANONICAL_NAN, execute, replay, symbolic

NAN_PAYLOADS = [0x7FA00001, 0xFFC12345, 0x7FC00000, 0xFFFFFFFF]
INF, NINF = 0x7F800000, 0xFF800000


def nonfinite_buffers(world: int, n: int = 64, seed: int = 9) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((world, n)).astype(np.float32)
    bits = g.view(np.uint32)
    bits[0, 0], bits[1, 0] = INF, NINF                      # inf - inf
    bits[0, 1], bits[1, 1] = INF, INF                       # inf + inf
    bits[0, 2] = NINF                                       # -inf + finite
    for k, p in enumerate(NAN_PAYLOADS):                    # NaN payloads, both signs
        bits[k % world, 3 + k] = p
    bits[:, 8] = [INF if r % 2 else NINF for r in range(world)]
    bits[:, 9] = 0x80000000                                 # -0 everywhere
    bits[:, 10] = 0x00000001                                # smallest subnormal
    # random placement of the specials across the rest of the buffer
    idx = rng.integers(11, n, size=(world, 6))
    for r in range(world):
        bits[r, idx[r]] = rng.choice([INF, NINF] + NAN_PAYLOADS, size=6)
    return g


def expected_by_adder_golden(schedule, buffers):
    """Independent reference: every (node, chunk) expression tree folded with the RTL
    adder's golden function (treenic.hdl.fp32.fp32_add_golden)."""
    from treenic.hdl.fp32 import fp32_add_golden
    sym = symbolic(schedule)
    bounds = schedule.chunk_bounds(buffers.shape[1])
    bits = buffers.view(np.uint32)
    out = np.empty_like(bits)
    for v in range(schedule.n):
        for k in range(schedule.num_chunks):
            sl = slice(bounds[k], bounds[k + 1])

            def ev(e):
                return bits[e, sl] if isinstance(e, int) else fp32_add_golden(ev(e[0]), ev(e[1]))
            out[v, sl] = ev(sym.exprs[v][k])
    return out


def assert_contract(result_bits, expected_bits):
    assert np.array_equal(result_bits, expected_bits)
    nan = np.isnan(result_bits.view(np.float32))
    assert nan.any() and np.all(result_bits[nan] == CANONICAL_NAN)


def test_rule_is_the_rtl_adders():
    from treenic.hdl.fp32 import CANONICAL_NAN as RTL_NAN, fp32_add_golden
    assert CANONICAL_NAN == RTL_NAN
    assert fp32_add_golden(INF, NINF) == CANONICAL_NAN


@pytest.mark.parametrize("alg,topo", [("ring", "ring:4"), ("multitree", "torus:2x2"),
                                      ("multitree", "switch:4")])
def test_golden_executor_and_replay_canonicalise(alg, topo):
    s = algorithms.build(alg, topo)
    g = nonfinite_buffers(s.n)
    want = expected_by_adder_golden(s, g)
    assert_contract(execute(s, g).view(np.uint32), want)
    assert_contract(replay(s, g).view(np.uint32), want)


def _threads(fn, world):
    out, errs = driver_helpers.run_threads(fn, world, timeout=60)
    assert errs == [None] * world, errs
    return out


@pytest.mark.parametrize("backend", ["model", "rtl"])
def test_model_and_fabric_server_backends(backend):
    s = algorithms.build("multitree", "ring:4")
    g = nonfinite_buffers(4)
    want = expected_by_adder_golden(s, g)
    srv = None
    if backend == "rtl":
        srv = FabricServer(4, "golden", collective_timeout=20)
        srv.start_thread()
        opts = dict(srv.endpoint, timeout=20)
    else:
        opts = dict(fabric=LocalFabric(s))
    try:
        def rank(r):
            with open_nic(backend, r, 4, algorithm=s, **opts) as c:
                t = g[r].copy()
                c.allreduce(t)
                return t
        out = _threads(rank, 4)
    finally:
        if srv is not None:
            srv.stop()
    for r in range(4):
        assert_contract(out[r].view(np.uint32), want[r])


def _torch_world(rank, world, g):
    import torch
    from treenic.driver import open_nic
    c = open_nic("torch", rank, world, "ring:2", "multitree")
    t = torch.from_numpy(g[rank].copy())
    c.allreduce(t)
    return t.numpy().view(np.uint32).copy()


@pytest.mark.slow
def test_torch_backend():
    pytest.importorskip("torch")
    from treenic.driver.launch import run_world
    s = algorithms.build("multitree", "ring:2")
    g = nonfinite_buffers(2)
    out = run_world(_torch_world, 2, g, timeout=120)
    want = expected_by_adder_golden(s, g)
    for r in range(2):
        assert_contract(out[r], want[r])


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TREENIC_RTL_TESTS") != "1",
                    reason="set TREENIC_RTL_TESTS=1 to build and run the Verilated fabric")
def test_verilated_rtl_engine():
    s = algorithms.build("multitree", "ring:4")
    g = nonfinite_buffers(4)
    reason = rtl_unavailable_reason(s, elements=g.shape[1])
    if reason:
        pytest.skip(reason)
    from treenic.driver.fabric import RTLEngine
    out, _ = RTLEngine(s).run(g)
    assert_contract(np.asarray(out, np.float32).view(np.uint32), expected_by_adder_golden(s, g))
