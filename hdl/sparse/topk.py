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
    two bins per memory word), each followed by a 131-cycle scan (two bins per cycle, top
    down) that picks the digit holding the k-th largest key
    and clears the bins; then 1 emit pass: keys > v_k, plus keys == v_k in ascending index
    order until k are out.
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
slowed only by output backpressure). EXACT total at full rate: 5 C/W + 4 * 133 + 4 cycles
(measured exactly that for C = 256, W = 4: 856).
"""
import numpy as np
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from treenic.sparse import select

from .search import GRID_LAYOUT, MAX_SEARCH_BITS, SearchReplay

__all__ = ["TopKUnit", "Mode", "HIST_PASSES", "SCAN_CYCLES", "PASSES", "chunk_beats", "chunk_words",
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
SCAN_CYCLES = ROWS + 3                       # read latency, registered sums, decision


class Mode(enum.Enum, shape=2):
    EXACT = 0
    THRESHOLD = 1
    BAND = 2
    SEARCH = 3


#: data passes per mode (SEARCH: data-dependent, see :func:`search_passes`)
PASSES = {Mode.EXACT: HIST_PASSES + 1, Mode.THRESHOLD: 1, Mode.BAND: 2}


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
        self.scan_cycles = self.rows + 3
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
        hist_sum, scanning_bin, hist_ready = self._histograms(m, st, keys, accepted)
        # before the controller: its clear of the counts at a new count pass overrides this
        st.search.count_pipeline(m, keys, (st.phase == _Phase.SEARCH_COUNT) & accepted)
        st.search.geometry(m)
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

    def _histograms(self, m, st, keys, accepted):
        """Per-lane 256-bin counters, two bins per memory word (the scan reads both at once):
        read-modify-write of the word at one key per lane per cycle (the
        transparent read port forwards a same-cycle write, so back-to-back hits on one bin
        count correctly), then a scan that sums the lanes bin by bin and clears them."""
        W, CB = self.lanes, self.count_bits
        in_hist = st.phase == _Phase.HIST
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
                        m.d.comb += d.eq(keys[l][shift:shift + DIGIT_BITS])
            hit = accepted & in_hist & (((keys[l] ^ st.prefix) & match_mask) == 0)
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
        # series behind the block RAM output: 16 at W = 16)
        m.d.comb += [hs.eq(_tree_sum([f[h] for f in lane_fields]))
                     for h, hs in enumerate(hist_sums)]
        st.scan_addr, st.scan_valid, st.match_mask = scan_addr, scan_valid, match_mask
        return hist_sums, scanning_row, None

    def _control(self, m, st, keys, accepted, hist_sum, scanning_bin, _):
        """Command intake, pass sequencing and the per-pass digit decision."""
        W, CB = self.lanes, self.count_bits
        cmd = self.cmd.payload
        m.d.comb += [self.busy.eq(st.phase != _Phase.IDLE), self.pass_index.eq(st.pass_index),
                     self.nonfinite.eq(st.nonfinite)]
        nonzero = sum(k != 0 for k in keys)
        over = sum(k > st.hi for k in keys)
        bad = Cat(k >= 0x7F800000 for k in keys).any()
        drain = Signal(2)
        with m.Switch(st.phase):
            with m.Case(_Phase.IDLE):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    self._start(m, st, cmd)
            with m.Case(_Phase.HIST):
                m.d.comb += self.i.ready.eq(1)
                with m.If(accepted):
                    with m.If(st.pass_index == 0):
                        m.d.sync += st.nonzero.eq(st.nonzero + nonzero)
                        with m.If(bad):
                            m.d.sync += st.nonfinite.eq(1)
                    with m.If(self.i.payload.last):
                        m.d.sync += [st.phase.eq(_Phase.DRAIN), drain.eq(0)]
            with m.Case(_Phase.DRAIN):
                # the last beat's histogram write lands one cycle after its read
                m.d.sync += drain.eq(drain + 1)
                with m.If(drain == 1):
                    m.d.sync += [st.phase.eq(_Phase.SCAN), st.scan_addr.eq(0), st.acc.eq(0),
                                 st.found.eq(0)]
                    with m.If(st.pass_index == 0):
                        m.d.sync += st.k_left.eq(Mux(st.k_total < st.nonzero, st.k_total, st.nonzero))
                        m.d.sync += st.k_total.eq(Mux(st.k_total < st.nonzero, st.k_total, st.nonzero))
            with m.Case(_Phase.SCAN):
                self._scan(m, st, hist_sum, scanning_bin)
            with m.Case(_Phase.COUNT):
                m.d.comb += self.i.ready.eq(1)
                with m.If(accepted):
                    m.d.sync += st.acc.eq(st.acc + over)
                    with m.If(self.i.payload.last):
                        m.d.sync += st.phase.eq(_Phase.COUNT_DONE)
            with m.Case(_Phase.COUNT_DONE):
                # band keys allowed: k - #(key > hi), at least 0; at most C are ever taken
                short = st.k_total - st.acc
                m.d.sync += [st.phase.eq(_Phase.EMIT), st.pass_index.eq(1),
                             st.ties_left.eq(Mux(st.acc >= st.k_total, 0,
                                                 Mux(short > self.max_chunk, self.max_chunk, short)))]
            with m.Case(_Phase.EMIT):
                m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
            with m.Case(_Phase.EMIT_FLUSH):
                pass                                    # stage A drains (see _emit)
            self._search_cases(m, st, keys, accepted, bad)

    def _search_cases(self, m, st, keys, accepted, bad):
        """SEARCH: threshold request, count pass, decision loop (see :mod:`.search`)."""
        sr = st.search
        m.d.comb += [self.converged.eq(sr.converged), self.search_passes.eq(sr.passes),
                     self.search_threshold.eq(sr.threshold)]
        with m.Case(_Phase.SEARCH_REQ):
            with m.If(sr.request(m, self.grid)):
                m.d.sync += st.phase.eq(_Phase.SEARCH_LOAD)
        with m.Case(_Phase.SEARCH_LOAD):
            with m.If(sr.take_threshold(m, self.thr)):
                with m.If(sr.band):                 # thr(lo) stored, thr(hi) arriving
                    m.d.sync += [st.phase.eq(_Phase.COUNT), st.lo.eq(sr.table[0]),
                                 st.hi.eq(self.thr.payload), sr.threshold.eq(sr.table[0]),
                                 st.acc.eq(0), st.room.eq(self.max_chunk)]
                with m.Else():
                    m.d.sync += st.phase.eq(_Phase.SEARCH_COUNT)
        with m.Case(_Phase.SEARCH_COUNT):
            m.d.comb += self.i.ready.eq(1)
            with m.If(accepted):
                with m.If(sr.passes == 0):
                    m.d.sync += sr.any_key.eq(sr.any_key | Cat(k != 0 for k in keys).any())
                    with m.If(bad):
                        m.d.sync += st.nonfinite.eq(1)
                with m.If(self.i.payload.last):
                    m.d.sync += [st.phase.eq(_Phase.SEARCH_DRAIN), sr.drain.eq(0)]
        with m.Case(_Phase.SEARCH_DRAIN):
            m.d.sync += sr.drain.eq(sr.drain + 1)
            with m.If(sr.drain == 2):               # counts final (compare, popcount, add)
                sr.begin_decision(m)
                with m.If(sr.any_key):
                    m.d.sync += st.phase.eq(_Phase.SEARCH_DECIDE)
                with m.Else():                      # all keys zero: one empty emit pass
                    m.d.sync += [st.phase.eq(_Phase.EMIT), st.hi.eq((1 << KEY_BITS) - 1),
                                 st.lo.eq((1 << KEY_BITS) - 1), st.ties_left.eq(0),
                                 st.room.eq(self.max_chunk)]
        with m.Case(_Phase.SEARCH_DECIDE):
            accepted_thr, exhausted = sr.decide(m, st, st.k_total)
            with m.If(accepted_thr):
                m.d.sync += [st.phase.eq(_Phase.EMIT), st.ties_left.eq(0),
                             st.room.eq(self.max_chunk)]
            with m.Elif(exhausted):
                m.d.sync += [st.phase.eq(_Phase.SEARCH_REQ), sr.band.eq(sr.shift == 0)]

    def _start(self, m, st, cmd):
        m.d.sync += [st.pass_index.eq(0), st.prefix.eq(0), st.nonzero.eq(0), st.nonfinite.eq(0),
                     st.acc.eq(0), st.sign.eq(cmd.sign), st.k_total.eq(cmd.k)]
        with m.Switch(cmd.mode):
            with m.Case(Mode.EXACT):
                m.d.sync += st.phase.eq(_Phase.HIST)
            with m.Case(Mode.THRESHOLD):
                m.d.sync += [st.phase.eq(_Phase.EMIT), st.hi.eq(cmd.threshold),
                             st.lo.eq(cmd.threshold), st.ties_left.eq(0),
                             st.room.eq(Mux(cmd.limit > self.max_chunk, self.max_chunk, cmd.limit))]
            with m.Case(Mode.BAND):
                m.d.sync += [st.phase.eq(_Phase.COUNT), st.hi.eq(cmd.threshold),
                             st.lo.eq(cmd.lo), st.room.eq(self.max_chunk)]
            with m.Case(Mode.SEARCH):
                # depth outside 1..30 (command_word refuses it) is clamped into range
                depth = Mux(cmd.depth == 0, 1, Mux(cmd.depth > 30, 30, cmd.depth))
                st.search.start(m, depth, cmd.strict)
                m.d.sync += st.phase.eq(_Phase.SEARCH_REQ)

    def _scan(self, m, st, hist_sums, scanning_row):
        """Bins from the top down, ``scan_bins`` per cycle: the first bin where (#keys in higher bins)
        + hist >= k_left holds the k-th largest key; keys in higher bins are all selected.
        The lane sums of a row are registered before the decision (block RAM output ->
        adder tree -> compare would not fit one 8 ns cycle)."""
        R, ROWS_ = self.row_bins, self.rows
        s_valid, s_row = Signal(), Signal(self.row_bits)
        # s_cum[h]: keys in bins h..R-1 of the row (the higher bins first), registered
        width = len(hist_sums[0]) + self.rb + 1
        s_cum = [Signal(width, name=f"s_cum{h}") for h in range(R)]
        m.d.sync += [st.scan_valid.eq(st.scan_addr < ROWS_),
                     scanning_row.eq(ROWS_ - 1 - st.scan_addr[:self.row_bits]),
                     s_valid.eq(st.scan_valid), s_row.eq(scanning_row)]
        for h in range(R):
            m.d.sync += s_cum[h].eq(sum(hist_sums[h:]))
        with m.If(st.scan_addr < ROWS_):
            m.d.sync += st.scan_addr.eq(st.scan_addr + 1)
        with m.If(s_valid & ~st.found):
            # the highest bin h where (#keys above it) + its count reaches k_left
            for n, h in enumerate(reversed(range(R))):
                above = st.acc + (s_cum[h + 1] if h + 1 < R else 0)
                with (m.If if n == 0 else m.Elif)(st.acc + s_cum[h] >= st.k_left):
                    m.d.sync += [st.found.eq(1), st.k_left.eq(st.k_left - above),
                                 st.digit.eq(Cat(Const(h, self.rb), s_row))]
            with m.Else():
                m.d.sync += st.acc.eq(st.acc + s_cum[0])
        with m.Elif(~s_valid & ~st.scan_valid & (st.scan_addr == ROWS_)):
            # once the last row's sum has left the register stage (``s_valid``) and no row
            # is in flight: all bins read and cleared; fix the digit, start the next pass
            with m.Switch(st.pass_index):
                for p, shift in enumerate(DIGIT_SHIFTS):
                    with m.Case(p):
                        m.d.sync += st.prefix.eq(st.prefix | (st.digit << shift))
            m.d.sync += st.pass_index.eq(st.pass_index + 1)
            with m.If(st.pass_index == HIST_PASSES - 1):
                m.d.sync += [st.phase.eq(_Phase.EMIT_SETUP)]
            with m.Else():
                m.d.sync += st.phase.eq(_Phase.HIST)

    def _emit(self, m, st, keys, beat, accepted):
        """Compaction pass, two stages. Stage A registers per lane ``above = key > hi`` and
        ``band = lo < key <= hi`` (a tie of the exact mode, a band key of BAND). Stage B takes
        lane l when it is above, or in the band with fewer than ties_left band lanes taken
        before it in index order, while the running total stays below ``limit`` (``room``
        counts down); taken lanes are packed into output lanes 0..count-1 in index order.
        ties_left and room enter the per-lane logic only through W-saturated copies, so the
        32-bit arithmetic is beside the compaction, not in series with it."""
        W = self.lanes
        LB = (W - 1).bit_length()
        with m.If(st.phase == _Phase.EMIT_SETUP):
            # v_k = prefix: emit keys > v_k and ties (v_k - 1, v_k] up to k_left; no cap (room = C
            # never binds), so the count is the tie rule's alone (above + k_left = min(k, nnz))
            m.d.sync += [st.hi.eq(st.prefix), st.lo.eq(st.prefix - 1), st.ties_left.eq(st.k_left),
                         st.room.eq(self.max_chunk), st.phase.eq(_Phase.EMIT)]
        advance = ~self.o.valid | self.o.ready
        a_valid, a_last, a_beat = Signal(), Signal(), Signal.like(beat)
        a_above = [Signal(name=f"above{l}") for l in range(W)]
        a_band = [Signal(name=f"band{l}") for l in range(W)]
        a_value = [Signal(32, name=f"a_value{l}") for l in range(W)]
        with m.If(advance):
            m.d.sync += [a_valid.eq((st.phase == _Phase.EMIT) & accepted),
                         a_last.eq(self.i.payload.last), a_beat.eq(beat)]
            for l, key in enumerate(keys):
                m.d.sync += [a_above[l].eq(key > st.hi),
                             a_band[l].eq((key > st.lo) & (key <= st.hi) & (key != 0)),
                             a_value[l].eq(self.i.payload.value[l])]
        with m.If((st.phase == _Phase.EMIT) & accepted & self.i.payload.last):
            m.d.sync += st.phase.eq(_Phase.EMIT_FLUSH)
        with m.If((st.phase == _Phase.EMIT_FLUSH) & advance):
            m.d.sync += st.phase.eq(_Phase.IDLE)       # stage A's last beat moves out now
        ties_cap, room_cap = Signal(range(W + 1)), Signal(range(W + 1))
        m.d.comb += [ties_cap.eq(Mux(st.ties_left > W, W, st.ties_left)),
                     room_cap.eq(Mux(st.room > W, W, st.room))]
        # Parallel form of "take lane l if above, or a band lane while ties remain, while room
        # remains" (a lane-by-lane running count was a 16-lane carry chain: 18.8 MHz at
        # W = 16). band_before/above_before are prefix counts of the registered flags; the
        # candidates taken before lane l, ignoring room, are above_before + min(band_before,
        # ties_cap), and room only truncates that sequence, so lane l's output rank (pairs
        # taken before it) is min(that, room_cap). Every lane is a few levels deep.
        cap = lambda v, c: Mux(v < c, v, c)      # noqa: E731
        take, ranks, tie_taken = [], [], []
        for l in range(W):
            above_before = Signal(range(W + 1), name=f"above_before{l}")
            band_before = Signal(range(W + 1), name=f"band_before{l}")
            cand_before = Signal(range(2 * W + 1), name=f"cand_before{l}")
            rank, sel = Signal(range(W + 1), name=f"rank{l}"), Signal(name=f"sel{l}")
            tie = Signal(name=f"tie{l}")
            m.d.comb += [above_before.eq(_tree_sum(a_above[:l])),
                         band_before.eq(_tree_sum(a_band[:l])),
                         cand_before.eq(above_before + cap(band_before, ties_cap)),
                         tie.eq(a_band[l] & (band_before < ties_cap)),
                         sel.eq((a_above[l] | tie) & (cand_before < room_cap)),
                         rank.eq(cap(cand_before, room_cap))]
            take.append(sel)
            ranks.append(rank)
            tie_taken.append(tie & sel)
        count, ties = Signal(range(W + 1)), Signal(range(W + 1))
        m.d.comb += [count.eq(_tree_sum(take)), ties.eq(_tree_sum(tie_taken))]
        out = self.o.payload
        with m.If(a_valid & advance):
            m.d.sync += [st.room.eq(st.room - count), st.ties_left.eq(st.ties_left - ties)]
        with m.If(advance):
            m.d.sync += [self.o.valid.eq(a_valid & ((count != 0) | a_last)),
                         out.count.eq(count), out.last.eq(a_last)]
            # output lane j = the taken input lane of rank j (at most one): a one-hot OR,
            # not a priority chain of muxes
            for j in range(W):
                hits = [take[l] & (ranks[l] == j) for l in range(j, W)]   # lane l lands at j <= l
                idx = _or_tree([Mux(h, Cat(Const(l, LB), a_beat)[:32], 0)
                                for h, l in zip(hits, range(j, W))])
                val = _or_tree([Mux(h, a_value[l], 0) for h, l in zip(hits, range(j, W))])
                m.d.sync += [out.index[j].eq(idx), out.value[j].eq(val)]


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


class _Phase(enum.Enum, shape=4):
    IDLE = 0
    HIST = 1
    DRAIN = 2
    SCAN = 3
    COUNT = 4
    EMIT_SETUP = 5
    EMIT = 6
    EMIT_FLUSH = 7
    COUNT_DONE = 8
    SEARCH_REQ = 9
    SEARCH_LOAD = 10
    SEARCH_COUNT = 11
    SEARCH_DRAIN = 12
    SEARCH_DECIDE = 13


class _State:
    """Registers of one selection (shared by the controller, histograms and emitter)."""

    def __init__(self, unit):
        CB = unit.count_bits
        self.phase = Signal(_Phase)
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
        self.acc = Signal(CB + 1)
        self.found = Signal()
        self.nonzero = Signal(CB + 1)
        self.nonfinite = Signal()
        self.search = SearchReplay(unit)
