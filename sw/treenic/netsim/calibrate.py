"""How the RTL constants of :data:`treenic.netsim.timing.RTL` were chosen.

    python -m treenic.netsim.calibrate [--fit ring8_1000,mesh2x2_1000]

The structural constants (entry, due, dependency and idle cycles, scan) are read off the
RTL's registers (``timing`` docstring). Four latencies are not a register count one can
read off a single path — ``tx_start``, ``rx_done``, ``credit_return``, ``gate_lag`` — so
they are fitted by a small grid search to node 0's per-step cycle log of the *calibration*
runs (default: Ring on ring:8 and MultiTree on mesh:2x2, both 1000 elements), and every
other recorded run (torus:4x4, packet mode, 64 KiB) is held out. The printout gives the
best constants, their per-step residuals and the held-out errors.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np


from . import rtl_runs
from .bench import rtl_timing
from .sim import simulate

GRID = {"tx_start": range(6, 15), "rx_done": range(26, 50, 2),
        "credit_return": range(3, 9), "gate_lag": range(15, 36, 5)}


def _cost(consts, cases):
    err = []
    for run, rec, sched in cases:
        r = simulate(sched, run.elements, rtl_timing(run).with_(**consts))
        m, g = np.array(r.step_cycles_node0), np.array(rec["step_cycles_node0"], float)
        if len(m) != len(g):
            return np.inf
        err.append((m - g) / g.mean())
        err.append([(r.cycles - rec["cycles"]) / rec["cycles"] * len(g)])
    return float(np.sqrt(np.mean(np.concatenate(err) ** 2)))


def fit(names) -> dict:
    rec = rtl_runs.load()
    cases = [(rtl_runs.BY_NAME[n], rec[n], rtl_runs.BY_NAME[n].schedule()) for n in names]
    best = None
    keys = list(GRID)
    for vals in itertools.product(*GRID.values()):
        consts = dict(zip(keys, vals))
        c = _cost(consts, cases)
        if best is None or c < best[0]:
            best = (c, consts)
    return {"fitted_on": names, "rms": round(best[0], 4), "constants": best[1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default="ring8_1000,mesh2x2_1000")
    a = ap.parse_args(argv)
    names = a.fit.split(",")
    bad = [n for n in names if n not in rtl_runs.load()]
    if bad:
        ap.error(f"no recorded RTL cycles for {bad}")
    res = fit(names)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
