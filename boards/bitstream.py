"""Board bitstreams: ``make bitstream BOARD=ecpix5``.

Run::

    python -m treenic.boards.bitstream --board ecpix5 --out build/bitstream/ecpix5
    python -m treenic.boards.bitstream --board ecpix5 --small      # 8 KiB buffer, faster P&R
    python -m treenic.boards.bitstream --board colorlight --area-only   # Yosys only
    python -m treenic.boards.bitstream --list

Steps: LiteEth's UDP core is generated for the board (``liteeth_gen``, cached by its
configuration), the board top is built with Amaranth's Trellis flow (YoWASP Yosys,
nextpnr-ecp5, ecppack; tools named relative to the build folder, see
:func:`treenic.boards.synth.build_platform`), and the result is checked: every clock's
worst slack from nextpnr's post-route report must be non-negative, else the command exits 1
after writing its reports (``--allow-negative-slack`` overrides).

Outputs in ``--out``: ``top.bit`` (flash: ``openFPGALoader -b ecpix5 top.bit``),
``top.tim`` (nextpnr log with the timing report), ``top.rpt`` (Yosys utilisation),
``report.json`` / ``report.md`` (Fmax and slack per clock, utilisation, build time),
``timing.md`` (every endpoint per clock, the failing registers with their deepest paths;
from nextpnr's ``nextpnr.json`` and ``routed.json``),
``liteeth/`` (the generated core).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import synth
from .core import LINKS

__all__ = ["BOARDS", "DEVICE_CAPACITY", "area", "build", "main"]

#: each board's FPGA: LUT4s, flip-flops, DP16KD block RAMs (Lattice ECP5 family data sheet)
DEVICE_CAPACITY = {"ecpix5": {"luts": 83640, "ffs": 83640, "brams": 208},
                   "colorlight": {"luts": 24288, "ffs": 24288, "brams": 56}}


def _ecpix5(out: Path, small: bool, node: int, topology: str, nic_mhz, banks=None,
            shared_ports=False):
    from treenic.hdl.host.liteeth import core_config, generate
    from treenic.hdl.nic import NicParams
    from .colorlight import board_addresses
    from .ecpix5 import DEFAULT_NIC_MHZ, ECPIX5Top, ecpix5_platform, eth_clock_hz

    params = NicParams(**(synth.NIC_SMALL_PARAMS if small else synth.NIC_CORE_PARAMS),
                       **({} if banks is None else {"banks": banks}),   # checks banks
                       shared_ports=shared_ports)
    a = board_addresses(node)
    nic_mhz = DEFAULT_NIC_MHZ if nic_mhz is None else nic_mhz
    verilog = generate(out / "liteeth", core_config(ip=a["host_ip"], mac=a["host_mac"],
                                                    clk_freq=eth_clock_hz(nic_mhz)))
    top = ECPIX5Top(params=params, verilog=verilog, nic_mhz=nic_mhz)     # checks nic_mhz
    return (ecpix5_platform(nic_mhz), top, params,
            f"{LINKS}: PMOD serial link PHY per NIC port (topology set by the cables); "
            f"NIC clock {nic_mhz:g} MHz, {params.banks} buffer banks"
            + (", shared buffer ports" if shared_ports else ""))


def _colorlight(out: Path, small: bool, node: int, topology: str, nic_mhz, banks=None,
                shared_ports=False):
    from treenic.hdl.host.liteeth import core_config, generate
    from treenic.hdl.nic import NicParams
    from .colorlight import (COLORLIGHT_NIC, ETH_CLOCK_HZ, ColorlightTop, board_addresses,
                             colorlight_platform, link_peers)

    if nic_mhz is not None:
        raise ValueError("--nic-mhz: the Colorlight top has one clock plan (NIC 62.5 MHz)")
    if banks is not None:
        raise ValueError("--banks: the Colorlight top's NIC has one buffer layout")
    if shared_ports:
        raise ValueError("--shared-ports: the Colorlight top's NIC has one buffer layout")
    params = NicParams(**COLORLIGHT_NIC)
    a = board_addresses(node)
    dev = "LFE5U-25F-6BG256C"
    host = generate(out / "liteeth", core_config(ip=a["host_ip"], mac=a["host_mac"],
                                                 clk_freq=round(ETH_CLOCK_HZ), device=dev))
    link = generate(out / "liteeth_link", core_config(ip=a["link_ip"], mac=a["link_mac"],
                                                      clk_freq=round(ETH_CLOCK_HZ), device=dev),
                    name="liteeth_link")
    peers = link_peers(topology, node, params.ports)
    top = ColorlightTop(params=params, host_verilog=host, link_verilog=link, peers=peers)
    return (colorlight_platform(), top, params,
            f"ethernet: NIC ports as UDP datagram links (node {node} of {topology}, "
            f"peers {peers})")


#: board name -> factory(out_dir, small, node, topology, nic_mhz, banks, shared_ports) ->
#: (platform, top,
#: NicParams, links description); nic_mhz / banks None: the board's default clock plan /
#: the NIC's default bank count
BOARDS = {"ecpix5": _ecpix5, "colorlight": _colorlight}


def _board_top(board: str, out, small: bool, node: int, topology: str, nic_mhz=None,
               banks=None, shared_ports=False):
    """(build folder, start time, the board factory's (platform, top, params, links))."""
    if board not in BOARDS:
        raise KeyError(f"unknown board {board!r}; known: {', '.join(BOARDS)}")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out, time.time(), BOARDS[board](out, small, node, topology, nic_mhz, banks,
                                           shared_ports)


def build(board: str, out: Path, *, small: bool = False, seed: int = 1,
          allow_negative_slack: bool = False, nextpnr_opts: str = "", node: int = 0,
          topology: str = "ring:4", nic_mhz=None, banks=None, shared_ports=False) -> dict:
    """Build one board's bitstream into *out*; returns the report (also written as
    ``report.json``/``report.md``).  Raises :class:`synth.SlackError` on negative slack
    (after the reports) unless *allow_negative_slack*.  *nic_mhz*: the board's NIC clock
    plan (None: its default); *banks*: the NIC buffer's bank count (None: the default);
    *shared_ports*: ``NicParams.shared_ports``."""
    out, t0, (plat, top, params, links) = _board_top(board, out, small, node, topology,
                                                     nic_mhz, banks, shared_ports)
    synth.build_platform(plat, top, "top", out, synth._tool_env(), seed, nextpnr_opts,
                         pnr_files=PNR_FILES)
    pnr = synth.parse_nextpnr_log((out / "top.tim").read_text())
    failing = _timing_md(out, pnr["target_mhz_per_clock"])
    yos = synth.parse_yosys_stat((out / "top.rpt").read_text())
    worst = synth.check_slack(board, pnr["slack_ns_per_clock"], allow=True)
    rep = {"board": board, "device": plat.device + "-" + plat.package,
           "nic": {k: v for k, v in asdict(params).items()}, "links": links,
           "fmax_mhz_per_clock": pnr["fmax_per_clock"],
           "target_mhz_per_clock": pnr["target_mhz_per_clock"],
           "slack_ns_per_clock": pnr["slack_ns_per_clock"], "worst_slack_ns": worst,
           "slack_ok": worst >= 0, "failing_endpoints_per_clock": failing,
           "utilisation": {k: list(v) for k, v in pnr["utilisation"].items()},
           "yosys": {k: v for k, v in yos.items() if k != "cells"},
           "bitstream": str(out / "top.bit"), "seconds": round(time.time() - t0, 1),
           "tools": "YoWASP yosys + nextpnr-ecp5 + ecppack"}
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    (out / "report.md").write_text(_markdown(rep))
    synth.check_slack(board, pnr["slack_ns_per_clock"], allow=allow_negative_slack)
    return rep


#: nextpnr's timing report and routed netlist in a bitstream's folder (``report.json`` is
#: the bitstream's own summary)
PNR_FILES = ("nextpnr.json", "routed.json")


def _timing_md(out: Path, targets: dict) -> dict:
    """``timing.md``: every endpoint of each clock against that clock's own constraint,
    grouped by register with its deepest path (:mod:`treenic.boards.timing`); returns the
    failing endpoints per clock."""
    from .timing import analyse, format_report, trace_paths
    report = json.loads((out / PNR_FILES[0]).read_text())
    routed = json.loads((out / PNR_FILES[1]).read_text())
    parts, failing = [], {}
    for clock, mhz in sorted(targets.items()):
        eps = analyse(report, 1000.0 / mhz, clock=clock)
        trace_paths(routed, eps, count=200)
        failing[clock] = sum(e.slack < 0 for e in eps)
        parts.append(f"## `{clock}`\n\n" + format_report(eps, 1000.0 / mhz, top=25))
    (out / "timing.md").write_text("\n".join(parts))
    return failing


def area(board: str, out: Path, *, node: int = 0, topology: str = "ring:4",
         nic_mhz=None, banks=None, shared_ports=False) -> dict:
    """Yosys ``synth_ecp5`` of one board's top (the same build plan as :func:`build`, no
    place and route): cell counts against the device (``area.json`` in *out*).

    ``lut4_equivalents`` counts a CCU2C carry cell as 2 LUT4 and a TRELLIS_DPR16X4 LUT RAM
    as 2, how they occupy a slice; it is an estimate before packing."""
    out, t0, (plat, top, params, links) = _board_top(board, out, False, node, topology,
                                                     nic_mhz, banks, shared_ports)
    env = synth._tool_env()
    plan = plat.prepare(top, name="top", **synth.yosys_overrides("top"))
    plan.extract(str(out))
    script = [line for line in (out / "top.ys").read_text().splitlines()
              if not line.startswith("write_json")] + ["tee -o top.stat stat"]
    (out / "area.ys").write_text("\n".join(script) + "\n")
    r = subprocess.run([env["YOSYS"], "-q", "-l", "area.log", "area.ys"], cwd=out, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"yosys area run for {board} failed:\n{r.stderr[-3000:]}")
    yos = synth.parse_yosys_stat((out / "top.stat").read_text())
    cap = DEVICE_CAPACITY[board]
    lut_eq = yos["luts"] + 2 * yos["carry"] + 2 * yos["lutram"]
    rep = {"board": board, "device": plat.device + "-" + plat.package,
           "nic": asdict(params), "links": links,
           "yosys": {k: v for k, v in yos.items() if k != "cells"},
           "lut4_equivalents": lut_eq, "capacity": cap,
           "lut_use": round(lut_eq / cap["luts"], 3), "ff_use": round(yos["ffs"] / cap["ffs"], 3),
           "bram_use": round(yos["brams"] / cap["brams"], 3),
           "fits": lut_eq <= cap["luts"] and yos["ffs"] <= cap["ffs"] and
           yos["brams"] <= cap["brams"],
           "seconds": round(time.time() - t0, 1), "tools": "YoWASP yosys synth_ecp5 (area only)"}
    (out / "area.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    return rep


def _markdown(rep: dict) -> str:
    lines = [f"# {rep['board']} bitstream ({rep['device']})", "",
             f"Tools: {rep['tools']}; links: {rep['links']}; build {rep['seconds']} s.", "",
             "| clock | Fmax (MHz) | constraint (MHz) | slack (ns) |", "|---|---:|---:|---:|"]
    for c, f in sorted(rep["fmax_mhz_per_clock"].items()):
        t = rep["target_mhz_per_clock"].get(c, "-")
        s = rep["slack_ns_per_clock"].get(c, "-")
        lines.append(f"| `{c}` | {f:.1f} | {t} | {s} |")
    lines += ["", "| resource | used | available |", "|---|---:|---:|"]
    lines += [f"| {k} | {u} | {a} |" for k, (u, a) in sorted(rep["utilisation"].items())]
    return "\n".join(lines) + "\n"


def _board_plan(args):
    """Fill what the command line left open from the board's bitstream plan (ECPIX-5:
    ``ecpix5.BITSTREAM_PLAN``, the build that routes here); say what was taken."""
    plan = {}
    if args.board == "ecpix5":
        from .ecpix5 import BITSTREAM_PLAN
        plan = BITSTREAM_PLAN
    taken = {k: v for k, v in plan.items() if getattr(args, k) is None}
    for k, v in taken.items():
        setattr(args, k, v)
    args.shared_ports = bool(args.shared_ports)
    args.nextpnr_opts = args.nextpnr_opts or ""
    if taken:
        print(f"[bitstream] {args.board} plan: " +
              ", ".join(f"{k}={v}" for k, v in taken.items()), file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m treenic.boards.bitstream",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--board", default="ecpix5", help="board (%(default)s)")
    ap.add_argument("--out", type=Path, help="build folder (default build/bitstream/BOARD)")
    ap.add_argument("--small", action="store_true",
                    help="NIC with an 8 KiB buffer (same ports and logic; P&R ~4x faster)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--node", type=int, default=0,
                    help="this board's node: IPv4 192.168.1.(50 + node) (%(default)s)")
    ap.add_argument("--topology", default="ring:4",
                    help="colorlight: the cluster's topology, for the link peers "
                         "(%(default)s)")
    ap.add_argument("--allow-negative-slack", action="store_true",
                    help="exit 0 even when a clock misses its constraint")
    ap.add_argument("--nic-mhz", type=float, default=None,
                    help="ecpix5: the NIC clock's PLL plan, 125 (default), 100 or 62.5")
    ap.add_argument("--banks", type=int, default=None,
                    help="ecpix5: the NIC buffer's bank count (a power of two, at least the "
                         "lanes; default 16 for the 4-port core): fewer banks, a smaller "
                         "crossbar, more bank conflicts")
    ap.add_argument("--shared-ports", action=argparse.BooleanOptionalAction, default=None,
                    help="ecpix5: the NIC's TX units share one buffer reader, its RX units "
                         "another (a 3-reader crossbar; the PMOD links carry a flit in 17 "
                         "cycles)")
    ap.add_argument("--nextpnr-opts", default=None)
    ap.add_argument("--area-only", action="store_true",
                    help="Yosys synthesis only: cell counts against the device, no bitstream")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(BOARDS))
        return 0
    _board_plan(args)
    if args.board not in BOARDS:
        ap.error(f"unknown board {args.board!r}; known: {', '.join(BOARDS)}")
    if args.nic_mhz is not None:
        from .ecpix5 import CLOCK_PLANS
        if args.board != "ecpix5":
            ap.error(f"--nic-mhz: the {args.board} top has one clock plan")
        if args.nic_mhz not in CLOCK_PLANS:
            ap.error(f"--nic-mhz {args.nic_mhz:g}: no PLL plan; known: "
                     f"{', '.join(map(str, CLOCK_PLANS))}")
    if args.shared_ports and args.board != "ecpix5":
        ap.error(f"--shared-ports: the {args.board} top's NIC has one buffer layout")
    if args.banks is not None:
        if args.board != "ecpix5":
            ap.error(f"--banks: the {args.board} top's NIC has one buffer layout")
        if args.banks < 2 or args.banks & (args.banks - 1):
            ap.error(f"--banks {args.banks}: a power of two, at least 2")
    out = args.out or Path("build/bitstream") / args.board
    if args.area_only:
        rep = area(args.board, Path(str(out) + "-area"), node=args.node, topology=args.topology,
                   nic_mhz=args.nic_mhz, banks=args.banks, shared_ports=args.shared_ports)
        print(json.dumps(rep, default=str))
        return 0
    try:
        rep = build(args.board, out, small=args.small, seed=args.seed,
                    allow_negative_slack=args.allow_negative_slack,
                    nextpnr_opts=args.nextpnr_opts, node=args.node,
                    topology=args.topology, nic_mhz=args.nic_mhz, banks=args.banks,
                    shared_ports=args.shared_ports)
    except synth.SlackError as e:
        print(f"[bitstream] error: {e} (reports in {out})", file=sys.stderr)
        return 1
    print(f"[bitstream] {rep['bitstream']}: worst slack {rep['worst_slack_ns']} ns, "
          f"Fmax {rep['fmax_mhz_per_clock']}, {rep['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
