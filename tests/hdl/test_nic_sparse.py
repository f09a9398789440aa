"""The sparse engine inside the NIC (``NicParams(sparse=...)``) in Amaranth's simulator: on
one fabric of combined NICs with random link stalls, a dense MultiTree all-reduce, then
two error-feedback iterations of MultiTree-Sparse, then a dense all-reduce again, over the
same links (SP_MODE switched by the host between them) -- the dense runs equal the golden
executor, the sparse runs' results AND residuals the golden model, bit for bit on every
node.  A mode switch while either side runs is refused and flagged; the engine's host
protocol goes through the register bus (SP_IN / SP_PUSH, SP_OUT_*).  With the option off
the NIC's ports are unchanged (and so are they with it on)."""
import numpy as np
import pytest

from treenic.algorithms import build
from treenic.firmware.image import compile_images
from treenic.hdl.nic import Nic, NicParams
from treenic.hdl.nic.fabric import Fabric
from treenic.hdl.nic.host import (NicImageError, buffer_writes, check_sparse_fits,
                                  host_writes, params_for_images, sim_read_all,
                                  sim_sparse_dump, sim_write_all, sparse_dump_writes,
                                  sparse_load_writes, sparse_push_writes)
from treenic.hdl.nic.params import Ctrl, ErrBit, Reg, SparseParams, SparseStatus
from treenic.hdl.nic.sparse_fabric import decode_program_dump
from treenic.schedule.execute import execute
from treenic.schedule.sparse_table import compile_sparse
from treenic.sparse.multitree_sparse import MultiTreeSparse

from nic_unit_helpers import simulate


def _grads(rng, P, N, iterations):
    return [(rng.standard_normal((P, N)) * 2.0 ** rng.integers(-4, 4, (P, N))).astype(np.float32)
            for _ in range(iterations)]


def _build(spec, E, density, *, seed=0, stall=64, topk_units=1):
    sched = build("multitree", spec)
    images = compile_images(None, sched, E)
    golden = MultiTreeSparse(sched.n, E, density, seed=seed, topology=spec)
    prog = compile_sparse(golden)
    sparse = SparseParams.for_program(prog, lanes=2, topk_units=topk_units)
    params = params_for_images(images, max_nodes=4, max_steps=8, sub_words=4, credits=6,
                               sparse=sparse)
    check_sparse_fits(params, prog)
    fab = Fabric(spec, params, latency=2, stall=stall, seed=seed + 3)
    return sched, images, golden, prog, params, fab


async def _pulse_start_and_wait(ctx, fab, during=None, max_cycles=20_000):
    """Fabric-wide start, then clock until every NIC is done; ``during``: a coroutine
    run (once) a few cycles after the start, while the NICs run."""
    ctx.set(fab.start, 1)
    await ctx.tick()
    ctx.set(fab.start, 0)
    for c in range(max_cycles):
        if c == 3 and during is not None:
            await during(ctx)
        await ctx.tick()
        if ctx.get(fab.done):
            return ctx.get(fab.cycles)
    raise TimeoutError("the fabric did not finish")


async def _clear(ctx, fab, node):
    """CTRL CLEAR, then a cycle: the registered CLEAR drops the events of its cycle."""
    await _write_one(ctx, fab, node, Reg.CTRL, Ctrl.CLEAR)
    await ctx.tick()


async def _write_one(ctx, fab, node, addr, value):
    ctx.set(fab.hw.payload.node, node)
    ctx.set(fab.hw.payload.addr, addr)
    ctx.set(fab.hw.payload.data, value)
    ctx.set(fab.hw.valid, 1)
    await ctx.tick()
    ctx.set(fab.hw.valid, 0)


async def _read_regs(ctx, fab, regs):
    rows = await sim_read_all(ctx, fab, [int(r) for r in regs])
    return dict(zip(regs, rows))


