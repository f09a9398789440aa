"""W-pair → one-pair narrowing adapter between the top-k unit and one-pair consumers.

:class:`~treenic.hdl.sparse.topk.TopKUnit` emits up to W selected pairs per beat, compacted
into lanes ``0 .. count-1``, with ``last`` on the selection's final beat (which may hold no
pair). The link (one (index, value) pair per 64-bit flit), the scatter-accumulate unit and
the encoder take one pair per beat. :class:`PairNarrower` serialises the lanes in lane order
(ascending index is kept) and ends every selection with one terminator beat (``end = 1``,
no pair), so a consumer learns where a selection ends even when its last beat was empty.

Golden: :func:`narrow_golden`. Throughput: one pair per cycle; a beat with no pair costs
nothing (the next beat is taken in the same cycle), the terminator one cycle.
"""
from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PairNarrower", "PAIR_END", "narrow_golden"]

#: layout of one narrowed beat: a pair, or the terminator of a selection (end = 1)
PAIR_END = data.StructLayout({"index": 32, "value": 32, "end": 1})


def narrow_golden(beats):
    """``beats``: (count, last, indices, values) tuples; returns the (index, value, end)
    beats :class:`PairNarrower` emits."""
    out = []
    for count, last, idx, val in beats:
        out += [(int(idx[l]), int(val[l]), 0) for l in range(count)]
        if last:
            out.append((0, 0, 1))
    return out


class PairNarrower(wiring.Component):
    """W lanes of pairs in, one pair (or a terminator) per beat out.

    Parameters
    ----------
    lanes : int
        W, pairs per input beat (the top-k unit's ``lanes``).

    Members
    -------
    i : In(stream.Signature(StructLayout{count, last, index: ArrayLayout(32, W), value: ...}))
        The top-k unit's output layout.
    o : Out(stream.Signature(:data:`PAIR_END`))
        Pairs in lane order; after the pairs of a ``last`` beat, one beat with ``end = 1``.
    """

    def __init__(self, *, lanes: int):
        if not isinstance(lanes, int) or not 1 <= lanes <= 32:
            raise ValueError(f"lanes must be an int in 1..32, got {lanes!r}")
        self.lanes = lanes
        beat = data.StructLayout({"count": range(lanes + 1), "last": 1,
                                  "index": data.ArrayLayout(32, lanes),
                                  "value": data.ArrayLayout(32, lanes)})
        super().__init__({"i": In(stream.Signature(beat)), "o": Out(stream.Signature(PAIR_END))})

    def elaborate(self, platform):
        m = Module()
        W = self.lanes
        held = Signal.like(self.i.payload)
        have = Signal()
        lane = Signal(range(W + 1))
        pairs_left = have & (lane < held.count)
        terminator = have & (lane >= held.count) & held.last
        # a beat whose pairs are out (and that needs no terminator) makes room at once
        m.d.comb += self.i.ready.eq(~have | ((lane >= held.count) & ~held.last))
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload), have.eq(1), lane.eq(0)]
        with m.Elif(have & (lane >= held.count) & ~held.last):
            m.d.sync += have.eq(0)
        m.d.comb += self.o.valid.eq(pairs_left | terminator)
        with m.Switch(lane):
            for l in range(W):
                with m.Case(l):
                    with m.If(pairs_left):
                        m.d.comb += [self.o.payload.index.eq(held.index[l]),
                                     self.o.payload.value.eq(held.value[l])]
        m.d.comb += self.o.payload.end.eq(terminator)
        with m.If(self.o.valid & self.o.ready):
            with m.If(terminator):
                m.d.sync += have.eq(0)
            with m.Else():
                m.d.sync += lane.eq(lane + 1)
        return m
