"""Network timing model (treenic.netsim): flit counts, structure, bad input, RTL validation."""
import numpy as np
import pytest

from treenic.algorithms import build
from treenic.hdl.nic.model import message_flits as golden_flits
from treenic.hdl.nic.params import NicParams
from treenic.netsim.sim import NetsimError, simulate
from treenic.netsim.timing import RTL, NicTiming, message_flits


@pytest.mark.parametrize("mode,pw", [("message", 64), ("packet", 16), ("packet", 64)])
def test_flit_counts_equal_golden_packetiser(mode, pw):
    rng = np.random.default_rng(3)
    params = NicParams(mode=mode, packet_words=pw, depth=4096)
    timing = RTL.with_(mode=mode, packet_words=pw)
    for words in [1, 2, 3, 15, 16, 17, pw - 1, pw, pw + 1, *rng.integers(1, 4000, 40)]:
        assert message_flits(int(words), timing) == golden_flits(int(words), params), words


def test_contention_free_multitree_runs_at_link_rate():
    """64 KiB on torus:4x4: every step of MultiTree moves one chunk per link, so the model's
    time is the per-step flits plus per-step latencies -- above the ideal, within 15 %."""
    from treenic.firmware.image import compile_images
    from treenic.hdl.nic.host import params_for_images
    from treenic.hdl.nic.model import ideal_cycles
    s = build("multitree", "torus:4x4")
    r = simulate(s, 16384, RTL.with_(link_latency_cycles=1))
    images = compile_images(None, s, 16384)
    ideal = ideal_cycles(images, params_for_images(images))
    assert ideal < r.cycles < 1.15 * ideal
    assert len(r.step_cycles_node0) == s.steps


def test_contention_slows_shared_links():
    """DBTree on a torus routes over multi-hop paths that share links: its time under the
    model exceeds the same schedule with every link's load alone (more bytes per link)."""
    s = build("dbtree", "torus:4x4")
    r = simulate(s, 1 << 16)
    ring = simulate(build("ring", "torus:4x4"), 1 << 16)
    assert r.cycles > ring.cycles


def test_packet_mode_costs_head_flits():
    s = build("multitree", "mesh:2x2")
    m = simulate(s, 8192, RTL.with_(mode="message"))
    p = simulate(s, 8192, RTL.with_(mode="packet", packet_words=16))
    assert p.head_flits > m.head_flits and p.cycles > m.cycles


def test_cut_through_is_faster_than_store_and_forward():
    s = build("multitree", "torus:4x4")
    a = simulate(s, 1 << 16, RTL.with_(forward="store"))
    b = simulate(s, 1 << 16, RTL.with_(forward="cut-through"))
    assert b.cycles < a.cycles


def test_switch_network_runs():
    for spec in ("fattree:16", "bigraph:4x8"):
        r = simulate(build("multitree", spec), 4096)
        assert r.cycles > 0 and r.messages > 0


def test_bad_input():
    s = build("ring", "ring:4")
    with pytest.raises(NetsimError, match="elements"):
        simulate(s, 0)
    with pytest.raises(NetsimError, match="Schedule"):
        simulate("ring:4", 10)
    with pytest.raises(ValueError, match="mode"):
        NicTiming(mode="wormhole")


def test_all_node_entries_equals_node_entries():
    from treenic.schedule.table import all_node_entries, node_entries
    for alg, spec in [("multitree", "torus:4x4"), ("ring", "ring:5"), ("multitree", "fattree:8"),
                      ("dbtree", "mesh:3x3")]:
        s = build(alg, spec)
        assert all_node_entries(s, 1000) == [node_entries(s, u, 1000) for u in range(s.n)]


def test_work_list_equals_time_ordered_events(monkeypatch):
    """Without shared links the model runs nodes from a work list; the time-ordered heap
    (used when links are shared) must give the same times."""
    from treenic.netsim import sim as S
    s = build("multitree", "torus:4x4")
    a = simulate(s, 3000)
    orig = S._Sim.__init__

    def forced(self, *args):
        orig(self, *args)
        self.shared = True
    monkeypatch.setattr(S._Sim, "__init__", forced)
    b = simulate(s, 3000, engine="event")
    assert a.cycles == b.cycles and a.node_done == b.node_done