def _run(spec, E, density, *, iterations=2, stall=64, seed=0, topk_units=1):
    sched, images, golden, prog, params, fab = _build(spec, E, density, seed=seed,
                                                      stall=stall, topk_units=topk_units)
    P = sched.n
    rng = np.random.default_rng(seed)
    dense_bufs = [rng.standard_normal((P, E)).astype(np.float32) for _ in range(2)]
    grads = _grads(rng, P, E, iterations)
    out = {"sparse": [], "dense": [], "refusals": []}
    base = params.buf_addr(0)

    async def refuse_switch(ctx, node, want):
        """A mode change while the fabric runs: refused, flagged, the mode kept."""
        await _write_one(ctx, fab, node, Reg.SP_MODE, want)
        regs = await _read_regs(ctx, fab, [Reg.SP_MODE, Reg.SP_STATUS, Reg.ERR_FLAGS])
        out["refusals"].append((node, want, {r: v[node] for r, v in regs.items()}))

    async def dense(ctx, bufs, config, probe):
        writes = host_writes(params, images, bufs) if config else \
            [buffer_writes(params, b) for b in bufs]
        await sim_write_all(ctx, fab, writes)
        cycles = await _pulse_start_and_wait(ctx, fab, probe)
        res = await sim_read_all(ctx, fab, [base + e for e in range(E)])
        flags = await _read_regs(ctx, fab, [Reg.ERR_FLAGS])
        out["dense"].append((np.array(res, np.uint32).T, cycles, flags[Reg.ERR_FLAGS]))

    async def switch_all(ctx, want):
        status = await _read_regs(ctx, fab, [Reg.SP_STATUS])
        assert all(s & SparseStatus.DRAINED for s in status[Reg.SP_STATUS]), status
        await sim_write_all(ctx, fab, [[(int(Reg.SP_MODE), want)]] * P)
        mode = await _read_regs(ctx, fab, [Reg.SP_MODE])
        assert mode[Reg.SP_MODE] == [want] * P

    async def sparse(ctx, it, probe):
        await sim_write_all(ctx, fab, [sparse_load_writes(params, prog, u, grads[it][u],
                                                          rows=it == 0) for u in range(P)])
        cycles = await _pulse_start_and_wait(ctx, fab, probe)
        regs = await _read_regs(ctx, fab, [Reg.SP_STATUS, Reg.SP_CYCLES, Reg.SP_FLITS,
                                           Reg.SP_MALFORMED, Reg.ERR_FLAGS])
        await sim_write_all(ctx, fab, [sparse_dump_writes(prog)] * P)
        words = await sim_sparse_dump(ctx, fab)
        out["sparse"].append(([decode_program_dump(w, prog) for w in words], cycles, regs))

    async def tb(ctx):
        await dense(ctx, dense_bufs[0], True, lambda c: refuse_switch(c, 0, 1))
        await _clear(ctx, fab, 0)
        await switch_all(ctx, 1)
        for it in range(iterations):
            await sparse(ctx, it, (lambda c: refuse_switch(c, 1, 0)) if it == 0 else None)
            if it == 0:
                await _clear(ctx, fab, 1)
        await switch_all(ctx, 0)
        await dense(ctx, dense_bufs[1], False, None)

    simulate(fab, tb)
    return out, sched, dense_bufs, golden, grads, prog


