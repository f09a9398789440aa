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

Sequential: one operation a state, each a short pipeline whose inputs are held through the
state (:data:`ROUND_CYCLES`, :data:`ADD_CYCLES`, :data:`MUL_CYCLES`): no path holds more
than one wide shift or one carry chain of about 57 bits (the first version, one operation a
cycle with the rounding in two, placed at 40.2 MHz; with four-stage pipelines, 91.1 MHz;
with a one-stage 114-bit rounding shift, 79.9 MHz); a state's end is a register set the
cycle before (from a compare of the phase counter it drove the 114-bit rounding input's
reset: 124.9 MHz). Latency: :data:`SETUP_CYCLES` = 26
after a request is taken (round t and b, t - b, its rounding), then :data:`POINT_CYCLES` =
31 per grid point when ``thr`` is always ready. A count pass over C/W beats follows each
request; the source's latency is paid once a pass (H = 3: 26 + 7 * 31 cycles).
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
ROUND_CYCLES = 7        # leading one and trailing zeros, shift k, shift amounts, coarse
#                         shift, fine shift, rounding, the result registered
ADD_CYCLES = 5          # operands, order and exponent difference, alignment, low half,
#                         high half
MUL_CYCLES = 4          # 18 x 18 partial products, three pair sums, two, the total
LOW_BITS = 57           # the adder's low half (a carry or borrow into the high half)
#: cycles from a request taken to its first point's multiply (round t, round b, t - b and
#: its rounding), and per point from the multiply to the answer on ``thr`` (multiply, add,
#: each rounded, the float32 rounding, then the answer's cycle)
SETUP_CYCLES = 3 * ROUND_CYCLES + ADD_CYCLES
POINT_CYCLES = MUL_CYCLES + ADD_CYCLES + 3 * ROUND_CYCLES + 1


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
        # rounded operands: t, b, the span t - b, the scaled span
        regs = {n: (Signal(name=f"{n}_neg"), Signal(F64_BITS + 1, name=f"{n}_m"),
                    Signal(EXP, name=f"{n}_e")) for n in ("t", "b", "span", "scaled")}
        g, left, step = Signal(GRID_BITS), Signal(5), Signal(GRID_BITS)
        key = Signal(KEY_BITS)
        phase = Signal(3)                           # cycle within a multi-cycle state
        # set in a state's last cycle from the cycle before: the state's end (it loads acc,
        # the 114-bit rounding input, and the operand registers) comes from a register,
        # not a compare of the phase counter (124.9 MHz: acc's reset input missed by 8 ps)
        done = Signal()
        # the datapaths: free-running pipelines, their inputs held through a state
        rounded = _round(m, acc, acc_exp, to_f32)
        add_a, add_b = ((Signal(name=f"add_{x}_neg"), Signal(F64_BITS + 1, name=f"add_{x}_m"),
                         Signal(EXP, name=f"add_{x}_e")) for x in "ab")
        added = _add(m, add_a, add_b)
        product = _multiply(m, g, regs["span"][1])

        def last(cycles):
            """True in a state's last cycle (``done``, registered); counts its cycles. A
            state is entered with phase 0 and done 0 (the previous state's last cycle
            clears both; IDLE and OUT leave them alone), and lasts at least 2 cycles."""
            m.d.sync += [phase.eq(Mux(done, 0, phase + 1)), done.eq(phase == cycles - 2)]
            return done

        def store(name):
            neg, mant, exp = regs[name]
            m.d.sync += [neg.eq(acc_neg), mant.eq(rounded[0]), exp.eq(rounded[1])]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.grid.ready.eq(1)
                # top enters the rounding input every idle cycle (nothing else uses it
                # then): acc's load does not wait on the request's valid and count
                _load(m, acc, acc_neg, acc_exp, _decode(self.top))
                with m.If(self.grid.valid & (self.grid.payload.count != 0)):
                    p = self.grid.payload
                    m.d.sync += [g.eq(p.start), step.eq(p.step), left.eq(p.count)]
                    m.next = "ROUND_T"
            with m.State("ROUND_T"):
                with m.If(last(ROUND_CYCLES)):
                    store("t")
                    _load(m, acc, acc_neg, acc_exp, _decode(self.base))
                    m.next = "ROUND_B"
            with m.State("ROUND_B"):
                with m.If(last(ROUND_CYCLES)):
                    store("b")
                    m.next = "SUB"
            with m.State("SUB"):                               # t - b
                t_neg, t_m, t_e = regs["t"]
                b_neg, b_m, b_e = regs["b"]
                m.d.comb += [x.eq(y) for x, y in zip(add_a + add_b,
                                                     (t_neg, t_m, t_e, ~b_neg, b_m, b_e))]
                with m.If(last(ADD_CYCLES)):
                    _load(m, acc, acc_neg, acc_exp, added)
                    m.next = "ROUND_SPAN"
            with m.State("ROUND_SPAN"):
                with m.If(last(ROUND_CYCLES)):
                    store("span")
                    m.next = "MUL"
            with m.State("MUL"):                               # g / 2**depth * span
                s_neg, s_m, s_e = regs["span"]
                with m.If(last(MUL_CYCLES)):
                    _load(m, acc, acc_neg, acc_exp,
                          (s_neg, product, Mux(s_m == 0, ZERO_EXP, s_e - self.depth)))
                    m.next = "ROUND_SCALED"
            with m.State("ROUND_SCALED"):
                with m.If(last(ROUND_CYCLES)):
                    store("scaled")
                    m.next = "ADD"
            with m.State("ADD"):                               # b + scaled
                m.d.comb += [x.eq(y) for x, y in zip(add_a + add_b,
                                                     regs["b"] + regs["scaled"])]
                with m.If(last(ADD_CYCLES)):
                    _load(m, acc, acc_neg, acc_exp, added)
                    m.next = "ROUND_VAL"
            with m.State("ROUND_VAL"):                         # then the float32 rounding
                with m.If(last(ROUND_CYCLES)):
                    m.d.sync += [acc.eq(rounded[0]), acc_exp.eq(rounded[1]), to_f32.eq(1)]
                    m.next = "ROUND_F32"
            with m.State("ROUND_F32"):
                with m.If(last(ROUND_CYCLES)):
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


