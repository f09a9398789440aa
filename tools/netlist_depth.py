"""Estimated register-to-register delays of a synthesised ECP5 netlist, before place and route.

A routed nextpnr run of the 64 KiB NIC with its sparse engine takes over an hour here, and a
placement-only run (``--no-route``) reports an Fmax estimate but no path. This pass reads
the Yosys JSON that ``synth_ecp5`` writes (``build/.../pnr/<top>.json``), propagates a
crude per-cell delay model from every flip-flop and block-RAM output to every flip-flop and
block-RAM input, and lists the endpoints by estimated arrival, grouped by register. It is a
ranking of deep logic (which registers to pipeline first), not timing sign-off: routing is
a flat per-LUT guess, and nets are not placed.

Delay model (ns, ECP5 speed grade 8, rough): LUT4 0.25 + 0.55 routing, PFUMX/L6MUX21 0.2,
CCU2C 0.45 + 0.55 into a chain and 0.06 a cell along it, LUT-RAM read 0.6 + 0.55; flip-flop
clock to out 0.45, DP16KD without output register 4.3; LSR pins +0.2 setup.

    python tools/netlist_depth.py build/synth/nic_core_sparse/pnr/nic_core_sparse.json [--top 40]
    python tools/netlist_depth.py --synth nic_core_sparse     # its Yosys step first (~10 min)
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys

LUT, ROUTE, MUX = 0.25, 0.55, 0.2
CARRY_IN, CARRY_BIT, LUTRAM = 0.45, 0.06, 0.6
CLK_TO_Q = {"TRELLIS_FF": 0.45, "DP16KD": 4.3, "TRELLIS_IO": 0.0}
LSR_SETUP = 0.2
ENDPOINT_CELLS = ("TRELLIS_FF", "DP16KD")
# names Yosys/ABC make up for mapped nets: not RTL names
_AUTO = re.compile(r"_(LUT4|CCU2C|TRELLIS|PFUMX|L6MUX21|DP16KD|DPR16X4)_"
                   r"|_(Z|Q|S0|S1|COUT|DO[AB]\d+|DI[AB]?\d*)$")


def _cell_delay(cell: dict, port_in: str) -> float:
    kind = cell["type"]
    if kind in ("PFUMX", "L6MUX21"):
        return MUX
    if kind == "CCU2C":
        return CARRY_BIT if port_in == "CIN" else CARRY_IN + ROUTE
    if kind == "TRELLIS_DPR16X4":
        return LUTRAM + ROUTE
    return LUT + ROUTE


class Netlist:
    """The top module of a Yosys JSON netlist with arrival times per net bit."""

    def __init__(self, design: dict):
        self.top = next(m for m in design["modules"].values()
                        if "top" in m.get("attributes", {}))
        self.cells = self.top["cells"]
        self.names = self._rtl_names()
        self.driver = {}
        for name, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) == "output":
                    for b in bits:
                        if isinstance(b, int):
                            self.driver[b] = (name, port)
        self.arrival, self.prev = {}, {}
        for cell in self.cells.values():
            if cell["type"] in CLK_TO_Q:
                for port, bits in cell["connections"].items():
                    if cell["port_directions"].get(port) == "output":
                        for b in bits:
                            if isinstance(b, int):
                                self.arrival[b], self.prev[b] = CLK_TO_Q[cell["type"]], None

    def _rtl_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for name, info in self.top["netnames"].items():
            if info.get("hide_name") or _AUTO.search(name):
                continue
            for b in info["bits"]:
                if isinstance(b, int) and (b not in names or len(name) < len(names[b])):
                    names[b] = name
        return names

    def arrive(self, bit: int) -> float:
        """Latest arrival at ``bit`` (iterative depth-first: the logic cones are deep)."""
        stack = [bit]
        while stack:
            b = stack[-1]
            if b in self.arrival:
                stack.pop()
                continue
            if b not in self.driver:
                self.arrival[b], self.prev[b] = 0.0, None
                stack.pop()
                continue
            name, _ = self.driver[b]
            cell = self.cells[name]
            inputs = [(p, ib) for p, bits in cell["connections"].items()
                      if cell["port_directions"].get(p) == "input"
                      and (cell["type"] != "TRELLIS_DPR16X4" or p.startswith("RAD"))
                      for ib in bits if isinstance(ib, int)]
            pending = [ib for _, ib in inputs if ib not in self.arrival]
            if pending:
                stack.extend(pending)
                continue
            best, via = 0.0, None
            for port, ib in inputs:
                t = self.arrival[ib] + _cell_delay(cell, port)
                if t > best:
                    best, via = t, ib
            self.arrival[b], self.prev[b] = best, via
            stack.pop()
        return self.arrival[bit]

    def endpoints(self) -> list[tuple[float, str, str, int]]:
        """(arrival incl. setup, register or RAM, pin, net bit) of every sequential input,
        latest first."""
        out = []
        for name, cell in self.cells.items():
            if cell["type"] not in ENDPOINT_CELLS:
                continue
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) != "input" or port.startswith("CLK"):
                    continue
                for b in bits:
                    if isinstance(b, int):
                        t = self.arrive(b) + (LSR_SETUP if port == "LSR" else 0.0)
                        out.append((t, self._register(name, cell), port, b))
        return sorted(out, reverse=True)

    def _register(self, name: str, cell: dict) -> str:
        if cell["type"] == "TRELLIS_FF":
            q = cell["connections"]["Q"][0]
            name = self.names.get(q, name)
            name = re.sub(r"\[\d+\]$", "", name)
        return re.sub(r"\.\d+(\.\d+)*(_[A-Z]+\d*.*)?$", ".*", name)

    def path(self, bit: int) -> list[str]:
        """The RTL-named nets along the latest path into ``bit``, start first."""
        names = []
        while bit is not None:
            n = self.names.get(bit)
            if n and (not names or names[-1] != n):
                names.append(n)
            bit = self.prev.get(bit)
        return names[::-1]


def group(endpoints):
    """Per (register, pin): the latest endpoint's arrival and bit, and the endpoint count."""
    groups: dict = collections.OrderedDict()
    for t, reg, pin, bit in endpoints:
        key = (reg, pin)
        if key not in groups:
            groups[key] = [t, bit, 0]
        groups[key][2] += 1
    return groups


