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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the fingerprint JSON here")
    ap.add_argument("--compare", help="fingerprint JSON to compare against")
    ap.add_argument("--only", action="append", help="topology spec(s) to run")
    a = ap.parse_args(argv)
    known = [c[0] for c in CASES]
    for s in a.only or []:
        if s not in known:
            ap.error(f"--only {s!r}: not a fingerprint case (one of {', '.join(known)})")
    fp = {}
    for case in CASES:
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