def _load(m, acc, acc_neg, acc_exp, value):
    neg, mant, exp = value
    m.d.sync += [acc.eq(mant), acc_neg.eq(neg), acc_exp.eq(exp)]


def _round(m, acc, acc_exp, to_f32):
    """Round acc * 2**acc_exp to 53 bits (or to 24 bits, never below 2**-149), in
    ROUND_CYCLES stages that load every cycle (acc held meanwhile): the leading one, the
    trailing zeros and acc == 0; the shift k (leading one minus the kept width, raised to the
    float32 subnormal floor); the shift amounts; the right shift by multiples of 16 with the
    sticky bit (a set bit below the half bit: trailing zeros < k - 1) and the left-normalised
    value; the rest of the shift (the kept bits and the half bit); then round to nearest
    even and renormalise a carry, registered. Returns (m, e), valid in the seventh
    cycle."""
    lead, low, zero = Signal(range(SUM_BITS)), Signal(range(SUM_BITS)), Signal()
    m.d.sync += [lead.eq(_leading_one(acc)[1]), low.eq(_lowest_one(acc)[1]),
                 zero.eq(acc == 0)]
    width = Mux(to_f32, F32_BITS, F64_BITS)
    k_lead, k_floor, k = Signal(EXP), Signal(EXP), Signal(EXP)
    m.d.comb += [k_lead.eq(lead - (width - 1)), k_floor.eq(F32_MIN_EXP - acc_exp)]
    m.d.sync += k.eq(Mux(to_f32 & (k_floor > k_lead), k_floor, k_lead))
    # the shift amounts registered (k > 0: the bits dropped, clamped; k <= 0: left)
    right, left = Signal(8), Signal(6)
    exact, zero1, exp = Signal(), Signal(), Signal(EXP)
    m.d.sync += [right.eq(Mux(k > SUM_BITS + 1, SUM_BITS + 1, k)), left.eq((-k)[:6]),
                 exact.eq(k <= 0), zero1.eq(zero), exp.eq(acc_exp + k)]
    # the right shift in two stages: by the multiple of 16, then by the rest (a 114-bit
    # shift by 7 bits behind the clamp was 14 logic levels: 79.9 MHz)
    coarse = Signal(SUM_BITS + 1)                        # bit 0: acc's bit (right & ~15) - 1
    normalised, fine, sticky = Signal(F64_BITS + 1), Signal(4), Signal()
    exact2, zero2, exp2 = Signal(), Signal(), Signal(EXP)
    m.d.sync += [coarse.eq(Cat(Const(0, 1), acc) >> (right & 0xF0)), fine.eq(right[:4]),
                 sticky.eq((right > 1) & (low < right - 1)), normalised.eq(acc << left),
                 exact2.eq(exact), zero2.eq(zero1), exp2.eq(exp)]
    kept, half = Signal(F64_BITS + 1), Signal()
    exact3, zero3, exp3, sticky3 = Signal(), Signal(), Signal(EXP), Signal()
    normalised3 = Signal(F64_BITS + 1)
    m.d.sync += [kept.eq(coarse >> (fine + 1)), half.eq((coarse >> fine)[0]),
                 exact3.eq(exact2), zero3.eq(zero2), exp3.eq(exp2), sticky3.eq(sticky),
                 normalised3.eq(normalised)]
    exact, zero2, exp, sticky, normalised = exact3, zero3, exp3, sticky3, normalised3
    q = Signal(F64_BITS + 2)
    m.d.comb += q.eq(kept + (half & (sticky | kept[0])))
    out_m, out_e = Signal(F64_BITS + 1), Signal(EXP)
    with m.If(zero2):
        m.d.sync += [out_m.eq(0), out_e.eq(ZERO_EXP)]
    with m.Elif(exact):                                  # exact: normalised to the left
        m.d.sync += [out_m.eq(normalised), out_e.eq(exp)]
    with m.Elif(q == (Const(1, F64_BITS + 2) << width)):  # a carry out of the kept bits
        m.d.sync += [out_m.eq(q >> 1), out_e.eq(exp + 1)]
    with m.Else():
        m.d.sync += [out_m.eq(q), out_e.eq(exp)]
    return out_m, out_e


