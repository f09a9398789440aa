"""Pipelined MurmurHash3_x86_32 hash unit with Zen's partition (``partition_of``) on top.

Contract
--------
``Murmur3HashUnit(lanes=W, partition_bits=P)`` takes a stream of W u32 keys per beat and
returns, per lane, ``hash = murmur3_32(key, seed)`` and ``partition = hash mod 2**P`` --
bit-exact with ``treenic.sparse.zen.murmur3_32`` / ``zen.partition_of(key, 2**P, seed)``
(and with the ``mmh3`` package). ``seed`` is a configuration input sampled with each beat
(change it only while the unit is idle). The hardware partition reduction is a mask, so the
worker count must be a power of two (notes on hashing: ``mod`` by a power of two; a
non-power-of-two ``n`` would need a divider and is not supported by this unit).

Pipeline (6 stages, latency 6 cycles, one beat = W keys per cycle)::

    S1  k = key * c1                        (seed-independent key mix)
    S2  k = rotl(k, 15) * c2
    S3  h = rotl(seed ^ k, 13) * 5 + n ^ 4; h ^= h >> 16
    S4  h *= f1
    S5  h = (h ^ h >> 13) * f2
    S6  h ^= h >> 16; partition = h & (2**P - 1)

One 32x32 multiply per stage (the ECP5 maps each to MULT18X18D slices). Stall-together
flow control (see ``pipeline.StallPipeline``).
"""
from amaranth import Module, Signal, Cat
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import StallPipeline

__all__ = ["Murmur3HashUnit", "LATENCY"]

LATENCY = 6
_C1, _C2, _N = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35


def _rotl(v, r):
    return Cat(v[32 - r:], v[:32 - r])


def _mul(v, c):
    return (v * c)[:32]


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
        s = [Signal(32, name=f"l{lane}_s{n + 1}") for n in range(LATENCY)]
        h3 = _rotl(seed ^ s[1], 13)
        h3 = ((h3 * 5)[:32] + _N)[:32] ^ 4
        h5 = s[3] ^ (s[3] >> 13)
        with m.If(advance):
            m.d.sync += [
                s[0].eq(_mul(key, _C1)),
                s[1].eq(_mul(_rotl(s[0], 15), _C2)),
                s[2].eq(h3 ^ (h3 >> 16)),
                s[3].eq(_mul(s[2], _F1)),
                s[4].eq(_mul(h5, _F2)),
                s[5].eq(s[4] ^ (s[4] >> 16)),
            ]
        m.d.comb += self.o.payload.hash[lane].eq(s[5])
        if self.partition_bits:
            m.d.comb += self.o.payload.partition[lane].eq(s[5][:self.partition_bits])
