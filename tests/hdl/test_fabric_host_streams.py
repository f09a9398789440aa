"""Fabric host streams in Amaranth's simulator: the all-node streams (``hwa``, ``hra`` ->
``hrda``) load and read every NIC in parallel, reads are pipelined, responses keep request
order across single (``hr`` -> ``hrd``) and all-node reads, under random backpressure; an
all-reduce loaded and read back this way equals the golden executor bit for bit."""
import numpy as np
from amaranth.sim import Simulator

from treenic.algorithms import build
from treenic.firmware.image import build_images
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import Fabric
from treenic.hdl.nic.host import host_writes, sim_write_all
from treenic.schedule.execute import execute


def test_all_node_streams_allreduce_bit_exact_with_backpressure():
    sched = build("multitree", "mesh:2x2")
    E, n = 13, 4
    params = NicParams(ports=2, depth=32, max_nodes=4, max_entries=16, max_steps=8,
                       sub_words=4, packet_words=4, credits=6)
    fab = Fabric("mesh:2x2", params, latency=2, seed=3)
    rng = np.random.default_rng(7)
    bufs = rng.standard_normal((n, E)).astype(np.float32)
    imgs = build_images(sched, E)
    config = host_writes(params, imgs)          # the one loading path (no buffers yet)
    base = params.buf_addr(0)
    out = {}

    async def reads(ctx, requests):
        """requests: ("one", node, addr) or ("all", addr); random gaps and backpressure."""
        got, pending = [], list(requests)
        issued = 0
        while len(got) < len(requests):
            if issued < len(pending) and rng.random() < 0.8:
                r = pending[issued]
                if r[0] == "one":
                    ctx.set(fab.hr.payload.node, r[1])
                    ctx.set(fab.hr.payload.addr, r[2])
                    ctx.set(fab.hr.valid, 1)
                else:
                    ctx.set(fab.hra.payload.en, (1 << n) - 1)
                    for u in range(n):
                        ctx.set(fab.hra.payload.addr[u], r[1])
                    ctx.set(fab.hra.valid, 1)
            ready = rng.random() < 0.6
            ctx.set(fab.hrd.ready, ready)
            ctx.set(fab.hrda.ready, ready)
            await ctx.delay(1e-9)
            if ctx.get(fab.hr.valid) and ctx.get(fab.hr.ready):
                issued += 1
            elif ctx.get(fab.hra.valid) and ctx.get(fab.hra.ready):
                issued += 1
            if ready and ctx.get(fab.hrd.valid):
                got.append(("one", ctx.get(fab.hrd.payload)))
            if ready and ctx.get(fab.hrda.valid):
                got.append(("all", [ctx.get(fab.hrda.payload[u]) for u in range(n)]))
            await ctx.tick()
            ctx.set(fab.hr.valid, 0)
            ctx.set(fab.hra.valid, 0)
        return got

    async def tb(ctx):
        words = bufs.view(np.uint32)
        await sim_write_all(ctx, fab, [c + [(base + e, int(words[u, e])) for e in range(E)]
                               for u, c in enumerate(config)])
        ctx.set(fab.start, 1)
        await ctx.tick()
        ctx.set(fab.start, 0)
        for _ in range(5000):
            await ctx.tick()
            if ctx.get(fab.done):
                break
        out["done"], out["error"] = ctx.get(fab.done), ctx.get(fab.error)
        # all-node reads of every element, single reads mixed in
        reqs = []
        for e in range(E):
            reqs.append(("all", base + e))
            if e % 3 == 0:
                reqs.append(("one", e % n, base + e))
        out["reqs"] = reqs
        out["got"] = await reads(ctx, reqs)

    sim = Simulator(fab)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert out["done"] and not out["error"]
    ref = execute(sched, bufs).view(np.uint32)
    assert [k for k, _ in out["got"]] == [r[0] for r in out["reqs"]]     # request order
    res = np.zeros((n, E), np.uint32)
    for r, (kind, val) in zip(out["reqs"], out["got"]):
        if kind == "all":
            res[:, r[1] - base] = val
        else:
            assert val == ref[r[1], r[2] - base]
    assert np.array_equal(res, ref)
