"""Amaranth-simulator tests of the hash placer (``treenic.hdl.nic.sparse_place.HashPlacer``)
against its golden (``place_golden``, through the golden model's ``hash_flows``): positions,
values, the inverse map and the dropped words, with random valid gaps and backpressure."""
import gc
import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings, strategies as st

from treenic.hdl.nic.sparse_place import HashPlacer, flow_table, place_golden
from treenic.sparse.multitree_sparse import hash_flows


def run_placer(words, *, elements, flows, seed, table=None, p_valid=1.0, p_ready=1.0,
               rng_seed=0):
    """(outputs [(position, value)], inverse {position: index} of the placed positions,
    errors, cycles) of the RTL placer fed ``words`` [(index, value)]."""
    if table is None:
        _, off = hash_flows(elements, flows, seed)
        table = (off[:-1], np.diff(off))
    dut = HashPlacer(flows=flows, elements=elements)
    rng = random.Random(rng_seed)
    got = {"out": [], "errors": 0, "cycles": 0, "inverse": {}}

    async def bench(ctx):
        for f, (lo, n) in enumerate(zip(*table)):
            ctx.set(dut.flow_en, 1)
            ctx.set(dut.flow.flow, f)
            ctx.set(dut.flow.lo, int(lo))
            ctx.set(dut.flow.n, int(n))
            await ctx.tick()
        ctx.set(dut.flow_en, 0)
        ctx.set(dut.seed, seed)
        k, quiet, cycles = 0, 0, 0
        while quiet < 3:
            offer = k < len(words) and rng.random() < p_valid
            if offer:
                ctx.set(dut.i.payload.index, words[k][0])
                ctx.set(dut.i.payload.value, words[k][1])
            ctx.set(dut.i.valid, offer)
            ready = rng.random() < p_ready
            ctx.set(dut.o.ready, ready)
            _, _, i_ready, o_valid, pos, val, err, busy = await ctx.tick().sample(
                dut.i.ready, dut.o.valid, dut.o.payload.position, dut.o.payload.value,
                dut.error, dut.busy)
            cycles += 1
            k += bool(offer and i_ready)
            if o_valid and ready:
                got["out"].append((pos, val))
            got["errors"] += err
            quiet = quiet + 1 if k == len(words) and not busy and not o_valid else 0
            assert cycles < 100 * len(words) + 200, "placer stalled"
        got["cycles"] = cycles
        for p, _ in got["out"]:
            ctx.set(dut.inv_addr, p)
            await ctx.tick()
            got["inverse"][p] = ctx.get(dut.inv_data)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got["out"], got["inverse"], got["errors"], got["cycles"]


def _sweep(elements, rng):
    return [(i, int(v)) for i, v in enumerate(rng.integers(0, 1 << 32, elements))]


@pytest.mark.parametrize("flows", [4, 6])
def test_full_sweep_is_the_golden_permutation(flows):
    """A full sweep (power-of-two and non-power-of-two flow counts) with stalls: element
    perm[p] lands at position p (the golden model's buffer order), values follow, inv = perm."""
    elements, seed = 200, 77
    words = _sweep(elements, np.random.default_rng(1))
    out, inverse, errors, _ = run_placer(words, elements=elements, flows=flows, seed=seed,
                                         p_valid=0.7, p_ready=0.6)
    perm, _ = hash_flows(elements, flows, seed)
    assert errors == 0 and len(out) == elements
    assert sorted(p for p, _ in out) == list(range(elements))
    by_position = dict(out)
    assert [by_position[p] for p in range(elements)] == [words[i][1] for i in perm]
    assert [inverse[p] for p in range(elements)] == perm.tolist()
    assert (out, inverse, 0) == place_golden(words, elements=elements, flows=flows, seed=seed)


@settings(max_examples=10, deadline=None)
@given(elements=st.integers(1, 120), flows=st.sampled_from([1, 2, 3, 5, 8, 12]),
       seed=st.integers(0, 2**32 - 1), rng_seed=st.integers(0, 10_000),
       p_valid=st.sampled_from([0.4, 1.0]), p_ready=st.sampled_from([0.4, 1.0]),
       mutation=st.sampled_from(["none", "skip", "repeat", "past_end", "second_sweep"]))
