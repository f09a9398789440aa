"""The NIC's bulk DMA port (hdl/nic/host_regs.py, ``Nic.dma``) and the fabric's all-node DMA
streams (``dwa``, ``dra`` -> ``drda``), in Amaranth's simulator: buffers written ``lanes``
elements per NIC per cycle at unaligned addresses with partial lane masks, an all-reduce
run on them, read back through the DMA streams under random gaps and backpressure -- equal
to the golden executor bit for bit; a DMA beat that meets a bus access, a write while
RUNNING and a lane past ``depth`` are dropped and flagged HOST_RANGE."""
import numpy as np
from amaranth.sim import Simulator

from treenic.algorithms import build
from treenic.firmware.image import build_images
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import Fabric
from treenic.hdl.nic.host import host_writes, sim_write_all
from treenic.hdl.nic.host_regs import HostRegs
from treenic.hdl.nic.params import Reg
from treenic.schedule.execute import execute

from nic_unit_helpers import SMALL, simulate

PARAMS = NicParams(ports=2, depth=32, max_nodes=4, max_entries=16, max_steps=8, sub_words=4,
                   packet_words=4, credits=6)


def _beats(E: int, W: int, rng) -> list[tuple[int, int]]:
    """(first element, lane mask) covering 0..E-1 once, starting at a random offset so the
    beats are unaligned to the banks, the first and last with partial masks."""
    first = int(rng.integers(1, W)) if W > 1 else 1
    beats = [(0, (1 << first) - 1)]
    e = first
    while e < E:
        k = min(W, E - e)
        beats.append((e, (1 << k) - 1))
        e += k
    rng.shuffle(beats)                      # any order: the port takes any address
    return beats


def test_dma_streams_load_and_read_back_allreduce_bit_exact():
    sched = build("multitree", "mesh:2x2")
    E, n, W = 13, 4, PARAMS.lanes
    fab = Fabric("mesh:2x2", PARAMS, latency=2, seed=3)
    rng = np.random.default_rng(11)
    bufs = rng.standard_normal((n, E)).astype(np.float32)
    words = bufs.view(np.uint32)
    config = host_writes(PARAMS, build_images(sched, E))
    beats = _beats(E, W, rng)
    out = {}

    async def tb(ctx):
        await sim_write_all(ctx, fab, config)                   # configuration: hwa
        for lo, mask in beats:                                  # buffers: dwa
            for u in range(n):
                lanes = [int(words[u, lo + k]) if mask >> k & 1 else 0xDEADBEEF
                         for k in range(W)]
                ctx.set(fab.dwa.payload.addr[u], lo)
                ctx.set(fab.dwa.payload.mask[u], mask)
                ctx.set(fab.dwa.payload.data[u], sum(v << (32 * k) for k, v in enumerate(lanes)))
            ctx.set(fab.dwa.valid, 1)
            while True:
                await ctx.delay(1e-9)
                if ctx.get(fab.dwa.ready):
                    break
                await ctx.tick()
            await ctx.tick()
            if rng.random() < 0.3:                              # a gap
                ctx.set(fab.dwa.valid, 0)
                await ctx.tick()
        ctx.set(fab.dwa.valid, 0)
        ctx.set(fab.start, 1)
        await ctx.tick()
        ctx.set(fab.start, 0)
        for _ in range(5000):
            await ctx.tick()
            if ctx.get(fab.done):
                break
        out["done"], out["error"] = ctx.get(fab.done), ctx.get(fab.error)
        # read back: one dra beat per W elements, random gaps and backpressure
        starts = list(range(0, E, W))
        got, issued = [], 0
        while len(got) < len(starts):
            if issued < len(starts) and rng.random() < 0.8:
                ctx.set(fab.dra.payload.en, (1 << n) - 1)
                for u in range(n):
                    ctx.set(fab.dra.payload.addr[u], starts[issued])
                ctx.set(fab.dra.valid, 1)
            ready = rng.random() < 0.6
            ctx.set(fab.drda.ready, ready)
            await ctx.delay(1e-9)
            if ctx.get(fab.dra.valid) and ctx.get(fab.dra.ready):
                issued += 1
            if ready and ctx.get(fab.drda.valid):
                got.append([ctx.get(fab.drda.payload[u]) for u in range(n)])
            await ctx.tick()
            ctx.set(fab.dra.valid, 0)
        out["got"] = got

    sim = Simulator(fab)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert out["done"] and not out["error"]
    res = np.zeros((n, len(out["got"]) * W), np.uint32)
    for r, row in enumerate(out["got"]):
        for u in range(n):
            for k in range(W):
                res[u, r * W + k] = (row[u] >> (32 * k)) & 0xFFFFFFFF
    assert np.array_equal(res[:, :E], execute(sched, bufs).view(np.uint32))


def test_dma_port_refusals_flag_host_range():
    p = SMALL
    W = p.lanes
    dut = HostRegs(params=p)

    async def tb(ctx):
        d, h = dut.dma, dut.host

        async def dma_write(at, mask, **expect):
            """One DMA write beat; ``expect``: buffer-writer fields (en, addr) and events."""
            ctx.set(d.addr, at)
            ctx.set(d.wmask, mask)
            data = sum((0x100 + at + k) << (32 * k) for k in range(W))
            ctx.set(d.wdata, data)
            ctx.set(d.we, 1)
            got = {k: ctx.get(getattr(dut.buf_write, k) if k in ("en", "addr")
                              else getattr(dut, k)) for k in expect}
            if got.get("en"):
                assert ctx.get(dut.buf_write.data) == data
            await ctx.tick()
            ctx.set(d.we, 0)
            assert got == expect, (at, mask, got, expect)

        full = (1 << W) - 1
        await dma_write(5, full, en=full, addr=5, ev_host_range=0)
        await dma_write(p.depth - 1, full, en=1, ev_host_range=1)     # lane 1 past depth
        await dma_write(p.depth - 1, 1, en=1, ev_host_range=0)        # masked off: fine
        ctx.set(dut.running, 1)
        await dma_write(0, full, en=0, ev_host_range=1)               # while RUNNING
        ctx.set(dut.running, 0)
        ctx.set(h.addr, p.buf_addr(3))                                # the bus reads the buffer
        ctx.set(h.re, 1)
        await dma_write(7, full, en=0, ev_host_range=1)
        ctx.set(h.re, 0)
        ctx.set(h.addr, Reg.ID)                                       # ... a register: no clash
        ctx.set(h.re, 1)
        await dma_write(7, full, en=full, ev_host_range=0)
        ctx.set(h.re, 0)
        # a DMA read drives the buffer's reader with all lanes at its address, a cycle
        # later (the read request is registered)
        ctx.set(d.addr, 9)
        ctx.set(d.re, 1)
        assert ctx.get(dut.buf_read.req) == 0
        await ctx.tick()
        ctx.set(d.re, 0)
        assert (ctx.get(dut.buf_read.req), ctx.get(dut.buf_read.addr)) == (1, 9)
        await ctx.tick()
        assert ctx.get(dut.buf_read.req) == 0

    simulate(dut, tb)
