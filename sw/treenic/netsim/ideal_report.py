"""Cycles against the schedule's ideal, store-and-forward against cut-through (issue 20
item 2), for the ``netsim`` bench section.

* RTL rows: every recorded Verilated fabric run (:mod:`.rtl_runs`) that has a twin in the
  other forwarding mode (``NAME`` / ``NAME_cut``): the fabric's cycles over the ideal of
  :func:`treenic.hdl.nic.model.ideal_cycles` (per step, the most-loaded directed link's
  flits, summed over the steps) for the same images and NIC build.
* Model curves: the network model (:func:`.sim.simulate`, the RTL's timing, the runs' link
  knobs) over message sizes from 32 B to 1 MiB per node, both forwarding modes, against
  the same ideal.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from . import rtl_runs
from .sim import simulate

__all__ = ["rtl_rows", "model_curves", "plot", "SIZES_BYTES", "CUT_SUFFIX"]

#: bytes per node of the model curves: 32 B … 1 MiB
SIZES_BYTES = [32 << (2 * k) for k in range(8)] + [1 << 20]
#: a cut-through run's name is its store twin's with this suffix
CUT_SUFFIX = "_cut"
#: bank arbiters other than "fixed" whose cut-through runs the table shows
ARBITERS_MEASURED = ("rotating", "age")


def _ideal(run: rtl_runs.RtlRun, elements: int) -> int:
    from treenic.firmware.image import compile_images
    from treenic.hdl.nic.model import ideal_cycles
    sched = run.schedule()
    sized = replace(run, elements=elements)     # the NIC build sized for this message
    return ideal_cycles(compile_images(None, sched, elements),
                        rtl_runs.nic_params(sized, sched))


def rtl_rows(records: dict) -> list[dict]:
    """Recorded store/cut-through twins: cycles, ideal, cycles over ideal."""
    rows = []
    for cut in rtl_runs.RUNS:
        if not cut.name.endswith(CUT_SUFFIX):
            continue
        store = rtl_runs.BY_NAME.get(cut.name[:-len(CUT_SUFFIX)])
        if store is None or cut.name not in records or store.name not in records:
            continue
        ideal = _ideal(cut, cut.elements)
        s, c = records[store.name]["cycles"], records[cut.name]["cycles"]
        rows.append({"run": store.name, "topology": cut.topology, "algorithm": cut.algorithm,
                     "variant": cut.variant or ("bound" if cut.algorithm == "multitree" else None),
                     "elements": cut.elements,
                     "bytes_per_node": 4 * cut.elements, "ideal_cycles": ideal,
                     "store_cycles": s, "cut_through_cycles": c,
                     "store_over_ideal": round(s / ideal, 3),
                     "cut_through_over_ideal": round(c / ideal, 3),
                     **_other_arbiters(cut, records, ideal)})
    return rows


def _other_arbiters(cut: rtl_runs.RtlRun, records: dict, ideal: int) -> dict:
    """The cut-through run again with another bank arbiter (``NicParams.arbiter``): its
    name is the run's with ``_<arbiter>`` appended; None where not recorded."""
    out = {}
    for arb in ARBITERS_MEASURED:
        rec = records.get(f"{cut.name}_{arb}")
        c = rec["cycles"] if rec else None
        out[f"cut_through_{arb}_cycles"] = c
        out[f"cut_through_{arb}_over_ideal"] = round(c / ideal, 3) if c else None
    return out


def model_curves(names=("ring8_1000", "torus4x4_1000")) -> list[dict]:
    """The model's cycles over the ideal for each named run's fabric, over SIZES_BYTES."""
    from .bench import rtl_timing
    out = []
    for name in names:
        run = rtl_runs.BY_NAME[name]
        sched = run.schedule()
        timing = rtl_timing(run)
        for size in SIZES_BYTES:
            e = max(1, size // 4)
            ideal = _ideal(run, e)
            row = {"run": name, "bytes_per_node": size, "ideal_cycles": ideal}
            for fwd in ("store", "cut-through"):
                cyc = simulate(sched, e, timing.with_(forward=fwd)).cycles
                row[f"{fwd.replace('-', '_')}_over_ideal"] = round(cyc / ideal, 3)
            out.append(row)
    return out


def plot(rtl: list[dict], model: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, name in enumerate(dict.fromkeys(r["run"] for r in model)):
        rows = [r for r in model if r["run"] == name]
        x = [r["bytes_per_node"] for r in rows]
        run = rtl_runs.BY_NAME[name]
        what = f"{run.topology} {run.algorithm}"
        ax.loglog(x, [r["store_over_ideal"] for r in rows], "--", color=f"C{k}",
                  label=f"{what}: model, store")
        ax.loglog(x, [r["cut_through_over_ideal"] for r in rows], "-", color=f"C{k}",
                  label=f"{what}: model, cut-through")
    for r in rtl:
        ax.plot(r["bytes_per_node"], r["store_over_ideal"], "kx")
        ax.plot(r["bytes_per_node"], r["cut_through_over_ideal"], "ko", fillstyle="none")
    ax.plot([], [], "kx", label="RTL (Verilator), store")
    ax.plot([], [], "ko", fillstyle="none", label="RTL (Verilator), cut-through")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("bytes per node")
    ax.set_ylabel("cycles / ideal (log)")
    ax.set_title("All-reduce cycles over the schedule's ideal")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(rtl: list[dict]) -> list[str]:
    md = ["", "Cycles over the schedule's ideal, store-and-forward against cut-through "
          "(`NicParams.forward`), Verilated fabric (recorded runs):", "",
          "| run | bytes/node | ideal | store | cut-through | store/ideal | "
          "cut-through/ideal | " + " | ".join(f"cut-through, {a} arbiter (/ideal)"
                                              for a in ARBITERS_MEASURED) + " |",
          "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(ARBITERS_MEASURED)]
    md += [f"| {r['run']} | {r['bytes_per_node']} | {r['ideal_cycles']} | "
           f"{r['store_cycles']} | {r['cut_through_cycles']} | {r['store_over_ideal']} | "
           f"{r['cut_through_over_ideal']} | " + " | ".join(
               f"{r[f'cut_through_{a}_cycles']} ({r[f'cut_through_{a}_over_ideal']})"
               if r.get(f"cut_through_{a}_cycles") else "not recorded"
               for a in ARBITERS_MEASURED) + " |" for r in rtl]
    md += ["", "![cycles over ideal against message size](cycles_over_ideal.png)"]
    return md
