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
from amaranth.sim import Simulator

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

    async def clear(ctx, node):                  # drop a provoked error flag
        await _write_one(ctx, fab, node, Reg.CTRL, Ctrl.CLEAR)

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
        await clear(ctx, 0)
        await switch_all(ctx, 1)
        for it in range(iterations):
            await sparse(ctx, it, (lambda c: refuse_switch(c, 1, 0)) if it == 0 else None)
            if it == 0:
                await clear(ctx, 1)
        await switch_all(ctx, 0)
        await dense(ctx, dense_bufs[1], False, None)

    sim = Simulator(fab)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
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
