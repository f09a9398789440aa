"""``make bench`` section ``netsim``: the network model against the RTL, and at scale.

    python -m treenic.bench --only netsim [--quick] [--json]
    TREENIC_NETSIM_LIVE=1 python -m treenic.bench --only netsim   # re-measure the RTL now

* ``validation``: for every recorded Verilated fabric run (:mod:`.rtl_runs`), the RTL's
  cycles, the model's prediction and the relative error; ``max_error`` the largest.
  ``held_out``: recorded runs that are not rows, and why (a bank arbiter other than
  "fixed": the model has no bank arbitration).
  The RTL numbers come from ``rtl_cycles.json`` (with the command that reproduces them);
  with ``TREENIC_NETSIM_LIVE=1`` they are re-measured with Verilator first (tens of minutes).
* ``cycles_over_ideal``: store-and-forward against cut-through (``NicParams.forward``),
  cycles over the schedule's ideal: recorded RTL twins and the model from 32 B to 1 MiB
  per node (:mod:`.ideal_report`, plot ``cycles_over_ideal.png``).
* ``seconds_torus_32x32``: model time of one MultiTree all-reduce of 64 MiB on torus 32x32
  (the MultiTree compiler's own time is reported beside it, ``build_seconds``), and the
  curve of model time against transfers for tori 4x4 … 32x32 (``scaling``, plot).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from treenic.algorithms import build

from . import ideal_report, rtl_runs, sparse
from .sim import simulate
from .stalls import fabric_stalls
from .timing import PAPER, RTL, NicTiming

__all__ = ["run", "rtl_timing", "predict", "validation"]

SCALE_BYTES = 64 << 20


def rtl_timing(run: rtl_runs.RtlRun) -> NicTiming:
    """The model's parameters for one fabric configuration."""
    return RTL.with_(link_latency_cycles=run.latency, credits=run.credits, mode=run.mode,
                     sub_words=run.sub_words, packet_words=run.packet_words, stall=run.stall,
                     forward=run.forward)


def predict(run: rtl_runs.RtlRun, record: dict | None = None):
    """The model's prediction of one fabric run -> (SimResult, stall model used).

    A run with link stalls whose record says how far the links' LFSRs ran before START
    (``lfsr_steps_at_start``) is priced with every link's own stall cycles replayed
    (:func:`.stalls.fabric_stalls`, the RTL's LFSR and seeds); without that the stalls
    can only be priced as a mean rate (``NicTiming.stall``)."""
    sched = run.schedule()
    timing = rtl_timing(run)
    steps = (record or {}).get("lfsr_steps_at_start")
    if not run.stall:
        return simulate(sched, run.elements, timing), "none"
    if steps is None:
        return simulate(sched, run.elements, timing), "mean rate (LFSR start not recorded)"
    timing = timing.with_(stall=0)
    stalls = fabric_stalls(sched.topology, ports=rtl_runs.nic_params(run, sched).ports,
                           seed=run.seed, stall=run.stall, lfsr_steps_at_start=steps,
                           latency=run.latency, credits=run.credits,
                           credit_return=timing.credit_return)
    return simulate(sched, run.elements, timing, stalls=stalls), "LFSR replay"