def _check(out, sched, dense_bufs, golden, grads, prog):
    for bufs, (res, cycles, flags) in zip(dense_bufs, out["dense"]):
        assert cycles > 0
        np.testing.assert_array_equal(res, execute(sched, bufs).view(np.uint32))
    # the first dense run had node 0's refused switch (CLEARed after), the second none
    assert out["dense"][0][2][0] == 1 << ErrBit.HOST_RANGE and out["dense"][1][2] == [0] * sched.n
    for it, (g, (nodes, cycles, regs)) in enumerate(zip(grads, out["sparse"])):
        want = golden.step(g)
        assert cycles > 0
        for u, (resid, res) in enumerate(nodes):
            np.testing.assert_array_equal(res.view(np.uint32), want.result[u].view(np.uint32),
                                          err_msg=f"iteration {it} node {u}: result")
            np.testing.assert_array_equal(resid.view(np.uint32),
                                          want.residuals[u].view(np.uint32),
                                          err_msg=f"iteration {it} node {u}: residual")
        assert regs[Reg.SP_MALFORMED] == [0] * sched.n
        assert sum(regs[Reg.SP_FLITS]) == prog.link_flits * (it + 1)   # counts since reset
        assert all(c > 0 for c in regs[Reg.SP_CYCLES])
        for u, s in enumerate(regs[Reg.SP_STATUS]):
            assert s & SparseStatus.DONE and s & SparseStatus.MODE
            assert not s & (SparseStatus.HOST_REFUSED | SparseStatus.RUNNING)
            # node 1's refused switch in the first run (CLEARed after it)
            assert regs[Reg.ERR_FLAGS][u] == (1 << ErrBit.HOST_RANGE if (it, u) == (0, 1) else 0)
    (n0, w0, r0), (n1, w1, r1) = out["refusals"]
    for r, mode in ((r0, 0), (r1, 1)):
        assert r[Reg.SP_MODE] == mode
        assert r[Reg.SP_STATUS] & SparseStatus.MODE_REFUSED
        assert r[Reg.ERR_FLAGS] & (1 << ErrBit.HOST_RANGE)


def test_dense_then_sparse_then_dense_ring4_with_stalls():
    args = _run("ring:4", 96, 0.1, stall=64)
    _check(*args)


def test_ports_unchanged_by_the_option():
    p = NicParams(ports=2, depth=64, max_nodes=4, max_entries=16, max_steps=8, sub_words=4,
                  credits=6)
    sp = SparseParams(depth=64, lanes=2, max_flow=16, chunks=4, slot=8, rows=16, rx_depth=32,
                      topk_units=1)
    off, on = Nic(p), Nic(NicParams(**{**p.__dict__, "sparse": sp}))
    assert off.sparse_engine is None and on.sparse_engine is not None
    def ports(nic):
        return [(path, m.flow, m.shape if m.is_port else None)
                for path, m in nic.signature.members.flatten()]
    assert ports(off) == ports(on)
    assert list(off.signature.members) == ["host", "start", "dma", "done", "running", "error",
                                           "tx", "rx"]


def test_bad_sparse_build_and_program_refused():
    with pytest.raises(TypeError, match="sparse must be SparseParams"):
        NicParams(sparse={"depth": 64})
    sp = SparseParams(depth=64, lanes=2, max_flow=16, chunks=4, slot=8, rows=16, rx_depth=32)
    with pytest.raises(ValueError, match="64-bit flits"):
        NicParams(width=128, sparse=sp)
    with pytest.raises(ValueError, match="host_fifo"):
        SparseParams(depth=64, lanes=2, max_flow=16, chunks=4, slot=8, rows=16, rx_depth=32,
                     host_fifo=1)
    prog = compile_sparse(MultiTreeSparse(4, 256, 0.1, seed=0, topology="ring:4"))
    small = NicParams(ports=2, max_nodes=4, sparse=sp)
    with pytest.raises(NicImageError, match="depth 256 > the engine's 64"):
        check_sparse_fits(small, prog)
    with pytest.raises(NicImageError, match="no sparse engine"):
        sparse_load_writes(NicParams(), prog, 0, np.zeros(256, np.float32))
    with pytest.raises(ValueError, match="wider than 128 bits"):
        sparse_push_writes(1 << 128)