def synthesise(top: str, out: str) -> str:
    """The Yosys step of ``python -m treenic.boards.synth --top TOP`` (the same build plan:
    the register wrapper on the ECPIX-5 85F, ``synth_ecp5``) without place and route;
    returns the mapped netlist's path (``OUT/TOP.json``)."""
    import subprocess
    from pathlib import Path
    from treenic.boards.synth import (CLOCK_MHZ, TOPS, SynthWrapper, _platform, _tool_env,
                                      yosys_overrides)
    if top not in TOPS:
        raise SystemExit(f"netlist_depth: unknown top {top!r}; registered: {sorted(TOPS)}")
    folder = Path(out).resolve()
    plan = _platform(CLOCK_MHZ).build(SynthWrapper(TOPS[top]()), name=top,
                                      build_dir=str(folder), do_build=False,
                                      **yosys_overrides(top))
    plan.extract(str(folder))
    env = _tool_env()
    subprocess.run([env["YOSYS"], "-q", "-l", f"{top}.rpt", f"{top}.ys"], cwd=folder, env=env,
                   check=True)
    return str(folder / f"{top}.json")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("netlist", nargs="?", help="Yosys JSON of a synth_ecp5 run")
    src.add_argument("--synth", metavar="TOP",
                     help="a registered synthesis top: run its Yosys step first "
                          "(boards.synth's plan, no place and route; minutes for nic_core_sparse)")
    p.add_argument("--out", default=None,
                   help="build folder for --synth (default: build/netlist/TOP)")
    p.add_argument("--period", type=float, default=8.0, help="clock period, ns (8: 125 MHz)")
    p.add_argument("--top", type=int, default=40, help="register groups to list")
    args = p.parse_args(argv)
    if args.synth:
        args.netlist = synthesise(args.synth, args.out or f"build/netlist/{args.synth}")
    with open(args.netlist) as f:
        net = Netlist(json.load(f))
    ends = net.endpoints()
    late = sum(t > args.period for t, *_ in ends)
    print(f"{len(ends)} endpoints; {late} estimated later than {args.period} ns "
          f"(worst {ends[0][0]:.2f} ns)" if ends else "no endpoints")
    for (reg, pin), (t, bit, n) in list(group(ends).items())[:args.top]:
        trail = " -> ".join(net.path(bit)[-8:])
        print(f"{t:6.2f} ns  {reg} [{pin}] x{n}" + (f"   via {trail}" if trail else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
