"""RedSync threshold binary search replayed from histograms, inside :class:`TopKUnit`
(``Mode.SEARCH``; golden: ``select.binary_search_histogram``, docs/sparse-units.md).

The search interval is [lo, hi] in grid units (ratio = g / 2**depth); hi - lo is always a
power of two. One **count pass** over the chunk counts ``#{key > thr_j}`` for the
``2**levels - 1`` grid points ``lo + j * step`` (``levels = min(H, log2(hi - lo))``,
``step = (hi - lo) >> levels``, H = ``search_bits``): a bank of W x (2**H - 1) comparators
and one counter per grid point. The **decision loop** then replays ``levels`` steps of the
binary search on that table, one step per cycle, without touching the data:
``mid = (lo + hi) / 2``; accept if ``k <= c < 2k`` (``strict``: ``k < c < 2k``); ``c < k``
-> hi = mid; else lo = mid. Every probe lies on the table's grid, so the trace equals the
golden's step for step. Accepted -> one emit pass ``key > thr`` (THRESHOLD). Interval down
to one grid unit without acceptance -> the band fill (BAND: count pass, emit pass) between
thr(lo) and thr(hi).

**Threshold source.** The grid thresholds ``max(0, fl32(base + g/2**depth * (top - base)))``
are float64 arithmetic on the exact mean and the maximum of the chunk (RedSync R-A9); the
unit does not compute them: :class:`.threshold.GridThresholdSource` does, in RTL, given the
mean and the maximum (or a controller answers). Before each count pass it asks on ``grid``
(``start``, ``step``, ``count``: grid points ``start + j * step``, j < count) and takes the
``count`` answers, in that order, on ``thr``. A non-converged search asks once more for
thr(lo) and thr(hi) (``start = lo``, ``step = 1``, ``count = 2``). The requests are
exactly ``SearchSelection.grids`` of the golden (plus the band request), which the tests
check.

Passes: ``len(grids)`` count passes, then 1 (converged) or 2 (band) more. An all-zero chunk
(golden: no pass) is seen in the first count pass and closes with one empty emit pass.
"""
from amaranth import Cat, Const, Mux, Signal
from amaranth.lib import data

__all__ = ["GRID_LAYOUT", "MAX_SEARCH_BITS", "SearchReplay"]

MAX_SEARCH_BITS = 4
GRID_BITS = 31                               # grid coordinates up to 2**30 (depth <= 30)
GRID_LAYOUT = data.StructLayout({"start": GRID_BITS, "step": GRID_BITS, "count": 5})
DRAIN_CYCLES = 4                             # key, compare, popcount registers, counter


def _pow2(exponent):
    return Const(1, 1) << exponent


