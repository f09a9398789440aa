"""MultiTree-Sparse on a fabric of sparse engines (Amaranth simulator) vs the golden model
``treenic.sparse.multitree_sparse``: results AND residuals bit for bit on every node over
several error-feedback iterations, with random link stalls."""
import os

import numpy as np
import pytest

from treenic.hdl.nic.sparse_fabric import SparseFabric, run_amaranth
from treenic.schedule.sparse_table import compile_sparse
from treenic.sparse.multitree_sparse import MultiTreeSparse


def _grads(rng, P, N, iterations):
    return [(rng.standard_normal((P, N)) * 2.0 ** rng.integers(-4, 4, (P, N))).astype(np.float32)
            for _ in range(iterations)]


def check_fabric(topology, P, N, density, *, iterations=3, stall=64, lanes=2, seed=0,
                 flow_assignment="contiguous", topk_units=2):
    golden = MultiTreeSparse(P, N, density, seed=seed, topology=topology,
                             flow_assignment=flow_assignment)
    prog = compile_sparse(golden)
    grads = _grads(np.random.default_rng(seed), P, N, iterations)
    runs = run_amaranth(SparseFabric(prog, lanes=lanes, stall=stall, seed=seed + 1,
                                     topk_units=topk_units), grads)
    for it, (g, (res, resid, cycles)) in enumerate(zip(grads, runs)):
        want = golden.step(g)
        assert cycles > 0
        np.testing.assert_array_equal(res.view(np.uint32), want.result.view(np.uint32),
                                      err_msg=f"iteration {it}: results")
        np.testing.assert_array_equal(resid.view(np.uint32), want.residuals.view(np.uint32),
                                      err_msg=f"iteration {it}: residuals")
    return runs


def test_ring4_three_iterations_with_stalls():
    check_fabric("ring:4", 4, 64, 0.25)


@pytest.mark.parametrize("units", [1, 4])
def test_ring4_topk_units(units):
    """One unit, and as many units as flows (every leaf selection at once): the selections
    run ahead of the sequencer in any overlap and the results stay the golden's."""
    check_fabric("ring:4", 4, 64, 0.25, iterations=2, stall=32, topk_units=units, seed=5)


def test_ring3_hash_flows_uneven_sizes():
    """A non-power-of-two node count and element count, Zen's hash flows (uneven flows)."""
    check_fabric("ring:3", 3, 45, 0.2, flow_assignment="hash", seed=3, iterations=2)


LONG = pytest.mark.skipif(os.environ.get("TREENIC_SPARSE_LONG") != "1",
                          reason="long Amaranth fabric run: set TREENIC_SPARSE_LONG=1")


@LONG
def test_ring8_three_iterations_with_stalls():            # ~90 s
    check_fabric("ring:8", 8, 96, 0.1, seed=2)


@LONG
def test_torus4x4_hash_flows_with_stalls():               # several minutes
    check_fabric("torus:4x4", 16, 160, 0.1, flow_assignment="hash", seed=2)