def _add(m, a, b):
    """a + b of normalised operands in ADD_CYCLES stages (inputs held meanwhile): the
    operands registered; x the
    operand of larger magnitude, y the other, and d their exponent difference; x shifted
    left by d onto y's scale (or, for d > ALIGN_LIMIT, x alone: the correctly rounded sum,
    see the module docstring); the low LOW_BITS of x +- y with their carry or borrow; the
    high half. |x| >= |y|, so the difference is never negative. Returns (neg, m, e)."""
    def regs(prefix, like):
        return [Signal.like(v, name=f"{prefix}_{n}") for n, v in zip(("neg", "m", "e"), like)]
    a_in, b_in = regs("add_a_in", a), regs("add_b_in", b)     # cut the FSM's operand mux
    m.d.sync += [r.eq(v) for r, v in zip(a_in + b_in, list(a) + list(b))]
    a, b = a_in, b_in
    (a_neg, a_m, a_e), (b_neg, b_m, b_e) = a, b
    a_big = (a_e > b_e) | ((a_e == b_e) & (a_m >= b_m))
    x, y = regs("add_x", a), regs("add_y", a)
    same, d = Signal(), Signal(EXP.width + 1)
    m.d.sync += [r.eq(Mux(a_big, p, q)) for r, p, q in zip(x, a, b)]
    m.d.sync += [r.eq(Mux(a_big, q, p)) for r, p, q in zip(y, a, b)]
    m.d.sync += [same.eq(a_neg == b_neg), d.eq(Mux(a_big, a_e - b_e, b_e - a_e))]
    x1, y1 = regs("add_x1", a), regs("add_y1", a)
    aligned, far, same1 = Signal(SUM_BITS), Signal(), Signal()
    m.d.sync += [r.eq(v) for r, v in zip(x1 + y1, x + y)]
    m.d.sync += [aligned.eq(x[1] << d[:6]), far.eq(d > ALIGN_LIMIT), same1.eq(same)]
    x2, y_e2 = regs("add_x2", a), Signal(EXP, name="add_y_e2")
    low, high, far2 = Signal(signed(LOW_BITS + 2)), Signal(SUM_BITS - LOW_BITS), Signal()
    m.d.sync += [r.eq(v) for r, v in zip(x2, x1)]
    m.d.sync += [low.eq(Mux(same1, aligned[:LOW_BITS] + y1[1], aligned[:LOW_BITS] - y1[1])),
                 high.eq(aligned[LOW_BITS:]), far2.eq(far), y_e2.eq(y1[2])]
    total = Cat(low[:LOW_BITS], (high + low[LOW_BITS:].as_signed())[:SUM_BITS - LOW_BITS])
    return x2[0], Mux(far2, x2[1], total), Mux(far2, x2[2], y_e2)