def validation(records: dict | None = None) -> list[dict]:
    """Model against every recorded RTL run; a stalled run's further samples (the same
    build run again, its links' LFSRs further on: ``more_samples``) are rows of their own,
    named ``run@lfsr_steps_at_start``."""
    records = rtl_runs.load() if records is None else records
    out = []
    for r in rtl_runs.RUNS:
        rec = records.get(r.name)
        if rec is None or r.name in held_out(records):
            continue
        if r.sparse:
            out += _sparse_rows(r, rec)
            continue
        for k, sample in enumerate([rec, *rec.get("more_samples", ())]):
            res, stall_model = predict(r, sample)
            rtl = sample["cycles"]
            out.append({
                "run": r.name if k == 0 else f"{r.name}@{sample['lfsr_steps_at_start']}",
                "topology": r.topology, "algorithm": r.algorithm, "elements": r.elements,
                "mode": r.mode, "forward": r.forward, "stall": r.stall,
                "stall_model": stall_model,
                "lfsr_steps_at_start": sample.get("lfsr_steps_at_start"),
                "variant": r.variant or ("bound" if r.algorithm == "multitree" else None),
                "rtl_cycles": rtl, "model_cycles": round(res.cycles, 1),
                "error": round((res.cycles - rtl) / rtl, 4),
                "rtl_step_cycles_node0": sample.get("step_cycles_node0"),
                "model_step_cycles_node0": [round(x, 1) for x in res.step_cycles_node0]})
    return out


def held_out(records: dict) -> dict:
    """Recorded runs that are not validation rows -> why: those with a bank arbiter other
    than "fixed" (the model prices no bank arbitration; their cycles are in
    ``cycles_over_ideal``)."""
    return {r.name: f"arbiter={r.arbiter}: the model has no bank arbitration"
            for r in rtl_runs.RUNS if r.arbiter != "fixed" and r.name in records}


def _sparse_rows(r: rtl_runs.RtlRun, rec: dict) -> list[dict]:
    """MultiTree-Sparse on the sparse engine (:mod:`.sparse`): one row per sample (the
    same build run again on fresh random gradients, the residual kept in the NIC), named
    ``run#sample``; the program is the one the fabric ran (``compile_sparse``)."""
    prog = sparse.program_for(r)
    if r.lanes != sparse.SPARSE_RTL.lanes:
        raise ValueError(f"{r.name}: the sparse model is calibrated for W = "
                         f"{sparse.SPARSE_RTL.lanes} lanes, not {r.lanes}")
    tm = sparse.SPARSE_RTL.with_(link_latency=r.latency, topk_units=r.topk_units)
    model, nodes = sparse.predict(prog, tm, detail=True)
    rows = []
    for k, sample in enumerate([rec, *rec.get("more_samples", ())]):
        rtl = sample["cycles"]
        rows.append({
            "run": r.name if k == 0 else f"{r.name}#{k}", "topology": r.topology,
            "algorithm": r.algorithm, "elements": r.elements, "density": r.density,
            "mode": "sparse engine", "stall": r.stall, "stall_model": "none",
            "role": "held out",
            "rtl_cycles": rtl, "model_cycles": model, "error": round((model - rtl) / rtl, 4),
            "rtl_node_cycles": sample.get("node_cycles"), "model_node_cycles": nodes})
    return rows


def scaling(sizes, out_dir: Path) -> list[dict]:
    rows = []
    for k in sizes:
        spec = f"torus:{k}x{k}"
        t0 = time.perf_counter()
        s = build("multitree", spec)
        b = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        r = simulate(s, SCALE_BYTES // 4, PAPER)
        m, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"topology": spec, "nodes": s.n, "transfers": len(s.transfers),
                     "messages": r.messages, "build_seconds": round(b, 2),
                     "model_seconds": round(m, 2), "model_cpu_seconds": round(cpu, 2),
                     "engine": r.engine,
                     "allreduce_us": round(r.seconds * 1e6, 1),
                     "algbw_GBps": round(r.algbw() / 1e9, 2),
                     "busbw_GBps": round(r.busbw() / 1e9, 2)})
        print(f"netsim: {spec} {len(s.transfers)} transfers: model {m:.2f} s wall, "
              f"{cpu:.2f} s CPU (MultiTree build {b:.2f} s; load average "
              f"{os.getloadavg()[0]:.1f})", file=sys.stderr)
    _plot_scaling(rows, out_dir)
    return rows


