"""A free-running pipeline with an output FIFO and a credit counter, used by the hash unit.

The datapath registers load every cycle: no clock enable, no reset (a stall-together
pipeline puts ``~o.valid | o.ready`` on the enable of every stage register, one net of
about 10 000 loads at 16 lanes, the hash unit's critical path at 103 MHz). A valid bit
travels with each stage instead, and the last stage writes into a :class:`SyncFIFO`. The
input is accepted only while the FIFO has room for every beat in flight: a registered
credit counter starts at the FIFO depth, a beat accepted takes a credit, a beat read from
the FIFO gives it back. ``i.ready`` is a register (it never depends on ``o.ready`` or
``i.valid``), so the back-pressure path is a handful of flip-flops, not the datapath.

The FIFO's storage is the pipeline's last register (its write data is the last stage's
logic), so the latency is ``stages`` cycles as for a plain register pipeline; with a FIFO
``stages + 1`` deep the credit returns in time to accept one beat every cycle while the
consumer is ready (a credit is held from the accepting cycle to the output transfer
``stages`` cycles later, and the counter is seen one cycle after that).
"""
from amaranth import Signal
from amaranth.lib.fifo import SyncFIFO


class CreditPipeline:
    """Valid bits, output FIFO and input credit of an ``stages``-cycle free-running pipeline.

    Parameters
    ----------
    m : Module
        Module the logic is added to (the FIFO becomes ``m.submodules.out_fifo``).
    i, o : stream interfaces
        Input and output streams (``i.ready``, ``o.valid`` and ``o.payload`` are driven here).
    stages : int
        Latency in cycles: ``stages - 1`` datapath registers, then the FIFO.

    Members
    -------
    result : Signal
        The last stage's value (``o.payload``'s shape, as a flat value), driven by the caller
        from the ``stages - 1``-th register; written into the FIFO with that stage's valid bit.
    depth : int
        FIFO depth, ``stages + 1``: the fewest entries that sustain one beat a cycle.
    """

    def __init__(self, m, i, o, stages: int):
        if not isinstance(stages, int) or stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got {stages!r}")
        self.depth = stages + 1
        width = len(o.payload.as_value())
        self.result = Signal(width)
        m.submodules.out_fifo = fifo = SyncFIFO(width=width, depth=self.depth)
        credits = Signal(range(self.depth + 1), init=self.depth)
        has_credit = Signal(init=1)
        accept = Signal()
        m.d.comb += [i.ready.eq(has_credit), accept.eq(i.valid & has_credit)]
        valid = accept
        for n in range(stages - 1):     # the valid bit beside each datapath register
            stage_valid = Signal(name=f"stage{n}_valid")
            m.d.sync += stage_valid.eq(valid)
            valid = stage_valid
        release = fifo.r_rdy & o.ready
        # unsigned steps only: the one-line ``credits - accept + release`` (a signed sum in
        # the Verilog) ran wrong in the Verilator 5.049 cosim model at -O3 without --trace
        # (i.ready low with 10 of 16 credits used, then beats lost); at -O0 or traced it
        # agreed with the Amaranth simulator
        credits_next = Signal.like(credits)
        m.d.comb += credits_next.eq(credits)
        with m.If(accept & ~release):
            m.d.comb += credits_next.eq(credits - 1)
        with m.If(release & ~accept):
            m.d.comb += credits_next.eq(credits + 1)
        m.d.sync += [credits.eq(credits_next), has_credit.eq(credits_next != 0)]
        m.d.comb += [fifo.w_en.eq(valid), fifo.w_data.eq(self.result),
                     o.valid.eq(fifo.r_rdy), o.payload.eq(fifo.r_data), fifo.r_en.eq(o.ready)]
