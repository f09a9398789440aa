"""Fault campaign on the Verilated NIC fabric (``make bench`` section ``faults``).

    python -m treenic.bench --only faults --runs 1000 --json
    python -m treenic.faults --runs 200 [--seed 1] [--topology ring:4]

One fabric is built once (``FabricSim(..., faults=True)``: per-sub-packet link CRC on
every link, a :class:`~treenic.hdl.link.inject.FaultInjector` after each CRC appender, a
reset line per NIC) and reused: every run resets the fabric, loads the schedule and fresh
random float32 buffers, starts the all-reduce, injects **one** fault at a random cycle
of the collective, and runs until DONE or until the driver raises.  Classes (round robin):

* ``bitflip``   1-3 random bits, or a burst of up to 16 bits, of one flit and its CRC
* ``drop``      one whole sub-packet lost (its credits come back)
* ``dup``       one sub-packet delivered twice
* ``stall``     a link delivers nothing for 1 .. 2x the watchdog limit cycles
* ``dead_link`` a link drops everything from then on, credits included
* ``nic_reset`` one NIC is reset mid-collective

Per run the outcome is one of: **detected** (:class:`FabricError`: a NIC flagged an
error -- link CRC, depacketiser, watchdog -- or the driver found the fabric stuck),
**recovered** (the run finished and its result is the golden executor's, bit for bit),
**silent_wrong** (finished "ok" with a result that differs from the golden one: must never
happen), or not injected (the fault was armed after the link's last flit; not counted).
The link layer does not retry, so a destroyed sub-packet is never *recovered*: such a
collective fails with an error and the caller re-runs it.  ``detect_cycles`` is the
number of cycles from the fault taking effect to the first error signal in the fabric
(a NIC error flag or a CRC failure) or, where none rose, to the driver's detection.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from treenic.schedule.execute import execute

from treenic.hdl.link.inject import FaultMode
from treenic.hdl.nic.fabric_sim import FabricError, FabricSim

__all__ = ["CLASSES", "Campaign", "run"]

CLASSES = ("bitflip", "drop", "dup", "stall", "dead_link", "nic_reset")
_MODE = {"bitflip": FaultMode.FLIP, "drop": FaultMode.DROP, "dup": FaultMode.DUP,
         "stall": FaultMode.STALL, "dead_link": FaultMode.KILL}


class Campaign:
    """A fault-injection fabric built once; :meth:`one` runs one seeded faulty collective.

    Parameters
    ----------
    topology, algorithm, elements
        The collective (small by default, so that >= 1000 runs take minutes).
    watchdog : int or None
        NIC watchdog limit (cycles without progress); None: 4x the fault-free run, at
        least 512.
    """

    def __init__(self, topology: str = "ring:4", algorithm: str = "multitree",
                 elements: int = 64, *, watchdog: int | None = None, verbose=False):
        if elements < 1 or elements > 4096:
            raise ValueError(f"elements must be 1..4096 for a campaign, got {elements}")
        if watchdog is not None and not 1 <= watchdog < 1 << 32:
            raise ValueError(f"watchdog must be 1..2**32-1 cycles, got {watchdog}")
        t0 = time.time()
        self.fs = FabricSim(topology, algorithm, elements, faults=True, watchdog=0,
                            verbose=verbose)
        self.build_seconds = time.time() - t0
        self.n, self.elements = self.fs.schedule.n, elements
        self.links = len(self.fs.fabric.plan)
        self.beat_bits = self.fs.fabric.beat_bits
        self.flit_bits = self.fs.params.fmt.flit_bits
        # fault-free reference: cycles and bit-exactness
        buf = np.random.default_rng(0).standard_normal((self.n, elements)).astype(np.float32)
        self._reset()
        out, self.clean_cycles = self.fs.run(buf)
        if not np.array_equal(out.view(np.uint32), execute(self.fs.schedule, buf).view(np.uint32)):
            raise FabricError("the fault-free campaign fabric does not match the golden executor")
        self.fs.watchdog = watchdog if watchdog is not None else max(512, 4 * self.clean_cycles)
        # a hung run is caught by the watchdog or the stuck check long before this bound
        self.max_cycles = 16 * self.fs.watchdog + 64 * self.clean_cycles

    def _reset(self):
        sim = self.fs.sim
        for k in ("fi_arm", "fi_mode", "fi_mask", "fi_length", "fi_link", "nic_reset", "start"):
            sim[k] = 0
        sim.reset()

    def _mask(self, rng) -> int:
        if rng.random() < 0.25:                       # a burst of up to 16 bits
            n = int(rng.integers(2, 17))
            lo = int(rng.integers(0, self.beat_bits - n + 1))
            # (first and last bit of the burst set, those between at random)
            return (int(rng.integers(0, 1 << n)) | 1 | 1 << (n - 1)) << lo
        bits = rng.choice(self.beat_bits, size=int(rng.integers(1, 4)), replace=False)
        return sum(1 << int(b) for b in bits)

    def one(self, cls: str, rng) -> dict:
        """One collective with one fault of class ``cls``: outcome and detection cycles."""
        if cls not in CLASSES:
            raise ValueError(f"unknown fault class {cls!r}; known: {', '.join(CLASSES)}")
        fs, sim = self.fs, self.fs.sim
        buf = rng.standard_normal((self.n, self.elements)).astype(np.float32)
        gold = execute(fs.schedule, buf)
        # (in the first 3/4 of the fault-free run: most links are idle in the last quarter,
        # where a fault armed would rarely fire)
        at = int(rng.integers(0, max(1, 3 * self.clean_cycles // 4)))
        link = int(rng.integers(0, self.links))
        node = int(rng.integers(0, self.n))
        fault = {"class": cls, "at": at}
        if cls == "nic_reset":
            fault["node"] = node
        else:
            fault["link"] = fs.fabric.plan[link]
        mask = self._mask(rng) if cls == "bitflip" else 0
        length = int(rng.integers(1, 2 * fs.watchdog + 1)) if cls == "stall" else 0
        if cls == "stall":
            fault["length"] = length
        if cls == "bitflip":
            fault["mask"] = hex(mask)

        def inject(_fs):
            sim.step(at)
            if cls == "nic_reset":
                sim["nic_reset"] = 1 << node
                sim.step(2)
                sim["nic_reset"] = 0
            else:
                sim.set(fi_link=link, fi_mode=int(_MODE[cls]), fi_mask=mask,
                        fi_length=min(length, 0xFFFF), fi_arm=1)

        self._reset()
        res = {"fault": fault, "outcome": None, "detect_cycles": None, "error": None}
        try:
            out, _ = fs.run(buf, hook=inject, max_cycles=self.max_cycles)
        except FabricError as e:
            res["outcome"], res["error"] = "detected", str(e)
        else:
            same = np.array_equal(out.view(np.uint32), gold.view(np.uint32))
            res["outcome"] = "recovered" if same else "silent_wrong"
        fired = cls == "nic_reset" or bool(sim["fi_fired"])
        if sim["fi_overflow"]:
            raise RuntimeError("fault injector FIFO overflowed: the campaign harness is "
                               "too small for this traffic")
        if not fired:
            res["outcome"] = "not_injected" if res["outcome"] == "recovered" else res["outcome"]
        if res["outcome"] == "detected":
            f_at, e_at = sim["fault_at"], sim["error_at"]
            end = e_at if e_at else sim["clock"]
            res["detect_cycles"] = max(0, int(end) - int(f_at))
        return res


def campaign(runs: int, *, seed: int = 1, topology: str = "ring:4",
             algorithm: str = "multitree", elements: int = 64, watchdog: int | None = None,
             log=None, keep_runs: bool = False) -> dict:
    """Run ``runs`` seeded faulty collectives (classes round robin); the summary dict."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    c = Campaign(topology, algorithm, elements, watchdog=watchdog)
    rng = np.random.default_rng(seed)
    stats = {k: {"injected": 0, "detected": 0, "recovered": 0, "silent_wrong": 0,
                 "detect_cycles_max": 0} for k in CLASSES}
    lat = {k: [] for k in CLASSES}
    not_injected = {k: 0 for k in CLASSES}
    wrong, kept = [], []
    t0 = time.time()
    for r in range(runs):
        cls = CLASSES[r % len(CLASSES)]
        res = c.one(cls, rng)
        s, o = stats[cls], res["outcome"]
        if o == "not_injected":
            not_injected[cls] += 1
        else:
            s["injected"] += 1
            s[o] += 1
            if o == "detected":
                lat[cls].append(res["detect_cycles"])
                s["detect_cycles_max"] = max(s["detect_cycles_max"], res["detect_cycles"])
            if o == "silent_wrong":
                wrong.append(res["fault"])
        if keep_runs:
            kept.append(res)
        if log and (r + 1) % 100 == 0:
            log(f"faults: {r + 1}/{runs} runs, {time.time() - t0:.0f} s")
    dist = {k: ({"n": len(v), "p50": int(np.percentile(v, 50)), "p90": int(np.percentile(v, 90)),
                 "max": int(max(v))} if v else {"n": 0}) for k, v in lat.items()}
    out = {"runs": runs, "silent_wrong": sum(s["silent_wrong"] for s in stats.values()),
           "classes": stats,
           "detect_cycles": dist, "not_injected": not_injected,
           "silent_wrong_faults": wrong,
           "fabric": {"engine": "verilator", "topology": topology, "algorithm": algorithm,
                      "elements": elements, "links": c.links, "watchdog": c.fs.watchdog,
                      "clean_cycles": int(c.clean_cycles), "link_crc": "CRC-16/IBM-3740",
                      "build_seconds": round(c.build_seconds, 1),
                      "run_seconds": round(time.time() - t0, 1), "seed": seed}}
    if keep_runs:
        out["runs_detail"] = kept
    return out


