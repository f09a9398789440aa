"""The hash placer's part of the sparse engine (built only with ``hash_elements``): the
``HASH`` host word, the flow table taken from the PROG rows, GRAD words through the placer,
and the element-index labels of the DUMP (see :mod:`.sparse_place` for the placer and
:mod:`.sparse_engine` for the host words).

The placer's output writes the scatter adder in the states where the sequencer waits for
its loads to land (IDLE and the WAIT states before a run, a CLEAR and a DUMP); those waits
also wait for the placer to empty (:func:`loads_done`), so a run never starts, and a dump
never reads, before every accepted gradient is in ``part``.
"""
from __future__ import annotations

from amaranth import Cat, Mux, Signal
from amaranth.lib import data

from .sparse_engine import ROW, HostKind
from ..sparse.hash import LATENCY
from ..sparse.scatter import LATENCY as SCATTER_LATENCY
from .sparse_place import PLACING_OPS, HashPlacer


def build_placer(m, c):
    """The placer and its configuration registers: ``hash_on`` (a HASH word since the last
    PROG word), ``region`` (the accumulator base the GRAD addresses start at) and the seed."""
    e = c.e
    m.submodules.placer = c.placer = HashPlacer(flows=e.chunks, elements=e.hash_elements)
    # a sweep's first word reaches the adder after every earlier write has left it
    assert LATENCY > SCATTER_LATENCY
    c.hash_on, c.region, c.hash_seed = Signal(), Signal(24), Signal(32)
    m.d.comb += c.placer.seed.eq(c.hash_seed)


def loads_done(c):
    """The gradients accepted so far are in ``part`` (the scatter adder and the placer
    empty): the condition every wait before a run, a CLEAR or a DUMP tests."""
    if c.placer is None:
        return c.adds_idle
    return c.adds_idle & ~c.placer.busy


def drain(m, c):
    """Placed words into the scatter adder (``part[region + position] += g``). Called last
    in the states that may hold them, so it wins over the state's own (idle) drive.

    The positions of a sweep are not ascending (they alternate between flows), which the
    scatter unit's read-after-write rule would treat as a message boundary each time (a
    pipeline drain, about 9 cycles); they are distinct, though (each position once a
    sweep), and a sweep's first word comes through the hash pipeline, longer than the
    adder's, after any earlier write. So they go in as ``distinct``: one word a cycle."""
    if c.placer is None:
        return
    o = c.placer.o
    with m.If(o.valid):
        m.d.comb += [c.sc_valid.eq(1), c.sc_index.eq(c.region + o.payload.position),
                     c.sc_value.eq(o.payload.value), o.ready.eq(c.sc_ready),
                     c.sc_distinct.eq(1)]


def restart_sweep(m, c):
    """A run starts: the next GRAD sweep begins at element 0 again."""
    if c.placer is not None:
        m.d.comb += c.placer.restart.eq(1)


def idle_words(m, c, h):
    """IDLE's GRAD, PROG and HASH host words on a hash-flow engine (after the plain ones,
    so these assignments win)."""
    if c.placer is None:
        return
    pl = c.placer
    with m.Switch(h.payload.kind):
        with m.Case(HostKind.GRAD):
            with m.If(c.hash_on):       # element order: the placer finds the position
                m.d.comb += [c.sc_valid.eq(0), pl.i.valid.eq(h.valid), h.ready.eq(pl.i.ready),
                             pl.i.payload.index.eq(h.payload.addr - c.region),
                             pl.i.payload.value.eq(h.payload.data[:32])]
            with m.Else():              # a buffer address: wait until placed words are in
                m.d.comb += [c.sc_valid.eq(h.valid & ~pl.busy),
                             h.ready.eq(c.sc_ready & ~pl.busy)]
        with m.Case(HostKind.PROG):
            row = data.View(ROW, h.payload.data)
            op = Cat(row.op, row.op_hi)
            placing = 0
            for p in PLACING_OPS:
                placing = placing | (op == p)
            m.d.comb += [pl.flow_en.eq(h.valid & placing), pl.flow.flow.eq(row.chunk),
                         pl.flow.lo.eq(row.lo), pl.flow.n.eq(row.n)]
            with m.If(h.valid):
                m.d.sync += c.hash_on.eq(0)
        with m.Case(HostKind.HASH):
            m.d.comb += h.ready.eq(~pl.busy)
            with m.If(h.valid & ~pl.busy):
                m.d.comb += pl.restart.eq(1)
                m.d.sync += [c.hash_on.eq(1), c.region.eq(h.payload.addr),
                             c.hash_seed.eq(h.payload.data[:32])]
    drain(m, c)


def count_drops(m, c):
    """Every GRAD word the placer drops counts in ``malformed`` (the input side drops only
    in IDLE, the output side in any wait before a run; nothing else counts there but a
    receive FIFO overflow)."""
    if c.placer is not None:
        with m.If(c.placer.error):
            m.d.comb += c.malformed_event.eq(1)


def residual_label(m, c, next_j, j):
    """The ``index`` of the residual-region DUMP word of buffer word ``j``: ``j`` itself,
    or with the placer on the element index ``inv[j - region]`` (``inv[j]`` below the
    region: the global residual's work region). ``next_j`` is the word read next cycle."""
    if c.placer is None:
        return j
    local = Mux(next_j >= c.region, next_j - c.region, next_j)
    m.d.comb += c.placer.inv_addr.eq(local)
    return Mux(c.hash_on, c.placer.inv_data, j)


def final_label(m, c):
    """The ``index`` of a final pair's DUMP word: its buffer position, or with the placer
    on the element index ``inv[position]`` (the lookup state before each word gives the
    inverse map its read cycle)."""
    position = c.fin_r.data[:32]
    if c.placer is None:
        return position
    m.d.comb += c.placer.inv_addr.eq(position)
    return Mux(c.hash_on, c.placer.inv_data, position)
