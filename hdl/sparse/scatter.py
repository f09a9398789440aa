"""Scatter-accumulate: adds an (index, value) stream into the dense buffer through the
project's pipelined binary32 adder (``treenic.hdl.fp32.FP32Adder``).

Contract
--------
Each pair (index, value) on ``i`` performs ``buf[index] = fl32(buf[index] + value)`` with the
buffer's value as the left operand (local value first); pairs take effect in stream order, so
messages fed in ascending (step, rx_port) order give exactly the numeric contract of
``treenic.sparse.base.scatter_accumulate`` (golden). Every write is also emitted on ``o`` as
(index, new value), in the same order. An index outside the buffer is dropped and sets the
sticky ``range_error`` flag (the golden raises).

Timing: one pair per cycle sustained (read, operand register, 7-stage add, write back:
latency 10 cycles; the block RAM's output is registered before the adder's first stage, as
the NIC's banked buffer's is: 4.3 ns of clock-to-out and the exponent compare behind it
missed 8 ns by an estimated 4 ns inside the sparse engine). The
buffer is a simple-dual-port :class:`~treenic.hdl.ram.BlockRam` (one read port for the operand,
one write port for the sum; a read that meets a write of its own word is never used, so no
read-first logic is built around the block RAM), so the read of a new pair and the write-back of an older one never compete for a
port: at one pair per cycle there is no bank conflict to arbitrate. The only hazard is
read-after-write on one index, possible only when a new message starts (indices inside one
message are strictly ascending, so a pair never meets an in-flight write of its own
message): a pair whose index is not above the previous pair's waits until the pipeline is
empty, about 10 cycles per message boundary. Nothing is ever reordered. With ``banks`` > 1
the buffer is a :class:`~treenic.hdl.ram.LaneBankedRam` (the same ports, the same cycles,
one bank-select mux behind the operand read).
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..fp32 import LATENCY as ADD_LATENCY
from ..fp32 import FP32Adder
from ..ram import BlockRam, LaneBankedRam

__all__ = ["ScatterAccumulate", "LATENCY"]

LATENCY = ADD_LATENCY + 3


class ScatterAccumulate(wiring.Component):
    """Pairs in, read-add-write into an internal dense buffer, writes out.

    Parameters
    ----------
    depth : int
        Buffer words (power of two, 2..2**20).
    init : sequence of int
        Initial buffer contents (binary32 bit patterns): the local values.
    distinct_port : bool
        Build the ``distinct`` input (default off: the unit as before, bit for bit).
    old_port : bool
        Build the ``log`` input and the ``old`` output (default off: the unit as before,
        bit for bit): the buffer operand each logged pair read, for an undo log.
    banks : int
        1 (default): ``buffer`` is one :class:`~treenic.hdl.ram.BlockRam`. A power of two
        above 1: a :class:`~treenic.hdl.ram.LaneBankedRam` of that many banks, whose lanes
        ports read ``banks`` consecutive words (the sparse engine's feeders), each one read
        port per bank rather than a copy of the buffer per word. The unit is the same,
        cycle for cycle.

    Members
    -------
    i : In(stream.Signature(StructLayout{index: 32, value: 32}))
        Pairs, ascending index within a message.
    o : Out(stream.Signature(StructLayout{index: 32, value: 32}))
        Every buffer write (index, new value), in input order.
    range_error : Out(1)
        Sticky: a pair with index >= depth was dropped.
    idle : Out(1)
        No pair accepted and not yet written: the count behind it is a register, so a
        caller tests "every add done" without a counter of its own.
    set : In(1)
        With the pair on ``i``: write ``value`` instead of adding it (the adder's buffer
        operand is replaced by +0, so the write is ``fl32(+0 + value)`` = ``value`` for every
        value but -0, which becomes +0). The sparse engine zeroes and copies regions with it
        through the one write path, in stream order with the additions.
    distinct : In(1)
        Only with ``distinct_port=True``. With the pair on ``i``: the caller guarantees its
        index is in no write still in flight, so it issues without the boundary wait (the
        sparse engine's hash placer: one sweep writes every position once, in an order that
        is not ascending).
    log : In(1)
        Only with ``old_port=True``. With the pair on ``i``: report the value it replaces.
    old : Out(stream.Signature(StructLayout{index: 32, value: 32}, always_ready=True))
        Only with ``old_port=True``. For every logged pair, in input order, (index, the
        buffer word before its write) -- the operand the adder reads, one cycle after the
        pair is accepted (or later, while the adder stalls), always before its write-back.
        The read-after-write rule above makes it the word as every earlier pair left it.
        The sparse engine keeps these to undo a malformed message::

            i     : (5,a)(7,b)(9,c)          pairs accepted, log = 1
            old   :      (5,p5)(7,p7)(9,p9)  one cycle later: the words they replace
            write :                ... 10 cycles after i: p5+a, p7+b, p9+c
    """

    def __init__(self, *, depth: int = 1024, init=(), distinct_port: bool = False,
                 old_port: bool = False, banks: int = 1):
        if not isinstance(depth, int) or not 2 <= depth <= 1 << 20 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two in 2..2**20, got {depth!r}")
        if len(init) > depth:
            raise ValueError(f"init has {len(init)} words, the buffer {depth}")
        if not isinstance(banks, int) or not 1 <= banks <= depth or banks & (banks - 1):
            raise ValueError(f"banks must be a power of two in 1..depth, got {banks!r}")
        self.depth, self.addr_bits = depth, depth.bit_length() - 1
        self.banks = banks
        if banks == 1:
            self.buffer = BlockRam(shape=32, depth=depth, init=list(init))
        else:
            self.buffer = LaneBankedRam(width=32, depth=depth, banks=banks, init=list(init))
        pair = data.StructLayout({"index": 32, "value": 32})
        self.distinct_port = bool(distinct_port)
        members = {"i": In(stream.Signature(pair)), "o": Out(stream.Signature(pair)),
                   "range_error": Out(1), "idle": Out(1), "set": In(1)}
        if self.distinct_port:
            members["distinct"] = In(1)
        self.old_port = bool(old_port)
        if self.old_port:
            members["log"] = In(1)
            members["old"] = Out(stream.Signature(pair, always_ready=True))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        AB = self.addr_bits
        m.submodules.buffer = self.buffer
        m.submodules.adder = adder = FP32Adder(tag_width=AB)
        rp, wp = self.buffer.read_port(), self.buffer.write_port()
        idx, val = self.i.payload.index, self.i.payload.value
        in_range = (idx >> AB) == 0

        # pairs accepted but not yet written back; a message boundary waits for zero
        in_flight = Signal(range(LATENCY + 4))
        last_index = Signal(AB)
        started = Signal()
        # stage B: the operand read of the accepted pair arrives one cycle later; stage C:
        # the operand registered (set mode: +0) in front of the adder
        b_valid, b_index, b_value, b_set = Signal(), Signal(AB), Signal(32), Signal()
        c_valid, c_index, c_value, c_operand = Signal(), Signal(AB), Signal(32), Signal(32)
        advance_c = ~c_valid | adder.i.ready
        advance_b = ~b_valid | advance_c
        boundary = started & (idx[:AB] <= last_index)
        if self.distinct_port:
            boundary = boundary & ~self.distinct
        may_issue = advance_b & (~boundary | (in_flight == 0))
        m.d.comb += self.i.ready.eq(may_issue | ~in_range)
        issue = self.i.valid & may_issue & in_range
        with m.If(self.i.valid & ~in_range):
            m.d.sync += self.range_error.eq(1)
        m.d.comb += [rp.addr.eq(idx[:AB]), rp.en.eq(advance_b)]
        with m.If(advance_b):
            m.d.sync += [b_valid.eq(issue), b_index.eq(idx[:AB]), b_value.eq(val),
                         b_set.eq(self.set)]
        with m.If(issue):
            m.d.sync += [last_index.eq(idx[:AB]), started.eq(1)]
        with m.If(advance_c):
            m.d.sync += [c_valid.eq(b_valid), c_index.eq(b_index), c_value.eq(b_value),
                         c_operand.eq(Mux(b_set, 0, rp.data))]
        if self.old_port:
            self._old(m, issue, advance_b, b_valid, b_index, rp.data, advance_c)
        m.d.comb += [adder.i.valid.eq(c_valid), adder.i.payload.a.eq(c_operand),
                     adder.i.payload.b.eq(c_value), adder.i.payload.tag.eq(c_index)]

        # write-back and the write stream leave together
        done = adder.o.valid & self.o.ready
        m.d.comb += [adder.o.ready.eq(self.o.ready), self.o.valid.eq(adder.o.valid),
                     self.o.payload.index.eq(adder.o.payload.tag),
                     self.o.payload.value.eq(adder.o.payload.sum),
                     wp.addr.eq(adder.o.payload.tag), wp.data.eq(adder.o.payload.sum),
                     wp.en.eq(done)]
        m.d.sync += in_flight.eq(in_flight + issue - done)
        m.d.comb += self.idle.eq(in_flight == 0)
        return m

    def _old(self, m, issue, advance_b, b_valid, b_index, operand, advance_c):
        """``old``: a logged pair's operand as it leaves stage B."""
        b_log = Signal()
        with m.If(advance_b):
            m.d.sync += b_log.eq(issue & self.log)
        m.d.comb += [self.old.valid.eq(b_valid & b_log & advance_c),
                     self.old.payload.index.eq(b_index), self.old.payload.value.eq(operand)]
