"""Pipelined MurmurHash3_x86_32 hash unit with Zen's partition (``partition_of``) on top.

Contract
--------
``Murmur3HashUnit(lanes=W, partition_bits=P)`` takes a stream of W u32 keys per beat and
returns, per lane, ``hash = murmur3_32(key, seed)`` and ``partition = hash mod 2**P`` --
bit-exact with ``treenic.sparse.zen.murmur3_32`` / ``zen.partition_of(key, 2**P, seed)``
(and with the ``mmh3`` package). ``seed`` is a configuration input sampled with each beat
(change it only while the unit is idle). The hardware partition reduction is a mask, so the
worker count must be a power of two (docs/sparse-models.md, Zen Z-4.2: ``mod`` by a power of two; a
non-power-of-two ``n`` would need a divider and is not supported by this unit).

Pipeline (11 stages, latency 11 cycles, one beat = W keys per cycle); every multiply by a
constant is split into 16x16 partial products (one MULT18X18D each) and a 16-bit sum::

    S1/S2   k = key * c1                    (seed-independent key mix)
    S3/S4   k = rotl(k, 15) * c2
    S5      t = rotl(seed ^ k, 13); t = t + (t << 2)          (x5: one adder)
    S6      h = (t + n) ^ 4; h ^= h >> 16
    S7/S8   h *= f1
    S9/S10  h = (h ^ h >> 13) * f2
    S11     h ^= h >> 16; partition = h & (2**P - 1)

At most one carry chain per stage: the first version (one 32x32 multiply per stage and
x5 + n in one stage) placed at 89.6 MHz on the ECP5 85F. Stall-together flow control (see
``pipeline.StallPipeline``).
"""
from amaranth import Module, Signal, Cat
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import StallPipeline

__all__ = ["Murmur3HashUnit", "LATENCY"]

LATENCY = 11
_C1, _C2, _N = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35


def _rotl(v, r):
    return Cat(v[32 - r:], v[:32 - r])


class Murmur3HashUnit(wiring.Component):
    """W-lane MurmurHash3_x86_32 of u32 keys, plus the Zen partition of each key.

    Parameters
    ----------
    lanes : int
        Keys per beat (W >= 1).
    partition_bits : int
        log2 of the worker count n (0..16); ``partition = hash mod 2**partition_bits``.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(32, lanes)))
        Keys, lane 0 first.
    seed : In(32)
        Hash seed (s0 for the partition); held constant while items are in flight.
    o : Out(stream.Signature(StructLayout{hash, partition}))
        Per lane the 32-bit hash and its partition, in input order.
    """

    def __init__(self, *, lanes: int = 2, partition_bits: int = 0):
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        if not isinstance(partition_bits, int) or not 0 <= partition_bits <= 16:
            raise ValueError(f"partition_bits must be an integer in 0..16, got {partition_bits!r}")
        self.lanes, self.partition_bits = lanes, partition_bits
        out = data.StructLayout({"hash": data.ArrayLayout(32, lanes),
                                 "partition": data.ArrayLayout(max(1, partition_bits), lanes)})
        super().__init__({"i": In(stream.Signature(data.ArrayLayout(32, lanes))),
                          "seed": In(32),
                          "o": Out(stream.Signature(out))})

    def elaborate(self, platform):
        m = Module()
        pipe = StallPipeline(m, self.i, self.o, LATENCY)
        seed = Signal(32)
        m.d.sync += seed.eq(self.seed)          # configuration register (cuts the input path)
        for lane in range(self.lanes):
            self._lane(m, pipe.advance, seed, self.i.payload[lane], lane)
        return m

    def _lane(self, m, advance, seed, key, lane):
        def reg(name):
            return Signal(32, name=f"l{lane}_{name}")

        def multiply(x, c, name):
            """x * c mod 2**32 in two stages: 16x16 partial products, then their sum."""
            lo, mid_a, mid_b = (Signal(32, name=f"l{lane}_{name}_pp{n}") for n in range(3))
            out = reg(name)
            with m.If(advance):
                m.d.sync += [lo.eq(x[:16] * (c & 0xFFFF)), mid_a.eq(x[:16] * (c >> 16)),
                             mid_b.eq(x[16:] * (c & 0xFFFF))]
                m.d.sync += out.eq(Cat(lo[:16], (lo[16:] + mid_a[:16] + mid_b[:16])[:16]))
            return out

        k1 = multiply(key, _C1, "k1")
        k2 = multiply(_rotl(k1, 15), _C2, "k2")
        t5, h6 = reg("t5"), reg("h6")
        t = _rotl(seed ^ k2, 13)
        h = (t5 + _N)[:32] ^ 4
        with m.If(advance):
            m.d.sync += [t5.eq((t + (t << 2))[:32]), h6.eq(h ^ (h >> 16))]
        h8 = multiply(h6, _F1, "h8")
        h10 = multiply(h8 ^ (h8 >> 13), _F2, "h10")
        out = reg("out")
        with m.If(advance):
            m.d.sync += out.eq(h10 ^ (h10 >> 16))
        m.d.comb += self.o.payload.hash[lane].eq(out)
        if self.partition_bits:
            m.d.comb += self.o.payload.partition[lane].eq(out[:self.partition_bits])
