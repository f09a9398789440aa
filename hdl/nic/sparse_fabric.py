"""A fabric of sparse engines (:class:`~.sparse_engine.SparseEngine`) wired like the dense
fabric (:func:`~.fabric.wiring_plan`) through :class:`~treenic.hdl.link.link.LinkChannel`
links with latency and random stalls, plus the drivers that run MultiTree-Sparse on it:
:func:`load_words` / :func:`decode_dump` (one host protocol for every simulator) and
:func:`run_amaranth` (the Amaranth simulator; the Verilated run is in :mod:`.sparse_sim`).
"""
from __future__ import annotations

import numpy as np
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from treenic.schedule.sparse_table import SparseProgram

from ..link.flit import FlitFormat
from ..link.link import LinkChannel
from .fabric import wiring_plan
from .sparse_engine import HOST_IN, HOST_OUT, HostKind, SparseEngine

__all__ = ["SparseFabric", "engine_sizes", "load_words", "decode_dump", "dump_request",
           "decode_program_dump"]


def _pow2(x: int) -> int:
    return 1 << max(1, int(x - 1).bit_length())


def engine_sizes(prog: SparseProgram, lanes: int, scan_bins: int = 16) -> dict:
    """SparseEngine parameters for a program (buffers sized to it)."""
    return dict(ports=prog.ports, depth=_pow2(prog.buffer_words), lanes=lanes, scan_bins=scan_bins,
                max_flow=prog.max_flow, chunks=prog.chunks, slot=_pow2(prog.max_k),
                rows=max(len(r) for r in prog.rows), rx_depth=_pow2(prog.rx_flits + 1),
                codec=prog.codec)


class SparseFabric(wiring.Component):
    """One sparse engine per node of the program's topology, links between them.

    Parameters
    ----------
    program : SparseProgram
        Sizes the engines (the rows are loaded at run time through ``host_i``).
    lanes : int
        Top-k lanes W.
    scan_bins : int
        Top-k histogram bins scanned a cycle.
    latency, stall, seed : int
        Link channels: register stages, stall probability /256, LFSR seed (per link
        ``seed + link number``).

    Members
    -------
    host_i : In(stream.Signature(HOST_IN)).array(P)
    host_o : Out(stream.Signature(HOST_OUT)).array(P)
    start : In(1)
        Starts every engine in the same cycle.
    busy : Out(P)
    cycles : Out(32).array(P)
    malformed : Out(16).array(P)
    finals : Out(32).array(P)
    flits : Out(32).array(P)
    """

    def __init__(self, program: SparseProgram, *, lanes: int = 2, scan_bins: int = 16,
                 latency: int = 1, stall: int = 0, seed: int = 1):
        from treenic.topology import parse
        self.program = program
        self.topology = parse(program.topology)
        self.sizes = engine_sizes(program, lanes, scan_bins)
        self.latency, self.stall, self.seed = latency, stall, seed
        P = len(program.rows)
        super().__init__({"host_i": In(stream.Signature(HOST_IN)).array(P),
                          "host_o": Out(stream.Signature(HOST_OUT)).array(P),
                          "start": In(1), "busy": Out(P), "cycles": Out(32).array(P),
                          "malformed": Out(16).array(P), "finals": Out(32).array(P),
                          "flits": Out(32).array(P)})

    def elaborate(self, platform):
        m = Module()
        fmt = FlitFormat()
        nodes = []
        for u in range(len(self.program.rows)):
            m.submodules[f"node{u}"] = eng = SparseEngine(fmt=fmt, **self.sizes)
            wiring.connect(m, wiring.flipped(self.host_i[u]), eng.host_i)
            wiring.connect(m, eng.host_o, wiring.flipped(self.host_o[u]))
            m.d.comb += [self.busy[u].eq(eng.busy), self.cycles[u].eq(eng.cycles),
                         eng.start.eq(self.start), self.finals[u].eq(eng.finals),
                         self.flits[u].eq(eng.flits),
                         self.malformed[u].eq(eng.malformed)]
            nodes.append(eng)
        for n, (u, pu, v, pv) in enumerate(wiring_plan(self.topology)):
            m.submodules[f"link{u}_{pu}"] = ch = LinkChannel(
                fmt, latency=self.latency, stall=self.stall, seed=self.seed + 97 * n,
                depth=self.sizes["rx_depth"])
            wiring.connect(m, nodes[u].tx[pu], ch.i)
            wiring.connect(m, ch.o, nodes[v].rx[pv])
        return m


def load_words(prog: SparseProgram, node: int, grads: np.ndarray) -> list[int]:
    """Host words that load node's program and add its gradient (``HOST_IN`` packed)."""
    def word(kind, addr, value):
        return kind | (addr << 3) | (value << 27)
    g = np.asarray(grads, np.float32).view(np.uint32)
    if prog.perm is not None:
        g = g[np.asarray(prog.perm)]          # hash flows: the buffer is in flow order
    out = [word(HostKind.PROG, a, r) for a, r in enumerate(prog.rows[node])]
    base = prog.residual_base          # global residual: the accumulator is part[N:2N]
    out += [word(HostKind.GRAD, base + i, int(v)) for i, v in enumerate(g)]
    return out


