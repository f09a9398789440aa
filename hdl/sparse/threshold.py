"""RedSync grid-threshold source: answers the top-k unit's SEARCH requests in RTL.

Contract
--------
``GridThresholdSource()`` serves the :class:`~.topk.TopKUnit`'s ``grid`` / ``thr`` ports
(connect ``unit.grid`` to ``source.grid`` and ``source.thr`` to ``unit.thr``). For a request
(``start``, ``step``, ``count``) it returns, in j order, the ``count`` keys

    thr(g) = key(max(0, fl32(fl64(b + fl64(g / 2**depth * fl64(t - b))))))

of the grid points g = start + j * step: ``select._grid_threshold(base, top, g, depth)``
(``select.redsync_threshold``), three float64 operations each correctly rounded
(round-to-nearest-even), then the float32 rounding with gradual underflow -- the double
rounding of the golden kept. ``base`` and ``top`` are float32 keys (non-negative, finite:
the unit flags a non-finite chunk) and ``depth`` (1..30) is the search depth; all three are
configuration inputs held while a request is served.

Not in RTL: ``base`` itself. The golden's base is ``select.exact_mean_abs`` (an exact sum of
|x| over the chunk, rounded to float64, divided by C, rounded to float32); a controller
supplies it with ``top`` (docs/sparse-units.md says what an RTL mean would need).

Arithmetic
----------
A value is (negative, m, e) = (-1)**negative * m * 2**e with m an integer. Every step
produces an exact integer and rounds it with one shared rounding datapath (``_round``: the
leading one, the kept bits, round-to-nearest-even; the result normalised, m in
[2**(p-1), 2**p) or 0), so each float64 result is a 53-bit m:

* the inputs: float32 keys decoded and normalised to 53 bits (exact);
* ``t - b`` and ``b + scaled`` (``_add``): the operand with the larger exponent shifted left
  by the exponent difference d onto the other's scale, then added; exact in 114 bits for
  d <= 60; for d > 60 the smaller operand is below 1/256 of the larger one's float64 ulp,
  and the correctly rounded sum is the larger operand itself;
* ``g * span / 2**depth``: a 31 x 53-bit product (exact), exponent minus ``depth``;
* the float32 rounding: 24 bits, the kept bits never below 2**-149 (subnormals); the key is
  then ``((e + 149) << 23) + m`` (a rounding carry to 2**24 lands on the next exponent).

No float64 subnormal or overflow can occur: every value lies in [2**-231, 2**129).

Sequential: one operation a state, the rounding in two (leading one, then shift and
increment). Latency: :data:`SETUP_CYCLES` after a request is taken (decode, t - b), then
:data:`POINT_CYCLES` per grid point when ``thr`` is always ready. A count pass over C/W
beats follows each request, so the source's latency is paid once a pass.
"""
from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .search import GRID_BITS, GRID_LAYOUT

__all__ = ["GridThresholdSource", "SETUP_CYCLES", "POINT_CYCLES"]

KEY_BITS = 31
F64_BITS = 53
F32_BITS = 24
F32_MIN_EXP = -149                       # exponent of the smallest float32 subnormal
ALIGN_LIMIT = 60                         # largest exact alignment in _add (see the module)
SUM_BITS = F64_BITS + ALIGN_LIMIT + 1    # an exact sum or difference of two aligned values
EXP = signed(12)                         # exponents: values in [2**-231, 2**129), zero apart
ZERO_EXP = -1024                         # the exponent of zero: below every real exponent
ROUND_CYCLES = 2                         # the rounding's two stages
#: cycles from a request taken to its first point's multiply (round t, round b, t - b and
#: its rounding), and per point from the multiply to the answer on ``thr`` (multiply, add,
#: float32 load, each followed by a rounding, then the answer's cycle)
SETUP_CYCLES = 3 * ROUND_CYCLES + 1
POINT_CYCLES = 3 * (1 + ROUND_CYCLES) + 1


