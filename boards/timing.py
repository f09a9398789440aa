"""Whole-design timing from a routed nextpnr-ecp5 run: every endpoint, not one path.

nextpnr prints one critical path per clock, so timing closure by its log alone fixes one
path per place-and-route run (20-30 min here for the NIC core).  With ``--report
report.json --detailed-timing-report`` nextpnr also writes, for every routed net, the
arrival time (min, max; ns after the launching edge, clock-to-out and routing included)
at each of its sink pins.  This module turns that into a closure worklist:

* every sequential input pin (flip-flop ``DI``/``M``/``CE``/``LSR``, block-RAM and
  distributed-RAM write pins) is an endpoint, with slack = period - setup - arrival
  (setup times as nextpnr's critical-path segments print them);
* endpoints are grouped by the RTL register they belong to (Yosys names a flip-flop after
  its output net: ``rx0_h_TRELLIS_FF_Q_12`` -> ``rx0_h``), the unit one fixes in Amaranth;
* with the routed netlist (``--write routed.json``) beside it, the deepest path into each
  group's worst endpoint is traced back to its start register, so it reads as a chain of
  RTL nets with the logic levels at each.

The worst endpoint's arrival is exactly nextpnr's critical path (``tests/test_synth_report.py``
checks it).  ``boards/synth.py`` writes both files for every place-and-route run and this
summary as ``timing.md`` beside them.

Run::

    python -m treenic.boards.timing build/synth/nic_core_small/pnr/report.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Endpoint", "analyse", "trace_paths", "rtl_name", "summarise", "format_report", "main"]

#: setup time per sequential input pin (ns) where the report's critical paths show none
SETUP = {"DI": 0.0, "M": 0.0, "CE": 0.0, "LSR": 0.225}
SETUP_DEFAULT = 0.0
#: sink pins that end a path: flip-flop inputs, RAM write side and block-RAM inputs
_RAM_WRITE_PIN = re.compile(r"^(WD\d*|WAD\d|WRE)$")
#: the input pins of a DP16KD block RAM (no other ECP5 cell has pins by these names).  Not
#: by the data nets a block RAM drives: nextpnr leaves a net out of the report when a
#: block RAM's output feeds only a register packed beside it, and then the RAM's address
#: pins were no endpoints at all (188 of the 366 failing endpoints of the 16th wave's
#: nic_core_sparse route were missed, its worst among them)
_BRAM_PIN = re.compile(r"^(AD[AB]\d+|DI[AB]\d+|CE[AB]|OCE[AB]|WE[AB]|CS[AB]\d|RST[AB])$")
_FF_PINS = ("DI", "M", "CE", "LSR")
_FF_NAME = re.compile(r"_TRELLIS_FF_Q(_\d+)?$")
_COMB_INPUTS = {"A", "B", "C", "D", "FCI", "M", "F1", "FXA", "FXB"}


@dataclass
class Endpoint:
    cell: str
    port: str
    net: str
    register: str          # RTL name (flip-flop output net without suffixes)
    arrival: float         # ns after the launching clock edge
    required: float        # period - setup
    path: list = field(default_factory=list)   # [(net, logic levels)], launch first

    @property
    def slack(self) -> float:
        return self.required - self.arrival


def register_name(cell: str) -> str:
    """RTL register of a flip-flop cell (Yosys: ``<net>_TRELLIS_FF_Q[_<bit>]``)."""
    return re.sub(r"_TRELLIS_FF_Q(_\d+)?$", "", cell)


def rtl_name(net: str) -> str:
    """The RTL signal a Yosys/nextpnr net name derives from: ``rx0_h_TRELLIS_FF_Q_DI_LUT4_Z``
    -> ``rx0_h``, ``buf.rd1_grant_LUT4_C_Z[2]`` -> ``buf.rd1_grant``."""
    return re.split(r"_TRELLIS_FF_Q|_LUT4_|_CCU2C_|_PFUMX_|_L6MUX21_|_TRELLIS_|\$", net)[0] \
        or "(carry)"


def analyse(report: dict, period_ns: float, clock: str | None = None) -> list[Endpoint]:
    """Arrival and slack of every endpoint in a nextpnr ``--detailed-timing-report``
    report; worst first.  With *clock* (a net name as nextpnr's Fmax lines print it), only
    the endpoints it captures from registers it launches (a design with several clocks:
    each against its own period; clock-domain crossings are left out)."""
    event = f"posedge {clock}" if clock else None
    nets = report.get("detailed_net_timings")
    if not nets:
        raise ValueError("report has no detailed_net_timings (run nextpnr with "
                         "--detailed-timing-report)")
    setup = dict(SETUP)
    for cp in report.get("critical_paths", []):
        for seg in cp["path"]:
            if seg["type"] == "setup":
                setup[seg["to"]["port"]] = seg["delay"]
    # flip-flops, told by the pins they drive (Q) or their names (not every Q net is
    # listed; Yosys names flip-flops ``<net>_TRELLIS_FF_Q[_<bit>]``); RAM pins by name
    ffs = {n["driver"] for n in nets if n["port"] == "Q"}
    ffs |= {e["cell"] for n in nets for e in n["endpoints"] if _FF_NAME.search(e["cell"])}

    def is_endpoint(cell, port):
        if cell in ffs:
            return port in _FF_PINS
        return bool(_RAM_WRITE_PIN.match(port) or _BRAM_PIN.match(port))

    # per cell, its input pins' arrivals and the nets that feed them
    endpoints: list[Endpoint] = []
    for n in nets:
        for e in n["endpoints"]:
            if n.get("event") == "<async>" or e.get("event") == "<async>":
                continue
            if event and (e.get("event") != event or n.get("event", event) != event):
                continue
            dl = e["delay"]
            t = max(dl) if isinstance(dl, list) else float(dl)
            if is_endpoint(e["cell"], e["port"]):
                reg = register_name(e["cell"]) if e["cell"] in ffs else \
                    f"{e['cell']}.{e['port']}"
                endpoints.append(Endpoint(e["cell"], e["port"], n["net"], reg, t,
                                          period_ns - setup.get(e["port"], SETUP_DEFAULT)))

    endpoints.sort(key=lambda e: e.slack)
    return endpoints


#: logic levels charged per cell input when tracing a path through the netlist
_LEVELS = {"FCI": 0.15, "M": 0.5, "FXA": 0.5, "FXB": 0.5, "F1": 0.5}


def trace_paths(routed: dict, endpoints: list[Endpoint], count: int = 400) -> None:
    """Fill ``path`` of the first *count* endpoints with their deepest path through the
    routed netlist (``nextpnr --write``): the chain of nets from a start register, with
    the logic levels (LUT = 1, carry step 0.15, mux 0.5) at each, so a failing endpoint
    reads as RTL signals.  (The report has arrivals only at endpoints, so the path is the
    deepest one, which is nearly always the late one.)"""
    top = next(iter(routed["modules"].values()))
    cells = top["cells"]
    names: dict[int, tuple] = {}
    for name, info in top["netnames"].items():
        for b in info["bits"]:
            if isinstance(b, int):
                key = (info.get("hide_name", 0), len(name), name)
                if b not in names or key < names[b]:
                    names[b] = key
    drv: dict[int, tuple[str, str]] = {}
    for cn, c in cells.items():
        for port, bits in c["connections"].items():
            if c["port_directions"].get(port) == "output":
                for b in bits:
                    if isinstance(b, int):
                        drv[b] = (cn, port)
    memo: dict[tuple[str, str], tuple[float, int | None]] = {}

    def depth(cn: str, port: str) -> tuple[float, int | None]:
        """Levels to the output (cn, port) and the input net on the deepest path."""
        if (cn, port) in memo:
            return memo[(cn, port)]
        c = cells[cn]
        memo[(cn, port)] = (0.0, None)          # loop guard
        best = (0.0, None)
        if c["type"] == "TRELLIS_COMB":
            for ip, bits in c["connections"].items():
                if c["port_directions"].get(ip) != "input" or ip not in _COMB_INPUTS:
                    continue
                for b in bits:
                    if isinstance(b, int) and b in drv:
                        d = depth(*drv[b])[0] + _LEVELS.get(ip, 1.0)
                        if d > best[0]:
                            best = (d, b)
        memo[(cn, port)] = best
        return best

    sys.setrecursionlimit(max(200000, sys.getrecursionlimit()))
    for ep in endpoints[:count]:
        c = cells.get(ep.cell)
        if c is None:
            continue
        bits = [b for b in c["connections"].get(ep.port, []) if isinstance(b, int)]
        path = []
        b = bits[0] if bits else None
        while b is not None and b in drv:
            lv, nb = depth(*drv[b])
            path.append((names[b][2] if b in names else drv[b][0], lv))
            b = nb
        ep.path = list(reversed(path))


def summarise(endpoints: list[Endpoint], top: int = 40) -> list[dict]:
    """Failing endpoints grouped by register: worst slack, failing bits, worst path."""
    groups: dict[str, dict] = {}
    for ep in endpoints:
        g = groups.setdefault(ep.register, {"register": ep.register, "worst_slack": ep.slack,
                                            "failing": 0, "endpoints": 0, "path": ep.path,
                                            "pin": ep.port})
        g["endpoints"] += 1
        g["failing"] += ep.slack < 0
    out = sorted(groups.values(), key=lambda g: g["worst_slack"])
    return out[:top]


def format_report(endpoints: list[Endpoint], period_ns: float, top: int = 40) -> str:
    fail = [e for e in endpoints if e.slack < 0]
    worst = endpoints[0] if endpoints else None
    lines = [f"# Static timing: every endpoint at {1000 / period_ns:.1f} MHz "
             f"({period_ns:.3f} ns)", ""]
    if worst:
        lines += [f"worst slack {worst.slack:+.3f} ns ({1000 / (worst.arrival + period_ns - worst.required):.1f} MHz); "
                  f"{len(fail)} of {len(endpoints)} endpoints fail", ""]
    lines += ["| register | pin | worst slack (ns) | failing / endpoints | deepest path "
              "(net @ logic levels) |",
              "|---|---|---:|---:|---|"]
    for g in summarise(endpoints, top):
        steps = []
        for n, t in g["path"]:
            n = rtl_name(n)
            if steps and steps[-1][0] == n:
                steps[-1] = (n, t)
            else:
                steps.append((n, t))
        p = " → ".join(f"{n} @{t:g}" for n, t in steps[-10:])
        if len(steps) > 10:
            p = "… → " + p
        lines.append(f"| `{g['register']}` | {g['pin']} | {g['worst_slack']:+.3f} | "
                     f"{g['failing']} / {g['endpoints']} | {p} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m treenic.boards.timing",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("report", type=Path, help="nextpnr --report JSON written with "
                    "--detailed-timing-report (boards/synth.py writes <top>/pnr/report.json)")
    ap.add_argument("--mhz", type=float, default=None,
                    help="clock target (default: the report's constraint)")
    ap.add_argument("--top", type=int, default=40, help="registers listed")
    args = ap.parse_args(argv)
    if not args.report.is_file():
        ap.error(f"{args.report} not found (a place-and-route run of boards/synth.py writes it)")
    report = json.loads(args.report.read_text())
    mhz = args.mhz or next(iter(report["fmax"].values()))["constraint"]
    try:
        eps = analyse(report, 1000.0 / mhz)
    except ValueError as e:
        ap.error(str(e))
    routed = args.report.with_name("routed.json")
    if routed.is_file():
        trace_paths(json.loads(routed.read_text()), eps)
    print(format_report(eps, 1000.0 / mhz, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