def test_link_share_matches_golden_random_traffic():
    """LinkShare against ``link_share_golden``: random flits both ways on every port,
    random credits (only for flits outstanding), the owner toggled at random."""
    from treenic.hdl.nic.params import SPARSE_ENGINE_FMT
    from treenic.hdl.nic.sparse_host import LinkShare, link_share_golden
    P, fmt = 2, NicParams(ports=2, max_nodes=4).fmt
    dut = LinkShare(fmt=fmt, engine_fmt=SPARSE_ENGINE_FMT, ports=P, max_outstanding=8)
    rng = np.random.default_rng(4)
    steps, sent, held = [], [0] * P, [0] * P
    sparse = 0
    for _ in range(400):
        if rng.random() < 0.05:
            sparse ^= 1
        s = {"sparse": sparse}
        for name in ("dense_tx", "engine_tx", "rx"):
            s[name] = [(int(rng.random() < 0.4),
                        int.from_bytes(rng.bytes(16), "little") % (1 << fmt.flit.size))
                       for _ in range(P)]
        s["tx_credit"] = [int(sent[p] > 0 and rng.random() < 0.4) for p in range(P)]
        rx_cr = [int(held[p] > 0 and rng.random() < 0.4) for p in range(P)]
        s["dense_rx_credit"] = [c if not sparse else int(rng.random() < 0.5) for c in rx_cr]
        s["engine_rx_credit"] = [c if sparse else int(rng.random() < 0.5) for c in rx_cr]
        for p in range(P):
            sent[p] += (s["engine_tx"] if sparse else s["dense_tx"])[p][0] - s["tx_credit"][p]
            held[p] += s["rx"][p][0] - rx_cr[p]
        steps.append(s)
    want = link_share_golden(steps, P)
    got = []

    async def tb(ctx):
        for s in steps:
            ctx.set(dut.sparse, s["sparse"])
            for p in range(P):
                for name in ("dense_tx", "engine_tx", "rx"):
                    port = getattr(dut, name)[p]
                    ctx.set(port.valid, s[name][p][0])
                    ctx.set(port.flit.as_value(), s[name][p][1])
                ctx.set(dut.tx[p].credit, s["tx_credit"][p])
                ctx.set(dut.dense_rx[p].credit, s["dense_rx_credit"][p])
                ctx.set(dut.engine_rx[p].credit, s["engine_rx_credit"][p])
            await ctx.delay(1e-9)
            o = {"drained": ctx.get(dut.drained)}
            for p in range(P):
                for key, val in (("tx", (ctx.get(dut.tx[p].valid),
                                         ctx.get(dut.tx[p].flit.as_value()))),
                                 ("engine_tx_credit", ctx.get(dut.engine_tx[p].credit)),
                                 ("dense_tx_credit", ctx.get(dut.dense_tx[p].credit)),
                                 ("engine_rx_valid", ctx.get(dut.engine_rx[p].valid)),
                                 ("dense_rx_valid", ctx.get(dut.dense_rx[p].valid)),
                                 ("rx_credit", ctx.get(dut.rx[p].credit))):
                    o.setdefault(key, []).append(val)
            got.append(o)
            await ctx.tick()

    simulate(dut, tb)
    assert got == want
    assert any(not o["drained"] for o in got) and any(o["drained"] for o in got[1:])


