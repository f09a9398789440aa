"""Pipelined IEEE-754 binary32 adder (docs/architecture.md §5) and its golden model.

Contract
--------
``FP32Adder`` computes ``a + b`` on binary32 bit patterns, bit-exact with numpy
``float32`` addition (:func:`fp32_add_golden`):

* round-to-nearest, ties-to-even; no flush-to-zero: subnormal inputs and outputs are
  exact IEEE (gradual underflow);
* signed zeros: ``x + (-x) = +0``, ``(+0) + (-0) = +0``, ``(-0) + (-0) = -0``;
* overflow rounds to ``±inf``; ``inf + x = inf``; ``inf + (-inf)`` is NaN;
* **NaN handling:** every NaN result (a NaN operand, or ``inf - inf``) is the canonical
  quiet NaN ``0x7FC00000`` (sign 0, payload dropped).  The golden canonicalises numpy's
  NaNs the same way, so NaN results compare bit for bit as well.

Micro-architecture (7 stages, one result per cycle, latency 7 cycles)::

    S1  unpack/classify, magnitude compare and swap (|x| >= |y|), exponent differences
        (both directions in parallel with the compare)
    S2a align y (right shift, guard/round/sticky)
    S2b add/subtract the 27-bit mantissas (one carry chain)
    S3  leading-zero count (log-depth tree)
    S4  normalise: carry -> shift right 1; else shift left by the leading-zero count,
        limited so the exponent stays >= 1 (gradual underflow)
    S5  round to nearest even (one 24-bit carry chain), exponent + 1 and overflow
        flags computed beside it
    S6  repack, override specials (NaN, inf, overflow) -- selects only (rounding and
        packing in one stage was the adder's worst path inside the NIC core)

Streaming: ``i`` (payload ``a``, ``b``, ``tag``) and ``o`` (payload ``sum``, ``tag``)
follow the ``amaranth.lib.stream`` rules.  Every stage holds a valid bit; stage *k*
loads when it is empty or stage *k+1* loads (bubble-collapsing pipeline), so the adder
sustains one operation per cycle under ``o.ready = 1``, absorbs bubbles, and stalls
without losing data under backpressure.  ``i.ready`` depends combinationally on
``o.ready`` (through the pipeline's valid bits).  ``tag`` (``tag_width`` bits, may be 0)
travels alongside unchanged -- the reduction engine uses it for the element index.

The golden function lives here (``treenic.hdl.fp32.fp32_add_golden``) so the RTL and its
model are imported from one place; ``fp32_add_exact`` is an independent integer model
(exact rational arithmetic) used by the tests to cross-check numpy itself.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["FP32Adder", "fp32_add_golden", "fp32_add_exact", "CANONICAL_NAN",
           "f32_to_bits", "bits_to_f32", "LATENCY", "DIRECTED_CASES", "random_operand_pairs"]

CANONICAL_NAN = 0x7FC00000
LATENCY = 7


# ----------------------------------------------------------------------------------
# golden models

def f32_to_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def bits_to_f32(b) -> np.ndarray:
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def fp32_add_golden(a_bits, b_bits):
    """Vectorised golden: binary32 bits of ``float32(a) + float32(b)`` (numpy, RNE,
    gradual underflow), NaN results canonicalised to ``0x7FC00000``.

    Accepts scalars or arrays of unsigned 32-bit patterns; returns the same shape
    (a Python ``int`` for scalar inputs)."""
    scalar = np.isscalar(a_bits) and np.isscalar(b_bits)
    a = np.asarray(a_bits, dtype=np.uint64).astype(np.uint32).view(np.float32)
    b = np.asarray(b_bits, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        r = np.add(a, b, dtype=np.float32)
    bits = r.view(np.uint32).copy()
    bits = np.where(np.isnan(r), np.uint32(CANONICAL_NAN), bits).astype(np.uint32)
    return int(bits) if scalar else bits


def fp32_add_exact(a: int, b: int) -> int:
    """Independent reference: exact rational sum rounded to binary32 (RNE, gradual
    underflow, overflow to inf) with Python integers -- no floating point involved."""
    def decode(x):
        s, e, f = x >> 31, (x >> 23) & 0xFF, x & 0x7FFFFF
        if e == 0xFF:
            return ("nan", None) if f else ("inf", -1 if s else 1)
        v = Fraction(f, 1 << 149) if e == 0 else Fraction((1 << 23) | f, 1 << 23) * Fraction(2) ** (e - 127)
        return ("fin", (s, -v if s else v))

    ka, va = decode(a)
    kb, vb = decode(b)
    if ka == "nan" or kb == "nan":
        return CANONICAL_NAN
    if ka == "inf" or kb == "inf":
        if ka == "inf" and kb == "inf" and va != vb:
            return CANONICAL_NAN
        return 0x7F800000 | ((0x80000000) if (va if ka == "inf" else vb) < 0 else 0)
    (sa, xa), (sb, xb) = va, vb
    v = xa + xb
    if v == 0:
        return 0x80000000 if (sa and sb) else 0
    sign = 0x80000000 if v < 0 else 0
    m = abs(v)
    # find exponent e such that 2^e <= m < 2^(e+1), clamp to subnormal range
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    e = max(e, -126)
    q = m / Fraction(2) ** (e - 23)          # scaled significand, want integer
    n, rem = divmod(q.numerator, q.denominator)
    r2 = 2 * rem
    if r2 > q.denominator or (r2 == q.denominator and n & 1):
        n += 1
    if n >= (1 << 24):
        n >>= 1
        e += 1
    if e > 127:
        return sign | 0x7F800000
    if n < (1 << 23):                        # subnormal (e == -126)
        return sign | n
    return sign | ((e + 127) << 23) | (n & 0x7FFFFF)


# ----------------------------------------------------------------------------------
# test vectors (shared by the Amaranth-sim tests, the cocotb bench and the cosim run)

_PZ, _NZ, _INF, _NINF = 0x00000000, 0x80000000, 0x7F800000, 0xFF800000
DIRECTED_CASES: list[tuple[int, int]] = [
    (_PZ, _NZ), (_NZ, _NZ), (_PZ, _PZ), (_NZ, _PZ),            # signed zeros
    (0x3F800000, 0xBF800000), (0xC0490FDB, 0x40490FDB),        # x + -x = +0
    (0x00000001, 0x00000001), (0x00000001, 0x80000001),        # subnormal in/out
    (0x007FFFFF, 0x00000001), (0x007FFFFF, 0x007FFFFF),        # subnormal -> normal
    (0x00800000, 0x80000001), (0x00800001, 0x80800000),        # normal -> subnormal
    (0x00400000, 0x00400000), (0x80123456, 0x00654321), (0x00000003, 0x80000002),
    (0x7F7FFFFF, 0x7F7FFFFF), (0x7F7FFFFF, 0x73800000),        # overflow to inf
    (0x7F7FFFFF, 0x73000000), (0x7F7FFFFF, 0x737FFFFF),        # tie at max: stays / rounds
    (0xFF7FFFFF, 0xFF7FFFFF), (0x7F7FFFFF, 0xF3800000),
    (_INF, 0x3F800000), (_INF, _NINF), (_NINF, _NINF), (_INF, _INF), (_NINF, 0x7F7FFFFF),
    (0x7FC00000, 0x3F800000), (0x7F800001, _INF), (0xFFFFFFFF, _PZ), (0x3F800000, 0xFFC00001),
    (0x3F800000, 0x33800000),               # 1 + 2^-24: tie, even -> 1
    (0x3F800001, 0x33800000),               # tie, odd -> up
    (0x3F800000, 0x33800001),               # just above tie -> up
    (0x3F800000, 0x337FFFFF),               # just below tie -> down
    (0x4B800000, 0xBF800000),               # 2^24 - 1 exact
    (0x3F800000, 0xB3800000), (0x3F800000, 0xB3000000),       # cancellation, borrow
    (0x3FFFFFFF, 0xBFFFFFFE), (0x4B7FFFFF, 0x3F000000),       # renormalisation, tie up
    (0x3F800000, 0x00000001), (0x7F000000, 0x7F000000),
]


def random_operand_pairs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """*n* operand pairs (uint32 bit arrays) mixing: uniform bit patterns, near
    cancellation (``b ~ -a``), close exponents (alignment/rounding ties), tiny values
    (subnormal inputs/outputs), huge values (overflow) and specials."""
    rng = np.random.default_rng(seed)
    u32 = lambda k, hi=2**32: rng.integers(0, hi, k, dtype=np.uint64).astype(np.uint32)
    a, b = u32(n), u32(n)
    kind = rng.integers(0, 6, n)
    # 1: b = -a with a few low bits flipped (massive cancellation)
    k = kind == 1
    flip = u32(k.sum(), 1 << 8) * (rng.random(k.sum()) < 0.75).astype(np.uint32)
    b[k] = a[k] ^ np.uint32(0x80000000) ^ flip
    # 2: exponent difference 0..30 (alignment, sticky, ties)
    k = kind == 2
    ea = (a[k] >> 23) & 0xFF
    d = u32(k.sum(), 31)
    eb = np.clip(ea.astype(np.int64) - d, 0, 254).astype(np.uint32)
    b[k] = (b[k] & np.uint32(0x807FFFFF)) | (eb << 23)
    # 3: tiny magnitudes (exponent field 0..3): subnormal in/out
    k = kind == 3
    a[k] = (a[k] & np.uint32(0x807FFFFF)) | (u32(k.sum(), 4) << 23)
    b[k] = (b[k] & np.uint32(0x807FFFFF)) | (u32(k.sum(), 4) << 23)
    # 4: huge magnitudes (exponent 252..255): overflow, inf, NaN
    k = kind == 4
    a[k] = (a[k] & np.uint32(0x807FFFFF)) | ((252 + u32(k.sum(), 4)) << 23)
    b[k] = (b[k] & np.uint32(0x807FFFFF)) | ((252 + u32(k.sum(), 4)) << 23)
    # 5: short mantissas (many exact ties after alignment)
    k = kind == 5
    a[k] &= np.uint32(0xFFFF0000)
    b[k] = (b[k] & np.uint32(0xFF800000)) | (u32(k.sum(), 4) << 21)
    return a, b


# ----------------------------------------------------------------------------------
# RTL

def _lzc_tree(v):
    """Leading-zero count of *v* (width a power of two) as a log-depth Mux tree.
    Returns ``(count, all_zero)``; ``count == len(v)`` when *v* is zero."""
    n = len(v)
    if n == 1:
        return (~v[0]).as_unsigned(), ~v[0]
    h = n // 2
    ch, zh = _lzc_tree(v[h:])
    cl, zl = _lzc_tree(v[:h])
    return Mux(zh, h + cl, ch), zh & zl


class FP32Adder(wiring.Component):
    """Pipelined binary32 adder with ``lib.stream`` input ``i`` and output ``o``.

    Parameters
    ----------
    tag_width : int
        Width of the ``tag`` sideband carried from ``i.payload.tag`` to
        ``o.payload.tag`` unchanged (0: no tag).
    """

    def __init__(self, tag_width: int = 0):
        self.tag_width = tag_width
        in_layout = data.StructLayout({"a": 32, "b": 32, "tag": tag_width})
        out_layout = data.StructLayout({"sum": 32, "tag": tag_width})
        super().__init__({
            "i": In(stream.Signature(in_layout)),
            "o": Out(stream.Signature(out_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        # ---- pipeline control: v[k] valid of stage k (1..N); en[k] stage k loads
        N = LATENCY
        v = [None] + [Signal(name=f"s{k}_valid") for k in range(1, N + 1)]
        en = [None] + [Signal(name=f"s{k}_en") for k in range(1, N + 2)]
        m.d.comb += en[N + 1].eq(self.o.ready)
        for k in range(N, 0, -1):
            m.d.comb += en[k].eq(~v[k] | en[k + 1])
        m.d.comb += self.i.ready.eq(en[1])
        prev_valid = [self.i.valid] + v[1:N]
        for k in range(1, N + 1):
            with m.If(en[k]):
                m.d.sync += v[k].eq(prev_valid[k - 1])

        self._normalise_round_pack(m, en, self._unpack_align_add(m, en))
        m.d.comb += self.o.valid.eq(v[N])
        return m

    def _unpack_align_add(self, m, en):
        """S1 unpack, classify, swap; S2a align; S2b add/subtract; returns
        the S2b registers."""
        tw = self.tag_width
        # ---- S1: unpack, classify, swap -------------------------------------------
        # the magnitude compare and both exponent differences run in parallel; the
        # compare only selects
        a, b = self.i.payload.a, self.i.payload.b
        ea, eb = a[23:31], b[23:31]
        swap = Signal()
        m.d.comb += swap.eq(b[:31] > a[:31])
        ea_eff = Mux(ea == 0, 1, ea)
        eb_eff = Mux(eb == 0, 1, eb)
        d_ab = Signal(8)
        d_ba = Signal(8)
        m.d.comb += [d_ab.eq(ea_eff - eb_eff), d_ba.eq(eb_eff - ea_eff)]
        ma = Cat(a[:23], ea != 0)
        mb = Cat(b[:23], eb != 0)
        a_nan = (ea == 0xFF) & (a[:23] != 0)
        b_nan = (eb == 0xFF) & (b[:23] != 0)
        a_inf = (ea == 0xFF) & (a[:23] == 0)
        b_inf = (eb == 0xFF) & (b[:23] == 0)

        s1_sx = Signal()
        s1_sub = Signal()
        s1_ex = Signal(8)       # effective exponent of x (>= 1)
        s1_mx = Signal(24)
        s1_my = Signal(24)
        s1_d = Signal(8)        # ex - ey (0..253)
        s1_nan = Signal()
        s1_inf = Signal()       # result is inf with sign s1_sx
        s1_tag = Signal(tw)
        with m.If(en[1]):
            m.d.sync += [
                s1_sx.eq(Mux(swap, b[31], a[31])),
                s1_sub.eq(a[31] ^ b[31]),
                s1_ex.eq(Mux(swap, eb_eff, ea_eff)),
                s1_mx.eq(Mux(swap, mb, ma)),
                s1_my.eq(Mux(swap, ma, mb)),
                s1_d.eq(Mux(swap, d_ba, d_ab)),
                s1_nan.eq(a_nan | b_nan | (a_inf & b_inf & (a[31] != b[31]))),
                s1_inf.eq(a_inf | b_inf),
                s1_tag.eq(self.i.payload.tag),
            ]

        # ---- S2a: align ----------------------------------------------------
        # y with 3 extra low bits (guard, round, sticky) shifted right by d (saturated
        # at 31: everything from 27 on lands in the sticky bit); bits shifted out below
        # the sticky position are OR-ed into it.
        dsat = Signal(5)
        m.d.comb += dsat.eq(Mux(s1_d[5:] != 0, 31, s1_d[:5]))
        wide = Signal(59)
        m.d.comb += wide.eq(Cat(Const(0, 35), s1_my) >> dsat)
        y_al = Signal(27)
        m.d.comb += y_al.eq(Cat(wide[32] | (wide[:32] != 0), wide[33:59]))
        s2a_x = Signal(27)
        s2a_y = Signal(27)
        s2a_sx = Signal()
        s2a_sub = Signal()
        s2a_ex = Signal(8)
        s2a_nan = Signal()
        s2a_inf = Signal()
        s2a_tag = Signal(tw)
        with m.If(en[2]):
            m.d.sync += [
                s2a_x.eq(Cat(Const(0, 3), s1_mx)), s2a_y.eq(y_al),
                s2a_sx.eq(s1_sx), s2a_sub.eq(s1_sub), s2a_ex.eq(s1_ex),
                s2a_nan.eq(s1_nan), s2a_inf.eq(s1_inf), s2a_tag.eq(s1_tag),
            ]

        # ---- S2b: add / subtract (one carry chain: x + (y ^ sub) + sub) -------------
        s2_z = Signal(28)
        s2_sx = Signal()
        s2_sub = Signal()
        s2_ex = Signal(8)
        s2_nan = Signal()
        s2_inf = Signal()
        s2_tag = Signal(tw)
        y_inv = Signal(27)
        m.d.comb += y_inv.eq(s2a_y ^ Mux(s2a_sub, (1 << 27) - 1, 0))
        with m.If(en[3]):
            m.d.sync += [
                # subtract: |x| >= |y| so the 28-bit difference is non-negative; the
                # carry out of x + ~y + 1 lands in bit 27 and is dropped
                s2_z.eq(Mux(s2a_sub, (s2a_x + y_inv + 1)[:27], s2a_x + s2a_y)),
                s2_sx.eq(s2a_sx), s2_sub.eq(s2a_sub), s2_ex.eq(s2a_ex),
                s2_nan.eq(s2a_nan), s2_inf.eq(s2a_inf), s2_tag.eq(s2a_tag),
            ]

        return s2_z, s2_sx, s2_sub, s2_ex, s2_nan, s2_inf, s2_tag

    def _normalise_round_pack(self, m, en, s2):
        """S3 leading-zero count, S4 normalise, S5 round to nearest even, S6 pack."""
        tw, N = self.tag_width, LATENCY
        s2_z, s2_sx, s2_sub, s2_ex, s2_nan, s2_inf, s2_tag = s2
        # ---- S3: leading-zero count -----------------------------------------------
        lz_raw, z_zero = _lzc_tree(Cat(Const(0, 5), s2_z[:27]))   # 32-bit, pad low
        s3_z = Signal(28)
        s3_lz = Signal(range(28))
        s3_lim = Signal(8)      # largest left shift keeping the exponent >= 1
        s3_ex = Signal(8)
        s3_sign = Signal()
        s3_nan = Signal()
        s3_inf = Signal()
        s3_tag = Signal(tw)
        with m.If(en[4]):
            m.d.sync += [
                s3_z.eq(s2_z),
                s3_lz.eq(Mux(z_zero, 27, lz_raw)),
                s3_lim.eq(s2_ex - 1),
                s3_ex.eq(s2_ex),
                # exact cancellation gives +0 in RNE; (-0) + (-0) keeps its sign
                s3_sign.eq(Mux((s2_z == 0) & s2_sub, 0, s2_sx)),
                s3_nan.eq(s2_nan), s3_inf.eq(s2_inf), s3_tag.eq(s2_tag),
            ]

        # ---- S4: normalise --------------------------------------------------------
        sh = Signal(5)
        m.d.comb += sh.eq(Mux(s3_lz > s3_lim, s3_lim, s3_lz))   # lz <= 27: 5 bits
        s4_n = Signal(27)       # [26] hidden, [25:3] fraction, [2] guard, [1:0] round|sticky
        s4_e = Signal(9)        # biased exponent of s4_n (1 for subnormal results)
        s4_sign = Signal()
        s4_nan = Signal()
        s4_inf = Signal()
        s4_tag = Signal(tw)
        with m.If(en[5]):
            with m.If(s3_z[27]):
                m.d.sync += [s4_n.eq(Cat(s3_z[1] | s3_z[0], s3_z[2:28])),
                             s4_e.eq(s3_ex + 1)]
            with m.Else():
                m.d.sync += [s4_n.eq(s3_z[:27] << sh),
                             s4_e.eq(s3_ex - sh)]
            m.d.sync += [s4_sign.eq(s3_sign), s4_nan.eq(s3_nan), s4_inf.eq(s3_inf),
                         s4_tag.eq(s3_tag)]

        # ---- S5: round to nearest even ---------------------------------------------
        mant = s4_n[3:27]
        guard = s4_n[2]
        rest = s4_n[:2] != 0
        up = guard & (rest | mant[0])
        s5_mr = Signal(25)      # rounded significand; [24]: rounding carried out
        s5_e = Signal(9)
        s5_e1 = Signal(10)      # s5_e + 1, for a carry out of the rounding
        s5_sign = Signal()
        s5_nan = Signal()
        s5_inf = Signal()
        s5_ovf = Signal(2)      # [c]: the exponent overflows if rounding carries out (c)
        s5_tag = Signal(tw)
        with m.If(en[6]):
            m.d.sync += [s5_mr.eq(mant + up), s5_e.eq(s4_e), s5_e1.eq(s4_e + 1),
                         s5_ovf.eq(Cat(s4_e >= 255, s4_e >= 254)),
                         s5_sign.eq(s4_sign), s5_nan.eq(s4_nan), s5_inf.eq(s4_inf),
                         s5_tag.eq(s4_tag)]

        # ---- S6: pack, specials ---------------------------------------------------
        e_r = Signal(10)
        frac = Signal(23)
        m.d.comb += [
            e_r.eq(Mux(s5_mr[24], s5_e1, s5_e)),
            frac.eq(Mux(s5_mr[24], s5_mr[1:24], s5_mr[:23])),
        ]
        hidden = s5_mr[23] | s5_mr[24]
        packed = Signal(32)
        m.d.comb += packed.eq(
            Mux(s5_nan, CANONICAL_NAN,
                # overflow compares made in S5 (no carry chain before the output)
                Mux(s5_inf | s5_ovf.bit_select(s5_mr[24], 1),
                    Cat(Const(0, 23), Const(0xFF, 8), s5_sign),
                    Cat(frac, Mux(hidden, e_r[:8], 0), s5_sign))))
        with m.If(en[N]):
            m.d.sync += [self.o.payload.sum.eq(packed), self.o.payload.tag.eq(s5_tag)]
