"""Behaviour fingerprint of the NIC RTL: Verilated fabric runs whose cycle counts, step
logs, per-port counters and result-buffer hashes must not change under a refactor.

Each case is one Verilator build of :class:`treenic.hdl.nic.fabric.Fabric`
(:class:`treenic.hdl.nic.fabric_sim.FabricSim`); each build runs the all-reduce twice,
with and without the ORDER table (the order gate's two paths).  The result is a JSON
object, one entry per run: ``cycles``, ``sha256`` of the result buffers (bytes of the
float32 array), ``bit_exact`` against the golden executor, and a hash of every node's
step log and port counters.

    python tools/nic_fingerprint.py --out build/fingerprint/before.json
    python tools/nic_fingerprint.py --compare build/fingerprint/before.json

``--compare`` exits 1 naming every run that differs.  ``--only ring:8`` runs one case.

``--engine amaranth`` runs small mesh:2x2 fabrics in the Amaranth simulator instead (no
Verilator build, a minute or two): besides cycles and result hashes it hashes every
NIC's link outputs (valid, flit, credit) in every cycle of the run, so any change of
timing anywhere in the fabric shows.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import numpy as np

#: (topology, algorithm, elements, mode, stall, latency): small but covering message and
#: packet mode, random link stalls and the three topology families
CASES = [
    ("ring:8", "multitree", 256, "message", 0, 1),
    ("mesh:2x2", "multitree", 200, "packet", 40, 2),
    ("torus:4x4", "multitree", 512, "message", 32, 2),
]


def _sha(obj) -> str:
    return hashlib.sha256(obj if isinstance(obj, bytes) else
                          json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def run_case(spec, alg, elements, mode, stall, latency) -> dict:
    from treenic.hdl.nic.fabric_sim import FabricSim
    from treenic.schedule.execute import execute
    t0 = time.time()
    out = {}
    for order in (True, False):
        fs = FabricSim(spec, alg, elements, mode=mode, stall=stall, latency=latency,
                       seed=7, order=order)
        bufs = np.random.default_rng(11).standard_normal(
            (fs.schedule.n, elements)).astype(np.float32)
        res, cycles = fs.run(bufs)
        gold = execute(fs.schedule, bufs)
        out[f"{spec}/{mode}/stall{stall}/order{int(order)}"] = {
            "cycles": cycles, "sha256": _sha(res.tobytes()),
            "bit_exact": bool(np.array_equal(res.view(np.uint32), gold.view(np.uint32))),
            "counters_sha256": _sha(fs.counters())}
    print(f"{spec}: {time.time() - t0:.0f} s", file=sys.stderr)
    return out


#: (topology, algorithm, elements, mode, order, stall): the Amaranth-simulator cases
AMARANTH_CASES = [
    ("mesh:2x2", "multitree", 13, "message", True, 0),
    ("mesh:2x2", "multitree", 13, "message", False, 80),
    ("mesh:2x2", "multitree", 13, "packet", True, 40),
]


def run_amaranth_case(spec, alg, elements, mode, order, stall) -> dict:
    """One small fabric in the Amaranth simulator; hashes the link traffic cycle by cycle."""
    from amaranth.sim import Simulator
    from treenic.algorithms import build
    from treenic.firmware.image import compile_images
    from treenic.hdl.nic.fabric import Fabric
    from treenic.hdl.nic.host import (host_writes, params_for_images, sim_load_and_start,
                                      sim_read_buffers)
    from treenic.schedule.execute import execute
    sched = build(alg, spec)
    imgs = compile_images(None, sched, elements)
    # a small fixed build (the fingerprint must not move when the sizing rule does); the
    # ports come from the images like every other build
    params = params_for_images(imgs, depth=32, max_nodes=4, max_entries=16, max_steps=8,
                               sub_words=4, packet_words=4, credits=6, mode=mode)
    fab = Fabric(spec, params, latency=2, stall=stall, seed=3)
    bufs = np.random.default_rng(5).standard_normal((sched.n, elements)).astype(np.float32)
    recorder = _RecordNics()
    try:
        sim = Simulator(fab)
    finally:
        recorder.restore()
    links = [tx for nic in recorder.nics for tx in _tx_ports(nic)]
    sim.add_clock(1e-8)
    out = {}
    trace = hashlib.sha256()

    async def tb(ctx):
        await sim_load_and_start(ctx, fab, host_writes(params, imgs, bufs, order=order))
        for _ in range(20000):
            await ctx.tick()
            trace.update(repr([(ctx.get(tx.valid), ctx.get(tx.flit.as_value()),
                                ctx.get(tx.credit)) for tx in links]).encode())
            if ctx.get(fab.done):
                break
        out["done"], out["error"], out["cycles"] = (ctx.get(fab.done), ctx.get(fab.error),
                                                    ctx.get(fab.cycles))
        out["res"] = await sim_read_buffers(ctx, fab, params, sched.n, elements)

    sim.add_testbench(tb)
    sim.run()
    gold = execute(sched, bufs)
    return {f"amaranth/{spec}/{mode}/stall{stall}/order{int(order)}": {
        "cycles": int(out["cycles"]), "done": int(out["done"]), "error": int(out["error"]),
        "sha256": _sha(out["res"].tobytes()),
        "bit_exact": bool(np.array_equal(out["res"], gold.view(np.uint32))),
        "link_trace_sha256": trace.hexdigest()[:16]}}


def _tx_ports(nic):
    """A NIC's transmit link ports (``tx[i]``; ``tx0, tx1, ..`` before issue 15's split,
    so that a tree from before the split can be fingerprinted too)."""
    ports = nic.p.ports
    return list(nic.tx) if hasattr(nic, "tx") else [getattr(nic, f"tx{i}")
                                                     for i in range(ports)]


class _RecordNics:
    """Collects the NICs a Fabric elaborates (they are created inside its elaborate)."""

    def __init__(self):
        import treenic.hdl.nic.fabric as fabric_mod
        self.mod, self.orig, self.nics = fabric_mod, fabric_mod.Nic, []
        rec = self

        class Recorded(self.orig):
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                rec.nics.append(self)
        fabric_mod.Nic = Recorded

    def restore(self):
        self.mod.Nic = self.orig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the fingerprint JSON here")
    ap.add_argument("--compare", help="fingerprint JSON to compare against")
    ap.add_argument("--only", action="append", help="topology spec(s) to run")
    ap.add_argument("--engine", choices=["verilator", "amaranth"], default="verilator",
                    help="verilator: Verilated fabrics (default); amaranth: small fabrics "
                         "in the Amaranth simulator with a cycle-by-cycle link trace")
    a = ap.parse_args(argv)
    known = [c[0] for c in CASES]
    for s in a.only or []:
        if s not in known:
            ap.error(f"--only {s!r}: not a fingerprint case (one of {', '.join(known)})")
    fp = {}
    if a.engine == "amaranth":
        for case in AMARANTH_CASES:
            fp.update(run_amaranth_case(*case))
    for case in CASES if a.engine == "verilator" else []:
        if not a.only or case[0] in a.only:
            fp.update(run_case(*case))
    text = json.dumps(fp, indent=1, sort_keys=True)
    if a.out:
        from pathlib import Path
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text)
    if a.compare:
        ref = json.loads(open(a.compare).read())
        bad = [k for k in fp if ref.get(k) != fp[k]]
        for k in bad:
            print(f"DIFFERS {k}: {ref.get(k)} -> {fp[k]}", file=sys.stderr)
        if bad:
            return 1
        print(f"fingerprint matches {a.compare} ({len(fp)} runs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