def test_refusals_while_a_sparse_run_is_stuck():
    """ring:2, sparse mode: only node 0 starts, so its run sends to node 1's idle engine
    (the flits wait in node 1's receive FIFO) and then waits for node 1 forever.  While
    it is stuck: a mode change is refused on node 0 (running) and node 1 (its received
    flits not taken), a second START and a pushed START word are refused, the HOST_IN FIFO
    takes ``host_fifo`` words and refuses the next; CTRL START did not start the dense
    core; an empty HOST_OUT pop reads not VALID.  Node 1 started, both finish, drain, and
    switch back."""
    from treenic.hdl.nic.sparse_engine import HostKind
    prog = compile_sparse(MultiTreeSparse(2, 64, 0.25, seed=1, topology="ring:2"))
    sparse = SparseParams.for_program(prog, lanes=2, topk_units=1, host_fifo=4)
    params = NicParams(ports=prog.ports, depth=64, max_nodes=4, max_entries=16, max_steps=8,
                       sub_words=4, credits=6, sparse=sparse)
    fab = Fabric("ring:2", params, latency=2, stall=32, seed=5)
    grads = _grads(np.random.default_rng(2), 2, 64, 1)[0]
    out = {}
    grad_word = sparse_push_writes(HostKind.GRAD | 5 << 3 | 0x3F800000 << 27)

    async def regs(ctx, names):
        return await _read_regs(ctx, fab, names)

    async def tb(ctx):
        await sim_write_all(ctx, fab, [[(int(Reg.SP_MODE), 1)]] * 2)
        out["empty_pop"] = (await regs(ctx, [Reg.SP_OUT_POP]))[Reg.SP_OUT_POP]
        await sim_write_all(ctx, fab, [sparse_load_writes(params, prog, 0, grads[0]), []])
        await _write_one(ctx, fab, 0, Reg.CTRL, Ctrl.START)
        for _ in range(400):
            await ctx.tick()
        out["stuck"] = await regs(ctx, [Reg.STATUS, Reg.SP_STATUS, Reg.SP_FLITS])
        await _write_one(ctx, fab, 0, Reg.SP_MODE, 0)
        await _write_one(ctx, fab, 1, Reg.SP_MODE, 0)
        out["mode"] = await regs(ctx, [Reg.SP_MODE, Reg.SP_STATUS, Reg.ERR_FLAGS])
        await _clear(ctx, fab, 1)
        await _clear(ctx, fab, 0)
        await _write_one(ctx, fab, 0, Reg.CTRL, Ctrl.START)
        out["restart"] = await regs(ctx, [Reg.SP_STATUS, Reg.ERR_FLAGS])
        await _clear(ctx, fab, 0)
        for a, v in sparse_push_writes(HostKind.START):
            await _write_one(ctx, fab, 0, a, v)
        out["start_word"] = await regs(ctx, [Reg.SP_STATUS])
        await _clear(ctx, fab, 0)
        for _ in range(sparse.host_fifo):
            for a, v in grad_word:
                await _write_one(ctx, fab, 0, a, v)
        out["full"] = await regs(ctx, [Reg.SP_STATUS])
        for a, v in grad_word:
            await _write_one(ctx, fab, 0, a, v)
        out["overflow"] = await regs(ctx, [Reg.SP_STATUS, Reg.ERR_FLAGS])
        await _clear(ctx, fab, 0)
        await sim_write_all(ctx, fab, [[], sparse_load_writes(params, prog, 1, grads[1])])
        await _write_one(ctx, fab, 1, Reg.CTRL, Ctrl.START)
        for _ in range(5000):
            await ctx.tick()
            if ctx.get(fab.done):
                break
        out["end"] = await regs(ctx, [Reg.SP_STATUS, Reg.ERR_FLAGS])
        await sim_write_all(ctx, fab, [[(int(Reg.SP_MODE), 0)]] * 2)
        out["back"] = await regs(ctx, [Reg.SP_MODE])

    simulate(fab, tb)
    S, HR = SparseStatus, 1 << ErrBit.HOST_RANGE
    assert out["empty_pop"] == [0, 0]
    st = out["stuck"]
    assert st[Reg.STATUS] == [0, 0]                      # the dense core never started
    assert st[Reg.SP_FLITS][0] > 0 and st[Reg.SP_FLITS][1] == 0
    s0, s1 = st[Reg.SP_STATUS]
    assert s0 & (S.RUNNING | S.BUSY) == S.RUNNING | S.BUSY and not s0 & S.DRAINED
    assert not s1 & (S.RUNNING | S.DRAINED)              # node 0's flits wait at node 1
    assert out["mode"][Reg.SP_MODE] == [1, 1]
    assert all(s & S.MODE_REFUSED for s in out["mode"][Reg.SP_STATUS])
    assert out["mode"][Reg.ERR_FLAGS] == [HR, HR]
    for key in ("restart", "start_word"):
        assert out[key][Reg.SP_STATUS][0] & S.HOST_REFUSED, key
    assert out["restart"][Reg.ERR_FLAGS][0] == HR
    full = out["full"][Reg.SP_STATUS][0]
    assert not full & S.HOST_REFUSED and (full >> 8) & 0xFF == sparse.host_fifo
    assert out["overflow"][Reg.SP_STATUS][0] & S.HOST_REFUSED
    assert out["overflow"][Reg.ERR_FLAGS][0] == HR
    for s in out["end"][Reg.SP_STATUS]:
        assert s & S.DONE and s & S.DRAINED and not s & (S.RUNNING | S.MODE_REFUSED)
    assert out["back"][Reg.SP_MODE] == [0, 0]


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("verilator") is None or
                    __import__("os").environ.get("TREENIC_RTL_TESTS") != "1",
                    reason="Verilated fabric: needs verilator and TREENIC_RTL_TESTS=1")
