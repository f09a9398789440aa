"""MultiTree-Sparse (both residuals) and TopkA on a fabric of sparse engines (Amaranth
simulator) vs the golden models ``treenic.sparse.multitree_sparse`` and
``treenic.sparse.topk_family.TopkA``: results AND residuals bit for bit on every node over
several error-feedback iterations, with random link stalls."""
import os

import numpy as np
import pytest

from treenic.firmware.image import sparse_images
from treenic.hdl.nic.sparse_fabric import SparseFabric, run_amaranth
from treenic.hdl.nic.sparse_sim import program_from_image_bytes
from treenic.schedule.sparse_table import compile_sparse, compile_topka
from treenic.sparse.multitree_sparse import MultiTreeSparse
from treenic.sparse.topk_family import TopkA


def _grads(rng, P, N, iterations):
    return [(rng.standard_normal((P, N)) * 2.0 ** rng.integers(-4, 4, (P, N))).astype(np.float32)
            for _ in range(iterations)]


def check_fabric(topology, P, N, density, *, iterations=3, stall=64, lanes=2, seed=0,
                 flow_assignment="contiguous", residual="local", algorithm="multitree-sparse",
                 codec=False, topk_units=2):
    if algorithm == "topka":
        golden = TopkA(P, N, density, seed=seed)
        prog = compile_topka(golden, topology, codec=codec)
    else:
        golden = MultiTreeSparse(P, N, density, seed=seed, topology=topology,
                                 flow_assignment=flow_assignment, residual=residual)
        prog = compile_sparse(golden, codec=codec)
    # the engines load what the configuration image carries (built, serialized, decoded)
    imaged = program_from_image_bytes(sparse_images(prog).to_bytes())
    assert imaged == prog
    prog = imaged
    grads = _grads(np.random.default_rng(seed), P, N, iterations)
    runs = run_amaranth(SparseFabric(prog, lanes=lanes, stall=stall, seed=seed + 1,
                                     topk_units=topk_units), grads)
    for it, (g, (res, resid, cycles, flits, malformed)) in enumerate(zip(grads, runs)):
        want = golden.step(g)
        assert cycles > 0 and malformed == 0
        assert flits == prog.link_flits      # every message at its full budget here
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


def test_ring4_global_residual_with_stalls():
    """SparDL's global residual: the accumulator except at final indices (differs from the
    local residual on these gradients, so the test tells them apart)."""
    runs = check_fabric("ring:4", 4, 64, 0.25, residual="global", iterations=2, seed=4)
    local = MultiTreeSparse(4, 64, 0.25, seed=4, topology="ring:4").step(
        _grads(np.random.default_rng(4), 4, 64, 1)[0])
    assert not np.array_equal(runs[0][1], local.residuals)


def test_topka_ring4_with_stalls():
    """TopkA: every node's top-k all-gathered on the gather trees, summed in rank order."""
    check_fabric("ring:4", 4, 64, 0.1, algorithm="topka", seed=5)


def test_ring6_hash_flows_global_and_topka_with_stalls():
    """A non-power-of-two fabric (ring:6, 6 flows of uneven hash sizes), heavy stalls:
    MultiTree-Sparse with hash flows and the global residual, then TopkA on the same ring."""
    check_fabric("ring:6", 6, 54, 0.15, flow_assignment="hash", residual="global", seed=6,
                 iterations=2, stall=128)
    check_fabric("ring:6", 6, 54, 0.05, algorithm="topka", seed=7, iterations=2, stall=128)


def test_codec_messages_bitmap_and_pairs():
    """Codec messages (``treenic.sparse.codec``'s format and decision rule in the encoder):
    bitmap + values where smaller (ring:4 flows of 16 at 25 %: 4 pairs, one bitmap word;
    TopkA: k = 6 of 64, two bitmap words), pairs where not (flows of 16 at 10 %: one pair).
    Every link flit is counted against the golden codec's message sizes."""
    from treenic.schedule.sparse_table import message_flits
    assert message_flits(4, 16, True) < message_flits(4, 16, False)
    assert message_flits(1, 16, True) == 4     # head, header word + one pair (2 flits), tail
    check_fabric("ring:4", 4, 64, 0.25, residual="global", iterations=2, seed=8, codec=True)
    check_fabric("ring:4", 4, 64, 0.1, algorithm="topka", iterations=2, seed=9, codec=True)
    check_fabric("ring:4", 4, 64, 0.1, iterations=2, seed=10, codec=True)


