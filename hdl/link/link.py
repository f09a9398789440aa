"""Link channel for simulated fabrics (RTL): latency and random stalls, flits one way,
credits back.

::

    i.flit ─► [latency regs] ─► elastic FIFO ─► (pop unless stalled) ─► o.flit
    i.credit ◄──────────────── [latency regs] ◄──────────────────────── o.credit

The stall enable comes from a 16-bit Fibonacci LFSR (x^16 + x^14 + x^13 + x^11 + 1,
seedable): in a cycle where its low byte is below ``stall`` (0..256 out of 256) the link
delivers nothing.  Flits are never lost while the sender honours credits and ``depth`` is
at least the receiver's total buffer (all VCs); ``overflow`` (sticky) flags it otherwise.

With ``crc_width`` > 0 the link also carries the CRC sideband of
:class:`~treenic.hdl.link.crc.CrcLinkSignature` (delayed and buffered with its flit).
"""

from functools import lru_cache

import numpy as np
from amaranth.hdl import Module, Signal, Cat
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from .flit import FlitFormat, LinkSignature

__all__ = ["LinkChannel", "lfsr16_next", "stall_pattern"]


def lfsr16_next(x: int) -> int:
    """Golden model of the LFSR step (same sequence as the RTL)."""
    bit = ((x >> 15) ^ (x >> 13) ^ (x >> 12) ^ (x >> 10)) & 1
    return ((x << 1) | bit) & 0xFFFF


LFSR16_PERIOD = (1 << 16) - 1


@lru_cache(maxsize=1)
def _lfsr16_cycle() -> tuple[np.ndarray, np.ndarray]:
    """The LFSR's one cycle of non-zero states from 1 (the polynomial is maximal: every seed
    lies on it) and each state's position on it."""
    seq = np.empty(LFSR16_PERIOD, np.uint16)
    x = 1
    for k in range(LFSR16_PERIOD):
        seq[k] = x
        x = lfsr16_next(x)
    if x != 1:
        raise AssertionError("LFSR polynomial is not maximal")
    pos = np.zeros(1 << 16, np.int64)
    pos[seq] = np.arange(LFSR16_PERIOD)
    return seq, pos


def stall_pattern(seed: int, stall: int, start: int, cycles: int) -> np.ndarray:
    """Golden model of a :class:`LinkChannel`'s stall enable: ``cycles`` booleans, the cycles
    after its LFSR has advanced ``start`` times from ``seed`` (it advances every cycle from
    reset release; ``seed`` as the constructor masks it).  The pattern repeats every
    ``LFSR16_PERIOD`` cycles."""
    if not 0 <= stall <= 256:
        raise ValueError("stall must be in 0..256")
    if start < 0 or cycles < 0:
        raise ValueError("start and cycles must be >= 0")
    seq, pos = _lfsr16_cycle()
    idx = (pos[(seed & 0xFFFF) or 1] + start + np.arange(cycles)) % LFSR16_PERIOD
    return (seq[idx] & 0xFF) < stall


class LinkChannel(wiring.Component):
    """Ports: ``i: In(LinkSignature(fmt))`` (from a packetiser), ``o: Out(...)`` (to a
    depacketiser), ``overflow: Out(1)``, ``stalls: Out(32)`` (stalled cycles).

    Args:
        latency: register stages in each direction (>= 1).
        stall: stall probability in 1/256 (0 = never, 256 = always).
        seed: LFSR seed (non-zero after masking to 16 bits; 0 is replaced by 1).
        depth: elastic buffer depth in flits.
        crc_width: width of the CRC sideband it carries with each flit (0: none; see
            :class:`~treenic.hdl.link.crc.CrcLinkSignature`).
    """

    def __init__(self, fmt: FlitFormat | None = None, *, latency: int = 1, stall: int = 0,
                 seed: int = 0xACE1, depth: int = 32, crc_width: int = 0):
        self.fmt = fmt = fmt or FlitFormat()
        if latency < 1:
            raise ValueError("latency must be >= 1")
        if not 0 <= stall <= 256:
            raise ValueError("stall must be in 0..256")
        self.latency, self.stall, self.depth = latency, stall, depth
        self.seed = (seed & 0xFFFF) or 1
        self.crc_width = crc_width
        if crc_width:
            from .crc import CrcLinkSignature
            sig = CrcLinkSignature(fmt, crc_width)
        else:
            sig = LinkSignature(fmt)
        super().__init__({
            "i": In(sig),
            "o": Out(sig),
            "overflow": Out(1),
            "stalls": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        # forward pipeline
        # (the CRC sideband, if any, travels as the flit's top bits)
        v, f = self.i.valid, Cat(self.i.flit.as_value(), self.i.crc if self.crc_width else [])
        for n in range(self.latency):
            vn, fn = Signal(name=f"fv{n}"), Signal(len(f), name=f"ff{n}")
            m.d.sync += [vn.eq(v), fn.eq(f)]
            v, f = vn, fn
        m.submodules.q = q = fifo.SyncFIFO(width=len(f), depth=self.depth)
        m.d.comb += [q.w_data.eq(f), q.w_en.eq(v)]
        with m.If(v & ~q.w_rdy):
            m.d.sync += self.overflow.eq(1)

        lfsr = Signal(16, init=self.seed)
        m.d.sync += lfsr.eq(Cat(lfsr[15] ^ lfsr[13] ^ lfsr[12] ^ lfsr[10], lfsr[:15]))
        stall = Signal()
        m.d.comb += stall.eq(lfsr[:8] < self.stall)
        m.d.sync += self.stalls.eq(self.stalls + stall)
        m.d.comb += [self.o.valid.eq(q.r_rdy & ~stall), self.o.flit.eq(q.r_data),
                     q.r_en.eq(~stall)]
        if self.crc_width:
            m.d.comb += self.o.crc.eq(q.r_data[fmt.flit.size:])

        # credit return pipeline
        c = self.o.credit
        for n in range(self.latency):
            cn = Signal(fmt.vcs, name=f"c{n}")
            m.d.sync += cn.eq(c)
            c = cn
        m.d.comb += self.i.credit.eq(c)
        return m
