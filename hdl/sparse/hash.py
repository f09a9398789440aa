"""Pipelined MurmurHash3_x86_32 hash unit with Zen's partition (``partition_of``) on top.

Contract
--------
``Murmur3HashUnit(lanes=W, partition_bits=P)`` takes a stream of W u32 keys per beat and
returns, per lane, ``hash = murmur3_32(key, seed)`` and ``partition = hash mod n`` --
bit-exact with ``treenic.sparse.zen.murmur3_32`` / ``zen.partition_of(key, n, seed)``
(and with the ``mmh3`` package). ``seed`` is a configuration input sampled with each beat
(change it only while the unit is idle). The worker count n is an elaboration parameter:
``partition_bits=P`` (n = 2**P, the reduction is a mask, latency 15) or ``workers=n`` for any
n in 1..65536. A power of two is still a mask; any other n goes through a constant-divisor
modulo (multiply-high, Granlund-Montgomery: q = (h * M) >> (32 + l) with
l = ceil(log2 n), M = ceil(2**(32 + l) / n) < 2**33, exact for every 32-bit h; then
partition = h - q * n), :data:`MOD_STAGES` more pipeline stages (latency
``LATENCY + MOD_STAGES`` = 21, the instance's ``latency``).

Pipeline (15 stages, latency 15 cycles, one beat = W keys per cycle); every multiply by a
constant takes :data:`MULTIPLY_STAGES` = 3 stages: its operand registered, the 16x16 partial
products registered (one MULT18X18D each), then a 16-bit sum::

    S1-S3    k = key * c1                    (seed-independent key mix)
    S4-S6    k = rotl(k, 15) * c2
    S7       t = rotl(seed ^ k, 13); t = t + (t << 2)          (x5: one adder)
    S8       h = (t + n) ^ 4; h ^= h >> 16
    S9-S11   h *= f1
    S12-S14  h = (h ^ h >> 13) * f2
    S15      h ^= h >> 16; partition = h & (n - 1)     (n a power of two: the FIFO write)
    M1      four 16x17 partial products of h * M                 (n not a power of two)
    M2      two partial sums;  M3  q = (h * M) >> (32 + l)
    M4      q * n as two 16x16 partial products;  M5  their sum;  M6  h - q * n (FIFO write)

Why the operand and product registers: with the multiplier's inputs and outputs both on
fabric registers, the placer can put a register beside each MULT18X18D, and the route to a
DSP block far across the die gets a cycle of its own. With the operand taken straight from
the previous stage's logic (11 stages), the W = 16 top failed 125 MHz post-route at
103.4 MHz: 5.2 ns of routing from a LUT to a distant MULT18X18D plus its 2.5 ns multiply.
(Yosys maps no fabric register into the MULT18X18D's own input/output registers on the
ECP5: its cells set no REG_* parameter; nextpnr places the fabric registers next to it.) The modulo path's multiplies take their
operands from plain registers (no logic in front) and keep two stages.

``lut_multiplies=n`` (0..4) does n of the four constant multiplies in LUTs instead, as
shift-and-add trees of the constant's canonical signed digits (:func:`csd_digits`; 12-14
terms): after the operand register, the first stage adds groups of four terms, the second
the group sums (two adder levels each), so latency and rate are unchanged. The multiplies with the fewest digits go
first (c2, f1, c1, f2). Each saves 3 MULT18X18D per lane: W = 16 needs 192 of them, the
ECP5-85F has 156, so ``lut_multiplies=1`` (144) fits.

At most one carry chain per stage (two small adders in a LUT multiply): the first version
(one 32x32 multiply per stage and x5 + n in one stage) placed at 89.6 MHz on the ECP5 85F.
Flow control (:class:`~.pipeline.CreditPipeline`): the datapath registers load every cycle,
with no enable and no reset; a valid bit travels beside each stage, and the last stage
writes into an output FIFO of ``latency + 1`` entries (its storage is that stage's
register, so the latency is unchanged; 16 x 576 bits at W = 16: distributed RAM). The input
is accepted while a registered credit counter says the FIFO has room for every beat in
flight, which sustains one beat a cycle under an always-ready consumer. The stall-together
pipeline it replaces put ``~o.valid | o.ready`` on the enable of all ~10 000 stage
registers at W = 16 and failed 125 MHz post-route on that net (103.2 MHz).
"""
from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import CreditPipeline

__all__ = ["Murmur3HashUnit", "LATENCY", "MOD_STAGES", "MULTIPLY_STAGES", "modulo_magic",
           "csd_digits"]

MULTIPLY_STAGES = 3                    # operand, partial products, sum (see ``_lane``)
LATENCY = 4 * MULTIPLY_STAGES + 3       # four multiplies, x5, the h6 fold, the final fold
MOD_STAGES = 6
MAX_WORKERS = 1 << 16
_C1, _C2, _N = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35


