"""A stall-together pipeline helper shared by the sparse units.

Every stage register of a :class:`StallPipeline` loads when the last stage is empty or the
consumer takes it (``advance = ~o.valid | o.ready``), so the pipeline moves one item per
cycle under ``o.ready = 1``, holds everything under backpressure and never drops or
duplicates a transfer. ``i.ready`` equals ``advance``: it depends on ``o.ready`` (allowed by
the stream rules: ready may depend on valid, valid never depends on ready).
"""
from amaranth import Signal


class StallPipeline:
    """Book-keeping of the valid bits of an ``n``-stage stall-together pipeline.

    Parameters
    ----------
    m : Module
        Module the logic is added to.
    i, o : stream interfaces
        Input and output streams (``o.valid`` is driven here).
    stages : int
        Number of register stages (latency in cycles).

    Members
    -------
    advance : Signal
        High when every stage register loads this cycle.
    """

    def __init__(self, m, i, o, stages: int):
        if stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got {stages}")
        self.advance = Signal()
        valid = [Signal(name=f"stage{n}_valid") for n in range(stages)]
        m.d.comb += [self.advance.eq(~valid[-1] | o.ready), i.ready.eq(self.advance),
                     o.valid.eq(valid[-1])]
        with m.If(self.advance):
            m.d.sync += valid[0].eq(i.valid)
            m.d.sync += [valid[n].eq(valid[n - 1]) for n in range(1, stages)]