class SearchReplay:
    """Registers and logic of the search (built into the unit's module by :class:`TopKUnit`).

    Parameters
    ----------
    unit : TopKUnit
        The unit (lanes, count width, ``grid`` / ``thr`` ports, ``search_bits``).
    """

    def __init__(self, unit):
        H, CB = unit.search_bits, unit.count_bits
        self.unit, self.points = unit, (1 << H) - 1
        self.lo, self.hi = Signal(GRID_BITS), Signal(GRID_BITS)
        self.span_log = Signal(5)                    # log2(hi - lo)
        self.strict = Signal()
        self.band = Signal()                         # the last request is the band's
        self.any_key = Signal()                      # a non-zero key seen in pass 0
        self.cmd_depth, self.cmd_strict = Signal(5), Signal()     # see hold_command
        self.passes = Signal(5)
        self.converged = Signal()
        self.accepted_step = Signal()                # the last decision step accepted
        self.status_clear, self.passes_bump = Signal(), Signal()   # see status_update
        self.threshold = Signal(31)                  # accepted threshold, else thr(lo)
        # ``threshold`` is status only: it is written a cycle after the event that sets it
        # (as passes and converged are, see ``status_update``),
        # from one-bit pulses and the unit's hi/lo registers, which hold the value by then,
        # so that neither the decision nor the threshold port's handshake sits in front of
        # its 31 enables and resets (-0.25 ns at W = 16, 125 MHz)
        self.threshold_pulse = {src: Signal(name=f"threshold_from_{src}")
                                for src in ("zero", "hi", "lo")}
        self.load = Signal(range(self.points + 1))
        self.j_lo, self.j_hi = Signal(H + 1), Signal(H + 1)
        self.j_mid, self.j_span = Signal(H + 1), Signal(H + 1)   # (lo + hi) / 2, hi - lo
        self.last_answer = Signal(range(self.points + 1))
        self.table = [Signal(31, name=f"grid_thr{j}") for j in range(self.points)]
        self.counts = [Signal(CB + 1, name=f"grid_count{j}") for j in range(self.points)]
        self.drain = Signal(2)
        # levels = min(H, span_log), shift = span_log - levels: registers set with span_log
        self.levels, self.shift = Signal(range(H + 1)), Signal(5)
        # per table entry, c >= k (c > k when strict), c < k, c < 2k: registered from the
        # counts so that a decision step is a one-bit mux, not a 32-bit compare
        self.ok_lo = Signal(self.points)
        self.below = Signal(self.points)
        self.under_2k = Signal(self.points)

    def hold_command(self, m, cmd, idle):
        """Register a command's depth (clamped into 1..30: ``command_word`` refuses
        others) and strict flag while the unit is idle, for ``start`` a cycle after the
        command: the handshake in front of the enables of passes, converged, levels and
        shift was 8 LUT levels (-0.33 ns at W = 16)."""
        with m.If(idle):
            m.d.sync += [self.cmd_depth.eq(Mux(cmd.depth == 0, 1,
                                               Mux(cmd.depth > 30, 30, cmd.depth))),
                         self.cmd_strict.eq(cmd.strict)]

    def start(self, m):
        """Start the search of the command ``hold_command`` took."""
        depth = self.cmd_depth
        m.d.sync += [self.lo.eq(0), self.hi.eq(_pow2(depth)), self.strict.eq(self.cmd_strict),
                     self.band.eq(0), self.any_key.eq(0), self.status_clear.eq(1)]
        self.set_threshold(m, "zero")
        self._set_span(m, depth)

    def set_threshold(self, m, source):
        """``threshold`` = 0 (``"zero"``), or the unit's ``hi`` / ``lo`` as they are in
        the next cycle (``"hi"``, ``"lo"``: the caller loads them in this one)."""
        m.d.sync += self.threshold_pulse[source].eq(1)

    def status_update(self, m, st):
        """The one-cycle-late writes of ``threshold``, ``passes`` and ``converged`` from
        registered pulses (``threshold_pulse``, ``status_clear``, ``passes_bump``,
        ``accepted_step``), so that their enables are a pulse or two, not the controller's
        phase logic (the start's and the decision's conditions in front of the enables of
        passes and converged: -0.27 ns at W = 16). Called before anything sets a pulse
        (their default is 0). Nothing reads passes before the count pass, at least three
        cycles after the start and the previous decision, nor converged before the unit is
        idle."""
        pulse = self.threshold_pulse
        m.d.sync += [p.eq(0) for p in pulse.values()]
        m.d.sync += [self.accepted_step.eq(0), self.status_clear.eq(0), self.passes_bump.eq(0)]
        with m.If(self.status_clear):
            m.d.sync += [self.passes.eq(0), self.converged.eq(0)]
        with m.Else():
            with m.If(self.passes_bump):
                m.d.sync += self.passes.eq(self.passes + 1)
            with m.If(self.accepted_step):
                m.d.sync += self.converged.eq(1)
        with m.If(pulse["zero"]):
            m.d.sync += self.threshold.eq(0)
        with m.Elif(pulse["hi"]):
            m.d.sync += self.threshold.eq(st.hi)
        with m.Elif(pulse["lo"]):
            m.d.sync += self.threshold.eq(st.lo)

    def _set_span(self, m, span_log):
        """span_log = log2(hi - lo) with its levels = min(H, span_log) and step exponent
        shift = span_log - levels."""
        H = self.unit.search_bits
        levels = Mux(span_log < H, span_log, H)
        m.d.sync += [self.span_log.eq(span_log), self.levels.eq(levels),
                     self.shift.eq(span_log - levels)]

    def decision_flags(self, m, k):
        """The decision flags of every table entry against k (see ``decide``), and the
        index of a request's last answer (``take_threshold``), registered every cycle:
        band and levels are set at least one cycle (the request) before the first answer
        (a compare with count - 1 fed the loads of hi/lo: W = 2 missed 8 ns by 0.16 ns)."""
        m.d.sync += self.last_answer.eq(Mux(self.band, 1, (_pow2(self.levels)) - 2))
        for j, c in enumerate(self.counts):
            m.d.sync += [self.ok_lo[j].eq(Mux(self.strict, c > k, c >= k)),
                         self.below[j].eq(c < k), self.under_2k[j].eq(c < (k << 1))]

    def request(self, m, grid):
        """Offer the next threshold request; True once taken."""
        req = grid.payload
        m.d.comb += grid.valid.eq(1)
        with m.If(self.band):
            m.d.comb += [req.start.eq(self.lo), req.step.eq(1), req.count.eq(2)]
        with m.Else():
            m.d.comb += [req.start.eq(self.lo + (_pow2(self.shift))), req.step.eq(_pow2(self.shift)),
                         req.count.eq((_pow2(self.levels)) - 1)]
        m.d.sync += self.load.eq(0)
        return grid.ready

    def take_threshold(self, m, thr):
        """Store answer ``load`` of the request; True on the request's last answer."""
        m.d.comb += thr.ready.eq(1)
        last = self.last_answer
        with m.If(thr.valid):
            m.d.sync += self.load.eq(self.load + 1)
            with m.Switch(self.load):
                for j, reg in enumerate(self.table):
                    with m.Case(j):
                        m.d.sync += reg.eq(thr.payload)
            m.d.sync += [c.eq(0) for c in self.counts]      # the count pass starts from 0
        return thr.valid & (self.load == last)

    def count_pipeline(self, m, rkeys, counting):
        """Per grid point: register the W comparisons of the registered keys ``rkeys``
        (one cycle behind ``counting``), register their popcount, accumulate
        (DRAIN_CYCLES after the last beat the counts are final)."""
        from .topk import _tree_sum
        W = len(rkeys)
        rcounting = Signal()
        m.d.sync += rcounting.eq(counting)
        for j, thr in enumerate(self.table):
            hits = Signal(W, name=f"grid_hits{j}")
            pop = Signal(range(W + 1), name=f"grid_pop{j}")
            m.d.sync += [hits.eq(Cat((key > thr) & rcounting for key in rkeys)),
                         pop.eq(_tree_sum(list(hits))),
                         self.counts[j].eq(self.counts[j] + pop)]

    def any_key_pipeline(self, m, rkeys, counting):
        """``any_key``: a non-zero key among the registered keys ``rkeys`` of pass 0's
        beats (one cycle behind ``counting``), final DRAIN_CYCLES - 2 cycles before the
        decision reads it. The OR of the W input keys straight from the sign logic missed
        125 MHz by 0.003 ns at W = 16."""
        taken = Signal(name="any_key_beat")
        m.d.sync += taken.eq(counting & (self.passes == 0))
        with m.If(taken):
            m.d.sync += self.any_key.eq(self.any_key | Cat(k != 0 for k in rkeys).any())

    def decide(self, m, st):
        """One binary-search step per cycle on the table. Returns (accepted, exhausted):
        accepted -> ``st.hi``/``st.lo`` hold the threshold; exhausted -> the table's levels
        are used up (lo/hi updated, ``span_log`` reduced)."""
        j_mid = self.j_mid
        ok, below, thr = Signal(), Signal(), Signal(31)
        with m.Switch(j_mid):
            for j in range(self.points):
                with m.Case(j + 1):
                    m.d.comb += [ok.eq(self.ok_lo[j] & self.under_2k[j]),
                                 below.eq(self.below[j]), thr.eq(self.table[j])]
        # j_hi - j_lo (a power of two) is kept one-hot in ``j_span``: > 1 is a bit test, and
        # the next probe j_mid +- j_span/4 is ready the next cycle (a subtract, a compare and
        # an add in front of the table mux fed the enables of hi/lo: 90 MHz at W = 2)
        stepping = self.j_span[1:].any()
        quarter = self.j_span >> 2
        accepted, exhausted = Signal(), Signal()
        m.d.comb += [accepted.eq(stepping & ok), exhausted.eq(~stepping)]
        m.d.sync += self.accepted_step.eq(accepted)
        # the emit pass's hi = lo = the probe's threshold, loaded at every step: only the
        # accepted step's survives into EMIT (a band fill sets them again for its COUNT);
        # enabled by ``accepted`` they sat behind the table mux (+0.10 ns at 125 MHz)
        m.d.sync += [st.hi.eq(thr), st.lo.eq(thr)]
        with m.If(accepted):
            self.set_threshold(m, "hi")             # st.hi = thr, loaded above
        # the probe moves at every step, the accepting one too: nothing reads j_* after
        # it (EMIT follows; begin_decision sets them again), and ``accepted`` stays off
        # their enables and resets (-0.69 ns at W = 16 behind the table mux). j_span is
        # one-hot above bit 0 while stepping, so the rotation is the halving, with no
        # constant bit for Yosys to turn into a reset
        with m.If(stepping):
            m.d.sync += self.j_span.eq(self.j_span.rotate_right(1))
            with m.If(below):
                m.d.sync += [self.j_hi.eq(j_mid), self.j_mid.eq(j_mid - quarter)]
            with m.Else():
                m.d.sync += [self.j_lo.eq(j_mid), self.j_mid.eq(j_mid + quarter)]
        with m.Else():
            m.d.sync += [self.lo.eq(self.lo + (self.j_lo << self.shift)),
                         self.hi.eq(self.lo + (self.j_hi << self.shift))]
            self._set_span(m, self.shift)
        return accepted, exhausted

    def begin_decision(self, m):
        m.d.sync += [self.j_lo.eq(0), self.j_hi.eq(_pow2(self.levels)),
                     self.j_span.eq(_pow2(self.levels)), self.j_mid.eq(_pow2(self.levels) >> 1),
                     self.passes_bump.eq(1)]