def start_word() -> int:
    return HostKind.START


def dump_word(elements: int) -> int:
    return HostKind.DUMP | (elements << 27)


def clear_word(elements: int) -> int:
    return HostKind.CLEAR | (elements << 27)


def dump_request(prog: SparseProgram) -> int:
    """The DUMP host word of ``prog``'s run (:attr:`SparseProgram.dump_words`)."""
    return dump_word(prog.dump_words)


def decode_program_dump(words, prog: SparseProgram) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decode_dump` of a DUMP sent as :func:`dump_request` (``prog``)."""
    words = list(words)
    if prog.residual_base:             # the residual region first, the final pairs as before
        words = (words[prog.residual_base:prog.residual_base + prog.elements] +
                 words[prog.dump_words:])
    return decode_dump(words, prog.elements, prog.perm, prog.result_base)


def decode_dump(words, elements: int, perm=None,
                result_base: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(residual, result) float32 vectors from a node's dump words (``HOST_OUT`` packed):
    the first ``elements`` words are part[0:elements], the rest the final pairs; ``perm``
    maps buffer positions back to element indices (hash flows). With ``result_base``
    (TopkA), the result is the dumped region part[result_base : result_base + elements]
    and the final pairs (every node's selection) are not part of it."""
    w = [int(x) for x in words]
    res = np.array([x >> 32 & 0xFFFFFFFF for x in w[:elements]], np.uint32)
    if result_base is not None:
        out = np.array([x >> 32 & 0xFFFFFFFF for x in w[result_base:result_base + elements]],
                       np.uint32)
        return res.view(np.float32), out.view(np.float32)
    pos = np.array([x & 0xFFFFFFFF for x in w[elements:]], np.int64)
    val = np.array([x >> 32 & 0xFFFFFFFF for x in w[elements:]], np.uint32)
    out = np.zeros(elements, np.uint32)
    if perm is not None:
        p = np.asarray(perm)
        res_p, res = res, np.empty_like(res)
        res[p] = res_p
        pos = p[pos]
    out[pos] = val
    return res.view(np.float32), out.view(np.float32)


def run_amaranth(fabric: SparseFabric, grads_list, *, max_cycles: int = 200_000):
    """Run len(grads_list) error-feedback iterations on the Amaranth simulator; returns per
    iteration ``(results (P,N), residuals (P,N), cycles, flits, malformed)`` (cycles: the
    slowest node's; flits: all nodes' link flits of the iteration; malformed: all nodes'
    counters after it)."""
    from amaranth.sim import Simulator
    prog = fabric.program
    P, N = len(prog.rows), prog.elements
    out = []
    gate = {"phase": 0}

    async def node(ctx, u):
        hi, ho = fabric.host_i[u], fabric.host_o[u]
        for it, grads in enumerate(grads_list):
            flits0 = ctx.get(fabric.flits[u])
            words = (load_words(prog, u, grads[u]) if it == 0 else
                     load_words(prog, u, grads[u])[len(prog.rows[u]):])
            for w in words + [start_word()]:
                ctx.set(hi.payload.as_value(), w)
                ctx.set(hi.valid, 1)
                await ctx.tick().until(hi.ready)
            ctx.set(hi.valid, 0)
            await ctx.tick().until(fabric.busy[u] == 1)
            await ctx.tick().until(fabric.busy[u] == 0)
            cycles = ctx.get(fabric.cycles[u])
            flits = ctx.get(fabric.flits[u]) - flits0
            bad = ctx.get(fabric.malformed[u])
            ctx.set(hi.payload.as_value(), dump_request(prog))
            ctx.set(hi.valid, 1)
            await ctx.tick().until(hi.ready)
            ctx.set(hi.valid, 0)
            ctx.set(ho.ready, 1)
            words, n = [], 0
            while True:
                _, _, valid, word = await ctx.tick().sample(ho.valid, ho.payload.as_value())
                if valid and word >> 65 & 1:
                    break
                if valid:
                    words.append(word)
                n += 1
                if n > max_cycles:
                    raise TimeoutError(f"node {u}: dump stalled")
            ctx.set(ho.ready, 0)
            out.append((it, u, words, cycles, flits, bad))

    sim = Simulator(fabric)
    sim.add_clock(1e-8)
    def bench(u):
        async def run(ctx):
            await node(ctx, u)
        return run

    for u in range(P):
        sim.add_testbench(bench(u))
    sim.run()
    return _collect(out, prog, len(grads_list))


def _collect(out, prog, iterations):
    P, N = len(prog.rows), prog.elements
    runs = []
    for it in range(iterations):
        res, resid, cyc = np.zeros((P, N), np.float32), np.zeros((P, N), np.float32), 0
        flits = bad = 0
        for i, u, words, cycles, f, b in out:
            if i == it:
                resid[u], res[u] = decode_program_dump(words, prog)
                cyc, flits, bad = max(cyc, cycles), flits + f, bad + b
        runs.append((res, resid, cyc, flits, bad))
    return runs