def test_random_sweeps_and_bad_words_match_the_golden(elements, flows, seed, rng_seed,
                                                      p_valid, p_ready, mutation):
    """Any flow count, seed and stall pattern; sweeps broken on purpose (an index skipped or
    repeated, an index past the end, a second sweep without restart): the dropped words are
    counted exactly as the golden counts them and nothing is placed elsewhere."""
    rng = np.random.default_rng(rng_seed)
    words = _sweep(elements, rng)
    cut = int(rng.integers(0, elements))
    if mutation == "skip":
        words = words[:cut] + words[cut + 1:]
    elif mutation == "repeat":
        words = words[:cut + 1] + words[cut:]
    elif mutation == "past_end":
        words = words + [(elements, 5)]
    elif mutation == "second_sweep":
        words = words + words[:3]
    want = place_golden(words, elements=elements, flows=flows, seed=seed)
    out, inverse, errors, _ = run_placer(words, elements=elements, flows=flows, seed=seed,
                                         p_valid=p_valid, p_ready=p_ready, rng_seed=rng_seed)
    assert (out, inverse, errors) == want
    assert errors == {"none": 0, "skip": elements - cut - 1, "repeat": 1, "past_end": 1,
                      "second_sweep": min(3, elements)}[mutation]


def test_wrong_seed_is_caught():
    """Mutation check: the table of one seed with the hash of another overflows some flow
    (counted, dropped), and the positions differ from the golden of the table's seed."""
    elements, flows = 256, 4
    words = _sweep(elements, np.random.default_rng(2))
    _, off = hash_flows(elements, flows, 1)
    out, _, errors, _ = run_placer(words, elements=elements, flows=flows, seed=2,
                                   table=(off[:-1], np.diff(off)))
    assert errors > 0
    assert (out, errors) == place_golden(words, elements=elements, flows=flows, seed=2,
                                         table=(off[:-1], np.diff(off)))[::2]
    assert out != place_golden(words, elements=elements, flows=flows, seed=1)[0]


def test_one_word_a_cycle():
    """Throughput: a full sweep of 256 takes the hash latency plus one cycle a word."""
    _, _, _, cycles = run_placer(_sweep(256, np.random.default_rng(3)), elements=256, flows=4,
                                 seed=0)
    assert cycles < 256 + 30


def test_flow_table_from_program_rows():
    """The engine's table is the program's: every flow's SEND / ROOT row carries the
    golden's hash-flow bounds."""
    from treenic.schedule.sparse_table import sparse_model
    _, prog = sparse_model("multitree-sparse", "ring:6", 100, 0.1, flow_assignment="hash",
                           seed=9)
    _, off = hash_flows(100, prog.chunks, 9)
    for rows in prog.rows:
        assert flow_table(rows) == (off[:-1].tolist(), np.diff(off).tolist())
    with pytest.raises(ValueError, match="no SEND/ROOT row names flow"):
        flow_table(prog.rows[0][-1:])


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_bad_parameters():
    with pytest.raises(ValueError, match="flows must be"):
        HashPlacer(flows=0, elements=4)
    with pytest.raises(ValueError, match="elements must be"):
        HashPlacer(flows=2, elements=1 << 24)
    gc.collect()             # the refused objects' unused-elaboratable warnings land here


def test_engine_load_costs_the_hash_latency_only():
    """The load of a hash-flow engine (the bench section ``hash_load`` at a small size):
    the hash pipeline's latency plus the HASH word and the output register over the
    contiguous load, not a scatter-adder drain at every flow switch."""
    from treenic.hdl.nic.sparse_place_bench import load_cycles
    from treenic.hdl.sparse.hash import LATENCY
    plain = load_cycles("ring:4", 256, 0.05, "contiguous")
    hashed = load_cycles("ring:4", 256, 0.05, "hash")
    assert hashed - plain == LATENCY + 2, (plain, hashed)