@pytest.mark.parametrize("alg,spec,elements", [
    ("multitree", "torus:4x4", 1000), ("ring", "ring:8", 999), ("ring2d", "torus:4x4", 5000),
    ("multitree", "mesh:3x5", 777), ("multitree", "torus:8x8", 100),
    ("multitree", "mesh:2x2", 3)])            # fewer elements than chunks: empty messages
@pytest.mark.parametrize("forward", ["store", "cut-through"])
def test_sweep_equals_event_loop(alg, spec, elements, forward):
    """The vectorised sweep is the event loop's model, cycle for cycle, node for node."""
    s = build(alg, spec)
    for timing in (RTL.with_(link_latency_cycles=2, credits=8, forward=forward),
                   RTL.with_(forward=forward)):
        a = simulate(s, elements, timing, engine="event")
        b = simulate(s, elements, timing, engine="sweep")
        assert b.engine == "sweep" and a.engine == "event"
        assert (a.cycles, a.node_done, a.step_cycles_node0, a.flits, a.head_flits) == \
            (b.cycles, b.node_done, b.step_cycles_node0, b.flits, b.head_flits)


def test_sweep_tables_equal_node_entries():
    """The sweep's entry arrays are the NIC tables of treenic.schedule.table, entry for
    entry (op, flow, step, size, order, what each waits for and sends)."""
    from treenic.netsim.fast import NOP, RETIRE, SEND, entry_arrays
    from treenic.schedule.ir import Op
    from treenic.schedule.table import node_entries
    for alg, spec, E in [("multitree", "torus:4x4", 1000), ("ring", "ring:6", 50),
                         ("multitree", "mesh:2x3", 5)]:
        s = build(alg, spec)
        ea = entry_arrays(s, E)
        st, sr, ds, op, ch = ea.rows
        for u in range(s.n):
            idx = [i for i in range(len(ea.node)) if ea.node[i] == u]
            tab = node_entries(s, u, E)
            assert [(int(ea.op[i]), int(ea.flow[i]) if ea.op[i] else 0, int(ea.step[i]))
                    for i in idx] == [(int(e.op), e.flow, e.step) for e in tab]
            for i, e in zip(idx, tab):
                sends = sorted(int(ds[r]) for r in ea.send_row[ea.send_entry == i])
                deps = sorted(int(sr[r]) for r in ea.dep_row[ea.dep_entry == i])
                if e.op == Op.NOP:
                    assert ea.kind[i] == NOP
                elif e.size == 0 or (e.op == Op.REDUCE and e.parent is None) or \
                        (e.op == Op.GATHER and not e.children):
                    assert ea.kind[i] == RETIRE
                else:
                    assert ea.kind[i] == SEND
                    assert sends == sorted([e.parent] if e.op == Op.REDUCE else e.children)
                    want = sorted(e.children) if e.op == Op.REDUCE else (
                        [e.parent] if e.parent is not None else
                        sorted(k for f in tab if f.op == Op.REDUCE and f.flow == e.flow
                               for k in f.children))
                    assert deps == want


def test_sweep_refused_where_links_are_shared():
    with pytest.raises(NetsimError, match="shared links"):
        simulate(build("dbtree", "torus:4x4"), 100, engine="sweep")


def test_model_within_5_percent_of_recorded_rtl_cycles():
    """The recorded Verilated fabric runs (treenic/netsim/rtl_cycles.json, reproduced by
    `python -m treenic.netsim.rtl_runs --measure`) against the model: every run up to 2000
    elements per node, each sample of a stalled run (its links' LFSR stall cycles replayed)
    a row of its own -- all within 5 %."""
    from treenic.netsim import rtl_runs
    from treenic.netsim.bench import validation
    recorded = rtl_runs.load()
    small = {r.name for r in rtl_runs.RUNS if r.elements <= 2000}
    rows = [v for v in validation(recorded) if v["run"].split("@")[0] in small]
    assert len(rows) >= 8, "RTL measurements missing"
    assert any(v["stall_model"] == "LFSR replay" for v in rows)
    for v in rows:
        assert abs(v["error"]) <= 0.05, v


