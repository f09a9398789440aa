"""Streaming top-k selection unit: radix-histogram select + compaction pass
(docs/sparse-models.md, RedSync R-7.4).

Contract
--------
Input ``i``: a chunk of C binary32 values streamed W lanes per beat, element ``b*W + l`` in
lane ``l`` of beat ``b``, ``last`` set on the chunk's final beat (C is a multiple of W; pad
with zeros, which are never selected). A command on ``cmd`` starts a selection; the unit
then consumes the chunk once per pass (the banked buffer re-streams it) and emits on ``o``
the selected (index u32, value f32) pairs in **ascending index order**, up to W per beat,
compacted into lanes ``0 .. count-1``; the final output beat (possibly ``count = 0``)
carries ``last``.

Keys are ``bits(x) & 0x7FFFFFFF`` (``select.magnitude_keys``); with ``sign = +1/-1`` keys of
the other sign are 0 (``select.signed_keys``). Key 0 is never selected.

Modes (``cmd.mode``), each equal to a golden selector of ``treenic.sparse.select``:

``EXACT`` (0) -- ``select.topk`` / ``radix_topk``: |v| descending, ties by ascending index,
    exactly min(k, nonzeros) pairs. Passes: 4 histogram passes over the 31-bit key
    (digits 30..24, 23..16, 15..8, 7..0; 256-bin histograms in block RAM, one per lane,
    ``scan_bins`` bins per memory word, default 2), each followed by a scan of
    256/scan_bins + 5 cycles (133 at two bins a row: one row a cycle, top down, then the
    read, field, half-sum, sum and decision registers; 256/scan_bins + 6 at 8 bins a row
    and + 7 at 16 and 32, where the row's suffix sums take more registered stages:
    :func:`scan_latency`)
    that picks the digit holding the k-th largest key and clears the bins; then 1 emit pass: keys > v_k, plus keys == v_k
    in ascending index order until k are out.
``THRESHOLD`` (1) -- one emit pass: ``key > threshold`` in index order, cut after ``limit``
    pairs: threshold reuse (``ThresholdReuse``: limit = cap_factor * k) and the converged
    outcome of the binary search (limit = 2**32 - 1).
``BAND`` (2) -- one count pass (``#key > hi``), then one emit pass: every key > hi plus the
    keys in (lo, hi] in index order until k are out: the band fill of a non-converged
    binary search (``select._band_fill``).
``SEARCH`` (3) -- the RedSync threshold binary search itself, replayed from histograms in
    the unit (``select.binary_search_histogram`` with ``hist_bits = search_bits``): count
    passes over 2**H - 1 grid thresholds each, the decision loop on the count table, then
    THRESHOLD's emit pass (converged) or BAND's two passes; the grid thresholds come from a
    threshold source over ``grid``/``thr`` (see :mod:`.search`). ``k``, ``sign``,
    ``depth`` (1..30) and ``strict`` as in the golden.

Every pass takes C/W cycles at full input rate, independent of k (the emit pass can be
slowed only by output backpressure). The emit pass is a 4-stage pipeline (``EMIT_STAGES``:
key, flags, prefix counts, lane selection) into an 8-beat output FIFO: a beat's pairs are
on ``o`` 5 cycles after the beat was taken; the input is taken while the FIFO has room for
every beat in flight. EXACT total at full rate, command to the last output transfer
(:func:`exact_cycles`): 5 C/W + 4 * (256/scan_bins + scan_latency + 2) + 8 cycles, 868 for
C = 256, W = 4, two bins a row (the tests measure it). Count passes (BAND, SEARCH) end 2 (BAND) or
4 (SEARCH, ``search.DRAIN_CYCLES``) cycles after their last beat.
"""
import numpy as np
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from treenic.sparse import select

from .search import DRAIN_CYCLES, GRID_LAYOUT, MAX_SEARCH_BITS, SearchReplay

__all__ = ["TopKUnit", "Mode", "HIST_PASSES", "SCAN_CYCLES", "PASSES", "exact_cycles",
           "scan_latency", "suffix_cuts",
           "EMIT_STAGES", "chunk_beats", "chunk_words",
           "decode_pairs", "command_word", "search_command", "search_requests",
           "search_passes", "grid_thresholds"]

KEY_BITS = 31
DIGIT_BITS = 8
BINS = 1 << DIGIT_BITS
DIGIT_SHIFTS = (24, 16, 8, 0)                 # most significant digit first (7 bits, then 8)
HIST_PASSES = len(DIGIT_SHIFTS)
ROW_BINS = 2                                 # default bins per histogram memory word (scan reads
#                                              ROW_BINS bins a cycle; ``scan_bins`` sets it)
ROWS = BINS // ROW_BINS
ROW_BITS = (ROWS - 1).bit_length()
SCAN_LATENCY = 5                             # read, field register, half sums, sums, decision
SCAN_CYCLES = ROWS + SCAN_LATENCY
WIDE_SCAN_BINS = 8                           # from this many bins a row, the suffix network
#                                              is registered after its first level, then
#                                              every two (see ``suffix_cuts``)
EMIT_STAGES = 4                              # key, flags, prefix counts, lane selection
OUT_FIFO_DEPTH = 8                           # room for the beats in flight and the next


class Mode(enum.Enum, shape=2):
    EXACT = 0
    THRESHOLD = 1
    BAND = 2
    SEARCH = 3


#: data passes per mode (SEARCH: data-dependent, see :func:`search_passes`)
PASSES = {Mode.EXACT: HIST_PASSES + 1, Mode.THRESHOLD: 1, Mode.BAND: 2}

#: cycles between a histogram pass's last beat and its scan (the last write lands)
HIST_DRAIN = 2
#: cycles of an EXACT selection beyond its passes and scans: the command, the emit setup,
#: the output FIFO, the emit pipeline's stages, and pass 0's nonzero count (one more drain)
EXACT_TAIL = 3 + EMIT_STAGES + 1


def suffix_cuts(scan_bins: int) -> list[int]:
    """After how many levels of a row's suffix-sum network (log2(scan_bins) levels) a
    register stands: none up to 4 bins a row; from ``WIDE_SCAN_BINS``, after the first level
    (which follows the lane tree) and then every two levels (three levels of ~17-bit adders
    in one cycle missed 8 ns: 104.6 MHz at 16 bins a row)."""
    levels = (scan_bins - 1).bit_length()
    return list(range(1, levels, 2)) if scan_bins >= WIDE_SCAN_BINS else []


def scan_latency(scan_bins: int = ROW_BINS) -> int:
    """Cycles from a scan's last row read to its decision: ``SCAN_LATENCY`` plus one per
    register in the row's suffix-sum network (:func:`suffix_cuts`): 5 up to 4 bins a row,
    6 at 8, 7 at 16 and 32."""
    return SCAN_LATENCY + len(suffix_cuts(scan_bins))