def _plot_scaling(rows, out_dir: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = [r["transfers"] for r in rows]
    ax.loglog(x, [r["model_seconds"] for r in rows], "o-", label="network model")
    ax.loglog(x, [r["build_seconds"] for r in rows], "s--", label="MultiTree compiler")
    for r in rows:
        ax.annotate(r["topology"].split(":")[1], (r["transfers"], r["model_seconds"]),
                    fontsize=7)
    ax.set_xlabel("transfers")
    ax.set_ylabel("seconds (this machine)")
    ax.set_title("64 MiB MultiTree all-reduce on tori")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "scaling.png", dpi=120)
    plt.close(fig)


def run(out_dir, quick: bool = False) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    live = os.environ.get("TREENIC_NETSIM_LIVE") == "1"
    if live:
        print("netsim: TREENIC_NETSIM_LIVE=1: re-measuring the RTL runs with Verilator",
              file=sys.stderr)
        records = {r.name: rtl_runs.measure(r) for r in rtl_runs.RUNS
                   if not (quick and r.slow)}
    else:
        records = rtl_runs.load()
    val = validation(records)
    over_ideal = {"rtl": ideal_report.rtl_rows(records), "model": ideal_report.model_curves()}
    ideal_report.plot(over_ideal["rtl"], over_ideal["model"], out_dir / "cycles_over_ideal.png")
    sizes = [4, 8] if quick else [4, 8, 16, 32]
    rows = scaling(sizes, out_dir)
    big = next((r for r in rows if r["nodes"] == 1024), None)
    res = {"rtl_source": "measured now (Verilator)" if live else
           f"recorded in {rtl_runs.DATA_FILE.name} ({rtl_runs.COMMAND})",
           "validation": val, "held_out": held_out(records),
           "max_error": max((abs(v["error"]) for v in val), default=None),
           "seconds_torus_32x32": big["model_seconds"] if big else None,
           "cpu_seconds_torus_32x32": big["model_cpu_seconds"] if big else None,
           "load_average": round(os.getloadavg()[0], 1),
           "build_seconds_torus_32x32": big["build_seconds"] if big else None,
           "target_seconds_torus_32x32": 60,
           "scaling": rows, "cycles_over_ideal": over_ideal}
    if big is None:
        print("netsim: NOTICE: --quick leaves out torus 32x32 (seconds_torus_32x32 = null)",
              file=sys.stderr)
    (out_dir / "netsim.json").write_text(json.dumps(res, indent=1))
    (out_dir / "section.md").write_text(_markdown(res))
    return res


def _markdown(res) -> str:
    md = ["Network model (`treenic.netsim`) against the Verilated NIC fabric "
          f"(RTL cycles {res['rtl_source']}).", "",
          "| run | RTL cycles | model cycles | error |", "|---|---:|---:|---:|"]
    md += [f"| {v['run']} | {v['rtl_cycles']} | {v['model_cycles']} | {v['error']:+.1%} |"
           for v in res["validation"]]
    if res["max_error"] is not None:
        md += ["", f"Largest error: {res['max_error']:.1%} (target 5 %)."]
    if res["held_out"]:
        md += ["", "Recorded runs that are not validation rows: " + "; ".join(
            f"{n} ({why})" for n, why in res["held_out"].items()) + "."]
    md += ideal_report.markdown(res["cycles_over_ideal"]["rtl"])
    md += ["", "64 MiB MultiTree all-reduce on tori, model time against transfers "
           "(paper links: 16 GB/s, 150 ns):", "",
           "| topology | transfers | model s (wall) | model s (CPU) | compiler s | "
           "all-reduce µs | algbw GB/s | busbw GB/s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    md += [f"| {r['topology']} | {r['transfers']} | {r['model_seconds']} | "
           f"{r['model_cpu_seconds']} | "
           f"{r['build_seconds']} | {r['allreduce_us']} | {r['algbw_GBps']} | "
           f"{r['busbw_GBps']} |" for r in res["scaling"]]
    md += ["", "![model time against transfers](scaling.png)"]
    return "\n".join(md) + "\n"