def test_other_bank_arbiters_held_out_of_validation():
    """Runs with the rotating or age-based bank arbiter are recorded but are not
    validation rows (the model prices no bank arbitration); the store/cut-through table
    shows their cycles beside the fixed-order run's."""
    from treenic.netsim import ideal_report, rtl_runs
    from treenic.netsim.bench import held_out, validation
    recorded = rtl_runs.load()
    other = {r.name for r in rtl_runs.RUNS if r.arbiter != "fixed" and r.name in recorded}
    assert "torus4x4_1000_cut_rotating" in other
    assert set(held_out(recorded)) == other
    assert not other & {v["run"].split("@")[0] for v in validation(recorded)}
    row = next(r for r in ideal_report.rtl_rows(recorded) if r["run"] == "torus4x4_1000")
    assert row["cut_through_rotating_cycles"] == recorded["torus4x4_1000_cut_rotating"]["cycles"]


def _replay(stall, steps=0, spec="torus:4x4", elements=400):
    from treenic.netsim.stalls import fabric_stalls
    s = build("multitree", spec)
    timing = RTL.with_(link_latency_cycles=1, credits=8)
    st = fabric_stalls(s.topology, ports=s.topology.max_ports(), seed=7, stall=stall,
                       lfsr_steps_at_start=steps, latency=1, credits=8,
                       credit_return=timing.credit_return)
    return simulate(s, elements, timing, stalls=st), simulate(s, elements, timing,
                                                              engine="event")


def test_stall_replay_without_stalls_is_the_message_model():
    """Flit by flit through the credit loop with no stalled cycle, a link that keeps up
    with its round trip (8 credits, 1-cycle links) gives the message-level times."""
    replay, plain = _replay(0)
    assert replay.cycles == plain.cycles
    assert replay.step_cycles_node0 == plain.step_cycles_node0


def test_stall_replay_costs_the_stalled_cycles():
    """More stalled cycles cost more; a different LFSR start is a different sample; a
    replayed schedule and a mean rate together are refused."""
    light, plain = _replay(30)
    heavy, _ = _replay(120)
    other, _ = _replay(30, steps=12345)
    assert plain.cycles < light.cycles < heavy.cycles
    assert other.cycles != light.cycles
    from treenic.netsim.stalls import fabric_stalls
    s = build("ring", "ring:4")
    st = fabric_stalls(s.topology, ports=2, seed=1, stall=8, lfsr_steps_at_start=0,
                       latency=1, credits=8, credit_return=6)
    with pytest.raises(NetsimError, match="not both"):
        simulate(s, 100, RTL.with_(stall=8), stalls=st)
    with pytest.raises(NetsimError, match="sweep"):
        simulate(s, 100, RTL, stalls=st, engine="sweep")


def test_dnn_layer_shapes_give_published_parameter_counts():
    from treenic.netsim.paper import DNN_MODELS
    assert sum(DNN_MODELS["AlexNet"]()) == 61_100_840        # torchvision alexnet
    assert sum(DNN_MODELS["VGG-16"]()) == 138_357_544        # Simonyan & Zisserman, config D


def test_sparse_messages_priced_on_links():
    """A recorded sparse all-reduce is priced on the topology: more bytes, more time."""
    from treenic.netsim.messages import record, simulate_messages
    from treenic.netsim.paper import PAPER_TIMING
    from treenic.sparse.base import make
    from treenic.topology import parse
    rng = np.random.default_rng(0)
    g = rng.standard_normal((4, 1 << 16)).astype(np.float32)     # bandwidth-bound size
    out = {}
    for alg in ("topka", "spardl"):
        m = make(alg, workers=4, elements=1 << 16, density=0.05, seed=1)
        with record() as steps:
            res = m.step(g)
        assert sum(b for s in steps for *_, b in s) == int(res.sent.sum())
        out[alg] = simulate_messages(parse("mesh:2x2"), steps, PAPER_TIMING)
        assert out[alg]["seconds"] > 0
    assert (out["topka"]["bytes"] > out["spardl"]["bytes"]) == \
        (out["topka"]["seconds"] > out["spardl"]["seconds"])
    with pytest.raises(NetsimError, match="outside"):
        simulate_messages(parse("mesh:2x2"), [[(0, 9, 10)]], PAPER_TIMING)


