"""A fabric of sparse engines (:class:`~.sparse_engine.SparseEngine`) wired like the dense
fabric (:func:`~.fabric.wiring_plan`) through :class:`~treenic.hdl.link.link.LinkChannel`
links with latency and random stalls, plus the drivers that run MultiTree-Sparse on it:
:func:`load_words` / :func:`decode_dump` (one host protocol for every simulator; element
order for every program, the engine's hash placer maps hash flows) and
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
from .sparse_place import flow_table

__all__ = ["SparseFabric", "engine_sizes", "load_words", "decode_dump", "dump_request",
           "decode_program_dump"]


def _pow2(x: int) -> int:
    return 1 << max(1, int(x - 1).bit_length())


def engine_sizes(prog: SparseProgram, lanes: int, scan_bins: int = 16,
                 topk_units: int = 2) -> dict:
    """SparseEngine parameters for a program (buffers sized to it)."""
    return dict(ports=prog.ports, depth=_pow2(prog.buffer_words), lanes=lanes,
                scan_bins=scan_bins, topk_units=topk_units,
                max_flow=prog.max_flow, chunks=prog.chunks, slot=_pow2(prog.max_k),
                rows=max(len(r) for r in prog.rows), rx_depth=_pow2(prog.rx_flits + 1),
                codec=prog.codec,
                hash_elements=prog.elements if prog.hash_seed is not None else 0)


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
    topk_units : int
        Top-k units per engine (:class:`~.sparse_engine.SparseEngine`).
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
                 topk_units: int = 2, latency: int = 1, stall: int = 0, seed: int = 1):
        from treenic.topology import parse
        self.program = program
        self.topology = parse(program.topology)
        self.sizes = engine_sizes(program, lanes, scan_bins, topk_units)
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
    """Host words that load node's program and add its gradient (``HOST_IN`` packed), in
    element order for every program: a hash-flow program (``prog.hash_seed``) adds a
    ``HASH`` word (the accumulator base and the seed) before the gradients, and the
    engine's placer puts element i where the golden's buffer order has it. The placer
    learns each flow's range from the PROG rows (:func:`~.sparse_place.flow_table`,
    checked here so a program it cannot place is refused before a word is sent)."""
    def word(kind, addr, value):
        return kind | (addr << 3) | (value << 27)
    g = np.asarray(grads, np.float32).view(np.uint32)
    out = [word(HostKind.PROG, a, r) for a, r in enumerate(prog.rows[node])]
    base = prog.residual_base          # global residual: the accumulator is part[N:2N]
    if prog.hash_seed is not None:
        flow_table(prog.rows[node])
        out.append(word(HostKind.HASH, base, int(prog.hash_seed) & 0xFFFFFFFF))
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
    """:func:`decode_dump` of a DUMP sent as :func:`dump_request` (``prog``); a hash-flow
    program's words carry element indices (the engine's placer labels them)."""
    words = list(words)
    if prog.residual_base:             # the residual region first, the final pairs as before
        words = (words[prog.residual_base:prog.residual_base + prog.elements] +
                 words[prog.dump_words:])
    return decode_dump(words, prog.elements, prog.result_base,
                       labelled=prog.hash_seed is not None)


def decode_dump(words, elements: int, result_base: int | None = None, *,
                labelled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(residual, result) float32 vectors from a node's dump words (``HOST_OUT`` packed):
    the first ``elements`` words are the residual region, the rest the final pairs. Words
    are placed by position, or with ``labelled`` (a hash-flow engine) by the element index
    each word carries -- the residual words must then name every element once. With
    ``result_base`` (TopkA), the result is the dumped region part[result_base : result_base +
    elements] and the final pairs (every node's selection) are not part of it."""
    w = [int(x) for x in words]
    res = np.array([x >> 32 & 0xFFFFFFFF for x in w[:elements]], np.uint32)
    if result_base is not None:
        out = np.array([x >> 32 & 0xFFFFFFFF for x in w[result_base:result_base + elements]],
                       np.uint32)
        return res.view(np.float32), out.view(np.float32)
    pos = np.array([x & 0xFFFFFFFF for x in w[elements:]], np.int64)
    val = np.array([x >> 32 & 0xFFFFFFFF for x in w[elements:]], np.uint32)
    out = np.zeros(elements, np.uint32)
    if labelled:
        label = np.array([x & 0xFFFFFFFF for x in w[:elements]], np.int64)
        if not np.array_equal(np.sort(label), np.arange(elements)) or np.any(pos >= elements):
            raise ValueError("sparse dump: the element indices of the words are not a "
                             "permutation of the elements (hash placer or dump fault)")
        res_by_position, res = res, np.empty_like(res)
        res[label] = res_by_position
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