def test_verilated_combined_fabric_dense_sparse_dense():
    """The same sequence on the Verilated fabric of combined NICs (``sparse_nic_sim``):
    ring:2, 512 elements, 5 %, link stalls; about a minute to build."""
    from treenic.hdl.nic.sparse_nic_sim import ENGINE, combined_report
    r = combined_report("ring:2", 512, 0.05, iterations=2, lanes=2, topk_units=1, stall=32)
    assert r["bit_exact"] and r["dense_bit_exact"] and r["engine"] == ENGINE
    assert r["sparse_bit_exact_per_iteration"] == [True, True] and r["malformed"] == 0
    assert all(c > e for c, e in zip(r["cycles_per_iteration"],
                                     r["engine_cycles_per_iteration"]))


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                          np.asarray(b, np.float32).view(np.uint32))


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("verilator") is None or
                    __import__("os").environ.get("TREENIC_RTL_TESTS") != "1",
                    reason="Verilated fabric: needs verilator and TREENIC_RTL_TESTS=1")
def test_verilated_combined_fabric_serves_the_driver():
    """The fabric server's view of the same Verilated fabric (``CombinedFabricSim``, built
    from a sparse image set; the build of the test above): fresh sparse all-reduces
    (``run_fresh``: the engines' buffers CLEARed to +0 between calls, the load paced behind
    the CLEAR) interleaved with dense all-reduces of the set's tables -- each sparse call
    bit for bit a fresh golden model of its accumulators, each dense one the executor."""
    from treenic.firmware.image import decode_schedule
    from treenic.hdl.nic.sparse_nic_sim import ENGINE, CombinedFabricSim
    from treenic.hdl.nic.sparse_sim import imaged_model
    from treenic.schedule.execute import execute
    from treenic.schedule.sparse_table import program_golden
    _, images, prog = imaged_model("multitree-sparse", "ring:2", 512, 0.05, seed=0)
    sim = CombinedFabricSim(images, prog, lanes=2, topk_units=1, stall=32, seed=1)
    rng = np.random.default_rng(5)
    for kind in ("sparse", "sparse", "dense", "sparse", "dense"):
        x = rng.standard_normal((2, 512)).astype(np.float32)
        if kind == "dense":
            out, cycles = sim.dense(x)
            assert same_bits(out, execute(decode_schedule(images), x)) and cycles > 0
            continue
        got, cycles = sim.run_fresh(x, 0)
        want = program_golden(prog, 0).step(x)
        assert same_bits(got.result, want.result) and same_bits(got.residuals, want.residuals)
        assert got.info["engine"] == ENGINE and got.info["malformed"] == 0
        assert got.info["link_bytes"] == 8 * prog.link_flits and cycles > 0


@pytest.mark.parametrize("argv,needle", [
    (["ring:4", "--elements", "-5"], "--elements must be >= 1"),
    (["torus:5x5", "--elements", "100"], "at most 16 on the fabric of combined NICs"),
    (["switch:4", "--elements", "100"], "has switches"),
    (["ring:4", "--algorithm", "topka", "--residual", "global"], "only multitree-sparse"),
    (["ring:4", "--algorithm", "topka", "--elements", "100", "--density", "0.001"],
     "selects k = 0"),
    (["ring:4", "--elements", "100", "--density", "3"], "--density must be in (0, 1]"),
    (["ring:4", "--elements", "2"], "need at least one per flow"),
    (["ring:4", "--stall", "-1"], "--stall must be >= 0"),
])
def test_sparse_nic_sim_refuses_bad_arguments_in_one_line(argv, needle, capsys):
    from treenic.hdl.nic.sparse_nic_sim import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1], err
