"""Zen's hash flow assignment (h0) in the sparse engine's load path: :class:`HashPlacer`.

With ``flow_assignment="hash"`` every flow of MultiTree-Sparse is the set of elements whose
MurmurHash3 partition (``treenic.sparse.zen.partition_of(i, flows, seed)``) is that flow.
The engine keeps each flow contiguous in its buffer (ascending element indices inside a
flow), so the top-k unit, the rows and the link format are those of contiguous flows; the
placer maps the host's element order onto that buffer order:

::

    GRAD (i, g), i = 0, 1, 2, ...  ─► Murmur3HashUnit(i, seed) ─► flow f
                                      position p = lo[f] + count[f]++   ─► (p, g) to the adder
                                      inv[p] = i                        (for the DUMP)

* ``lo[f]`` / ``n[f]`` (first buffer word and size of flow f) are written through ``flow``
  / ``flow_en``; the engine takes them from the program rows as they are loaded (every
  node has one SEND or ROOT row per flow, whose ``lo`` / ``n`` the compiler set from the
  golden's flow bounds): one source, the program (:func:`flow_table`).
* The input must be the sweep 0, 1, 2, ... (the host sends every element, in order). A word
  that is not the next index, an index at or past ``elements``, or a word whose flow is
  already full (a table that does not match the seed: a wrong seed is caught here) is
  dropped and flagged on ``error`` for one cycle, never placed elsewhere.
* ``restart`` starts a new sweep (next index 0, counters 0); assert it only while
  ``busy`` is low. ``busy`` is high while an accepted word has not left ``o``.
* ``inv`` (``lib.memory``, ``elements`` words): the element index of every buffer
  position, read through ``inv_addr`` / ``inv_data`` (one cycle), so the engine labels
  what it dumps with element indices.

Latency: the hash unit's (15 cycles for a power-of-two flow count, 21 otherwise) plus the
output register; one word a cycle. Golden: :func:`place_golden` (through
``treenic.sparse.multitree_sparse.hash_flows``, the golden model's own flow assignment).
"""
from __future__ import annotations

import numpy as np
from amaranth import Array, Module, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from treenic.schedule.sparse_table import SparseOp, unpack_row

from ..sparse.hash import Murmur3HashUnit

__all__ = ["HashPlacer", "PLACE_IN", "PLACE_OUT", "FLOW_ENTRY", "place_golden", "flow_table",
           "MAX_FLOWS", "MAX_ELEMENTS"]

MAX_FLOWS = 256                 # the row's chunk field (8 bits)
MAX_ELEMENTS = (1 << 24) - 1    # the host word's address field (24 bits)
#: the row ops whose lo / n the engine writes into its placer's flow table
PLACING_OPS = (SparseOp.SEND, SparseOp.ROOT, SparseOp.SEND_BM)

PLACE_IN = data.StructLayout({"index": 24, "value": 32})
PLACE_OUT = data.StructLayout({"position": 24, "value": 32})
FLOW_ENTRY = data.StructLayout({"flow": 8, "lo": 24, "n": 24})