def crc_overhead(cases=(("ring:8", "ring"), ("torus:4x4", "multitree")),
                 elements: int = 1024, seed: int = 3) -> dict:
    """Fault-free cycles of each case without and with the link CRC (same NIC build,
    same buffers; both results checked bit for bit against the golden executor)."""
    out = {}
    for spec, alg in cases:
        row = {}
        for crc in (False, True):
            fs = FabricSim(spec, alg, elements, crc=crc)
            buf = np.random.default_rng(seed).standard_normal(
                (fs.schedule.n, elements)).astype(np.float32)
            res, cyc = fs.run(buf)
            if not np.array_equal(res.view(np.uint32),
                                  execute(fs.schedule, buf).view(np.uint32)):
                raise FabricError(f"{spec} crc={crc}: result differs from the golden executor")
            row["crc" if crc else "plain"] = int(cyc)
        row["overhead_cycles"] = row["crc"] - row["plain"]
        row["overhead"] = round(row["crc"] / row["plain"] - 1, 4)
        out[f"{spec} {alg} {elements}"] = row
    return out


def _section_md(res: dict) -> str:
    f = res["fabric"]
    lines = [f"Fault campaign: {res['runs']} seeded runs on the Verilated fabric "
             f"({f['topology']}, {f['algorithm']}, {f['elements']} float32 per node, "
             f"{f['links']} links with {f['link_crc']} per sub-packet, watchdog "
             f"{f['watchdog']} cycles; fault-free run {f['clean_cycles']} cycles).", "",
             f"**silent wrong results: {res['silent_wrong']}**", "",
             "| class | injected | detected | recovered | silent wrong | detect cycles "
             "p50 / p90 / max |", "|---|---|---|---|---|---|"]
    for k, s in res["classes"].items():
        d = res["detect_cycles"][k]
        dd = f"{d['p50']} / {d['p90']} / {d['max']}" if d["n"] else "-"
        lines.append(f"| {k} | {s['injected']} | {s['detected']} | {s['recovered']} | "
                     f"{s['silent_wrong']} | {dd} |")
    return "\n".join(lines) + "\n"


