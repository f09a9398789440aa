"""Dense all-reduce benchmark: the MultiTree paper's Fig. 9 study under treenic's timing models,
MultiTree construction time, and MultiTree all-gather steps against a lower bound.

``run(out_dir, quick=False) -> dict`` writes into ``out_dir``:

* ``dense_bandwidth_contention.png`` / ``dense_bandwidth_alpha_beta.png`` — all-reduce
  bandwidth (data size ÷ modelled time, GB/s) against data size (32 KiB … 64 MiB) for every
  applicable algorithm on torus 4x4/8x8, mesh 4x4/8x8, fattree:16, fattree:64, bigraph:4x8,
  bigraph:4x16 (paper Fig. 9 layout);
* ``dense.md`` — a markdown section with the tables behind the plots, the Fig. 9 claims
  checked on the numbers, construction times and the step bound table;
* ``dense.json`` — every number.

Models (``treenic.schedule.cost``, evaluated on each algorithm's Schedule IR, never re-derived):
*contention* — per step the most-loaded directed link's bytes ÷ bandwidth plus the longest
route's latency; *α–β* — per step α plus the most bytes any node sends ÷ bandwidth (one port
per node, topology-blind). 16 GB/s links, 150 ns latency (paper Table III). These are
analytic step models, not BookSim: they show the structure of Fig. 9 (step counts, link
utilisation, contention), not its absolute numbers.

Every schedule is checked (postcondition, dependencies; link conflicts reported) before it is
costed. An algorithm that does not apply to a topology (2D-Ring off grids, HDRM off BiGraph)
is listed as n/a; one that fails to build is reported with its error, never silently dropped.

Step lower bound (part c). In an all-gather every chunk must reach N−1 nodes: N(N−1)
deliveries. A delivery enters its destination over a directed link whose head is that end
node, and MultiTree moves one chunk per link per step, so with L = the number of directed
links into end nodes (direct networks: all node-to-node links; switch networks: the
switch→node links, i.e. N for single-homed nodes) the all-gather needs at least
⌈N(N−1)/L⌉ steps. Two refinements give the tighter reported bound: per node,
⌈(N−1)/indeg(v)⌉ (mesh corners have 2 links in), and on direct networks the diameter (the
farthest node is that many one-hop steps from a root). On switch networks one step may cross
several links, so the diameter term is 1.

Command: ``python -m treenic.bench_dense --out build/bench [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import networkx as nx

from .algorithms import build
from .schedule.check import check_all, link_loads
from .schedule.cost import alpha_beta, contention
from .schedule.ir import ScheduleError
from .topology import is_switch, parse

TOPOLOGIES = ["torus:4x4", "torus:8x8", "mesh:4x4", "mesh:8x8",
              "fattree:16", "fattree:64", "bigraph:4x8", "bigraph:4x16"]
QUICK_TOPOLOGIES = ["torus:4x4", "torus:8x8", "bigraph:4x8"]
ALGORITHMS = ["multitree", "ring", "ring2d", "dbtree", "dbtree-p8", "halving-doubling", "hdrm"]
#: DBTree with each tree's half split into this many pipelined sub-chunks (NCCL pipelines
#: its tree all-reduce over many small chunks; the paper's BookSim runs pipeline by packets)
DBTREE_PIPELINE = 8
KIB, MIB = 1024, 1024 * 1024
SIZES = [32 * KIB << i for i in range(12)]                 # 32 KiB .. 64 MiB
QUICK_SIZES = [32 * KIB, 64 * MIB]
CONSTRUCTION = [("torus:16x16", 2.0), ("torus:32x32", 60.0)]
BOUND_TOPOLOGIES = ["torus:4x4", "torus:4x8", "torus:8x8", "torus:16x16", "mesh:4x4",
                    "mesh:8x8", "mesh:16x16", "switch:6", "switch:12", "fattree:12",
                    "fattree:16", "fattree:18", "fattree:64", "bigraph:4x8", "bigraph:8x4",
                    "bigraph:4x16", "dgx2"]
QUICK_BOUND_TOPOLOGIES = ["torus:4x4", "mesh:4x4", "switch:6", "fattree:16"]


def _progress(it, desc, total=None):
    try:
        from tqdm import tqdm
        return tqdm(it, desc=desc, total=total, leave=False, dynamic_ncols=True)
    except ImportError:                                  # pragma: no cover
        return it


def _size_label(b: int) -> str:
    return f"{b // MIB} MiB" if b >= MIB else f"{b // KIB} KiB"


def _max_sharing(schedule) -> int:
    """Most transfers that cross one directed link pair in one step, per parallel link."""
    g = schedule.topology.graph
    worst = 0
    for counter in link_loads(schedule).values():
        for (u, v), k in counter.items():
            worst = max(worst, math.ceil(k / g.number_of_edges(u, v)))
    return worst


def _build(name: str, topo):
    if name == "dbtree-p8":
        from .algorithms import dbtree
        t0 = time.perf_counter()
        s = dbtree.build(topo, pipeline=DBTREE_PIPELINE)
        s.build_seconds = time.perf_counter() - t0
        return s
    return build(name, topo)


def no_sharing_time(schedule, elements: int, itemsize: int = 4) -> float:
    """The contention model's time with link sharing removed: per step, the slowest single
    transfer (bytes ÷ its route's narrowest link) plus the longest route latency. The ratio
    contention() / no_sharing_time() is the slowdown caused purely by link contention."""
    topo = schedule.topology
    total = 0.0
    for _, transfers in schedule.by_step().items():
        if not transfers:
            continue
        worst, lat = 0.0, 0.0
        for t in transfers:
            path = schedule.route(t)
            links = [topo.link(u, v) for u, v in zip(path, path[1:])]
            worst = max(worst, schedule.bytes_of(t, elements, itemsize) /
                        min(d["bandwidth"] for d in links))
            lat = max(lat, sum(d["latency"] for d in links))
        total += worst + lat
    return total


# ---- (a) bandwidth ------------------------------------------------------------------------

def bandwidth_study(topologies, sizes) -> dict:
    out = {}
    jobs = [(t, a) for t in topologies for a in ALGORITHMS]
    for spec, name in _progress(jobs, "dense bandwidth"):
        topo = parse(spec)
        rec = {"status": "ok"}
        try:
            s = _build(name, topo)
        except ScheduleError as e:
            out.setdefault(spec, {})[name] = {"status": "n/a", "reason": str(e)}
            continue
        except Exception as e:                       # reported, never silently dropped
            out.setdefault(spec, {})[name] = {"status": "error",
                                              "reason": f"{type(e).__name__}: {e}"}
            continue
        summary = check_all(s)
        rec.update(steps=s.steps, reduce_steps=s.reduce_steps, gather_steps=s.gather_steps,
                   chunks=s.num_chunks, transfers=len(s.transfers),
                   build_seconds=s.build_seconds, link_conflicts=summary["link_conflicts"],
                   max_link_sharing=_max_sharing(s),
                   contention_gbps={}, alpha_beta_gbps={}, contention_us={}, alpha_beta_us={})
        for size in sizes:
            elements = size // 4
            tc = contention(s, elements)
            ta = alpha_beta(s, elements)
            rec["contention_us"][size] = tc * 1e6
            rec["alpha_beta_us"][size] = ta * 1e6
            rec["contention_gbps"][size] = size / tc / 1e9
            rec["alpha_beta_gbps"][size] = size / ta / 1e9
        big = sizes[-1]
        rec["contention_slowdown"] = rec["contention_us"][big] / (
            no_sharing_time(s, big // 4) * 1e6)
        out.setdefault(spec, {})[name] = rec
    return out


def fig9_claims(study: dict, largest: int) -> list[dict]:
    """The paper's Fig. 9 statements, evaluated on the numbers (contention model)."""
    claims = []

    def bw(spec, name, size=largest):
        r = study.get(spec, {}).get(name, {})
        return r.get("contention_gbps", {}).get(size) if r.get("status") == "ok" else None

    for spec in ("torus:8x8", "torus:4x4"):
        if spec not in study:
            continue
        mt, r2, rg = bw(spec, "multitree"), bw(spec, "ring2d"), bw(spec, "ring")
        if mt is not None and r2 is not None and rg is not None:
            claims.append({"claim": f"MultiTree beats 2D-Ring and Ring at {_size_label(largest)} "
                                    f"on {spec}",
                           "holds": mt > r2 and mt > rg,
                           "numbers": f"MultiTree {mt:.2f}, 2D-Ring {r2:.2f}, Ring {rg:.2f} GB/s"})
        for key in ("dbtree", "dbtree-p8"):
            db = study[spec].get(key, {})
            if db.get("status") != "ok":
                continue
            others = [bw(spec, a) for a in ("multitree", "ring", "ring2d")]
            others = [x for x in others if x is not None]
            slowest = bw(spec, key) < min(others)
            if key == "dbtree":      # step model: a whole half per step, little overlap
                claim = f"DBTree (step model) is slower than MultiTree/Ring/2D-Ring on {spec}"
                holds = slowest
            else:
                claim = f"{STYLE[key][0]} suffers link contention on {spec}"
                holds = db["link_conflicts"] > 0 and db["contention_slowdown"] > 1.2 and slowest
            claims.append({"claim": claim, "holds": holds,
                           "numbers": f"{db['link_conflicts']} link conflicts, up to "
                                      f"{db['max_link_sharing']} transfers on one link in a "
                                      f"step, {db['contention_slowdown']:.2f}× slower than "
                                      f"the same schedule without link sharing; "
                                      f"{bw(spec, key):.2f} GB/s vs "
                                      f"{min(others):.2f} for the slowest of MultiTree/Ring/"
                                      f"2D-Ring"})
    return claims


# ---- (b) construction time ----------------------------------------------------------------

def construction_study(quick: bool) -> list[dict]:
    out = []
    cases = CONSTRUCTION[:1] if quick else CONSTRUCTION
    for spec, target in _progress(cases, "MultiTree construction"):
        topo = parse(spec)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            s = build("multitree", topo)
            secs, cpu = time.perf_counter() - t0, time.process_time() - c0
            out.append({"topology": spec, "nodes": topo.n, "seconds": secs, "cpu_seconds": cpu,
                        "target_seconds": target, "meets_target": secs <= target,
                        "steps": s.steps, "transfers": len(s.transfers)})
        except Exception as e:
            out.append({"topology": spec, "nodes": topo.n, "error": f"{type(e).__name__}: {e}",
                        "target_seconds": target})
    if quick:
        out.append({"topology": CONSTRUCTION[1][0], "skipped": "quick mode",
                    "target_seconds": CONSTRUCTION[1][1]})
    return out


# ---- (c) step bound -----------------------------------------------------------------------

def allgather_lower_bound(topo) -> dict:
    g = topo.graph
    n = topo.n
    into = {v: g.in_degree(v) for v in topo.nodes}      # parallel links counted
    L = sum(into.values())
    simple = math.ceil(n * (n - 1) / L)
    per_node = max(math.ceil((n - 1) / d) for d in into.values())
    diameter = nx.diameter(nx.Graph(g)) if topo.is_direct else 1
    return {"L": L, "ceil_N(N-1)/L": simple, "per_node": per_node, "diameter": diameter,
            "bound": max(simple, per_node, diameter)}


def bound_study(topologies) -> list[dict]:
    out = []
    for spec in _progress(topologies, "all-gather step bound"):
        topo = parse(spec)
        rec = {"topology": spec, "nodes": topo.n, **allgather_lower_bound(topo)}
        try:
            s = build("multitree", topo)
            rec["multitree_allgather_steps"] = s.gather_steps
            rec["multitree_construction"] = s.meta["construction"]
            rec["ratio_to_bound"] = s.gather_steps / rec["bound"]
            rec["multitree_paper_allgather_steps"] = build("multitree", topo,
                                                           variant="paper").gather_steps
            rec["ring_allgather_steps"] = build("ring", topo).gather_steps
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        out.append(rec)
    return out


# ---- plots and markdown -------------------------------------------------------------------

STYLE = {"multitree": ("MultiTree", "tab:red", "o"), "ring": ("Ring", "tab:blue", "s"),
         "ring2d": ("2D-Ring", "tab:green", "^"), "dbtree": ("DBTree", "tab:orange", "v"),
         "dbtree-p8": (f"DBTree ({DBTREE_PIPELINE}-way pipelined)", "tab:olive", "<"),
         "halving-doubling": ("Halving-doubling", "tab:purple", "D"),
         "hdrm": ("HDRM", "tab:brown", "P")}


def plot(study: dict, sizes, model: str, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    specs = list(study)
    cols = 4 if len(specs) > 4 else len(specs)
    rows = math.ceil(len(specs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, spec in zip(axes.flat, specs):
        for name in ALGORITHMS:
            r = study[spec].get(name, {})
            if r.get("status") != "ok":
                continue
            label, color, marker = STYLE[name]
            ax.plot(range(len(sizes)), [r[f"{model}_gbps"][s] for s in sizes], label=label,
                    color=color, marker=marker, ms=4, lw=1.4)
        ax.set_title(spec, fontsize=10)
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([_size_label(s).replace(" ", "") for s in sizes], rotation=60,
                           fontsize=7)
        ax.set_ylabel("all-reduce bandwidth (GB/s)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(specs):]:
        ax.axis("off")
    title = {"contention": "contention model (link sharing, route latency)",
             "alpha_beta": "α–β model (one port per node)"}[model]
    fig.suptitle(f"treenic dense all-reduce bandwidth — {title}; 16 GB/s, 150 ns links",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(res: dict) -> str:
    sizes = res["sizes"]
    show = [s for s in (32 * KIB, 1 * MIB, 64 * MIB) if s in sizes]
    L = ["## Dense all-reduce (`treenic.bench_dense`)", "",
         f"Mode: {'quick' if res['quick'] else 'full'}; links 16 GB/s, 150 ns. Bandwidth = "
         "all-reduce data size ÷ modelled time (GB/s), from the Schedule IR of each algorithm "
         "under `treenic.schedule.cost` (contention model / α–β model). Plots: "
         "`dense_bandwidth_contention.png`, `dense_bandwidth_alpha_beta.png`.", "",
         "### (a) Algorithm comparison (paper Fig. 9)", ""]
    head = "| topology | algorithm | steps | link conflicts | max on a link | " + \
        f"contention slowdown @{_size_label(sizes[-1])} | " + \
        " | ".join(f"cont. {_size_label(s)}" for s in show) + " | " + \
        " | ".join(f"α–β {_size_label(s)}" for s in show) + " |"
    L += [head, "|" + "---|" * (6 + 2 * len(show))]
    for spec, algs in res["bandwidth"].items():
        for name in ALGORITHMS:
            r = algs.get(name)
            if r is None:
                continue
            if r["status"] != "ok":
                if r["status"] == "error":
                    L.append(f"| {spec} | {STYLE[name][0]} | error: {r['reason']} |" +
                             " |" * (4 + 2 * len(show)))
                continue
            L.append(f"| {spec} | {STYLE[name][0]} | {r['steps']} | {r['link_conflicts']} | "
                     f"{r['max_link_sharing']} | {r['contention_slowdown']:.2f}× | " +
                     " | ".join(f"{r['contention_gbps'][s]:.2f}" for s in show) + " | " +
                     " | ".join(f"{r['alpha_beta_gbps'][s]:.2f}" for s in show) + " |")
    L += ["", "Fig. 9 statements checked on these numbers (contention model):", ""]
    for c in res["claims"]:
        L.append(f"- {'✔' if c['holds'] else '✘'} {c['claim']}: {c['numbers']}")
    L += ["", "### (b) MultiTree construction time", "",
          "Wall-clock seconds of `build(\"multitree\", topo)` (CPU seconds of this process in "
          "brackets: they differ when the machine is shared).", "",
          "| topology | nodes | seconds | target | meets | steps |", "|---|---|---|---|---|---|"]
    for c in res["construction"]:
        if "seconds" in c:
            L.append(f"| {c['topology']} | {c['nodes']} | {c['seconds']:.2f} "
                     f"({c['cpu_seconds']:.2f} CPU) | "
                     f"≤ {c['target_seconds']:.0f} | {'yes' if c['meets_target'] else 'NO'} | "
                     f"{c['steps']} |")
        else:
            why = c.get("skipped") or c.get("error")
            L.append(f"| {c['topology']} | {c.get('nodes', '')} | {why} | "
                     f"≤ {c['target_seconds']:.0f} | | |")
    L += ["", "### (c) MultiTree all-gather steps vs lower bound", "",
          "L = directed links into end nodes (direct: node-to-node links; switch networks: "
          "switch→node links). Bound = max(⌈N(N−1)/L⌉, max_v ⌈(N−1)/indeg v⌉, diameter on "
          "direct networks).", "",
          "MultiTree = the default `variant=\"bound\"` (rule that built it in the last column); "
          "Algorithm 1 as printed = `variant=\"paper\"`.", "",
          "| topology | N | L | ⌈N(N−1)/L⌉ | per-node | diameter | bound | MultiTree AG steps | "
          "ratio | Algorithm 1 as printed | Ring | rule |", "|---|---|---|---|---|---|---|---|---|"
          "---|---|---|"]
    for b in res["bounds"]:
        got = b.get("multitree_allgather_steps", b.get("error", ""))
        ratio = f"{b['ratio_to_bound']:.2f}" if "ratio_to_bound" in b else ""
        L.append(f"| {b['topology']} | {b['nodes']} | {b['L']} | {b['ceil_N(N-1)/L']} | "
                 f"{b['per_node']} | {b['diameter']} | {b['bound']} | {got} | {ratio} | "
                 f"{b.get('multitree_paper_allgather_steps', '')} | "
                 f"{b.get('ring_allgather_steps', '')} | "
                 f"{b.get('multitree_construction', '')} |")
    L += ["", f"Benchmark wall time: {res['seconds']:.1f} s.", ""]
    return "\n".join(L)


def run(out_dir: pathlib.Path, quick: bool = False) -> dict:
    t0 = time.perf_counter()
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = QUICK_SIZES if quick else SIZES
    study = bandwidth_study(QUICK_TOPOLOGIES if quick else TOPOLOGIES, sizes)
    res = {"quick": quick, "sizes": sizes, "bandwidth": study,
           "claims": fig9_claims(study, sizes[-1]),
           "construction": construction_study(quick),
           "bounds": bound_study(QUICK_BOUND_TOPOLOGIES if quick else BOUND_TOPOLOGIES)}
    plots = {}
    for model in ("contention", "alpha_beta"):
        p = out_dir / f"dense_bandwidth_{model}.png"
        plot(study, sizes, model, p)
        plots[model] = str(p)
    res["plots"] = plots
    res["seconds"] = time.perf_counter() - t0
    md = markdown(res)
    (out_dir / "dense.md").write_text(md)
    res["markdown"] = md
    (out_dir / "dense.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="treenic dense all-reduce benchmark")
    ap.add_argument("--out", default="build/bench", type=pathlib.Path)
    ap.add_argument("--quick", action="store_true", help="small subset (smoke test)")
    args = ap.parse_args(argv)
    res = run(args.out, quick=args.quick)
    print(res["markdown"])


if __name__ == "__main__":
    main()