class HashPlacer(wiring.Component):
    """Places an element-order sweep into hash-flow buffer order (see the module docstring).

    Parameters
    ----------
    flows : int
        Flow count (the partition modulus n of ``partition_of``), 1..256; any value (a
        non-power-of-two goes through the hash unit's constant-divisor modulo).
    elements : int
        Elements of a sweep (the depth of the inverse map), 1..2**24 - 1.
    lut_multiplies : int
        Passed to :class:`~treenic.hdl.sparse.hash.Murmur3HashUnit`.

    Members
    -------
    i : In(stream.Signature(PLACE_IN))
        (element index, value), the sweep in ascending index order.
    o : Out(stream.Signature(PLACE_OUT))
        (buffer position, value), in input order.
    seed : In(32)
        Hash seed; held while ``busy``.
    restart : In(1)
        Start a new sweep (only while not ``busy``).
    flow_en : In(1)
        Write ``flow`` into the flow table.
    flow : In(FLOW_ENTRY)
        A flow's first buffer word ``lo`` and size ``n``.
    error : Out(1)
        A word was dropped this cycle (out of sweep order, past ``elements``, or its flow full).
    busy : Out(1)
        A word is inside (hash pipeline or output register).
    inv_addr : In(range(elements))
    inv_data : Out(24)
        The element index written at buffer position ``inv_addr`` (one cycle later).
    """

    def __init__(self, *, flows: int, elements: int, lut_multiplies: int = 0):
        if not isinstance(flows, int) or not 1 <= flows <= MAX_FLOWS:
            raise ValueError(f"flows must be an integer in 1..{MAX_FLOWS}, got {flows!r}")
        if not isinstance(elements, int) or not 1 <= elements <= MAX_ELEMENTS:
            raise ValueError(f"elements must be an integer in 1..{MAX_ELEMENTS}, got {elements!r}")
        self.flows, self.elements, self.lut_multiplies = flows, elements, lut_multiplies
        super().__init__({"i": In(stream.Signature(PLACE_IN)),
                          "o": Out(stream.Signature(PLACE_OUT)),
                          "seed": In(32), "restart": In(1), "flow_en": In(1),
                          "flow": In(FLOW_ENTRY), "error": Out(1), "busy": Out(1),
                          "inv_addr": In(range(elements)), "inv_data": Out(24)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.hash = hu = Murmur3HashUnit(lanes=1, workers=self.flows,
                                                 lut_multiplies=self.lut_multiplies)
        # the values wait beside the hash pipeline (it returns keys in order, at most
        # latency + 1 of them inside)
        m.submodules.values = values = fifo.SyncFIFOBuffered(width=32, depth=hu.latency + 2)
        m.submodules.inverse = inv = memory.Memory(shape=24, depth=self.elements, init=[])
        inv_w, inv_r = inv.write_port(), inv.read_port()
        m.d.comb += [inv_r.addr.eq(self.inv_addr), self.inv_data.eq(inv_r.data),
                     hu.seed.eq(self.seed)]
        table = [Array(Signal(24, name=f"{what}{f}") for f in range(self.flows))
                 for what in ("lo", "n", "count")]
        lo, size, count = table
        with m.If(self.flow_en & (self.flow.flow < self.flows)):
            m.d.sync += [lo[self.flow.flow].eq(self.flow.lo), size[self.flow.flow].eq(self.flow.n)]
        sweep_next = Signal(24)       # the element index the sweep accepts next
        result_index = Signal(24)     # the element index of the next hash result (in order)
        dropped_in = self._accept(m, hu, values, sweep_next)
        dropped_out = self._place(m, hu, values, lo, size, count, inv_w, result_index)
        m.d.comb += [self.error.eq(dropped_in | dropped_out),
                     self.busy.eq((sweep_next != result_index) | self.o.valid)]
        with m.If(self.restart):            # last: wins over the counter updates
            m.d.sync += [sweep_next.eq(0), result_index.eq(0)]
            m.d.sync += [count[f].eq(0) for f in range(self.flows)]
        return m

    def _accept(self, m, hu, values, sweep_next):
        """The input side: the next index of the sweep enters the hash unit (its value the
        FIFO beside it); any other word is taken and dropped. Returns the drop strobe."""
        i = self.i
        in_order = (i.payload.index == sweep_next) & (i.payload.index < self.elements)
        take = i.valid & in_order & hu.i.ready & values.w_rdy
        m.d.comb += [i.ready.eq(~in_order | (hu.i.ready & values.w_rdy)),
                     hu.i.valid.eq(take), hu.i.payload[0].eq(i.payload.index),
                     values.w_en.eq(take), values.w_data.eq(i.payload.value)]
        with m.If(take):
            m.d.sync += sweep_next.eq(sweep_next + 1)
        return i.valid & ~in_order

    def _place(self, m, hu, values, lo, size, count, inv_w, result_index):
        """The output register: position ``lo[f] + count[f]`` of the hash result's flow f,
        the inverse map written beside it. Returns the drop strobe (flow full)."""
        o = self.o
        flow = hu.o.payload.partition[0] if self.flows > 1 else 0
        room = count[flow] < size[flow]
        position = (lo[flow] + count[flow])[:24]
        load = hu.o.valid & (~o.valid | o.ready)
        m.d.comb += [hu.o.ready.eq(load), values.r_en.eq(load)]
        with m.If(o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(load):
            m.d.sync += result_index.eq(result_index + 1)
            with m.If(room):
                m.d.sync += [o.valid.eq(1), o.payload.position.eq(position),
                             o.payload.value.eq(values.r_data), count[flow].eq(count[flow] + 1)]
                m.d.comb += [inv_w.addr.eq(position), inv_w.data.eq(result_index),
                             inv_w.en.eq(1)]
        return load & ~room


def flow_table(rows) -> tuple[list[int], list[int]]:
    """(lo, n) per flow from one node's program rows, as the engine loads its placer: the
    ``lo`` / ``n`` of the flow's SEND, SEND_BM or ROOT row (every MultiTree-Sparse node has
    exactly one per flow). Raises ``ValueError`` if a flow has none or two."""
    found: dict[int, tuple[int, int]] = {}
    for word in rows:
        r = unpack_row(int(word))
        if r["op"] in PLACING_OPS:
            if r["chunk"] in found:
                raise ValueError(f"flow {r['chunk']} has two SEND/ROOT rows in the program")
            found[r["chunk"]] = (r["lo"], r["n"])
    flows = max(found, default=-1) + 1
    missing = [f for f in range(flows) if f not in found]
    if missing or not found:
        raise ValueError(f"no SEND/ROOT row names flow {missing[0] if missing else 0}: the "
                         "hash placer cannot learn its buffer range")
    return [found[f][0] for f in range(flows)], [found[f][1] for f in range(flows)]




def place_golden(words, *, elements: int, flows: int, seed: int, table=None):
    """The :class:`HashPlacer` of ``words`` ([(index, value)] in input order): returns
    ``(outputs [(position, value)], inverse {position: index}, errors)``. The flow of an
    element comes from ``treenic.sparse.multitree_sparse.hash_flows`` (the golden model's
    assignment); ``table`` = (lo, n) per flow, default that assignment's own bounds, in
    which case a full sweep places element ``perm[p]`` at position p."""
    from treenic.sparse.multitree_sparse import hash_flows
    perm, offsets = hash_flows(elements, flows, seed)
    rank = np.empty(elements, np.int64)
    rank[perm] = np.arange(elements)
    flow_of = np.searchsorted(offsets, rank, side="right") - 1
    lo, size = table if table is not None else (offsets[:-1], np.diff(offsets))
    count = [0] * flows
    sweep_next, out, inverse, errors = 0, [], {}, 0
    for index, value in words:
        if index != sweep_next or index >= elements:
            errors += 1
            continue
        sweep_next += 1
        f = int(flow_of[index])
        if count[f] >= size[f]:
            errors += 1
            continue
        position = int(lo[f]) + count[f]
        count[f] += 1
        out.append((position, value))
        inverse[position] = index
    return out, inverse, errors
