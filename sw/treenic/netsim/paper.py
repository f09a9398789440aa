"""``make bench`` section ``paper``: the MultiTree paper's studies under the network model.

    python -m treenic.bench --only paper [--quick] [--json]

Every time here comes from :func:`treenic.netsim.sim.simulate` — each algorithm's Schedule
IR run through the NIC tables (lockstep, store-and-forward per step) on the topology's links
(16 GB/s, 150 ns: the paper's Table III; 128-bit flits at 1 GHz; credits covering the link's
bandwidth-delay product) — except the sparse study, whose host-driven traffic is priced by
:func:`treenic.netsim.messages.simulate_messages` on the same links. Bandwidths are reported
the way nccl-tests does: ``algbw = bytes / time``, ``busbw = algbw · 2(N−1)/N``.

* **Fig. 9**: all-reduce algbw/busbw against size on torus/mesh 4x4 and 8x8, a fat-tree and
  a BiGraph, every algorithm, MultiTree with message-based and with packet-based flow
  control (256-byte packets).
* **DNN study**: one training iteration's gradient all-reduce (fp32, DDP's 25 MiB buckets,
  one after another) for AlexNet, GoogLeNet, ResNet-50, VGG-16 and Transformer-base, from
  their published layer shapes / parameter counts (no downloads).
* **Scalability**: 64 MiB on tori from 4x4 up to 16x16 (32x32 is in section ``netsim``).
* **Sparse**: SparDL, Ok-Topk, gTopk, TopkA (AGsparse), Zen and MultiTree-Sparse on tori as
  P grows — bytes per worker from the golden models, time on the same links.

Each table is printed beside the paper's reported numbers (2.3× over Ring and 1.56× over
2D-Ring on average; ~6 % from message-based flow control), with an account of the gaps.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from treenic.algorithms import build

from .sim import simulate
from .timing import PAPER

__all__ = ["run", "PAPER_TIMING", "dnn_gradients", "DNN_MODELS"]

PAPER_TIMING = PAPER
PACKET_TIMING = PAPER_TIMING.with_(mode="packet", packet_words=64)      # 256-byte packets
BUCKET_BYTES = 25 << 20                                                 # DDP's default

FIG9_TOPOLOGIES = ["torus:4x4", "torus:8x8", "mesh:4x4", "mesh:8x8", "fattree:16",
                   "bigraph:4x4"]
FIG9_SIZES = [32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20]


def _algorithms(spec: str) -> list[str]:
    algs = ["ring", "dbtree", "halving-doubling"]
    if spec.startswith(("torus", "mesh")):
        algs.append("ring2d")
    if spec.startswith("bigraph"):
        algs.append("hdrm")
    return algs + ["multitree", "multitree-packet"]


def _time(schedule, nbytes: int, packet: bool = False):
    r = simulate(schedule, max(1, nbytes // 4), PACKET_TIMING if packet else PAPER_TIMING)
    return r


def _bw(nbytes, seconds, n):
    alg = nbytes / seconds
    return round(alg / 1e9, 3), round(alg * 2 * (n - 1) / n / 1e9, 3)


# ---- Fig. 9 ----------------------------------------------------------------------------

def fig9(topologies, sizes) -> list[dict]:
    rows = []
    for spec in topologies:
        for alg in _algorithms(spec):
            s = build(alg.replace("-packet", ""), spec)
            for nbytes in sizes:
                r = _time(s, nbytes, packet=alg.endswith("-packet"))
                algbw, busbw = _bw(nbytes, r.seconds, s.n)
                rows.append({"topology": spec, "algorithm": alg, "bytes": nbytes,
                             "us": round(r.seconds * 1e6, 2), "algbw_GBps": algbw,
                             "busbw_GBps": busbw, "engine": r.engine})
        print(f"paper: fig9 {spec} done", file=sys.stderr)
    return rows


def _speedups(rows, over: str, key=("topology", "bytes")) -> list[float]:
    t = {(r[key[0]], r[key[1]], r["algorithm"]): r["us"] for r in rows}
    return [t[(a, b, over)] / t[(a, b, "multitree")] for (a, b, alg) in t
            if alg == "multitree" and (a, b, over) in t]


# ---- DNN study -------------------------------------------------------------------------

def _conv(cin, cout, k):
    return cin * cout * k * k + cout


def _fc(i, o):
    return i * o + o


def _alexnet() -> list[int]:
    """Krizhevsky et al. 2012 (single-tower form, as torchvision): 5 conv + 3 FC layers."""
    return [_conv(3, 64, 11), _conv(64, 192, 5), _conv(192, 384, 3), _conv(384, 256, 3),
            _conv(256, 256, 3), _fc(256 * 6 * 6, 4096), _fc(4096, 4096), _fc(4096, 1000)]


def _vgg16() -> list[int]:
    """Simonyan & Zisserman 2015, configuration D: 13 3x3 conv + 3 FC layers."""
    cfg = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    layers, cin = [], 3
    for c in cfg:
        layers.append(_conv(cin, c, 3))
        cin = c
    return layers + [_fc(512 * 7 * 7, 4096), _fc(4096, 4096), _fc(4096, 1000)]


#: parameters per model: layer lists where the architecture is a short list of shapes,
#: published totals otherwise (GoogLeNet: Szegedy et al. 2015 Table 1, 6.8 M;
#: ResNet-50: He et al. 2016, 25.6 M; Transformer base: Vaswani et al. 2017 Table 3, 65 M)
DNN_MODELS = {
    "AlexNet": _alexnet,
    "GoogLeNet": lambda: [6_800_000],
    "ResNet-50": lambda: [25_557_032],
    "VGG-16": _vgg16,
    "Transformer": lambda: [65_000_000],
}


def dnn_gradients(name: str) -> int:
    """fp32 gradient bytes of one model."""
    return 4 * sum(DNN_MODELS[name]())


def _allreduce_buckets(schedule, nbytes, packet=False) -> float:
    """Seconds to all-reduce ``nbytes`` in DDP buckets, one after another."""
    full, rest = divmod(nbytes, BUCKET_BYTES)
    t = full * _time(schedule, BUCKET_BYTES, packet).seconds if full else 0.0
    return t + (_time(schedule, rest, packet).seconds if rest else 0.0)


def dnn_study(topologies) -> list[dict]:
    rows = []
    for spec in topologies:
        scheds = {a: build(a, spec) for a in ("ring", "ring2d", "multitree")}
        for model in DNN_MODELS:
            nbytes = dnn_gradients(model)
            t = {a: _allreduce_buckets(s, nbytes) for a, s in scheds.items()}
            t["multitree-packet"] = _allreduce_buckets(scheds["multitree"], nbytes, True)
            rows.append({"topology": spec, "model": model, "gradient_MiB": round(nbytes / 2**20, 1),
                         **{f"{a}_ms": round(v * 1e3, 3) for a, v in t.items()},
                         "speedup_vs_ring": round(t["ring"] / t["multitree"], 3),
                         "speedup_vs_ring2d": round(t["ring2d"] / t["multitree"], 3),
                         "message_fc_gain": round(t["multitree-packet"] / t["multitree"] - 1, 4)})
        print(f"paper: dnn {spec} done", file=sys.stderr)
    return rows


# ---- scalability -----------------------------------------------------------------------

def scalability(sides, nbytes=64 << 20) -> list[dict]:
    rows = []
    for k in sides:
        spec = f"torus:{k}x{k}"
        for alg in ("ring", "ring2d", "multitree"):
            s = build(alg, spec)
            r = _time(s, nbytes)
            algbw, busbw = _bw(nbytes, r.seconds, s.n)
            rows.append({"topology": spec, "nodes": s.n, "algorithm": alg, "steps": s.steps,
                         "us": round(r.seconds * 1e6, 1), "algbw_GBps": algbw,
                         "busbw_GBps": busbw})
        print(f"paper: scalability {spec} done", file=sys.stderr)
    return rows


# ---- sparse ----------------------------------------------------------------------------

SPARSE_ALGS = ["spardl", "oktopk", "gtopk", "topka", "zen", "multitree-sparse"]
_TORI = {4: "mesh:2x2", 8: "torus:4x2", 16: "torus:4x4", 32: "torus:8x4", 64: "torus:8x8"}


def sparse_study(workers, elements=1 << 18, density=0.01) -> list[dict]:
    from treenic import topology as topo_mod
    from treenic.sparse.base import make

    from .messages import record, simulate_messages
    rows = []
    for P in workers:
        spec = _TORI[P]
        topo = topo_mod.parse(spec)
        rng = np.random.default_rng(P)
        shared = rng.standard_normal(elements).astype(np.float32)
        for alg in SPARSE_ALGS:
            kw = {"topology": spec} if alg == "multitree-sparse" else {}
            m = make(alg, workers=P, elements=elements, density=density, seed=1, **kw)
            grads = lambda: (shared + rng.standard_normal((P, elements)).astype(np.float32))  # noqa
            m.step(grads())                               # warm the error feedback
            with record() as steps:
                res = m.step(grads())
            sim = simulate_messages(topo, steps, PAPER_TIMING)
            sent = res.bytes_sent_per_worker()
            rows.append({"workers": P, "topology": spec, "algorithm": alg,
                         "steps": sim["steps"], "sent_per_worker_max_KiB": round(sent.max() / 1024, 1),
                         "sent_per_worker_mean_KiB": round(sent.mean() / 1024, 1),
                         "us": round(sim["seconds"] * 1e6, 2)})
        print(f"paper: sparse P={P} done", file=sys.stderr)
    return rows


# ---- report ----------------------------------------------------------------------------

def run(out_dir, quick: bool = False) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    topos = ["torus:4x4", "mesh:4x4", "fattree:16"] if quick else FIG9_TOPOLOGIES
    sizes = [32 << 10, 2 << 20, 64 << 20] if quick else FIG9_SIZES
    f9 = fig9(topos, sizes)
    dnn = dnn_study(["torus:4x4"] if quick else ["torus:4x4", "torus:8x8"])
    scal = scalability([4, 8] if quick else [4, 8, 16])
    sparse = sparse_study([4, 8, 16] if quick else [4, 8, 16, 32])
    tori = [r for r in f9 if r["topology"].startswith("torus")]
    summary = {
        "fig9_speedup_vs_ring_mean": _gmean(_speedups(tori, "ring")),
        "fig9_speedup_vs_ring2d_mean": _gmean(_speedups(tori, "ring2d")),
        "fig9_message_fc_gain_mean": _gmean(_speedups(f9, "multitree-packet")) - 1,
        "dnn_speedup_vs_ring_mean": _gmean([r["speedup_vs_ring"] for r in dnn]),
        "dnn_speedup_vs_ring2d_mean": _gmean([r["speedup_vs_ring2d"] for r in dnn]),
        "dnn_message_fc_gain_mean": float(np.mean([r["message_fc_gain"] for r in dnn])),
        "paper": {"speedup_vs_ring": 2.3, "speedup_vs_ring2d": 1.56, "message_fc_gain": 0.06},
    }
    res = {"timing": {"flit_bytes": PAPER_TIMING.flit_bytes, "clock_hz": PAPER_TIMING.clock_hz,
                      "link": "16 GB/s, 150 ns (Table III)", "packet_bytes": 256},
           "summary": summary, "fig9": f9, "dnn": dnn, "scalability": scal, "sparse": sparse,
           "model_seconds": round(time.perf_counter() - t0, 1)}
    from . import paper_report
    paper_report.plots(res, out_dir)
    (out_dir / "paper.json").write_text(json.dumps(res, indent=1))
    (out_dir / "section.md").write_text(paper_report.markdown(res))
    return res


def _gmean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return round(float(np.exp(np.mean(np.log(xs)))), 3) if xs else None
