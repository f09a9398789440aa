"""Skid buffer: a ``lib.stream`` register slice that cuts the ``ready`` path as well.

    i ──► [skid register] ──┐
      │                     ▼
      └────────────────► [output register] ──► o

``o.valid``/``o.payload`` come from a register (one cycle of latency) and ``i.ready`` is a
register too (``not skid.valid``), so neither the forward data nor the backward ``ready``
passes combinationally from one side to the other.  A transfer accepted while the output
is stalled waits in the skid register; the stream still moves one transfer per cycle
whenever ``o.ready`` stays high.  Golden model: the identity on the sequence of
transfers (nothing lost, duplicated or reordered), see ``tests/test_hdl_skid.py``.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """``i`` -> ``o`` with registered ``o.valid``/``o.payload`` and registered ``i.ready``.

    Parameters
    ----------
    shape : shape-like
        Payload shape of both streams.
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)),
                          "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        skid_valid = Signal()
        skid = Signal.like(self.i.payload)
        m.d.comb += self.i.ready.eq(~skid_valid)
        # the skid register follows the input while it holds nothing (its word is unused
        # then), so its enable is ``~skid_valid``, not the input's valid: a late valid
        # drives two flip-flops, not the enables of the whole payload
        with m.If(~skid_valid):
            m.d.sync += skid.eq(self.i.payload)
        with m.If(~self.o.valid | self.o.ready):
            # the output register is free next cycle: refill it, from the skid first
            with m.If(skid_valid):
                m.d.sync += [self.o.valid.eq(1), self.o.payload.eq(skid), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
        with m.Elif(self.i.valid & ~skid_valid):
            # output stalled: park the accepted transfer (its word is in ``skid``)
            m.d.sync += skid_valid.eq(1)
        return m
