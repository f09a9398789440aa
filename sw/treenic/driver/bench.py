"""Driver benchmark: treenic's schedules over torch.distributed vs gloo's own all_reduce.

``run(out_dir, quick=False) -> dict`` spawns 4 local processes (gloo, loopback) and measures,
in the same world and on the same buffers:

* dense all-reduce of 4 M float32 (16 MiB) per rank: gloo ``all_reduce`` vs the ``torch``
  backend running the ring and MultiTree schedules (median of ``repeats`` timed runs after
  one warm-up, slowest rank counts); ``ratio`` = treenic / gloo (target ≤ 1.5);
* sparse TopkA at 1% density on the same buffers (``torch`` backend): bytes each rank puts
  on the wire vs the dense schedule's (target ≤ 5%) and wall time;
* the ``rtl`` backend: the fabric server with the golden engine on the same 4 M buffers
  (host-protocol + executor wall time); and, on the demo's bucket (``RTL_ELEMENTS`` = 4810
  floats, ring:4 MultiTree), seconds per all-reduce through the fabric server with the golden
  engine and with the RTL engine (Verilated fabric; cycles too) in the same run
  (``golden_seconds_per_allreduce``, ``rtl_seconds_per_allreduce``, goal rtl ≤ 5× golden) —
  or the reason the RTL fabric does not build; and ``engines_side_by_side``: the engines
  alone on that bucket, no protocol -- the fabric with its buffers through the NICs' DMA
  ports and through the host bus, and the golden executor -- in wall and CPU seconds
  (``rtl_dma_vs_bus_cpu``, ``rtl_vs_golden_cpu``; CPU time does not move with the load of a
  shared machine), each result checked bit for bit.

``torch_ring_vs_gloo`` / ``torch_multitree_vs_gloo``: treenic's torch backend ÷ gloo's own
all_reduce (goals 1.2 and 1.5).

Writes ``driver_bench.json`` into ``out_dir``. Timings depend on the machine; the bench
reports them, tests never assert them.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

WORLD = 4
RTL_ELEMENTS = 4810          # the demo's one bucket (the RTL fabric is cycle-accurate)


def _timed(fn, repeats, barrier, maxreduce):
    fn()                                               # warm-up (plans, buffers, sockets)
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(maxreduce(time.perf_counter() - t0))
    return statistics.median(times)


def _interleaved(fns, repeats, barrier, maxreduce):
    for fn in fns.values():                            # warm-up
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            barrier()
            t0 = time.perf_counter()
            fn()
            times[k].append(maxreduce(time.perf_counter() - t0))
    return times


def _bench_world(rank, world, elements, repeats, address, rtl_address):
    import numpy as np
    import torch
    import torch.distributed as dist
    from . import open_nic

    def barrier():
        dist.barrier()

    def maxreduce(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    base = torch.from_numpy(np.random.default_rng(rank).standard_normal(elements)
                            .astype(np.float32))
    out = {}
    buf = base.clone()

    def gloo():
        buf.copy_(base)
        dist.all_reduce(buf)
    fns, comms, bufs = {"gloo": gloo}, {}, {}
    for alg in ("ring", "multitree"):
        comms[alg] = comm = open_nic("torch", rank, world, f"ring:{world}", alg, verify=False)
        bufs[alg] = b = base.clone()

        def tn(comm=comm, b=b):
            b.copy_(base)
            comm.allreduce(b)
        fns[alg] = tn
    # interleaved: every repeat times gloo, ring and MultiTree back to back, so a load spike
    # on the shared machine hits all three; ratios are the median of per-repeat ratios
    times = _interleaved(fns, 3 * repeats, barrier, maxreduce)
    out["gloo_allreduce_s"] = statistics.median(times["gloo"])
    gloo_result = buf.clone()
    for alg, comm in comms.items():
        out[f"torch_{alg}_s"] = statistics.median(times[alg])
        out[f"torch_{alg}_vs_gloo"] = statistics.median(
            a / g for a, g in zip(times[alg], times["gloo"]))
        out[f"torch_{alg}_bytes_per_rank"] = comm.counters.bytes_sent // comm.counters.collectives
        out[f"torch_{alg}_max_abs_diff_vs_gloo"] = float((bufs[alg] - gloo_result).abs().max())
        out["torch_executor"] = comm.status()["executor"]
        comm.close()
    # sparse TopkA 1%
    comm = open_nic("torch", rank, world, f"ring:{world}", "ring", verify=False)
    b = base.clone()
    res = torch.zeros_like(b)
    stats = {}

    def sp():
        b.copy_(base)
        o = comm.sparse_allreduce(b, 0.01, scheme="topka", residual=res)
        stats["bytes"] = o.bytes_sent
    out["torch_topka_1pct_s"] = _timed(sp, repeats, barrier, maxreduce)
    out["torch_topka_1pct_bytes_per_rank"] = stats["bytes"]
    comm.close()
    # fabric server path: golden engine at full size; golden and RTL engines (when built) on
    # the demo bucket, one after the other in this run
    for key, addr, n in (("golden", address, elements), ("golden_demo", address, RTL_ELEMENTS),
                         ("rtl", rtl_address, RTL_ELEMENTS)):
        if addr is None:
            continue
        comm = open_nic("rtl", rank, world, f"ring:{world}", "multitree", **addr,
                        timeout=900)
        b = base[:n].clone()

        def rt():
            b.copy_(base[:n])
            comm.allreduce(b)
        out[f"server_{key}_s"] = _timed(rt, max(1, repeats // 2), barrier, maxreduce)
        calls = comm.counters.collectives
        out[f"server_{key}_cycles"] = (comm.counters.cycles // calls) if calls else None
        comm.close()
    return out


def _engines_side_by_side(sched, repeats: int) -> dict:
    """The engines alone on the demo bucket, no protocol: the Verilated fabric with the
    buffers through the DMA ports and through the host bus, and the golden executor --
    wall and CPU seconds (CPU time does not move with the other jobs on a shared machine),
    median of ``repeats``, every result checked bit for bit against golden."""
    import numpy as np
    from ..hdl.nic.fabric_sim import FabricSim
    from .fabric import GoldenEngine
    fs = FabricSim(sched.topology, sched, RTL_ELEMENTS)          # cached: the server's build
    golden = GoldenEngine(sched)
    bufs = np.random.default_rng(1).standard_normal((WORLD, RTL_ELEMENTS)).astype(np.float32)
    ref = np.asarray(golden.run(bufs)[0]).view(np.uint32)
    out = {}
    for key, fn in (("rtl_dma", lambda: fs.run(bufs, bulk="dma")[0]),
                    ("rtl_bus", lambda: fs.run(bufs, bulk="bus")[0]),
                    ("golden", lambda: golden.run(bufs)[0])):
        wall, cpu, exact = [], [], True
        for _ in range(repeats + 1):                     # the first is a warm-up
            t0, c0 = time.perf_counter(), time.process_time()
            res = fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            exact &= bool(np.array_equal(np.asarray(res).view(np.uint32), ref))
        out[key] = {"wall_s": statistics.median(wall[1:]), "cpu_s": statistics.median(cpu[1:]),
                    "bit_exact": exact}
        if key.startswith("rtl"):
            out[key].update({k: v for k, v in fs.last_timing.items() if k.endswith("cycles")})
    out["rtl_dma_vs_bus_cpu"] = out["rtl_dma"]["cpu_s"] / out["rtl_bus"]["cpu_s"]
    out["rtl_vs_golden_cpu"] = out["rtl_dma"]["cpu_s"] / out["golden"]["cpu_s"]
    return out


def run(out_dir="build/bench", quick: bool = False) -> dict:
    from .. import algorithms
    from .fabric import rtl_unavailable_reason
    from .launch import run_world
    from .server import ServerProcess

    elements = 4 * 1024 * 1024
    repeats = 3 if quick else 7
    sched = algorithms.build("multitree", f"ring:{WORLD}")
    reason = rtl_unavailable_reason(sched, elements=RTL_ELEMENTS)
    rtl_srv = None
    with ServerProcess(WORLD, "golden", collective_timeout=300) as srv:
        try:
            if reason is None:
                rtl_srv = ServerProcess(WORLD, "rtl", collective_timeout=900)
            per_rank = run_world(_bench_world, WORLD, elements, repeats, srv.endpoint,
                                 rtl_srv.endpoint if rtl_srv else None, timeout=1200,
                                 pg_timeout=900)
        finally:
            if rtl_srv is not None:
                rtl_srv.stop()
    r = per_rank[0]
    engines = _engines_side_by_side(sched, repeats) if reason is None else None
    dense_bytes = r["torch_ring_bytes_per_rank"]
    result = {
        "workers": WORLD, "elements": elements, "bytes_per_rank_buffer": 4 * elements,
        "repeats": repeats, "repeats_torch_vs_gloo": 3 * repeats,
        "gloo_allreduce_s": r["gloo_allreduce_s"],
        "treenic_torch_ring_s": r["torch_ring_s"],
        "treenic_torch_multitree_s": r["torch_multitree_s"],
        "torch_ring_vs_gloo": r["torch_ring_vs_gloo"],
        "torch_multitree_vs_gloo": r["torch_multitree_vs_gloo"],
        "torch_vs_gloo_method": "median over repeats of (treenic time / gloo time), gloo, "
                                "ring and MultiTree timed back to back in every repeat",
        "torch_executor": r["torch_executor"],
        "torch_vs_gloo_goals": {"ring": 1.2, "multitree": 1.5},
        "dense_bytes_per_rank": {"ring": dense_bytes,
                                 "multitree": r["torch_multitree_bytes_per_rank"]},
        "max_abs_diff_vs_gloo": {"ring": r["torch_ring_max_abs_diff_vs_gloo"],
                                 "multitree": r["torch_multitree_max_abs_diff_vs_gloo"]},
        "sparse_topka_1pct_s": r["torch_topka_1pct_s"],
        "sparse_topka_1pct_bytes_per_rank": r["torch_topka_1pct_bytes_per_rank"],
        "sparse_bytes_ratio_vs_dense_ring": r["torch_topka_1pct_bytes_per_rank"] / dense_bytes,
        "server_golden_multitree_s": r["server_golden_s"],
        "demo_bucket_elements": RTL_ELEMENTS,
        "golden_seconds_per_allreduce": r["server_golden_demo_s"],
        "rtl_seconds_per_allreduce": r.get("server_rtl_s"),
        "rtl_vs_golden": (r["server_rtl_s"] / r["server_golden_demo_s"]
                          if r.get("server_rtl_s") else None),
        "rtl_vs_golden_goal": 5.0,
        "rtl": {"available": reason is None, "reason": reason, "elements": RTL_ELEMENTS,
                "server_rtl_multitree_s": r.get("server_rtl_s"),
                "cycles": r.get("server_rtl_cycles")},
        # the engines alone (no protocol), DMA vs host-bus buffer path, wall and CPU
        "engines_side_by_side": engines,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "driver_bench.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(prog="python -m treenic.driver.bench")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    print(json.dumps(run(a.out, a.quick), indent=1))
