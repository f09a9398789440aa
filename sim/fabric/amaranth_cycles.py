"""Cycle count of a fabric all-reduce in Amaranth's simulator (no Verilator build needed).

    python sim/fabric/amaranth_cycles.py mesh:2x2 multitree 4096      # prints cycles, ideal

Loads the compiler's images + ORDER table + random buffers, runs to DONE with no stalls
and link latency 1, prints total cycles and the schedule's ideal; with --check it also
reads the buffers back and compares them bit for bit with execute()."""
import sys

import numpy as np
from amaranth.sim import Simulator

from treenic.algorithms import build
from treenic.firmware.image import compile_images
from treenic.hdl.nic.fabric import Fabric
from treenic.hdl.nic.host import (host_writes, params_for_images, sim_load_and_start,
                                  sim_read_buffers)
from treenic.hdl.nic.model import ideal_cycles
from treenic.schedule.execute import execute


def main(spec, alg, E, check=False):
    sched = build(alg, spec)
    imgs = compile_images(None, sched, E)
    params = params_for_images(imgs, max_entries=64, sub_words=64, credits=16)
    fab = Fabric(spec, params, latency=1, stall=0)
    bufs = np.random.default_rng(1).standard_normal((sched.n, E)).astype(np.float32)
    writes = host_writes(params, imgs, bufs)
    out = {}
    sim = Simulator(fab)
    sim.add_clock(1e-8)

    async def tb(ctx):
        await sim_load_and_start(ctx, fab, writes)
        while not ctx.get(fab.done):
            await ctx.tick()
        out["cycles"] = ctx.get(fab.cycles)
        if check:
            res = await sim_read_buffers(ctx, fab, params, sched.n, E)
            out["exact"] = bool(np.array_equal(res, execute(sched, bufs).view(np.uint32)))

    sim.add_testbench(tb)
    sim.run()
    ideal = ideal_cycles(imgs, params)
    print(f"{spec} {alg} E={E}: cycles {out['cycles']} ideal {ideal} "
          f"ratio {out['cycles'] / ideal:.3f}" +
          (f" bit_exact {out['exact']}" if check else ""))


if __name__ == "__main__":
    a = [x for x in sys.argv[1:] if x != "--check"]
    main(a[0], a[1], int(a[2]), "--check" in sys.argv)
