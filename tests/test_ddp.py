"""DDP communication hook: dense/sparse phases, per-bucket error feedback, bucket rebuilds,
pickling. Ranks are threads over an in-process fabric (or the fabric server) and buckets are
stand-ins with DDP's GradBucket interface (buffer/index/is_last); the hook inside a real DDP
training loop is covered by tests/test_train.py."""
import pickle
import threading

import numpy as np
import pytest
import torch

from treenic import algorithms
from treenic.ddp import TreenicHookState, treenic_hook
from treenic.driver import LocalFabric, open_nic
from treenic.driver.server import FabricServer
from treenic.schedule.execute import execute
from treenic.sparse.base import make

WORLD = 4
SIZES = {0: 500, 1: 300}            # two buckets


class Bucket:
    def __init__(self, index, tensor, last):
        self._i, self._t, self._last = index, tensor, last

    def buffer(self):
        return self._t

    def index(self):
        return self._i

    def is_last(self):
        return self._last


def grads(it, index, n):
    rng = np.random.default_rng(1000 * it + index)
    return rng.standard_normal((WORLD, n)).astype(np.float32)


def run_iterations(states, iters, sizes=SIZES, start=0):
    """Every rank (thread) calls the hook on every bucket for ``iters`` iterations."""
    out = [[None] * WORLD for _ in range(iters)]
    errs = []

    def rank(r):
        try:
            for it in range(start, start + iters):
                res = {}
                for i, n in sizes.items():
                    t = torch.from_numpy(grads(it, i, n)[r].copy())
                    fut = treenic_hook(states[r], Bucket(i, t, i == max(sizes)))
                    res[i] = fut.value().numpy().copy()
                out[it - start][r] = res
        except BaseException as e:
            errs.append(e)
    ts = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(WORLD)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
        assert not t.is_alive()
    assert not errs, errs
    return out


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.fixture
def fabric():
    return LocalFabric(algorithms.build("multitree", "ring:4"), timeout=10)


def make_states(fabric, **kw):
    return [TreenicHookState(open_nic("model", r, WORLD, algorithm=fabric.schedule,
                                      fabric=fabric), **kw) for r in range(WORLD)]


def test_dense_hook_is_schedule_sum_over_world(fabric):
    states = make_states(fabric)
    out = run_iterations(states, 2)
    for it in range(2):
        for i, n in SIZES.items():
            ref = execute(fabric.schedule, grads(it, i, n)) / np.float32(WORLD)
            for r in range(WORLD):
                assert np.array_equal(bits(out[it][r][i]), bits(ref[r]))
    assert states[0].iter == 2 and states[0].dense_calls == 4 and states[0].sparse_calls == 0


def sparse_reference(iters, warmup, density, sizes=SIZES):
    """Per bucket: dense during warm-up, then the golden TopkA model with its residuals."""
    models = {i: make("topka", workers=WORLD, elements=n, density=density)
              for i, n in sizes.items()}
    sched = algorithms.build("multitree", "ring:4")
    ref = []
    for it in range(iters):
        row = {}
        for i, n in sizes.items():
            g = grads(it, i, n)
            if it < warmup:
                row[i] = execute(sched, g) / np.float32(WORLD)
            else:
                row[i] = models[i].step(g).result / np.float32(WORLD)
        ref.append(row)
    return ref


def test_sparse_hook_warmup_then_error_feedback_per_bucket(fabric):
    states = make_states(fabric, scheme="topka", density=0.02, warmup_iters=2)
    out = run_iterations(states, 5)
    ref = sparse_reference(5, 2, 0.02)
    for it in range(5):
        for i in SIZES:
            for r in range(WORLD):
                assert np.array_equal(bits(out[it][r][i]), bits(ref[it][i][r])), (it, i, r)
    st = states[1]
    assert st.dense_calls == 4 and st.sparse_calls == 6
    assert set(st.error_dict) == {0, 1} and st.error_dict[0].shape == (500,)
    assert 0 < st.sparse_bytes < st.dense_bytes


def test_state_survives_pickling_and_bucket_rebuild(fabric):
    states = make_states(fabric, scheme="topka", density=0.02, warmup_iters=1)
    run_iterations(states, 3)
    blobs = [pickle.dumps(s) for s in states]
    restored = [pickle.loads(b) for b in blobs]
    assert restored[2].comm is None and restored[2].iter == 3
    with pytest.raises(RuntimeError, match="no communicator"):
        restored[0].communicator()
    for r, s in enumerate(restored):
        s.attach(open_nic("model", r, WORLD, algorithm=fabric.schedule, fabric=fabric))
    out = run_iterations(restored, 2, start=3)
    ref = sparse_reference(5, 1, 0.02)                # uninterrupted run
    for k, it in enumerate((3, 4)):
        for i in SIZES:
            for r in range(WORLD):
                assert np.array_equal(bits(out[k][r][i]), bits(ref[it][i][r]))
    # DDP rebuilds buckets: bucket 0 changes size -> its residual restarts from zero
    rebuilt = {0: 420, 1: 300}
    out = run_iterations(restored, 1, sizes=rebuilt, start=5)
    assert restored[0].resets == 1 and restored[0].error_dict[0].shape == (420,)
    fresh = make("topka", workers=WORLD, elements=420, density=0.02)
    ref0 = fresh.step(grads(5, 0, 420)).result / np.float32(WORLD)
    for r in range(WORLD):
        assert np.array_equal(bits(out[0][r][0]), bits(ref0[r]))


def test_state_reopens_communicator_from_config():
    srv = FabricServer(WORLD, "golden", collective_timeout=10)
    srv.start_thread()
    try:
        states = [TreenicHookState(comm_config=dict(
            backend="rtl", rank=r, world=WORLD, topology="ring:4", algorithm="ring",
            **srv.endpoint, timeout=10)) for r in range(WORLD)]
        states = [pickle.loads(pickle.dumps(s)) for s in states]
        out = run_iterations(states, 1)
        sched = algorithms.build("ring", "ring:4")
        ref = execute(sched, grads(0, 1, 300)) / np.float32(WORLD)
        assert np.array_equal(bits(out[0][3][1]), bits(ref[3]))
        assert states[0].comm.status()["nic"]["collectives"] == 2
        for s in states:
            s.comm.close()
    finally:
        srv.stop()


def test_bad_state_parameters():
    with pytest.raises(ValueError, match="density"):
        TreenicHookState(scheme="topka", density=0.0)
    with pytest.raises(ValueError, match="warmup"):
        TreenicHookState(warmup_iters=-1)