def exact_cycles(chunk: int, lanes: int, scan_bins: int = ROW_BINS) -> int:
    """Cycles of an EXACT selection of a ``chunk``-value chunk at full input rate and no
    output backpressure, from the command to the last output transfer (the unit's cycle
    contract; the tests measure it): ``PASSES[EXACT]`` passes of C/W beats and
    ``HIST_PASSES`` scans of ``256 / scan_bins + scan_latency(scan_bins)`` cycles, each after a
    ``HIST_DRAIN``, plus ``EXACT_TAIL``. 868 for C = 256, W = 4, two bins a row."""
    beats = -(-chunk // lanes)
    return (PASSES[Mode.EXACT] * beats
            + HIST_PASSES * (BINS // scan_bins + scan_latency(scan_bins) + HIST_DRAIN)
            + EXACT_TAIL)


# ---- stream formats shared by tests, benches and the benchmark ----------------------------

def chunk_beats(values, lanes: int, passes: int) -> list[int]:
    """The input words of ``passes`` passes over a float32 chunk (``last`` on each pass's
    final beat); the chunk is zero-padded to a multiple of ``lanes``."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    bits = np.concatenate([bits, np.zeros(-bits.size % lanes, np.uint32)])
    nb = bits.size // lanes
    one = [sum(int(v) << (32 * l) for l, v in enumerate(bits[b * lanes:(b + 1) * lanes]))
           | (int(b == nb - 1) << (32 * lanes)) for b in range(nb)]
    return one * passes


def chunk_words(values, lanes: int, passes: int) -> np.ndarray:
    """:func:`chunk_beats` as the ``(beats, lanes + 1)`` uint32 array the C++ co-simulation
    takes (lane words, then the word holding ``last``); no Python loop over beats."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    bits = np.concatenate([bits, np.zeros(-bits.size % lanes, np.uint32)])
    one = np.zeros((bits.size // lanes, lanes + 1), np.uint32)
    one[:, :lanes] = bits.reshape(-1, lanes)
    one[-1, lanes] = 1
    return np.tile(one, (passes, 1))


def decode_pairs(words, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64, value bits uint32) of the output words, in stream order."""
    cb = lanes.bit_length()
    idx, val = [], []
    for w in words:
        c = w & ((1 << cb) - 1)
        body = w >> (cb + 1)
        idx += [(body >> (32 * l)) & 0xFFFFFFFF for l in range(c)]
        val += [(body >> (32 * (lanes + l))) & 0xFFFFFFFF for l in range(c)]
    return np.array(idx, np.int64), np.array(val, np.uint32)


def output_is_last(word: int, lanes: int) -> bool:
    return bool((word >> lanes.bit_length()) & 1)


def command_word(mode: Mode, *, k=0, threshold=0, lo=0, limit=0, sign=0, depth=16,
                 strict=False) -> int:
    """Packed ``cmd`` payload (field order of the layout: mode, sign, k, threshold, lo,
    limit, depth, strict). ``sign`` as in ``select.signed_keys``: 0, +1 or -1; ``depth``
    and ``strict``: the SEARCH mode's (``select.binary_search_histogram``)."""
    code = {0: 0, 1: 1, -1: 2}[sign]
    if Mode(mode) == Mode.SEARCH and not (isinstance(depth, int) and 1 <= depth <= 30):
        raise ValueError(f"search depth must be an integer in 1..30, got {depth!r}")
    word, pos = 0, 0
    for value, width in ((Mode(mode).value, 2), (code, 2), (k, 32), (threshold, KEY_BITS),
                         (lo, KEY_BITS), (limit, 32), (depth, 5), (int(strict), 1)):
        word |= (int(value) & ((1 << width) - 1)) << pos
        pos += width
    return word


def search_command(x, k: int, **search_args) -> tuple[int, "select.SearchSelection"]:
    """The command a controller issues after ``select.binary_search_histogram`` decided:
    converged -> THRESHOLD (``key > threshold``, no cap); not converged -> BAND with the
    final interval's thresholds (the band fill). Threshold arithmetic and the decision loop
    are the golden's own; the unit selects."""
    res = select.binary_search_histogram(x, k, **search_args)
    if res.converged:
        return command_word(Mode.THRESHOLD, threshold=res.threshold_key, limit=0xFFFFFFFF,
                            sign=search_args.get("sign", 0)), res
    depth, lower = search_args.get("depth", 16), search_args.get("lower", "mean")
    _, keys, base, top = select._search_setup(x, k, search_args.get("sign", 0), depth, lower)
    hi = select._grid_threshold(base, top, res.hi, depth) if keys.size and keys.max() else 0
    return command_word(Mode.BAND, k=k, threshold=int(hi), lo=res.threshold_key,
                        sign=search_args.get("sign", 0)), res


def search_requests(res: "select.SearchSelection", keys, depth: int,
                    search_bits: int) -> list[tuple[int, int, int]]:
    """The threshold requests SEARCH makes for the golden outcome ``res``: its count passes
    (``res.grids``), the band's (lo, 1, 2) when not converged; an all-zero chunk
    (golden: no pass) still costs the first count pass over the first grid."""
    if not keys.size or not keys.max():
        levels = min(search_bits, depth)
        step = 1 << (depth - levels)
        return [(step, step, (1 << levels) - 1)]
    return list(res.grids) + ([] if res.converged else [(res.lo, 1, 2)])


def search_passes(res: "select.SearchSelection", keys) -> int:
    """Data passes SEARCH takes: count passes, then 1 (converged, or an all-zero chunk) or
    2 (band fill)."""
    if not keys.size or not keys.max():
        return 2
    return len(res.grids) + (1 if res.converged else 2)


def grid_thresholds(x, start: int, step: int, count: int, *, depth=16, sign=0,
                    lower="mean") -> list[int]:
    """A threshold source's answer to one request: the golden's grid thresholds
    ``select._grid_threshold`` of points ``start + j * step``."""
    _, _, base, top = select._search_setup(x, 1, sign, depth, lower)
    return [int(select._grid_threshold(base, top, start + j * step, depth))
            for j in range(count)]


class TopKUnit(wiring.Component):
    """Streaming top-k / threshold selection over W lanes.

    Parameters
    ----------
    lanes : int
        W, values per input beat (2..32).
    max_chunk : int
        Largest chunk C supported (sizes the counters; up to 2**24).
    search_bits : int
        H of the SEARCH mode (1..4): grid thresholds per count pass 2**H - 1.

    Members
    -------
    cmd : In(stream.Signature(StructLayout{mode, sign, k, threshold, lo, limit}))
        Starts one selection. ``sign``: 0 magnitude, 1 positive keys, 2 negative keys.
        ``threshold``: THRESHOLD threshold and BAND upper bound (keys); ``lo``: BAND lower
        bound. ``k``: EXACT and BAND count; ``limit``: THRESHOLD cap.
    i : In(stream.Signature(StructLayout{value: ArrayLayout(32, W), last}))
        The chunk, once per pass.
    o : Out(stream.Signature(StructLayout{count, last, index, value}))
        Selected pairs, ascending index, compacted to lanes 0..count-1.
    grid : Out(stream.Signature(StructLayout{start, step, count}))
        SEARCH: thresholds wanted for grid points start + j * step, j < count.
    thr : In(stream.Signature(31))
        SEARCH: the answers to ``grid``, one threshold key per transfer, in j order.
    converged, search_passes, search_threshold : Out(1), Out(5), Out(31)
        SEARCH outcome (``SearchSelection.converged``, ``.passes``, ``.threshold_key``),
        valid once ``busy`` falls.
    busy : Out(1)
        A selection is in progress.
    pass_index : Out(3)
        Pass the unit expects next (0-based).
    nonfinite : Out(1)
        A NaN/Inf key was seen in the first pass of the current selection (the golden model
        raises; the result is then unspecified and the caller falls back to dense).
    """

    def __init__(self, *, lanes: int = 2, max_chunk: int = 65536, search_bits: int = 3,
                 scan_bins: int = ROW_BINS):
        if not isinstance(lanes, int) or not 2 <= lanes <= 32 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two in 2..32, got {lanes!r}")
        if not isinstance(max_chunk, int) or not lanes <= max_chunk <= 1 << 24 \
                or max_chunk % lanes:
            raise ValueError(f"max_chunk must be a multiple of lanes in [lanes, 2**24], "
                             f"got {max_chunk!r}")
        if not isinstance(search_bits, int) or not 1 <= search_bits <= MAX_SEARCH_BITS:
            raise ValueError(f"search_bits must be an integer in 1..{MAX_SEARCH_BITS}, "
                             f"got {search_bits!r}")
        if scan_bins not in (2, 4, 8, 16, 32):
            raise ValueError(f"scan_bins must be 2, 4, 8, 16 or 32, got {scan_bins!r}")
        self.lanes, self.max_chunk, self.search_bits = lanes, max_chunk, search_bits
        # histogram rows of scan_bins bins: the row address is digit[RB:], the bin in the
        # row digit[:RB]; a scan reads one row a cycle (SCAN: rows + 3 cycles a pass)
        self.row_bins, self.rb = scan_bins, scan_bins.bit_length() - 1
        self.rows = BINS // scan_bins
        self.row_bits = (self.rows - 1).bit_length()
        self.scan_cycles = self.rows + scan_latency(scan_bins)
        self.count_bits = max_chunk.bit_length()
        cmd = data.StructLayout({"mode": Mode, "sign": 2, "k": 32, "threshold": KEY_BITS,
                                 "lo": KEY_BITS, "limit": 32, "depth": 5, "strict": 1})
        inp = data.StructLayout({"value": data.ArrayLayout(32, lanes), "last": 1})
        out = data.StructLayout({"count": range(lanes + 1), "last": 1,
                                 "index": data.ArrayLayout(32, lanes),
                                 "value": data.ArrayLayout(32, lanes)})
        super().__init__({"cmd": In(stream.Signature(cmd)), "i": In(stream.Signature(inp)),
                          "o": Out(stream.Signature(out)), "busy": Out(1),
                          "pass_index": Out(3), "nonfinite": Out(1),
                          "grid": Out(stream.Signature(GRID_LAYOUT)),
                          "thr": In(stream.Signature(KEY_BITS)), "converged": Out(1),
                          "search_passes": Out(5), "search_threshold": Out(KEY_BITS)})

    def elaborate(self, platform):
        m = Module()
        W = self.lanes
        st = _State(self)
        keys = [self._key(m, st, self.i.payload.value[l]) for l in range(W)]
        beat = Signal(32 - (W - 1).bit_length())       # beat number within the pass
        accepted = self.i.valid & self.i.ready
        with m.If(accepted):
            m.d.sync += beat.eq(Mux(self.i.payload.last, 0, beat + 1))
        # the keys registered for the histograms and the search's comparators (the emit
        # pipeline registers its own): each input bit then drives a few flags, not every
        # consumer (W = 16: the compares straight from the input missed 8 ns)
        rkeys = [Signal(KEY_BITS, name=f"rkey{l}") for l in range(W)]
        m.d.sync += [r.eq(key) for r, key in zip(rkeys, keys)]
        hist_sum, scanning_bin, hist_ready = self._histograms(m, st, rkeys, accepted)
        # before the controller: its clear of the counts at a new count pass overrides this
        st.search.count_pipeline(m, rkeys, st.phase[_Phase.SEARCH_COUNT] & accepted)
        st.search.any_key_pipeline(m, rkeys, st.phase[_Phase.SEARCH_COUNT] & accepted)
        st.search.decision_flags(m, st.k_total)
        st.search.status_update(m, st)
        self._control(m, st, keys, accepted, hist_sum, scanning_bin, hist_ready)
        self._emit(m, st, keys, beat, accepted)
        return m

    def _key(self, m, st, value):
        """Magnitude key, zeroed when its sign is not the selected one (signed keys)."""
        key = Signal(KEY_BITS)
        negative = value[31]
        wrong = ((st.sign == 1) & negative) | ((st.sign == 2) & ~negative)
        m.d.comb += key.eq(Mux(wrong, 0, value[:KEY_BITS]))
        return key

    def _histograms(self, m, st, rkeys, accepted):
        """Per-lane 256-bin counters, two bins per memory word (the scan reads both at once):
        read-modify-write of the word at one key per lane per cycle (the
        transparent read port forwards a same-cycle write, so back-to-back hits on one bin
        count correctly), then a scan that sums the lanes bin by bin and clears them."""
        W, CB = self.lanes, self.count_bits
        # a beat's keys (``rkeys``) are registered: its read is one cycle after it was taken,
        # its write two; the scan's first read comes after the drain, later than the write
        in_hist = Signal()
        m.d.sync += in_hist.eq(accepted & st.phase[_Phase.HIST])
        digit = Signal(DIGIT_BITS)
        match_mask = Signal(KEY_BITS)
        with m.Switch(st.pass_index):
            for p, shift in enumerate(DIGIT_SHIFTS):
                with m.Case(p):
                    m.d.comb += match_mask.eq(((1 << KEY_BITS) - 1) & ~((1 << (shift + DIGIT_BITS)) - 1))
        R, RB, ROWS_, RBITS = self.row_bins, self.rb, self.rows, self.row_bits
        scan_addr = Signal(RBITS + 1)           # counts 0..rows; row read = rows-1-scan_addr
        scan_valid = Signal()                   # rdata holds row scanning_row this cycle
        scanning_row = Signal(RBITS)
        lane_fields = []                        # per lane, the R counts of the row read
        for l in range(W):
            # one memory word holds ROW_BINS adjacent bins: the scan reads them together
            m.submodules[f"hist{l}"] = mem = memory.Memory(shape=CB * R, depth=ROWS_, init=[])
            wp = mem.write_port()
            rp = mem.read_port(transparent_for=(wp,))
            d = Signal(DIGIT_BITS, name=f"digit{l}")
            with m.Switch(st.pass_index):
                for p, shift in enumerate(DIGIT_SHIFTS):
                    with m.Case(p):
                        m.d.comb += d.eq(rkeys[l][shift:shift + DIGIT_BITS])
            hit = in_hist & (((rkeys[l] ^ st.prefix) & match_mask) == 0)
            hit_b, bin_b = Signal(name=f"hit{l}"), Signal(DIGIT_BITS, name=f"bin{l}")
            m.d.sync += [hit_b.eq(hit), bin_b.eq(d)]
            m.d.comb += rp.addr.eq(Mux(in_hist, d[RB:], ROWS_ - 1 - scan_addr[:RBITS]))
            fields = [rp.data[h * CB:(h + 1) * CB] for h in range(R)]
            with m.If(scan_valid):
                m.d.comb += [wp.addr.eq(scanning_row), wp.data.eq(0), wp.en.eq(1)]
            with m.Else():
                bumped = Cat(*[(f + (bin_b[:RB] == h))[:CB] for h, f in enumerate(fields)])
                m.d.comb += [wp.addr.eq(bin_b[RB:]), wp.data.eq(bumped), wp.en.eq(hit_b)]
            lane_fields.append(fields)
        hist_sums = [Signal(CB + (W - 1).bit_length() + 1, name=f"hist_sum{h}")
                     for h in range(R)]
        # lane sums as balanced adder trees (a running sum over the lanes was W adders in
        # series behind the block RAM output: 16 at W = 16), the block RAM output registered
        # first and the tree registered after its first two levels (W = 16 missed 8 ns)
        reg_fields = []
        for l, fields in enumerate(lane_fields):
            rf = [Signal(CB, name=f"field{l}_{h}") for h in range(R)]
            m.d.sync += [a.eq(b) for a, b in zip(rf, fields)]
            reg_fields.append(rf)
        G = min(4, W)
        groups = []
        for g in range(0, W, G):
            gs = [Signal(CB + 2, name=f"group{g // G}_{h}") for h in range(R)]
            m.d.sync += [gs[h].eq(_tree_sum([f[h] for f in reg_fields[g:g + G]]))
                         for h in range(R)]
            groups.append(gs)
        m.d.comb += [hs.eq(_tree_sum([gs[h] for gs in groups]))
                     for h, hs in enumerate(hist_sums)]
        st.scan_addr, st.scan_valid, st.match_mask = scan_addr, scan_valid, match_mask
        return hist_sums, scanning_row, None

    def _control(self, m, st, keys, accepted, hist_sum, scanning_bin, _):
        """Command intake, pass sequencing and the per-pass digit decision."""
        W, CB = self.lanes, self.count_bits
        cmd = self.cmd.payload
        m.d.comb += [self.busy.eq(~st.phase[_Phase.IDLE]), self.pass_index.eq(st.pass_index),
                     self.nonfinite.eq(st.nonfinite)]
        # per-lane flags registered, then their tree sum registered, then accumulated: a
        # W-lane popcount behind a 31-bit compare and in front of an adder missed 8 ns
        nonzero = self._lane_count(m, "nonzero", [k != 0 for k in keys],
                                   accepted & st.phase[_Phase.HIST] & (st.pass_index == 0))
        over = self._lane_count(m, "over", [k > st.hi for k in keys],
                                accepted & st.phase[_Phase.COUNT])
        bad = Signal()
        m.d.sync += bad.eq(Cat(k >= 0x7F800000 for k in keys).any() & accepted
                           & ((st.phase[_Phase.HIST] & (st.pass_index == 0))
                              | (st.phase[_Phase.SEARCH_COUNT] & (st.search.passes == 0))))
        with m.If(bad):
            m.d.sync += st.nonfinite.eq(1)
        m.d.sync += st.nonzero.eq(st.nonzero + nonzero)
        # acc counts the keys above hi in a count pass and holds for COUNT_DONE, zero in
        # every other phase: its only loads are the phase flops, not the transitions
        with m.If(st.phase[_Phase.COUNT] | st.phase[_Phase.COUNT_DRAIN]):
            m.d.sync += st.acc.eq(st.acc + over)
        with m.Elif(~st.phase[_Phase.COUNT_DONE]):
            m.d.sync += st.acc.eq(0)
        st.search.hold_command(m, cmd, st.phase[_Phase.IDLE])
        # the emit budget: a THRESHOLD command's limit (at most max_chunk), else max_chunk
        # (never binds); held from the command, loaded into room as the emit pass begins
        with m.If(st.phase[_Phase.IDLE]):
            m.d.sync += st.room_init.eq(Mux((cmd.mode == Mode.THRESHOLD)
                                            & (cmd.limit < self.max_chunk),
                                            cmd.limit, self.max_chunk))
        drain = Signal(2)
        with m.If(st.phase[_Phase.IDLE]):
            m.d.comb += self.cmd.ready.eq(1)
            with m.If(self.cmd.valid):
                self._start(m, st, cmd)
        self._data_pass(m, st, accepted, _Phase.HIST, _Phase.DRAIN, drain)
        with m.If(st.phase[_Phase.DRAIN]):
            # the last beat's histogram write lands one cycle after its read; in pass 0
            # its nonzero count two cycles after the beat
            m.d.sync += drain.eq(drain + 1)
            with m.If(drain == Mux(st.pass_index == 0, 2, 1)):
                m.d.sync += [*st.phase.move(_Phase.DRAIN, _Phase.SCAN), st.scan_addr.eq(0),
                             st.found.eq(0), st.need.eq(st.k_left)]
                with m.If(st.pass_index == 0):
                    k_eff = Mux(st.k_total < st.nonzero, st.k_total, st.nonzero)
                    m.d.sync += [st.k_left.eq(k_eff), st.k_total.eq(k_eff),
                                 st.need.eq(k_eff)]
        with m.If(st.phase[_Phase.SCAN]):
            self._scan(m, st, hist_sum, scanning_bin)
        self._data_pass(m, st, accepted, _Phase.COUNT, _Phase.COUNT_DRAIN, drain)
        with m.If(st.phase[_Phase.COUNT_DRAIN]):
            # the last beat's count reaches acc two cycles after the beat
            m.d.sync += drain.eq(drain + 1)
            with m.If(drain == 1):
                m.d.sync += st.phase.move(_Phase.COUNT_DRAIN, _Phase.COUNT_DONE)
        with m.If(st.phase[_Phase.COUNT_DONE]):
            # band keys allowed: k - #(key > hi), at least 0; at most C are ever taken
            short = st.k_total - st.acc
            m.d.sync += [*st.phase.move(_Phase.COUNT_DONE, _Phase.EMIT), st.pass_index.eq(1),
                         st.ties_left.eq(Mux(st.acc >= st.k_total, 0,
                                             Mux(short > self.max_chunk, self.max_chunk, short)))]
        with m.If(st.phase[_Phase.EMIT]):
            m.d.comb += self.i.ready.eq(st.emit_ready)
        # EMIT_FLUSH: the emit pipeline drains (see _emit)
        self._search_cases(m, st, accepted)

    def _data_pass(self, m, st, accepted, phase, drain_phase, drain):
        """A pass over the chunk in ``phase``: every beat taken; after the last, the drain
        phase with its counter at zero."""
        with m.If(st.phase[phase]):
            m.d.comb += self.i.ready.eq(1)
            with m.If(accepted & self.i.payload.last):
                m.d.sync += [*st.phase.move(phase, drain_phase), drain.eq(0)]

    def _search_cases(self, m, st, accepted):
        """SEARCH: threshold request, count pass, decision loop (see :mod:`.search`)."""
        sr = st.search
        m.d.comb += [self.converged.eq(sr.converged), self.search_passes.eq(sr.passes),
                     self.search_threshold.eq(sr.threshold)]
        with m.If(st.phase[_Phase.SEARCH_START]):
            sr.start(m)
            m.d.sync += st.phase.move(_Phase.SEARCH_START, _Phase.SEARCH_REQ)
        with m.If(st.phase[_Phase.SEARCH_REQ]):
            with m.If(sr.request(m, self.grid)):
                m.d.sync += st.phase.move(_Phase.SEARCH_REQ, _Phase.SEARCH_LOAD)
        with m.If(st.phase[_Phase.SEARCH_LOAD]):
            with m.If(sr.take_threshold(m, self.thr)):
                with m.If(sr.band):                 # thr(lo) stored, thr(hi) arriving
                    m.d.sync += [*st.phase.move(_Phase.SEARCH_LOAD, _Phase.COUNT),
                                 st.lo.eq(sr.table[0]), st.hi.eq(self.thr.payload)]
                    sr.set_threshold(m, "lo")       # st.lo = table[0], loaded here
                with m.Else():
                    m.d.sync += st.phase.move(_Phase.SEARCH_LOAD, _Phase.SEARCH_COUNT)
        self._data_pass(m, st, accepted, _Phase.SEARCH_COUNT, _Phase.SEARCH_DRAIN, sr.drain)
        with m.If(st.phase[_Phase.SEARCH_DRAIN]):
            m.d.sync += sr.drain.eq(sr.drain + 1)
            with m.If(sr.drain == DRAIN_CYCLES - 1):    # counts final (see count_pipeline)
                sr.begin_decision(m)
                # the tie quota of a converged search (no band), set here and not when the
                # decision accepts: the decision's table mux then fed its enable (121.4 MHz
                # at 16 scan bins, W = 2). Nothing reads it before the emit pass, and a band
                # fill sets it again (COUNT_DONE); room loads as the emit pass begins
                m.d.sync += st.ties_left.eq(0)
                with m.If(sr.any_key):
                    m.d.sync += st.phase.move(_Phase.SEARCH_DRAIN, _Phase.SEARCH_DECIDE)
                with m.Else():                      # all keys zero: one empty emit pass
                    m.d.sync += [*st.phase.move(_Phase.SEARCH_DRAIN, _Phase.EMIT),
                                 st.hi.eq((1 << KEY_BITS) - 1), st.lo.eq((1 << KEY_BITS) - 1)]
        with m.If(st.phase[_Phase.SEARCH_DECIDE]):
            # EMIT a cycle after the accepting step, from its registered pulse (hi/lo hold
            # its threshold): the step's table mux in front of ``phase``'s enable missed
            # 125 MHz by 0.39 ns at W = 16
            with m.If(sr.accepted_step):
                m.d.sync += st.phase.move(_Phase.SEARCH_DECIDE, _Phase.EMIT)
            with m.Else():
                _, exhausted = sr.decide(m, st)
                with m.If(exhausted):
                    m.d.sync += [*st.phase.move(_Phase.SEARCH_DECIDE, _Phase.SEARCH_REQ),
                                 sr.band.eq(sr.shift == 0)]

    def _start(self, m, st, cmd):
        m.d.sync += [st.pass_index.eq(0), st.prefix.eq(0), st.nonzero.eq(0), st.nonfinite.eq(0),
                     st.sign.eq(cmd.sign), st.k_total.eq(cmd.k)]
        with m.Switch(cmd.mode):
            with m.Case(Mode.EXACT):
                m.d.sync += st.phase.move(_Phase.IDLE, _Phase.HIST)
            with m.Case(Mode.THRESHOLD):
                m.d.sync += [*st.phase.move(_Phase.IDLE, _Phase.EMIT), st.hi.eq(cmd.threshold),
                             st.lo.eq(cmd.threshold), st.ties_left.eq(0)]
            with m.Case(Mode.BAND):
                m.d.sync += [*st.phase.move(_Phase.IDLE, _Phase.COUNT), st.hi.eq(cmd.threshold),
                             st.lo.eq(cmd.lo)]
            with m.Case(Mode.SEARCH):
                m.d.sync += st.phase.move(_Phase.IDLE, _Phase.SEARCH_START)

    def _lane_count(self, m, name, flags, enable):
        """Number of true ``flags`` while ``enable``, two cycles later (flags, then their
        sum, registered)."""
        hits = Signal(len(flags), name=f"{name}_hits")
        pop = Signal(range(len(flags) + 1), name=f"{name}_pop")
        m.d.sync += [hits.eq(Cat(f & enable for f in flags)), pop.eq(_tree_sum(list(hits)))]
        return pop

    def _scan(self, m, st, hist_sums, scanning_row):
        """Bins from the top down, ``scan_bins`` per cycle: the first bin where (#keys in higher bins)
        + hist >= k_left holds the k-th largest key; keys in higher bins are all selected.
        The lane sums of a row are registered before the decision (block RAM output ->
        adder tree -> compare would not fit one 8 ns cycle); the row's suffix sums come from
        a prefix network (:func:`_suffix_levels`), registered inside at 8 or more bins a row
        (:func:`suffix_cuts`, :func:`scan_latency`)."""
        R, ROWS_ = self.row_bins, self.rows
        # the row's lane fields registered (v1), its group sums (v2), its suffix sums (s),
        # and from 8 bins a row the suffix network's registers in between (``suffix_cuts``)
        v1, v2, s_valid = Signal(), Signal(), Signal()
        r1, r2, s_row = (Signal(self.row_bits, name=n) for n in ("row1", "row2", "s_row"))
        # s_cum[h]: keys in bins h..R-1 of the row (the higher bins first), registered
        width = len(hist_sums[0]) + self.rb + 1
        s_cum = [Signal(width, name=f"s_cum{h}") for h in range(R)]
        m.d.sync += [st.scan_valid.eq(st.scan_addr < ROWS_),
                     scanning_row.eq(ROWS_ - 1 - st.scan_addr[:self.row_bits]),
                     v1.eq(st.scan_valid), r1.eq(scanning_row), v2.eq(v1), r2.eq(r1)]
        values, done, valid, row, in_flight = list(hist_sums), 0, v2, r2, [v1, v2]
        for n, cut in enumerate(suffix_cuts(R)):
            mid = [Signal(width, name=f"s_mid{n}_{h}") for h in range(R)]
            v_mid, r_mid = Signal(name=f"v_mid{n}"), Signal(self.row_bits, name=f"row_mid{n}")
            m.d.sync += [a.eq(b) for a, b in
                         zip(mid, _suffix_levels(values, width, start=done)[cut - done])]
            m.d.sync += [v_mid.eq(valid), r_mid.eq(row)]
            values, done, valid, row = mid, cut, v_mid, r_mid
            in_flight.append(v_mid)
        m.d.sync += [a.eq(b) for a, b in zip(s_cum, _suffix_levels(values, width, start=done)[-1])]
        m.d.sync += [s_valid.eq(valid), s_row.eq(row)]
        with m.If(st.scan_addr < ROWS_):
            m.d.sync += st.scan_addr.eq(st.scan_addr + 1)
        with m.If(s_valid & ~st.found):
            self._scan_decision(m, st, s_cum, s_row)
        with m.Elif(~s_valid & ~Cat(*in_flight).any() & ~st.scan_valid
                    & (st.scan_addr == ROWS_)):
            # once the last row's sum has left the register stage (``s_valid``) and no row
            # is in flight: all bins read and cleared; fix the digit, start the next pass
            with m.Switch(st.pass_index):
                for p, shift in enumerate(DIGIT_SHIFTS):
                    with m.Case(p):
                        m.d.sync += st.prefix.eq(st.prefix | (st.digit << shift))
            m.d.sync += st.pass_index.eq(st.pass_index + 1)
            with m.If(st.pass_index == HIST_PASSES - 1):
                m.d.sync += [*st.phase.move(_Phase.SCAN, _Phase.EMIT_SETUP)]
            with m.Else():
                m.d.sync += st.phase.move(_Phase.SCAN, _Phase.HIST)

    def _scan_decision(self, m, st, s_cum, s_row):
        """The highest bin h of the row with s_cum[h] >= need (need = k_left - keys in the
        rows above) holds the k-th largest key. Suffix sums fall with h, so the compares
        form a thermometer code: bin h is the one where compare h holds and compare h + 1
        does not -- a one-hot select from neighbouring pairs, no priority chain over the
        row (16 deep at 16 bins a row)."""
        R = self.row_bins
        reach = [Signal(name=f"scan_reach{h}") for h in range(R)]
        m.d.comb += [r.eq(s >= st.need) for r, s in zip(reach, s_cum)]
        chosen = [reach[h] & ~reach[h + 1] if h + 1 < R else reach[h] for h in range(R)]
        # k_left = need - (keys in the bins above the chosen one), one subtraction per bin
        rest = [Mux(c, st.need - (s_cum[h + 1] if h + 1 < R else 0), 0)
                for h, c in enumerate(chosen)]
        with m.If(reach[0]):
            m.d.sync += [st.found.eq(1), st.k_left.eq(_or_tree(rest)[:len(st.k_left)]),
                         st.digit.eq(Cat(_or_tree([Mux(c, Const(h, self.rb), 0)
                                                   for h, c in enumerate(chosen)]), s_row))]
        with m.Else():
            m.d.sync += st.need.eq(st.need - s_cum[0])

    def _ties_cap_next(self, m, st, band_total):
        """min(ties_left - taken, W) for a beat whose lanes take ``taken`` = min(band_total,
        ties_left) band lanes, i.e. min(max(ties_left - band_total, 0), W), on a narrow
        subtraction: ``ties_big`` (registered: ties_left >= 3W a cycle ago) means ties_left
        >= 2W now (a beat takes at most W, and the phases that set ties_left do so at least
        3 cycles before the first beat reaches S), so the result is W; otherwise ties_left <
        3W fits in log2(W) + 2 bits. The full-width subtract and saturation missed 125 MHz
        by 0.04 ns at W = 16, and so did a min() in front of the subtraction."""
        W = self.lanes
        narrow = min(len(st.ties_left), (W - 1).bit_length() + 2)
        ties_big = Signal(name="ties_big")
        m.d.sync += ties_big.eq(st.ties_left >= 3 * W)
        return Mux(ties_big, W, _saturate(_minus_floor0(m, st.ties_left[:narrow], band_total), W))

    def _emit(self, m, st, keys, beat, accepted):
        """Emit pass: a pipeline of EMIT_STAGES registers (key, flags, prefix counts, lane
        selection) into an output FIFO. No stage stalls (a stall-together pipeline put
        o.ready on the enable of every stage register: one net of thousands of loads); the
        input is taken only while the FIFO has room for every beat in flight.

        K registers the lanes' keys (a register of the emit pass's own). A: per lane the
        compares ``key > hi`` and ``key > lo``, whence ``above = key > hi`` and ``band = lo < key
        <= hi`` (a tie of the exact mode, a band key of BAND). P: prefix counts of both
        flags and the beat totals. S: lane l is taken when it is above, or in the band with
        fewer than ties_left band lanes before it, while the running total stays below
        ``limit`` (``room`` counts down); a taken lane's output lane is the number taken
        before it. Then the one-hot output muxes pack the taken lanes into lanes
        0..count-1 in index order, into the FIFO.

        ties_left and room enter the lanes only through W-saturated copies (``ties_cap``,
        ``room_cap``), updated with them. The cap ``room`` and the band quota ``ties_left``
        never bind in one selection (THRESHOLD has an empty band; EXACT and BAND start room
        at max_chunk >= C, more than all the chunk's candidates), so room counts every
        candidate of a beat and ties_left every band lane up to its quota: exactly the
        lanes taken, with two short subtractions instead of the compaction in the loop."""
        W = self.lanes
        LB = (W - 1).bit_length()
        with m.If(st.phase[_Phase.EMIT_SETUP]):
            # v_k = prefix: emit keys > v_k and ties (v_k - 1, v_k] up to k_left; no cap (room = C
            # never binds), so the count is the tie rule's alone (above + k_left = min(k, nnz))
            m.d.sync += [st.hi.eq(st.prefix), st.lo.eq(st.prefix - 1), st.ties_left.eq(st.k_left),
                         *st.phase.move(_Phase.EMIT_SETUP, _Phase.EMIT)]
        m.submodules.out_fifo = fifo = SyncFIFO(width=len(self.o.payload.as_value()),
                                                depth=OUT_FIFO_DEPTH)
        m.d.comb += [self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.o.ready),
                     st.emit_ready.eq(fifo.level <= OUT_FIFO_DEPTH - EMIT_STAGES - 1)]
        # K: keys and values. The emit pass keeps a key register of its own, loaded only
        # in EMIT: its distinct enable keeps Yosys from merging it with ``rkeys``, so each
        # key bit drives either the two emit compares or the grid and histogram logic
        # (one shared register: the compares sat at the end of 4-5 ns of fan-out, W = 16)
        k_valid, k_last = Signal(), Signal()
        k_beat = Signal.like(beat, name="k_beat")
        k_key = [Signal(KEY_BITS, name=f"k_key{l}") for l in range(W)]
        with m.If(st.phase[_Phase.EMIT]):
            m.d.sync += [r.eq(key) for r, key in zip(k_key, keys)]
        k_value = [Signal(32, name=f"k_value{l}") for l in range(W)]
        m.d.sync += [k_valid.eq(st.phase[_Phase.EMIT] & accepted),
                     k_last.eq(self.i.payload.last), k_beat.eq(beat)]
        m.d.sync += [k_value[l].eq(self.i.payload.value[l]) for l in range(W)]
        with m.If(st.phase[_Phase.EMIT] & accepted & self.i.payload.last):
            m.d.sync += st.phase.move(_Phase.EMIT, _Phase.EMIT_FLUSH)
        # A: the two compares, each registered straight from its carry chain; the flags
        # are their combinations, one LUT in front of the prefix sums (the AND behind the
        # chains missed 125 MHz by 0.57 ns at W = 16)
        a_valid, a_last = Signal(), Signal()
        a_beat = Signal.like(beat, name="a_beat")
        a_gt_hi = [Signal(name=f"gt_hi{l}") for l in range(W)]
        a_gt_lo = [Signal(name=f"gt_lo{l}") for l in range(W)]
        a_value = [Signal(32, name=f"a_value{l}") for l in range(W)]
        m.d.sync += [a_valid.eq(k_valid), a_last.eq(k_last), a_beat.eq(k_beat)]
        for l, key in enumerate(k_key):
            m.d.sync += [a_gt_hi[l].eq(key > st.hi), a_gt_lo[l].eq(key > st.lo),
                         a_value[l].eq(k_value[l])]
        # above = key > hi; band = lo < key <= hi (key > lo >= 0 already excludes key 0)
        a_above = a_gt_hi
        a_band = [Signal(name=f"band{l}") for l in range(W)]
        m.d.comb += [a_band[l].eq(a_gt_lo[l] & ~a_gt_hi[l]) for l in range(W)]
        # P: prefix counts (flags of the lanes before l) and beat totals
        p_valid, p_last = Signal(), Signal()
        p_beat = Signal.like(beat, name="p_beat")
        p_above = [Signal(name=f"p_above{l}") for l in range(W)]
        p_band = [Signal(name=f"p_band{l}") for l in range(W)]
        p_value = [Signal(32, name=f"p_value{l}") for l in range(W)]
        above_before = [Signal(range(W + 1), name=f"above_before{l}") for l in range(W)]
        band_before = [Signal(range(W + 1), name=f"band_before{l}") for l in range(W)]
        cand_before = [Signal(range(W + 1), name=f"cand_before{l}") for l in range(W)]
        above_total, band_total = Signal(range(W + 1)), Signal(range(W + 1))
        cand_total = Signal(range(W + 1))
        m.d.sync += [p_valid.eq(a_valid), p_last.eq(a_last), p_beat.eq(a_beat),
                     above_total.eq(_tree_sum(a_above)), band_total.eq(_tree_sum(a_band)),
                     cand_total.eq(_tree_sum([a | b for a, b in zip(a_above, a_band)]))]
        for l in range(W):
            m.d.sync += [p_above[l].eq(a_above[l]), p_band[l].eq(a_band[l]),
                         p_value[l].eq(a_value[l]),
                         above_before[l].eq(_tree_sum(a_above[:l])),
                         band_before[l].eq(_tree_sum(a_band[:l])),
                         cand_before[l].eq(_tree_sum([a | b for a, b in zip(a_above[:l],
                                                                             a_band[:l])]))]
        # S: lane selection as one-hot (output lane j, input lane l >= j); budget update
        cap = lambda v, c: Mux(v < c, v, c)      # noqa: E731
        t, r = st.ties_cap, st.room_cap
        s_valid, s_last = Signal(), Signal()
        s_beat = Signal.like(beat, name="s_beat")
        s_count = Signal(range(W + 1))
        s_value = [Signal(32, name=f"s_value{l}") for l in range(W)]
        s_hit = [[Signal(name=f"hit{j}_{l}") for l in range(W)] for j in range(W)]
        m.d.sync += [s_valid.eq(p_valid), s_last.eq(p_last), s_beat.eq(p_beat),
                     s_count.eq(cap(above_total + cap(band_total, t), r))]
        for l in range(W):
            # rank (output lane) of a taken lane: above_before + min(band_before, t), which
            # is cand_before while the quota holds and above_before + t past it. The room
            # test uses cand_before (every candidate before l): room binds only with an
            # empty band (THRESHOLD), where the two are equal, and never binds otherwise.
            # Both ranks and both tests come from registers, side by side: the serial
            # compare, min, add and compare missed 125 MHz by 0.38 ns at W = 16.
            in_quota, sel = Signal(name=f"in_quota{l}"), Signal(name=f"sel{l}")
            past_quota = Signal(range(2 * W + 1), name=f"past_quota{l}")
            m.d.comb += [in_quota.eq(band_before[l] < t), past_quota.eq(above_before[l] + t),
                         sel.eq((p_above[l] | (p_band[l] & in_quota)) & (cand_before[l] < r))]
            m.d.sync += s_value[l].eq(p_value[l])
            m.d.sync += [s_hit[j][l].eq(sel & Mux(in_quota, cand_before[l] == j, past_quota == j))
                         for j in range(l + 1)]
        # the saturated copies follow their counters (set elsewhere at least 3 cycles before
        # the first beat reaches S), and are updated with them beat by beat
        m.d.sync += [st.ties_cap.eq(_saturate(st.ties_left, W)),
                     st.room_cap.eq(_saturate(st.room, W))]
        # a beat takes min(band_total, ties_left) band lanes and min(cand_total, room) from
        # room (t, r are those counters capped at W >= the totals): a subtraction floored
        # at zero, its borrow the only compare
        ties_cap_next = self._ties_cap_next(m, st, band_total)
        # room loads its budget in the pass's first cycle (its first beat reaches S three
        # cycles later; room_cap follows room a cycle behind), from two flops: loaded at
        # every transition into EMIT, its enable missed 125 MHz (W = 16)
        was_emit = Signal()
        m.d.sync += was_emit.eq(st.phase[_Phase.EMIT])
        with m.If(st.phase[_Phase.EMIT] & ~was_emit):
            m.d.sync += st.room.eq(st.room_init)
        with m.If(p_valid):
            ties_next = _minus_floor0(m, st.ties_left, band_total)
            room_next = _minus_floor0(m, st.room, cand_total)
            m.d.sync += [st.ties_left.eq(ties_next), st.room.eq(room_next),
                         st.ties_cap.eq(ties_cap_next),
                         st.room_cap.eq(_saturate(room_next, W))]
        with m.If(st.phase[_Phase.EMIT_FLUSH] & s_valid & s_last):
            # the last beat enters the FIFO now
            m.d.sync += st.phase.move(_Phase.EMIT_FLUSH, _Phase.IDLE)
        # output lane j = the taken input lane of rank j (at most one): a one-hot OR
        out = Signal.like(self.o.payload)
        m.d.comb += [out.count.eq(s_count), out.last.eq(s_last),
                     fifo.w_en.eq(s_valid & ((s_count != 0) | s_last)),
                     fifo.w_data.eq(out.as_value())]
        for j in range(W):
            hits = s_hit[j][j:]
            code = _or_tree([Mux(h, l, 0) for h, l in zip(hits, range(j, W))])
            m.d.comb += [out.index[j].eq(Mux(Cat(*hits).any(), Cat(code[:LB], s_beat)[:32], 0)),
                         out.value[j].eq(_or_tree([Mux(h, s_value[l], 0)
                                                   for h, l in zip(hits, range(j, W))]))]


def _minus_floor0(m, a, b):
    """max(a - b, 0) for unsigned ``a`` and ``b`` < 2**len(a): one subtraction, its borrow
    (the sign of the (len(a) + 1)-bit difference) selecting 0."""
    diff = Signal(len(a) + 1, name="minus_floor0")
    m.d.comb += diff.eq(a - b)
    return Mux(diff[-1], 0, diff[:len(a)])


def _saturate(value, limit: int):
    """min(value, limit) for a power-of-two limit: value >= limit iff a bit at or above
    log2(limit) is set (no comparator)."""
    lb = limit.bit_length() - 1
    return Mux(value[lb:].any(), limit, value[:lb])


def _suffix_levels(values, width, start=0):
    """The levels of a Sklansky suffix-sum network over ``values``: after level j, entry h
    holds the sum of entries h .. the end of its block of 2**(j+1) (the last level, every
    suffix sum) -- log2(n) adder levels instead of a chain of n - 1. ``start`` continues a
    network cut after level ``start`` (its list of values given)."""
    levels, cur = [list(values)], list(values)
    n = len(values)
    for j in range(start, (n - 1).bit_length()):
        size = 1 << j
        nxt = []
        for h in range(n):
            upper = (h // (2 * size)) * 2 * size + size        # first entry of the upper half
            nxt.append((cur[h] + cur[upper])[:width] if h < upper < n else cur[h])
        levels.append(nxt)
        cur = nxt
    return levels


def _tree_sum(bits):
    """Sum of 1-bit values as a balanced adder tree (a Python ``sum`` is a serial chain)."""
    if not bits:
        return Const(0, 1)
    if len(bits) == 1:
        return bits[0]
    half = len(bits) // 2
    return _tree_sum(bits[:half]) + _tree_sum(bits[half:])


def _or_tree(values):
    if len(values) == 1:
        return values[0]
    half = len(values) // 2
    return _or_tree(values[:half]) | _or_tree(values[half:])


class _Phase(enum.Enum):
    """The controller's states: names only, each one a flop of its own (:class:`_PhaseFlops`)."""

    IDLE = 0
    HIST = 1
    DRAIN = 2
    SCAN = 3
    COUNT = 4
    EMIT_SETUP = 5
    EMIT = 6
    EMIT_FLUSH = 7
    COUNT_DONE = 8
    COUNT_DRAIN = 14
    SEARCH_REQ = 9
    SEARCH_LOAD = 10
    SEARCH_COUNT = 11
    SEARCH_DRAIN = 12
    SEARCH_DECIDE = 13
    SEARCH_START = 15


class _PhaseFlops:
    """The controller's phase as one flip-flop per :class:`_Phase` (one-hot), ``phases[p]``
    the flop of phase ``p``. A transition clears its source's flop and sets its
    destination's, so a flop's enable sees only the transitions into and out of its own
    phase. A binary phase register put every transition's condition in front of all four
    bits' enables, and those of the registers loaded on the same decodes (W = 16 missed
    125 MHz there by 0.16 to 0.83 ns, by placement seed)."""

    def __init__(self):
        self._flops = {p: Signal(name=f"phase_{p.name.lower()}", init=p == _Phase.IDLE)
                       for p in _Phase}

    def __getitem__(self, phase):
        return self._flops[phase]

    def move(self, source, destination):
        """The statements of the transition ``source`` -> ``destination`` (sync domain)."""
        return [self._flops[source].eq(0), self._flops[destination].eq(1)]


class _State:
    """Registers of one selection (shared by the controller, histograms and emitter)."""

    def __init__(self, unit):
        CB = unit.count_bits
        self.phase = _PhaseFlops()
        self.pass_index = Signal(3)
        self.sign = Signal(2)
        self.prefix = Signal(KEY_BITS)
        self.digit = Signal(DIGIT_BITS)
        self.hi = Signal(KEY_BITS)
        self.lo = Signal(KEY_BITS)
        self.k_total = Signal(32)
        self.k_left = Signal(CB + 1)
        self.ties_left = Signal(CB + 1)     # both at most C: never more than C pairs go out
        self.room = Signal(CB + 1)
        self.room_init = Signal(CB + 1)     # the budget room starts the emit pass with
        # min(ties_left, W), min(room, W): what the emit lanes see (see TopKUnit._emit)
        self.ties_cap = Signal(range(unit.lanes + 1))
        self.room_cap = Signal(range(unit.lanes + 1))
        self.emit_ready = Signal()          # the emit pipeline takes a beat
        self.acc = Signal(CB + 1)
        self.need = Signal(CB + 1)          # scan: k_left minus the keys in the bins above
        self.found = Signal()
        self.nonzero = Signal(CB + 1)
        self.nonfinite = Signal()
        self.search = SearchReplay(unit)
