"""NIC fabric benchmark (``make bench`` part): torus:4x4 MultiTree all-reduce of 64 KiB per
node on the Verilated RTL fabric.

Reports total cycles against the schedule's ideal (per step, the most-loaded directed
link's flits, summed over steps), per-step cycles, Verilator build and run wall time,
link utilisation, and message-based vs packet-mode payload efficiency from the NICs' flit
counters.  Every run is checked bit for bit against the golden executor.

    python -m treenic.hdl.nic.bench --out build/bench [--quick]
    python -m treenic.hdl.nic.bench --topology mesh:2x2 --elements 4096 --message-only
    python -m treenic.hdl.nic.bench --topology torus:4x4 --message-only --forward cut-through
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from treenic.algorithms import build as build_schedule
from treenic.schedule.execute import execute
from treenic.topology import TopologyError, parse

from treenic.firmware.image import compile_images

from .fabric_sim import FabricSim
from .host import params_for_images
from .model import expected_port_counters, ideal_cycles, step_link_flits
from .params import FORWARD_MODES

__all__ = ["run"]


def _one(spec, alg, elements, mode, *, stall=0, latency=1, seed=1, banks=None,
         forward="store"):
    t0 = time.time()
    sched = build_schedule(alg, spec)
    images = compile_images(None, sched, elements)
    # the default build, with another bank count or forwarding if asked
    params = params_for_images(images, mode=mode, forward=forward,
                               **({"banks": banks} if banks is not None else {}))
    fs = FabricSim(spec, sched, elements, mode=mode, stall=stall, latency=latency, seed=seed,
                   params=params, images=images)
    build_s = time.time() - t0
    rng = np.random.default_rng(seed)
    bufs = rng.standard_normal((fs.schedule.n, elements)).astype(np.float32)
    t0 = time.time()
    res, cycles = fs.run(bufs)
    run_s = time.time() - t0
    gold = execute(fs.schedule, bufs)
    exact = bool(np.array_equal(res.view(np.uint32), gold.view(np.uint32)))
    cnt = fs.counters()
    p = fs.params
    tx_flits = sum(pc["tx_flits"] for c in cnt.values() for pc in c["ports"].values())
    heads = sum(pc["tx_heads"] for c in cnt.values() for pc in c["ports"].values())
    words = sum(pc["tx_words"] for c in cnt.values() for pc in c["ports"].values())
    exp = expected_port_counters(fs.images, p)
    counters_match = all(cnt[u]["ports"][q]["tx_flits"] == exp[u].get(q, {}).get("tx_flits", 0)
                         for u in cnt for q in cnt[u]["ports"])
    links = [(u, q) for u in cnt for q in cnt[u]["ports"] if cnt[u]["ports"][q]["tx_flits"]]
    busiest = max(cnt[u]["ports"][q]["tx_flits"] for u, q in links)
    ideal = ideal_cycles(fs.images, p)
    per_step_ideal = {s: max(v.values()) for s, v in
                      sorted(step_link_flits(fs.images, p).items())}
    return {
        "topology": spec, "algorithm": alg, "elements": elements,
        "bytes_per_node": 4 * elements, "mode": mode, "stall": stall, "latency": latency,
        "bit_exact": exact, "counters_match_golden": counters_match,
        "cycles": cycles, "ideal_cycles": ideal, "cycles_over_ideal": cycles / ideal,
        "step_cycles_node0": cnt[0]["step_cycles"],
        "step_ideal_flits": list(per_step_ideal.values()),
        "tx_flits": tx_flits, "head_flits": heads,
        "payload_efficiency": words / p.lanes / tx_flits,
        "busiest_link_utilisation": busiest / cycles,
        "mean_link_utilisation": tx_flits / len(links) / cycles,
        "verilator_build_s": round(build_s, 2), "run_wall_s": round(run_s, 3),
        "sim_cycles_per_s": round(cycles / max(run_s, 1e-9)),
        "params": {"ports": p.ports, "width": p.width, "depth": p.depth,
                   "sub_words": p.sub_words, "packet_words": p.packet_words,
                   "credits": p.credits, "banks": p.banks, "forward": p.forward},
    }


def run(out_dir, quick: bool = False, *, topology: str = "torus:4x4",
        elements: int | None = None, message_only: bool = False,
        banks: int | None = None, forward: str = "store") -> dict:
    """Run the NIC benchmarks; writes ``out_dir/nic_bench.json``; returns the dict.
    ``message_only``: just the no-stall message-mode run (one Verilator build);
    ``banks``: gradient-buffer banks (default: :class:`NicParams`' rule); ``forward``:
    ``NicParams.forward`` of every run ("store" or "cut-through")."""
    if elements is not None and elements <= 0:
        raise ValueError(f"elements must be positive, not {elements}")
    if banks is not None and (banks < 2 or banks & (banks - 1)):
        raise ValueError(f"banks must be a power of two >= 2, not {banks}")
    E = elements if elements is not None else (4096 if quick else 16384)   # 16/64 KiB per node
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if forward not in FORWARD_MODES:
        raise ValueError(f"forward must be one of {FORWARD_MODES}, not {forward!r}")
    kw = {"banks": banks, "forward": forward}
    res = {"message": _one(topology, "multitree", E, "message", **kw)}
    if not message_only:
        res["packet"] = _one(topology, "multitree", E, "packet", **kw)
        if not quick:
            res["message_stalls"] = _one(topology, "multitree", E, "message", stall=32,
                                         latency=2, **kw)
    m, pk = res["message"], res.get("packet")
    res["summary"] = {
        "cycles_over_ideal_message": m["cycles_over_ideal"],
        "payload_efficiency_message": m["payload_efficiency"],
        "payload_efficiency_packet": pk["payload_efficiency"] if pk else None,
        "message_vs_packet_cycles": pk["cycles"] / m["cycles"] if pk else None,
        "all_bit_exact": all(r["bit_exact"] for k, r in res.items() if k != "summary"),
    }
    (out_dir / "nic_bench.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--quick", action="store_true", help="16 KiB per node")
    ap.add_argument("--topology", default="torus:4x4")
    ap.add_argument("--elements", type=int, help="float32 elements per node")
    ap.add_argument("--message-only", action="store_true",
                    help="only the message-mode run without stalls")
    ap.add_argument("--banks", type=int,
                    help="gradient-buffer banks (power of two; default 2·ports·lanes)")
    ap.add_argument("--forward", choices=FORWARD_MODES, default="store",
                    help="step-boundary forwarding of the NIC build (NicParams.forward)")
    a = ap.parse_args(argv)
    if a.elements is not None and a.elements <= 0:
        ap.error("--elements must be positive")
    if a.banks is not None and (a.banks < 2 or a.banks & (a.banks - 1)):
        ap.error(f"--banks must be a power of two >= 2, not {a.banks}")
    try:
        parse(a.topology)
    except TopologyError as e:
        ap.error(str(e))
    r = run(a.out, a.quick, topology=a.topology, elements=a.elements,
            message_only=a.message_only, banks=a.banks, forward=a.forward)
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