def _multiply(m, g, s):
    """g * s (31 x 53 bits, exact) in MUL_CYCLES stages (inputs held meanwhile): six
    18 x 18 partial products registered (one MULT18X18D each, operands from registers), then
    three pair sums, then two, then the total. Returns the product."""
    g_parts = (g[:18], g[18:])
    s_parts = (s[:18], s[18:36], s[36:])
    pp = {(i, j): Signal(36, name=f"mul_pp{i}{j}") for i in range(2) for j in range(3)}
    m.d.sync += [pp[i, j].eq(g_parts[i] * s_parts[j]) for i, j in pp]
    # by weight: 2**0, 2**18 (two), 2**36 (two), 2**54
    r0, r1, r2 = (Signal(SUM_BITS, name=f"mul_r{n}") for n in range(3))
    m.d.sync += [r0.eq(pp[0, 0] + (pp[0, 1] << 18)), r1.eq(pp[1, 0] + (pp[0, 2] << 18)),
                 r2.eq(pp[1, 1] + (pp[1, 2] << 18))]
    low, r2d = Signal(SUM_BITS, name="mul_low"), Signal(SUM_BITS, name="mul_r2d")
    m.d.sync += [low.eq(r0 + (r1 << 18)), r2d.eq(r2)]
    return (low + (r2d << 36))[:SUM_BITS]


def _leading_one(bits):
    """(any bit set, index of the highest set bit) as a balanced tree (log2 levels, not a
    priority chain over every bit)."""
    if len(bits) == 1:
        return bits[0], Const(0, 1)
    half = 1 << ((len(bits) - 1).bit_length() - 1)          # the low part: a power of two
    lo_any, lo_at = _leading_one(bits[:half])
    hi_any, hi_at = _leading_one(bits[half:])
    return lo_any | hi_any, Mux(hi_any, hi_at | half, lo_at)       # hi_at < half: no adder


def _lowest_one(bits):
    """(any bit set, index of the lowest set bit), the same tree."""
    if len(bits) == 1:
        return bits[0], Const(0, 1)
    half = 1 << ((len(bits) - 1).bit_length() - 1)
    lo_any, lo_at = _lowest_one(bits[:half])
    hi_any, hi_at = _lowest_one(bits[half:])
    return lo_any | hi_any, Mux(lo_any, lo_at, hi_at | half)


def _decode(key):
    """(negative, m, e) of a non-negative float32 key (exact; not normalised)."""
    biased, frac = key[23:31], key[:23]
    subnormal = biased == 0
    mant = Mux(subnormal, frac, frac | (1 << 23))
    exp = Mux(subnormal, F32_MIN_EXP, biased - 150)
    return Const(0, 1), mant, Mux(mant == 0, ZERO_EXP, exp)