def _rotl(v, r):
    return Cat(v[32 - r:], v[:32 - r])


def csd_digits(c: int) -> list[tuple[int, int]]:
    """The non-zero canonical signed digits of ``c`` below bit 32 as (position, +1 or -1):
    ``sum(d << p) == c mod 2**32``, no two adjacent (the fewest additions)."""
    digits, pos = [], 0
    while c and pos < 32:
        if c & 1:
            d = 2 - (c & 3)                      # +1 if c = ...01, -1 if c = ...11
            digits.append((pos, d))
            c -= d
        c >>= 1
        pos += 1
    return digits


#: the four constant multiplies, in the order ``lut_multiplies`` moves them into LUTs
_LUT_ORDER = (_C2, _F1, _C1, _F2)             # 12, 12, 13, 14 digits


def _signed_sum(terms):
    """(value, negated) of a balanced add/subtract tree of (value, negated) terms, every
    node cut to 32 bits (arithmetic mod 2**32)."""
    if len(terms) == 1:
        return terms[0]
    (a, na), (b, nb) = _signed_sum(terms[:len(terms) // 2]), _signed_sum(terms[len(terms) // 2:])
    if na == nb:
        return (a + b)[:32], na
    return ((b - a) if na else (a - b))[:32], False


def modulo_magic(n: int) -> tuple[int, int]:
    """(M, shift) with ``h // n == (h * M) >> shift`` for every 0 <= h < 2**32
    (round-up method, Granlund & Montgomery 1994, Thm 4.2: l = ceil(log2 n),
    M = ceil(2**(32 + l) / n), M < 2**33)."""
    if not isinstance(n, int) or not 1 <= n <= MAX_WORKERS:
        raise ValueError(f"workers must be an integer in 1..{MAX_WORKERS}, got {n!r}")
    shift = 32 + (n - 1).bit_length()
    return -(-(1 << shift) // n), shift


class Murmur3HashUnit(wiring.Component):
    """W-lane MurmurHash3_x86_32 of u32 keys, plus the Zen partition of each key.

    Parameters
    ----------
    lanes : int
        Keys per beat (W >= 1).
    partition_bits : int
        log2 of the worker count n (0..16); ``partition = hash mod 2**partition_bits``.
    workers : int or None
        The worker count n itself (1..65536, any value; overrides ``partition_bits``, which
        must then be 0 or equal log2 n); ``partition = hash mod n``.
    lut_multiplies : int
        How many of the four constant multiplies are shift-add trees in LUTs (0..4) rather
        than MULT18X18D partial products (3 per multiply and lane).

    Members
    -------
    i : In(stream.Signature(ArrayLayout(32, lanes)))
        Keys, lane 0 first.
    seed : In(32)
        Hash seed (s0 for the partition); held constant while items are in flight.
    o : Out(stream.Signature(StructLayout{hash, partition}))
        Per lane the 32-bit hash and its partition, in input order.
    """

    def __init__(self, *, lanes: int = 2, partition_bits: int = 0, workers: int | None = None,
                 lut_multiplies: int = 0):
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        if not isinstance(partition_bits, int) or not 0 <= partition_bits <= 16:
            raise ValueError(f"partition_bits must be an integer in 0..16, got {partition_bits!r}")
        if workers is None:
            workers = 1 << partition_bits
        else:
            modulo_magic(workers)                   # validates the range
            if partition_bits and workers != 1 << partition_bits:
                raise ValueError(f"partition_bits={partition_bits} contradicts workers={workers}")
        if not isinstance(lut_multiplies, int) or not 0 <= lut_multiplies <= 4:
            raise ValueError(f"lut_multiplies must be an integer in 0..4, got {lut_multiplies!r}")
        self.lanes, self.workers = lanes, workers
        self.lut_constants = frozenset(_LUT_ORDER[:lut_multiplies])
        self.power_of_two = workers & (workers - 1) == 0
        # partition field width: log2 n for a power of two (as before), else ceil(log2 n)
        self.partition_bits = (workers - 1).bit_length()
        self.latency = LATENCY if self.power_of_two else LATENCY + MOD_STAGES
        out = data.StructLayout({"hash": data.ArrayLayout(32, lanes),
                                 "partition": data.ArrayLayout(max(1, self.partition_bits), lanes)})
        super().__init__({"i": In(stream.Signature(data.ArrayLayout(32, lanes))),
                          "seed": In(32),
                          "o": Out(stream.Signature(out))})

    def elaborate(self, platform):
        m = Module()
        pipe = CreditPipeline(m, self.i, self.o, self.latency)
        seed = Signal(32)
        m.d.sync += seed.eq(self.seed)          # configuration register (cuts the input path)
        result = data.View(self.o.payload.shape(), pipe.result)
        for lane in range(self.lanes):
            hash_value, partition = self._lane(m, seed, self.i.payload[lane], lane)
            m.d.comb += result.hash[lane].eq(hash_value)
            if self.partition_bits:
                m.d.comb += result.partition[lane].eq(partition)
        return m

    def _lane(self, m, seed, key, lane):
        """(hash, partition) of one lane's key: the values written into the output FIFO,
        the pipeline's last stage. Every register loads every cycle (no enable, no reset:
        the valid bits travel in :class:`CreditPipeline`)."""
        def reg(name):
            return Signal(32, name=f"l{lane}_{name}", reset_less=True)

        def multiply(x, c, name):
            """x * c mod 2**32 in MULTIPLY_STAGES stages: the operand registered (the
            MULT18X18D input register), then 16x16 partial products registered (its output
            register), then their sum; a LUT multiply registers the operand the same way,
            then sums of four shifted terms, then their sum (the same latency)."""
            out, operand = reg(name), reg(f"{name}_in")
            m.d.sync += operand.eq(x)
            if c in self.lut_constants:
                terms = [((operand << p)[:32], d < 0) for p, d in csd_digits(c)]
                groups = [terms[i:i + 4] for i in range(0, len(terms), 4)]
                parts = [(Signal(32, name=f"l{lane}_{name}_ps{n}", reset_less=True),
                          _signed_sum(g)[1]) for n, g in enumerate(groups)]
                total, negated = _signed_sum(parts)
                m.d.sync += [p.eq(_signed_sum(g)[0]) for (p, _), g in zip(parts, groups)]
                m.d.sync += out.eq((-total)[:32] if negated else total)
                return out
            lo, mid_a, mid_b = (reg(f"{name}_pp{n}") for n in range(3))
            m.d.sync += [lo.eq(operand[:16] * (c & 0xFFFF)),
                         mid_a.eq(operand[:16] * (c >> 16)),
                         mid_b.eq(operand[16:] * (c & 0xFFFF))]
            m.d.sync += out.eq(Cat(lo[:16], (lo[16:] + mid_a[:16] + mid_b[:16])[:16]))
            return out

        k1 = multiply(key, _C1, "k1")
        k2 = multiply(_rotl(k1, 15), _C2, "k2")
        t5, h6 = reg("t5"), reg("h6")
        t = _rotl(seed ^ k2, 13)
        h = (t5 + _N)[:32] ^ 4
        m.d.sync += [t5.eq((t + (t << 2))[:32]), h6.eq(h ^ (h >> 16))]
        h8 = multiply(h6, _F1, "h8")
        h10 = multiply(h8 ^ (h8 >> 13), _F2, "h10")
        final = h10 ^ (h10 >> 16)
        if self.power_of_two:               # S15 is the FIFO write: the hash and its mask
            return final, final[:self.partition_bits]
        out = reg("out")
        m.d.sync += out.eq(final)
        return self._modulo(m, out, lane)

    def _modulo(self, m, h, lane):
        """(h, h mod n) for a constant non-power-of-two n in MOD_STAGES stages (see the
        module docstring), the last one (h - q*n) written into the output FIFO; the hash
        travels beside it. One carry chain per stage."""
        n = self.workers
        magic, shift = modulo_magic(n)
        m_lo, m_hi = magic & 0x1FFFF, magic >> 17            # 17 + 16 bits (16x17 products)

        def regs(count, width, name):
            return [Signal(width, name=f"l{lane}_{name}{i}", reset_less=True)
                    for i in range(count)]

        hs = regs(MOD_STAGES - 1, 32, "mod_h")            # the hash, delayed alongside
        pp = regs(4, 34, "mod_pp")
        s0, s1 = regs(2, 51, "mod_sum")
        q, qn_lo, qn_hi, qn = regs(4, 32, "mod_q")        # q, q*n low/high parts, q*n
        m.d.sync += [hs[0].eq(h)] + [hs[i].eq(hs[i - 1]) for i in range(1, MOD_STAGES - 1)]
        m.d.sync += [pp[0].eq(h[:16] * m_lo), pp[1].eq(h[16:] * m_lo),
                     pp[2].eq(h[:16] * m_hi), pp[3].eq(h[16:] * m_hi)]
        m.d.sync += [s0.eq(pp[0] + (pp[1] << 16)), s1.eq(pp[2] + (pp[3] << 16))]
        m.d.sync += q.eq((s0 + (s1 << 17)) >> shift)
        m.d.sync += [qn_lo.eq(q[:16] * n), qn_hi.eq((q[16:] * n)[:16])]
        m.d.sync += qn.eq((qn_lo + (qn_hi << 16))[:32])
        return hs[4], (hs[4] - qn)[:self.partition_bits]