def test_topk_cycle_contract_from_the_units_constants():
    """The model's top-k cycles are the unit's documented EXACT total (5 C/W + 4*135 + 8
    at two bins a scan row, measured 868 for C = 256, W = 4 in tests/hdl/test_sparse_topk)."""
    from treenic.netsim.sparse import topk_exact_cycles
    assert topk_exact_cycles(256, 4, 2) == 868
    assert topk_exact_cycles(4096, 16, 16) - topk_exact_cycles(2048, 16, 16) == 5 * 128


def test_emit_pass_expectation_equals_monte_carlo():
    """k uniformly placed pairs over n values, W lanes: a beat costs max(1, pairs in it)."""
    from treenic.netsim.sparse import emit_pass_cycles
    rng = np.random.default_rng(3)
    for n, k, w in ((500, 50, 16), (1024, 10, 16), (250, 12, 16)):
        beats = -(-n // w)
        sims = [np.maximum(1, np.bincount(rng.choice(n, k, replace=False) // w,
                                          minlength=beats)).sum() for _ in range(4000)]
        assert abs(np.mean(sims) - emit_pass_cycles(n, k, w)) < 0.3


def test_sparse_model_within_5_percent_of_the_sparse_fabric():
    """The sparse engine model's constants are calibrate() of the one-engine records (no
    fabric run enters them); every recorded MultiTree-Sparse run on the Verilated sparse
    fabric (`python -m treenic.netsim.rtl_runs --measure --only sparse_...`) is predicted
    within 5 %, node by node too."""
    from treenic.netsim import rtl_runs, sparse
    from treenic.netsim.bench import validation
    assert sparse.calibrate(sparse.CALIBRATION) == sparse.SPARSE_RTL
    rows = [v for v in validation(rtl_runs.load()) if v["algorithm"] == "multitree-sparse"]
    assert {v["topology"] for v in rows} >= {"ring:2", "mesh:2x2"}, "sparse RTL runs missing"
    for v in rows:
        assert abs(v["error"]) <= 0.05, v
        for got, want in zip(v["model_node_cycles"], v["rtl_node_cycles"]):
            assert abs(got - want) <= 0.05 * want, v


def test_sparse_calibration_records_are_the_engine_cycles():
    """Two of the recorded one-engine calibration programs, re-run in the Amaranth
    simulator, still take the recorded cycles (the rest: sparse_calibrate's command)."""
    from treenic.netsim.sparse import CALIBRATION
    from treenic.netsim.sparse_calibrate import program, run_rows
    for case in (("END", 0, 0), ("GRECV", 500, 12)):
        assert run_rows(*program(*case)) == CALIBRATION[case], case


def test_sparse_region_rows_are_the_engine_cycles():
    """The slot and region rows re-run in the Amaranth simulator take the recorded cycles:
    one a slot pair (FIXUP two) or a COPY word, each pair through the scatter unit once (a
    handshake that hands the unit a pair twice cost FIXUP 230 cycles, bit-exact all the
    same: set mode is idempotent)."""
    from treenic.netsim.sparse import REGION_RECORDS
    from treenic.netsim.sparse_calibrate import region_rows
    got = region_rows()
    assert got == REGION_RECORDS
    assert got["FIXUP"] - got["ACC"] == 50


def test_sparse_model_needs_every_message():
    """A RECV whose sender never sends deadlocks the model: an error, not a number."""
    from treenic.netsim import rtl_runs, sparse
    from treenic.schedule.sparse_table import SparseOp, unpack_row
    prog = sparse.program_for(rtl_runs.BY_NAME["sparse_ring2_1000_d10"])
    prog.rows[1] = [w for w in prog.rows[1] if unpack_row(w)["op"] != SparseOp.SEND]
    with pytest.raises(RuntimeError, match="deadlock"):
        sparse.predict(prog)


def test_sparse_model_more_topk_units_never_slower():
    """The selection side in the model: a second unit overlaps selections of independent
    flows (torus:4x4, where every node selects all 16 flows) and more never cost cycles."""
    from treenic.netsim import sparse
    from treenic.schedule.sparse_table import compile_sparse
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    prog = compile_sparse(MultiTreeSparse(16, 2048, 0.05, seed=0, topology="torus:4x4"))
    cyc = [sparse.predict(prog, sparse.SPARSE_RTL.with_(topk_units=t)) for t in (1, 2, 4, 8)]
    assert cyc[1] < cyc[0] and all(b <= a for a, b in zip(cyc, cyc[1:])), cyc