def run(out_dir=None, quick: bool = False, runs: int | None = None, seed: int = 1) -> dict:
    """Bench section: ``runs`` (default 1000, quick 60) faulty collectives."""
    runs = runs if runs is not None else (60 if quick else 1000)
    res = campaign(runs, seed=seed, log=lambda s: print(s, file=sys.stderr, flush=True))
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "section.md").write_text(_section_md(res))
        (out / "faults.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="treenic.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--topology", default="ring:4")
    p.add_argument("--algorithm", default="multitree")
    p.add_argument("--elements", type=int, default=64)
    p.add_argument("--watchdog", type=int, default=None)
    p.add_argument("--overhead", action="store_true",
                   help="instead: fault-free cycles of ring:8 / torus:4x4 without and with "
                        "the link CRC (four Verilator builds)")
    a = p.parse_args(argv)
    if a.overhead:
        print(json.dumps({"engine": "verilator", "crc_overhead": crc_overhead()}))
        return 0
    try:
        res = campaign(a.runs, seed=a.seed, topology=a.topology, algorithm=a.algorithm,
                       elements=a.elements, watchdog=a.watchdog,
                       log=lambda s: print(s, file=sys.stderr, flush=True))
    except (ValueError, FabricError) as e:
        print(f"treenic.faults: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 1 if res["silent_wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
