"""Cycle count of a fabric all-reduce in Amaranth's simulator (no Verilator build needed).

    python sim/fabric/amaranth_cycles.py mesh:2x2 multitree 4096      # prints cycles, ideal

Loads the compiler's images + ORDER table + random buffers, runs to DONE with no stalls
and link latency 1, prints total cycles and the schedule's ideal; with --check it also
reads the buffers back and compares them bit for bit with execute()."""
import sys

import numpy as np
from amaranth.sim import Simulator

from treenic.algorithms import build
from treenic.firmware.image import build_images
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import Fabric
from treenic.hdl.nic.host import buffer_writes, image_writes, order_writes, sim_read_buffers
from treenic.hdl.nic.model import ideal_cycles
from treenic.schedule.execute import execute


def main(spec, alg, E, check=False):
    sched = build(alg, spec)
    depth = 1 << max(4, (E - 1).bit_length())
    params = NicParams(ports=sched.topology.max_ports(), depth=depth, max_nodes=max(4, sched.n),
                       max_entries=64, max_steps=max(4, sched.steps), sub_words=64, credits=16)
    fab = Fabric(spec, params, latency=1, stall=0)
    bufs = np.random.default_rng(1).standard_normal((sched.n, E)).astype(np.float32)
    imgs = build_images(sched, E)
    ow = order_writes(params, imgs)
    out = {}
    sim = Simulator(fab)
    sim.add_clock(1e-8)

    async def tb(ctx):
        for u in range(sched.n):
            for a, v in image_writes(params, imgs[u]) + ow[u] + buffer_writes(params, bufs[u]):
                ctx.set(fab.hw.valid, 1)
                ctx.set(fab.hw.payload.node, u)
                ctx.set(fab.hw.payload.addr, a)
                ctx.set(fab.hw.payload.data, v)
                await ctx.tick()
        ctx.set(fab.hw.valid, 0)
        ctx.set(fab.start, 1)
        await ctx.tick()
        ctx.set(fab.start, 0)
        while not ctx.get(fab.done):
            await ctx.tick()
        out["cycles"] = ctx.get(fab.cycles)
        if check:
            res = await sim_read_buffers(ctx, fab, params, sched.n, E)
            out["exact"] = bool(np.array_equal(res, execute(sched, bufs).view(np.uint32)))

    sim.add_testbench(tb)
    sim.run()
    ideal = ideal_cycles(sched, E, params)
    print(f"{spec} {alg} E={E}: cycles {out['cycles']} ideal {ideal} "
          f"ratio {out['cycles'] / ideal:.3f}" +
          (f" bit_exact {out['exact']}" if check else ""))


if __name__ == "__main__":
    a = [x for x in sys.argv[1:] if x != "--check"]
    main(a[0], a[1], int(a[2]), "--check" in sys.argv)
