"""Selection primitives of the sparse golden models, in the form a streaming unit computes them.

Everything here works on **keys**: the 31-bit magnitude bit pattern of a float32,
``key = bits(x) & 0x7FFFFFFF``. For non-negative binary32 values the unsigned integer order of
the bit patterns is the numeric order (IEEE-754 is monotone), so "compare magnitudes" is an
unsigned integer compare, exactly what a hardware comparator does. ``-0.0`` and ``+0.0`` both
have key 0. NaN or Inf in the input raise :class:`SparseError` (hardware: status bit, dense
fallback; see docs/sparse-models.md, RedSync R-A4).

Sign-alternating selection (RedSync quantization, docs/sparse-models.md, RedSync R-2.5 and
R-A10) uses the same machinery on a *signed key*: ``key = |x|`` bits where ``sign(x) == s`` and
``x != 0``, else 0. So "largest positive" (s = +1) and "most negative" (s = -1) reuse every
magnitude selector.

Conventions shared by every selector:

* a selection is an ``int64`` index array in **ascending index order** (stream-compaction order);
* **key 0 is never selected** (zeros carry nothing; L = min(k, #non-zero keys));
* exact top-k breaks ties by **ascending index** (key descending, then index ascending);
* threshold selectors use the strict compare ``key > threshold`` (ties at the threshold are
  all excluded), as in the paper.

Contents: :func:`radix_topk` (exact, digit-histogram select, the hardware form) and its sort
based reference :func:`topk_reference`; :func:`trimmed_topk` (RedSync Alg. 2, corrected);
:func:`threshold_binary_search` (RedSync Alg. 3, corrected, sequential probes) and
:func:`binary_search_histogram` (the same search replayed from 2^H-bin histograms, one data
pass per H levels); :class:`ThresholdReuse` (RedSync's "sampled" search: reuse with a cap);
:func:`block_topk`; :func:`sign_for_step`; :func:`quantize_mean`; :func:`exact_mean_abs`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .base import SparseError

MAGNITUDE_MASK = np.uint32(0x7FFFFFFF)
EXPONENT_ALL_ONES = 0xFF


# ---- keys ------------------------------------------------------------------------------

def _as_f32(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise SparseError(f"selection input must be float32, got {a.dtype}")
    if a.ndim != 1:
        raise SparseError(f"selection input must be 1-D, got shape {a.shape}")
    return a


def magnitude_keys(x) -> np.ndarray:
    """uint32 keys ``bits(|x|)``; raises SparseError on NaN/Inf (exponent field all ones)."""
    bits = _as_f32(x).view(np.uint32) & MAGNITUDE_MASK
    if bits.size and int(bits.max()) >= 0x7F800000:
        raise SparseError("non-finite value (NaN or Inf) in selection input")
    return bits


def signed_keys(x, sign: int) -> np.ndarray:
    """Keys of sign-alternating selection: ``bits(|x|)`` where ``x`` has sign ``sign`` (+1/-1)
    and is non-zero, 0 elsewhere. ``sign == 0`` means plain magnitude keys."""
    keys = magnitude_keys(x)
    if sign == 0:
        return keys
    if sign not in (1, -1):
        raise SparseError(f"sign must be +1, -1 or 0 (magnitude), got {sign}")
    negative = (_as_f32(x).view(np.uint32) >> np.uint32(31)).astype(bool)
    wrong_sign = negative if sign > 0 else ~negative
    return np.where(wrong_sign, np.uint32(0), keys)


def key_to_float(key) -> np.float32:
    return np.array([key], np.uint32).view(np.float32)[0]


def float_to_key(value) -> np.uint32:
    """Key of a non-negative float32 threshold (what the comparator is loaded with)."""
    v = np.float32(value)
    if not (v >= 0) or not np.isfinite(v):
        raise SparseError(f"threshold must be finite and >= 0, got {value}")
    return np.array([v], np.float32).view(np.uint32)[0]


def _check_k(k) -> int:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise SparseError(f"k must be a positive integer, got {k!r}")
    return int(k)


# ---- exact top-k ------------------------------------------------------------------------

def topk_reference(keys: np.ndarray, k: int) -> np.ndarray:
    """Sort-based reference of exact top-k: stable sort by key descending (so equal keys keep
    ascending index order), first min(k, #non-zero) entries, returned in ascending index order."""
    keys = np.asarray(keys, np.uint32)
    take = min(_check_k(k), int(np.count_nonzero(keys)))
    order = np.argsort(-keys.astype(np.int64), kind="stable")
    return np.sort(order[:take])


@dataclass
class RadixSelection:
    """Outcome of :func:`radix_topk`.

    ``indices``: selected element indices, ascending. ``kth_key``: key of the k-th largest
    (the last one selected; 0 when nothing is selected). ``above``: how many keys are strictly
    greater than ``kth_key`` (all selected); the remaining ``len(indices) - above`` are the
    lowest-index elements whose key equals ``kth_key``. ``digits``: the digit chosen per pass,
    most significant first, and ``histograms``: the per-pass digit histograms (restricted to
    the prefix fixed so far), what a hardware unit's counter bank holds after each pass."""
    indices: np.ndarray
    kth_key: int
    above: int
    digits: list[int] = field(default_factory=list)
    histograms: list[np.ndarray] = field(default_factory=list)


def radix_topk(keys: np.ndarray, k: int, digit_bits: int = 8) -> RadixSelection:
    """Exact top-k of uint32 ``keys`` by radix selection (docs/sparse-models.md, RedSync R-7.4).

    Streaming form: ``ceil(32 / digit_bits)`` histogram passes from the most significant digit
    down. Each pass counts the next digit of the keys whose higher digits equal the prefix
    fixed so far, then picks the digit holding the k-th largest key (largest digit d with
    ``#(digit > d) < k_left``). After the last pass the prefix *is* the k-th largest key
    ``v_k``. The compaction pass emits every key > v_k and then keys == v_k in ascending index
    order until k are out: the tie rule (key descending, index ascending) with O(2^r) counters
    and no candidate buffer. Zero keys are never selected, so L = min(k, #non-zero keys).

    The model restricts each pass to the elements still matching the prefix (a compaction the
    hardware replaces by re-streaming with a prefix comparator); counts are identical.
    """
    k = _check_k(k)
    if not (1 <= digit_bits <= 16):
        raise SparseError(f"digit_bits must be in 1..16, got {digit_bits}")
    keys = np.asarray(keys)
    if keys.dtype != np.uint32 or keys.ndim != 1:
        raise SparseError("radix_topk needs a 1-D uint32 key array")
    k_left = min(k, int(np.count_nonzero(keys)))
    if k_left == 0:
        return RadixSelection(np.zeros(0, np.int64), 0, 0)
    # k_left <= #non-zero keys, so the k-th largest key is never 0 and zero keys can take part
    # in the digit histograms without ever being selected.
    k_total = k_left
    candidates = None                    # element indices still matching the prefix (None: all)
    cand_keys = keys
    prefix = 0
    digits, hists = [], []
    shift = 32
    while shift > 0:
        width = min(digit_bits, shift)
        shift -= width
        digit = ((cand_keys >> np.uint32(shift)) & np.uint32((1 << width) - 1)).astype(np.intp)
        hist = np.bincount(digit, minlength=1 << width)
        # at_or_above[d] = #(digit >= d); choose the largest d with at_or_above[d] >= k_left
        at_or_above = np.cumsum(hist[::-1])[::-1]
        d = int(np.flatnonzero(at_or_above >= k_left)[-1])
        k_left -= int(at_or_above[d] - hist[d])      # keys in higher digits are all selected
        prefix = (prefix << width) | d
        keep = np.flatnonzero(digit == d)
        candidates = keep if candidates is None else candidates[keep]
        cand_keys = cand_keys[keep]
        digits.append(d)
        hists.append(hist)
    kth = np.uint32(prefix)
    greater = np.flatnonzero(keys > kth)
    ties = candidates[:k_left]                        # candidates are in ascending index order
    indices = np.sort(np.concatenate([greater, ties]))
    assert indices.size == k_total
    return RadixSelection(indices, int(kth), int(greater.size), digits, hists)


def topk(x, k: int, sign: int = 0) -> np.ndarray:
    """Exact top-k of a float32 vector by magnitude (or signed key, see :func:`signed_keys`):
    ascending indices, ties by ascending index, zeros never selected."""
    return radix_topk(signed_keys(x, sign), k).indices


# ---- deterministic statistics -----------------------------------------------------------

def exact_sum(x) -> float:
    """Correctly rounded float64 of the *exact* sum of a float32 vector, independent of order.

    Kulisch-style: values are bucketed by their binary32 exponent field e. Every value in
    bucket e is an integer multiple of that bucket's ulp 2^(max(e,1)-150) below 2^24 ulps, so
    with fewer than 2^29 elements every float64 partial sum inside a bucket is exact
    (< 2^53 ulps) whatever order ``bincount`` adds in. The 254 bucket sums are then combined
    in a Python integer counted in units of 2^-149 and converted with one correctly rounded
    division. Hardware equivalent: a wide fixed-point accumulator (docs/sparse-models.md,
    RedSync R-A9).
    """
    a = _as_f32(x)
    if a.size >= 1 << 29:
        raise SparseError("exact_sum supports fewer than 2^29 elements")
    exponent = ((a.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)).astype(np.intp)
    if a.size and int(exponent.max()) == EXPONENT_ALL_ONES:
        raise SparseError("non-finite value (NaN or Inf) in input")
    per_exponent = np.bincount(exponent, weights=a.astype(np.float64), minlength=256)
    total = 0
    for e in np.flatnonzero(per_exponent):
        ulps = math.ldexp(float(per_exponent[e]), 150 - max(int(e), 1))   # exact integer
        total += int(ulps) << (max(int(e), 1) - 1)
    return total / (1 << 149)


def exact_mean_abs(x) -> np.float32:
    """``fl32(fl64(exact Σ|x|) / M)`` (docs/sparse-models.md, RedSync R-A9): the order-free mean of
    RedSync."""
    a = _as_f32(x)
    if a.size == 0:
        raise SparseError("mean of an empty vector")
    return np.float32(exact_sum(np.abs(a)) / a.size)


def redsync_threshold(base, top, ratio: float) -> np.uint32:
    """Key of ``max(0, fl32(base + ratio * (top - base)))``, evaluated as three separate
    float64 operations (no FMA), rounded once to float32 (docs/sparse-models.md,
    RedSync R-A9)."""
    b, t = float(base), float(top)
    span = t - b
    scaled = float(ratio) * span
    value = np.float32(b + scaled)
    return float_to_key(max(np.float32(0.0), value))


def counts_above(keys: np.ndarray, threshold_keys) -> np.ndarray:
    """``C[j] = #{key > threshold_keys[j]}`` for every threshold: what a streaming unit's bank
    of comparators and counters (one per threshold) holds after **one pass** over the keys
    (docs/sparse-models.md, RedSync R-7.1 point 5 and R-7.3). Up to 32 thresholds numpy counts
    per threshold; larger banks go through :func:`counts_by_histogram`; both give identical
    counts."""
    thr = np.asarray(threshold_keys, np.uint32)
    if thr.size > 32:
        return counts_by_histogram(keys, thr)
    return np.array([np.count_nonzero(keys > t) for t in thr], np.int64)


def counts_by_histogram(keys: np.ndarray, threshold_keys) -> np.ndarray:
    """The histogram form of :func:`counts_above`: each key's bin is the number of (sorted)
    thresholds strictly below it (a comparator tree), the bins are histogrammed and suffix
    sums give every count: ``key > sorted_thr[j]  <=>  bin > j``."""
    thr = np.asarray(threshold_keys, np.uint32)
    out = np.empty(thr.size, np.int64)
    if thr.size == 0:
        return out
    order = np.argsort(thr, kind="stable")
    sorted_thr = thr[order]
    # keys <= the lowest threshold land in bin 0 and keys above the highest in the last bin;
    # only the band in between needs the comparator tree (same histogram, less numpy work)
    low, high = sorted_thr[0], sorted_thr[-1]
    above_all = int(np.count_nonzero(keys > high))
    band = keys[(keys > low) & (keys <= high)]
    bins = np.searchsorted(sorted_thr, band, side="left")   # #{thr < key}, in 1..size-1
    hist = np.bincount(bins, minlength=thr.size + 1)
    hist[thr.size] += above_all
    above_sorted = np.cumsum(hist[::-1])[::-1][1:]
    out[order] = above_sorted
    return out


# ---- RedSync trimmed top-k (Alg. 2, corrected) ------------------------------------------

TRIM_RATIOS = tuple((4 - i) / 5 for i in range(8))   # 0.8, 0.6, ..., -0.6 exactly (A2, A4)


@dataclass
class TrimmedSelection:
    """``indices``: the exact top-min(k, #non-zero); ``threshold_key``: the trim threshold
    used; ``step``: index into TRIM_RATIOS of that threshold (len(TRIM_RATIOS) = clamped to 0);
    ``counts``: count above every scheduled threshold (all from one pass);
    ``candidates``: #keys above the trim threshold (what reaches the exact stage)."""
    indices: np.ndarray
    threshold_key: int
    step: int
    counts: np.ndarray
    candidates: int
    mean: np.float32
    top: np.float32


def trimmed_topk(x, k: int, sign: int = 0) -> TrimmedSelection:
    """RedSync trimmed top-k (paper Alg. 2 with the fixes R-A1–R-A4 of
    docs/sparse-models.md).

    ``mean = exact_mean_abs(x)`` (always of |x|, also in signed mode, A10), ``top = max(key)``.
    Thresholds ``thr_i = max(0, fl32(mean + r_i (top - mean)))`` for ``r_i = (4 - i)/5``,
    i = 0..7, then 0. The schedule does not depend on the counts, so all counts come from one
    pass (:func:`counts_above`); the trim threshold is the first with count >= k, or 0. The
    candidates ``key > thr`` then go through exact :func:`radix_topk`. The result is the exact
    top-min(k, #non-zero keys) whatever the schedule (RedSync R-10 invariant 1 in
    docs/sparse-models.md).
    """
    k = _check_k(k)
    keys = signed_keys(x, sign)
    mean = exact_mean_abs(x)
    top = key_to_float(keys.max()) if keys.size else np.float32(0)
    schedule = [redsync_threshold(mean, top, r) for r in TRIM_RATIOS] + [np.uint32(0)]
    counts = counts_above(keys, schedule)
    step = len(TRIM_RATIOS)
    for i, (thr, c) in enumerate(zip(schedule, counts)):
        if c >= k or thr == 0:
            step = i
            break
    thr = schedule[step]
    cand = np.flatnonzero(keys > thr)
    picked = radix_topk(keys[cand], k).indices if cand.size else np.zeros(0, np.int64)
    return TrimmedSelection(cand[picked], int(thr), step, counts, int(cand.size), mean, top)


# ---- RedSync threshold binary search (Alg. 3, corrected) --------------------------------

@dataclass
class SearchSelection:
    """``indices``: the selection, ascending. ``converged``: a threshold with an accepted count
    was found (then ``indices = {key > threshold}``); otherwise the band fill of A7 was used.
    ``trace``: the probes ``(mid, threshold_key, count)`` in order. ``lo``/``hi``: the final
    interval (ratios lo/2^depth, hi/2^depth). ``passes``: data passes spent counting (one per
    probe sequentially, one per histogram in the replay). ``grids``: the histogram replay's
    count passes as ``(first grid point, step, thresholds)`` (empty for the sequential
    search): what a hardware replay asks its threshold source for, pass by pass."""
    indices: np.ndarray
    threshold_key: int
    converged: bool
    trace: list[tuple[int, int, int]]
    lo: int
    hi: int
    passes: int
    grids: list[tuple[int, int, int]] = field(default_factory=list)


def _search_setup(x, k, sign, depth, lower):
    k = _check_k(k)
    if not isinstance(depth, (int, np.integer)) or not (1 <= depth <= 30):
        raise SparseError(f"search depth must be an integer in 1..30, got {depth!r}")
    if lower not in ("mean", "zero"):
        raise SparseError(f"lower bound must be 'mean' or 'zero', got {lower!r}")
    keys = signed_keys(x, sign)
    base = exact_mean_abs(x) if lower == "mean" else np.float32(0)
    top = key_to_float(keys.max()) if keys.size else np.float32(0)
    return k, keys, base, top


def _accept(count: int, k: int, strict: bool) -> bool:
    return (k < count < 2 * k) if strict else (k <= count < 2 * k)


def _grid_threshold(base, top, mid: int, depth: int) -> np.uint32:
    return redsync_threshold(base, top, mid / (1 << depth))   # mid / 2^depth is exact


def _band_fill(keys, k, thr_lo, thr_hi) -> np.ndarray:
    """A7: all keys > thr(hi), then keys in (thr(lo), thr(hi)] in ascending index order until
    k are selected."""
    sure = np.flatnonzero(keys > thr_hi)
    band = np.flatnonzero((keys > thr_lo) & (keys <= thr_hi))
    return np.sort(np.concatenate([sure, band[: max(0, k - sure.size)]]))


def _finish_search(keys, k, base, top, depth, lo, hi, accepted, trace, passes):
    if accepted is not None:
        return SearchSelection(np.flatnonzero(keys > accepted), int(accepted), True,
                               trace, lo, hi, passes)
    if keys.size == 0 or keys.max() == 0:
        return SearchSelection(np.zeros(0, np.int64), 0, False, trace, lo, hi, passes)
    thr_lo = _grid_threshold(base, top, lo, depth)
    thr_hi = _grid_threshold(base, top, hi, depth)
    return SearchSelection(_band_fill(keys, k, thr_lo, thr_hi), int(thr_lo), False,
                           trace, lo, hi, passes)


def threshold_binary_search(x, k: int, *, depth: int = 16, strict: bool = False,
                            sign: int = 0, lower: str = "mean") -> SearchSelection:
    """RedSync threshold binary search (paper Alg. 3 with the fixes R-A6–R-A8
    of docs/sparse-models.md).

    Ratios are integers over 2^depth (every probe exact). Starting from lo = 0, hi = 2^depth:
    ``mid = (lo + hi) // 2``, ``thr = max(0, fl32(base + (mid/2^depth)(top - base)))`` with
    base = exact mean(|x|) (``lower="mean"``, the paper) or 0 (``lower="zero"``, A8);
    ``c = #{key > thr}``; accept if ``k <= c < 2k`` (``strict=True``: the printed
    ``k < c < 2k``); ``c < k`` -> hi = mid; else lo = mid. Converged: select ``key > thr``
    (k <= L < 2k, a superset of the exact top-k). Not converged (``hi - lo == 1``): band fill
    (A7), L = min(k, #keys > thr(lo)). One full data pass per probe.
    """
    k, keys, base, top = _search_setup(x, k, sign, depth, lower)
    lo, hi = 0, 1 << depth
    trace: list[tuple[int, int, int]] = []
    accepted = None
    if keys.size and keys.max() > 0:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            thr = _grid_threshold(base, top, mid, depth)
            c = int(np.count_nonzero(keys > thr))
            trace.append((mid, int(thr), c))
            if _accept(c, k, strict):
                accepted = thr
                break
            if c < k:
                hi = mid
            else:
                lo = mid
    return _finish_search(keys, k, base, top, depth, lo, hi, accepted, trace, len(trace))


def binary_search_histogram(x, k: int, *, depth: int = 16, hist_bits: int = 8,
                            strict: bool = False, sign: int = 0,
                            lower: str = "mean") -> SearchSelection:
    """The same search as :func:`threshold_binary_search`, replayed from histograms
    (docs/sparse-models.md, RedSync R-7.3): one data pass builds counts above all 2^H - 1 grid
    thresholds inside the current interval [lo, hi] (grid step (hi - lo)/2^H, H = min(hist_bits,
    log2(hi - lo))); the controller then runs the decision loop on the table without touching
    the data. Every probe ratio lies on the grid and the threshold arithmetic is identical, so
    the trace, the accepted threshold and the selection are bit-identical to the sequential
    search; only ``passes`` differs (one per H levels)."""
    if not isinstance(hist_bits, (int, np.integer)) or not (1 <= hist_bits <= 16):
        raise SparseError(f"hist_bits must be an integer in 1..16, got {hist_bits!r}")
    k, keys, base, top = _search_setup(x, k, sign, depth, lower)
    lo, hi = 0, 1 << depth
    trace: list[tuple[int, int, int]] = []
    grids: list[tuple[int, int, int]] = []
    accepted = None
    passes = 0
    if keys.size and keys.max() > 0:
        while hi - lo > 1 and accepted is None:
            levels = min(hist_bits, (hi - lo).bit_length() - 1)
            step = (hi - lo) >> levels
            grid = [lo + j * step for j in range(1, 1 << levels)]
            thresholds = [_grid_threshold(base, top, g, depth) for g in grid]
            table = dict(zip(grid, zip(thresholds, counts_above(keys, thresholds))))
            passes += 1
            grids.append((lo + step, step, len(grid)))
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if mid not in table:
                    break                      # beyond this pass's levels: histogram again
                thr, c = table[mid]
                c = int(c)
                trace.append((mid, int(thr), c))
                if _accept(c, k, strict):
                    accepted = thr
                    break
                if c < k:
                    hi = mid
                else:
                    lo = mid
    res = _finish_search(keys, k, base, top, depth, lo, hi, accepted, trace, passes)
    res.grids = grids
    return res


# ---- threshold reuse ("sampled" binary search) ------------------------------------------

@dataclass
class ReuseSelection:
    indices: np.ndarray
    threshold_key: int
    searched: bool          # a full binary search ran this iteration
    truncated: bool         # the reuse count exceeded the cap and was cut
    force_search_next: bool


class ThresholdReuse:
    """RedSync "sampled" threshold binary search = threshold reuse
    (docs/sparse-models.md, RedSync R-2.4 and R-A5).

    Per layer, iteration t (counted by :meth:`select` calls): a full
    :func:`threshold_binary_search` runs when ``t % interval == 0``, when the previous
    iteration forced it, or when no threshold is cached. Otherwise one pass selects
    ``key > cached``. Guards (not in the paper): if the reuse count L is above
    ``cap_factor * k`` the selection is truncated to its first ``cap_factor * k`` indices in
    index order (unsent elements stay in the residual); if L is outside
    ``[ceil(k/2), cap_factor * k]`` the next iteration searches. After a non-converged
    search (band fill) nothing is cached and the next iteration searches again. Magnitude keys
    only: reuse is not allowed with sign alternation (quantization).
    """

    def __init__(self, k: int, *, interval: int = 5, depth: int = 16, cap_factor: int = 4,
                 strict: bool = False, lower: str = "mean"):
        self.k = _check_k(k)
        if not isinstance(interval, (int, np.integer)) or interval < 1:
            raise SparseError(f"reuse interval must be a positive integer, got {interval!r}")
        if not isinstance(cap_factor, (int, np.integer)) or cap_factor < 2:
            raise SparseError(f"cap_factor must be an integer >= 2, got {cap_factor!r}")
        self.interval, self.depth, self.cap_factor = int(interval), depth, int(cap_factor)
        self.strict, self.lower = strict, lower
        self.iteration = 0
        self.cached: np.uint32 | None = None
        self.force = False

    def invalidate(self) -> None:
        self.cached = None

    def select(self, x) -> ReuseSelection:
        t = self.iteration
        self.iteration += 1
        if self.cached is None or self.force or t % self.interval == 0:
            res = threshold_binary_search(x, self.k, depth=self.depth, strict=self.strict,
                                          lower=self.lower)
            self.cached = np.uint32(res.threshold_key) if res.converged else None
            self.force = not res.converged
            return ReuseSelection(res.indices, res.threshold_key, True, False, self.force)
        keys = magnitude_keys(x)
        sel = np.flatnonzero(keys > self.cached)
        cap = self.cap_factor * self.k
        truncated = sel.size > cap
        self.force = not ((self.k + 1) // 2 <= sel.size <= cap)
        if truncated:
            sel = sel[:cap]
        return ReuseSelection(sel, int(self.cached), False, bool(truncated), self.force)


# ---- block top-k -------------------------------------------------------------------------

def block_topk(x, block: int, k_per_block: int, sign: int = 0) -> np.ndarray:
    """Top-``k_per_block`` by key inside each fixed block ``[b*block, (b+1)*block)`` (the last
    block may be short), ties by ascending index, zero keys never selected. Returns global
    indices, ascending. Hardware: one small sorter/selector per block as the stream passes."""
    if not isinstance(block, (int, np.integer)) or block < 1:
        raise SparseError(f"block must be a positive integer, got {block!r}")
    kb = _check_k(k_per_block)
    keys = signed_keys(x, sign)
    n = keys.size
    if n == 0:
        return np.zeros(0, np.int64)
    nblocks = -(-n // block)
    padded = np.full(nblocks * block, -1, np.int64)      # padding never wins (key -1)
    padded[:n] = keys
    rows = padded.reshape(nblocks, block)
    take = min(kb, block)
    # stable sort of -key: key descending, equal keys in ascending position
    order = np.argsort(-rows, axis=1, kind="stable")[:, :take]
    chosen_keys = np.take_along_axis(rows, order, axis=1)
    glob = order + (np.arange(nblocks, dtype=np.int64) * block)[:, None]
    return np.sort(glob[chosen_keys > 0])


# ---- sign alternation and quantization -------------------------------------------------

def sign_for_step(step: int) -> int:
    """RedSync sign phase: +1 (largest positive) at even compression steps, -1 at odd ones,
    identical on every rank (docs/sparse-models.md, RedSync R-3 and R-A10)."""
    return 1 if step % 2 == 0 else -1


def quantize_mean(values) -> np.float32:
    """RedSync quantization: the one float sent for L same-sign values, ``fl32(exact Σ / L)``
    (order-free, docs/sparse-models.md, RedSync R-10 item 5). Raises on an empty message (send
    no value then)."""
    v = _as_f32(values)
    if v.size == 0:
        raise SparseError("cannot quantize an empty selection")
    return np.float32(exact_sum(v) / v.size)