LONG = pytest.mark.skipif(os.environ.get("TREENIC_SPARSE_LONG") != "1",
                          reason="long Amaranth fabric run: set TREENIC_SPARSE_LONG=1")


@LONG
def test_ring8_three_iterations_with_stalls():            # ~90 s
    check_fabric("ring:8", 8, 96, 0.1, seed=2)


@LONG
def test_torus4x4_hash_flows_with_stalls():               # several minutes
    check_fabric("torus:4x4", 16, 160, 0.1, flow_assignment="hash", seed=2)


def test_timing_model_prices_topka_and_global_rows():
    """The network model (``treenic.netsim.sparse.predict``) follows the new rows: within
    5 % of the Amaranth fabric (W = 16) for TopkA (steady state: the second run, whose ZERO
    rows clear full slots) and the global residual; codec rows are refused, not guessed."""
    from treenic.hdl.nic.sparse_sim import sparse_model
    from treenic.netsim.sparse import predict
    rng = np.random.default_rng(11)
    grads = [rng.standard_normal((4, 256)).astype(np.float32) for _ in range(2)]
    for alg, residual, d in (("topka", "local", 0.1), ("multitree-sparse", "global", 0.25)):
        _, prog = sparse_model(alg, "ring:4", 256, d, residual=residual)
        cycles = run_amaranth(SparseFabric(prog, lanes=16, seed=1), grads)[1][2]
        assert abs(predict(prog) - cycles) <= 0.05 * cycles, (alg, predict(prog), cycles)
    _, prog = sparse_model("multitree-sparse", "ring:4", 256, 0.25, codec=True)
    with pytest.raises(ValueError, match="codec-message rows"):
        predict(prog)


def _hash_fabric_runs(program, grads, **kw):
    """run_amaranth on a fabric built and loaded from ``program`` with the host's copy of
    the golden's permutation removed: the host sends and receives element order only."""
    import dataclasses
    host_program = dataclasses.replace(program, perm=None)
    return run_amaranth(SparseFabric(host_program, lanes=2, seed=1, **kw), grads)


def test_ring2_hash_flows_placed_by_the_engine():
    """Zen's hash flows with the hash unit in the engine (issue 17): ring:2, 1000 elements,
    two error-feedback iterations with link stalls, results and residuals bit-exact vs the
    golden model, and the host never touches ``perm``. Mutation check: the same run with a
    wrong seed in the HASH word is caught: the placer drops the words of flows that
    overflow, so the dump's element labels are no permutation and the host refuses it."""
    import dataclasses
    from treenic.hdl.nic.sparse_sim import imaged_model
    P, N = 2, 1000
    golden, _, prog = imaged_model("multitree-sparse", "ring:2", N, 0.02,
                                   flow_assignment="hash", seed=12)
    assert prog.hash_seed == 12 and prog.perm is not None
    grads = _grads(np.random.default_rng(12), P, N, 2)
    runs = _hash_fabric_runs(prog, grads, stall=64)
    for it, (g, (res, resid, cycles, flits, bad)) in enumerate(zip(grads, runs)):
        want = golden.step(g)
        assert bad == 0 and flits == prog.link_flits
        np.testing.assert_array_equal(res.view(np.uint32), want.result.view(np.uint32),
                                      err_msg=f"iteration {it}: results")
        np.testing.assert_array_equal(resid.view(np.uint32), want.residuals.view(np.uint32),
                                      err_msg=f"iteration {it}: residuals")
    with pytest.raises(ValueError, match="not a permutation of the elements"):
        _hash_fabric_runs(dataclasses.replace(prog, hash_seed=13), grads[:1])