class GridThresholdSource(wiring.Component):
    """Float64 grid thresholds of the RedSync binary search (``select._grid_threshold``).

    Members
    -------
    grid : In(stream.Signature(GRID_LAYOUT))
        Requests: grid points ``start + j * step``, j < ``count`` (the unit's ``grid``).
    thr : Out(stream.Signature(31))
        One threshold key per grid point, in j order (the unit's ``thr``).
    base, top : In(31)
        float32 keys of the search's lower and upper value (non-negative, finite).
    depth : In(5)
        Search depth (1..30): ratio = g / 2**depth.
    """

    def __init__(self):
        super().__init__({"grid": In(stream.Signature(GRID_LAYOUT)),
                          "thr": Out(stream.Signature(KEY_BITS)),
                          "base": In(KEY_BITS), "top": In(KEY_BITS), "depth": In(5)})

    def elaborate(self, platform):
        m = Module()
        # the exact value being rounded, and the rounding's inputs
        acc, acc_neg, acc_exp = Signal(SUM_BITS), Signal(), Signal(EXP)
        to_f32 = Signal()                           # round to 24 bits, not below 2**-149
        # rounded operands: t, b, the span t - b, the scaled span, the float64 value
        regs = {n: (Signal(name=f"{n}_neg"), Signal(F64_BITS + 1, name=f"{n}_m"),
                    Signal(EXP, name=f"{n}_e")) for n in ("t", "b", "span", "scaled", "val")}
        g, left, step = Signal(GRID_BITS), Signal(5), Signal(GRID_BITS)
        key = Signal(KEY_BITS)
        rounded = self._round(m, acc, acc_exp, to_f32)          # (m, e), two stages
        lead_done = Signal()                    # a ROUND state's second cycle: k registered
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.grid.ready.eq(1)
                with m.If(self.grid.valid & (self.grid.payload.count != 0)):
                    p = self.grid.payload
                    m.d.sync += [g.eq(p.start), step.eq(p.step), left.eq(p.count)]
                    self._load(m, acc, acc_neg, acc_exp, *_decode(self.top))
                    m.next = "ROUND_T"
            for name, nxt in (("T", "ROUND_B"), ("B", "SUB"), ("SPAN", "MUL"),
                              ("SCALED", "ADD"), ("VAL", "F32")):
                with m.State(f"ROUND_{name}"):
                    m.d.sync += lead_done.eq(~lead_done)
                    with m.If(lead_done):
                        neg, mant, exp = regs[name.lower()]
                        m.d.sync += [neg.eq(acc_neg), mant.eq(rounded[0]), exp.eq(rounded[1])]
                        if name == "T":
                            self._load(m, acc, acc_neg, acc_exp, *_decode(self.base))
                        m.next = nxt
            with m.State("SUB"):                               # t - b
                t_neg, t_m, t_e = regs["t"]
                b_neg, b_m, b_e = regs["b"]
                self._add(m, (t_neg, t_m, t_e), (~b_neg, b_m, b_e), acc, acc_neg, acc_exp)
                m.next = "ROUND_SPAN"
            with m.State("MUL"):                               # g / 2**depth * span
                s_neg, s_m, s_e = regs["span"]
                m.d.sync += [acc.eq(g * s_m), acc_neg.eq(s_neg),
                             acc_exp.eq(Mux(s_m == 0, ZERO_EXP, s_e - self.depth))]
                m.next = "ROUND_SCALED"
            with m.State("ADD"):                               # b + scaled
                self._add(m, regs["b"], regs["scaled"], acc, acc_neg, acc_exp)
                m.next = "ROUND_VAL"
            with m.State("F32"):                               # the float32 rounding
                v_neg, v_m, v_e = regs["val"]
                m.d.sync += to_f32.eq(1)
                self._load(m, acc, acc_neg, acc_exp, v_neg, v_m, v_e)
                m.next = "ROUND_F32"
            with m.State("ROUND_F32"):
                m.d.sync += lead_done.eq(~lead_done)
                with m.If(lead_done):
                    f_m, f_e = rounded
                    # max(0, .): a negative or zero value is threshold key 0
                    m.d.sync += [to_f32.eq(0),
                                 key.eq(Mux(acc_neg | (f_m == 0), 0,
                                            ((f_e - F32_MIN_EXP) << 23) + f_m))]
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.thr.valid.eq(1), self.thr.payload.eq(key)]
                with m.If(self.thr.ready):
                    m.d.sync += [g.eq(g + step), left.eq(left - 1)]
                    m.next = "MUL"
                    with m.If(left == 1):
                        m.next = "IDLE"
        return m

    @staticmethod
    def _load(m, acc, acc_neg, acc_exp, neg, mant, exp):
        m.d.sync += [acc.eq(mant), acc_neg.eq(neg), acc_exp.eq(exp)]

    @staticmethod
    def _add(m, a, b, acc, acc_neg, acc_exp):
        """acc = a + b exactly (or the larger operand alone when the exponents are more than
        ALIGN_LIMIT apart: its correctly rounded sum, see the module docstring)."""
        (a_neg, a_m, a_e), (b_neg, b_m, b_e) = a, b
        a_big = a_e >= b_e
        x_neg, x_m, x_e = (Mux(a_big, p, q) for p, q in ((a_neg, b_neg), (a_m, b_m), (a_e, b_e)))
        y_neg, y_m, y_e = (Mux(a_big, q, p) for p, q in ((a_neg, b_neg), (a_m, b_m), (a_e, b_e)))
        d = Signal(EXP.width + 1)
        m.d.comb += d.eq(x_e - y_e)
        aligned = (x_m << d[:6])[:SUM_BITS]
        total = Signal(signed(SUM_BITS + 2))
        m.d.comb += total.eq(Mux(x_neg == y_neg, aligned + y_m, aligned - y_m))
        with m.If(d > ALIGN_LIMIT):
            m.d.sync += [acc.eq(x_m), acc_neg.eq(x_neg), acc_exp.eq(x_e)]
        with m.Else():
            # a difference below zero: the smaller-exponent operand's sign wins
            m.d.sync += [acc.eq(Mux(total < 0, -total, total)),
                         acc_neg.eq(Mux(total < 0, ~x_neg, x_neg)), acc_exp.eq(y_e)]

    @staticmethod
    def _round(m, acc, acc_exp, to_f32):
        """Round acc * 2**acc_exp to 53 bits (or to 24 bits, never below 2**-149): stage one
        registers the shift k (leading one minus the kept width, raised to the float32
        subnormal floor), stage two shifts, rounds to nearest even and normalises a carry.
        Returns stage two's (m, e), valid in the cycle after acc was loaded; stage one's
        register loads every cycle."""
        lead = Signal(range(SUM_BITS))
        m.d.comb += lead.eq(_leading_one(acc)[1])
        width = Mux(to_f32, F32_BITS, F64_BITS)
        k_lead = Signal(EXP)
        m.d.comb += k_lead.eq(lead - (width - 1))
        k_floor = Signal(EXP)
        m.d.comb += k_floor.eq(F32_MIN_EXP - acc_exp)
        k = Signal(EXP)
        m.d.sync += k.eq(Mux(to_f32 & (k_floor > k_lead), k_floor, k_lead))
        right = Signal(8)                                # k > 0: bits dropped
        m.d.comb += right.eq(Mux(k > SUM_BITS + 1, SUM_BITS + 1, k))
        kept, below = Signal(SUM_BITS), Signal(SUM_BITS + 1)
        m.d.comb += [kept.eq(acc >> right),
                     below.eq(Cat(Const(0, 1), acc) >> right)]   # bit 0: acc's bit right - 1
        mask = Signal(SUM_BITS)                          # the bits below that one
        m.d.comb += mask.eq(((Const(1, SUM_BITS + 2) << right) - 1) >> 1)
        up = below[0] & (((acc & mask) != 0) | kept[0])
        q = Signal(F64_BITS + 2)
        m.d.comb += q.eq(kept + up)
        carry = q == (Const(1, F64_BITS + 2) << width)
        out_m, out_e = Signal(F64_BITS + 1), Signal(EXP)
        with m.If(acc == 0):
            m.d.comb += [out_m.eq(0), out_e.eq(ZERO_EXP)]
        with m.Elif(k <= 0):                             # exact: normalise to the left
            m.d.comb += [out_m.eq(acc << (-k)[:6]), out_e.eq(acc_exp + k)]
        with m.Elif(carry):
            m.d.comb += [out_m.eq(q >> 1), out_e.eq(acc_exp + k + 1)]
        with m.Else():
            m.d.comb += [out_m.eq(q), out_e.eq(acc_exp + k)]
        return out_m, out_e


def _leading_one(bits):
    """(any bit set, index of the highest set bit) as a balanced tree (log2 levels, not a
    priority chain over every bit)."""
    if len(bits) == 1:
        return bits[0], Const(0, 1)
    half = 1 << ((len(bits) - 1).bit_length() - 1)          # the low part: a power of two
    lo_any, lo_at = _leading_one(bits[:half])
    hi_any, hi_at = _leading_one(bits[half:])
    return lo_any | hi_any, Mux(hi_any, hi_at + half, lo_at)


def _decode(key):
    """(negative, m, e) of a non-negative float32 key (exact; not normalised)."""
    biased, frac = key[23:31], key[:23]
    subnormal = biased == 0
    mant = Mux(subnormal, frac, frac | (1 << 23))
    exp = Mux(subnormal, F32_MIN_EXP, biased - 150)
    return Const(0, 1), mant, Mux(mant == 0, ZERO_EXP, exp)
