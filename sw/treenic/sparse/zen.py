"""Zen: balanced-parallelism sparse all-reduce with hierarchical hashing and a hash bitmap
(Wang et al., OSDI '25 / arXiv:2309.13254v2; implementation decisions in
docs/sparse-models.md, Zen Z-4).

Pieces, each usable on its own (the hardware hash unit is verified against them):

* :func:`murmur3_32` — MurmurHash3_x86_32 of uint32 keys (4-byte little-endian), vectorized,
  bit-exact with the reference implementation (``mmh3.hash(key.to_bytes(4, "little"), seed,
  signed=False)``). :func:`murmur3_key_mix` is its seed-independent half, shared by all lanes.
* :func:`partition_of` (h0) and :func:`slot_hashes` (h1..hk).
* :func:`hierarchical_hash` — Algorithm 1 with sequential semantics (first free probe wins,
  serial region filled in processing order), computed level-parallel but bit-identical to
  :func:`hierarchical_hash_reference` (a plain loop, the literal specification).
* :func:`candidate_sets`, :func:`hash_bitmap_encode` / :func:`hash_bitmap_decode`,
  :func:`pack_bits` / :func:`unpack_bits` — the Pull format.
* Metrics (paper Defs. 3–5, 8), the Chernoff test bounds of docs/sparse-models.md
  (Zen Z-3.3), and :func:`choose_scheme` (Eq. 1 vs Eq. 2 on measured unions, §3.1).
* :class:`Zen` (registry ``zen``) and :func:`cost`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .base import (INDEX_BYTES, PAIR_BYTES, VALUE_BYTES, SparseError, SparseResult,
                   TrafficLog, check_params)
from .ef import (accumulate, check_select_mode, mask_residuals, mass_conserved,
                 read_only, check_flag, select_rows, union_density)

EMPTY = np.uint32(0xFFFFFFFF)          # slot sentinel: index 0 is a valid key (A4)
MAX_KEY = 0xFFFFFFFE                    # largest hashable index (EMPTY is reserved)
MAX_LEVELS = 256                        # dependency depth beyond which hashing runs sequentially

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_M, _N = np.uint32(5), np.uint32(0xE6546B64)
_F1, _F2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


# ---- MurmurHash3_x86_32 -------------------------------------------------------------------

def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _as_keys(keys) -> np.ndarray:
    a = np.asarray(keys)
    if a.dtype.kind not in "iu":
        raise SparseError(f"hash keys must be integers, got {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
        raise SparseError("hash keys must lie in [0, 2^32)")
    return a.astype(np.uint32, copy=False)


def murmur3_key_mix(keys) -> np.ndarray:
    """Seed-independent half of MurmurHash3_x86_32 for one 4-byte block:
    ``rotl(key * c1, 15) * c2`` (mod 2^32). Computed once, shared by every hash lane."""
    k = _as_keys(keys) * _C1
    return _rotl(k, 15) * _C2


def murmur3_from_mix(mixed: np.ndarray, seed: int) -> np.ndarray:
    """Seed-dependent half: ``h = rotl(seed ^ k, 13) * 5 + n; h ^= 4 (length); fmix32(h)``."""
    h = np.uint32(seed & 0xFFFFFFFF) ^ mixed
    h = _rotl(h, 13) * _M + _N
    h = h ^ np.uint32(4)
    h = h ^ (h >> np.uint32(16))
    h = h * _F1
    h = h ^ (h >> np.uint32(13))
    h = h * _F2
    return h ^ (h >> np.uint32(16))


def murmur3_32(keys, seed: int = 0) -> np.ndarray:
    """MurmurHash3_x86_32 of each uint32 key encoded as 4 little-endian bytes, with ``seed``
    (taken mod 2^32); uint32 array of the same shape. All arithmetic wraps mod 2^32."""
    with np.errstate(over="ignore"):
        return murmur3_from_mix(murmur3_key_mix(np.atleast_1d(keys)), seed).reshape(np.shape(keys))


def partition_of(indices, workers: int, seed0: int) -> np.ndarray:
    """h0: ``murmur3_32(idx, s0) mod n`` — the server of each index, the same on every worker."""
    return (murmur3_32(indices, seed0) % np.uint32(workers)).astype(np.int64)


def slot_hashes(indices, r1: int, seeds) -> np.ndarray:
    """h1..hk: ``murmur3_32(idx, s_j) mod r1``, shape (len(indices), k); the key mix is shared."""
    with np.errstate(over="ignore"):
        mixed = murmur3_key_mix(indices)
        cols = [murmur3_from_mix(mixed, s) % np.uint32(r1) for s in seeds]
    return np.stack(cols, axis=1).astype(np.int64) if cols else np.zeros((len(mixed), 0), np.int64)


# ---- hierarchical hashing (Algorithm 1) ---------------------------------------------------

def pow2ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def region_sizes(nnz_local: int, workers: int, paper_literal: bool = False) -> tuple[int, int]:
    """Per-partition (r1, r2) of docs/sparse-models.md, Zen Z-4.2/Z-A3:
    ``r1 = pow2ceil(ceil(2 nnz / n))`` (load factor 0.25–0.5), ``r2 = ceil(r1 / 10)``;
    ``paper_literal``: r1 = 2 nnz per partition."""
    r1 = max(1, 2 * nnz_local) if paper_literal else pow2ceil(max(1, -(-2 * nnz_local // workers)))
    return r1, max(1, -(-r1 // 10))


@dataclass
class HashMemory:
    """Memory image of Algorithm 1. ``x``: (n, r1 + r2) uint32, EMPTY where unused;
    ``counter``: c[p] = r1 + #serial entries written (stops at r1 + r2); ``overflow``: indices
    that found both regions full (reported, never dropped: the caller sends them too);
    ``partition``/``slot``: per input item, slot -1 for overflowed items; ``levels``: number of
    dependency levels the parallel evaluation used."""
    x: np.ndarray
    counter: np.ndarray
    overflow: np.ndarray
    partition: np.ndarray
    slot: np.ndarray
    levels: int
    r1: int

    def pieces(self) -> list[np.ndarray]:
        """What worker sends to each server: the row's non-EMPTY entries in slot order, then that
        partition's overflowed indices in processing order."""
        spilled_partition = self.partition[self.slot < 0]     # aligned with self.overflow
        out = []
        for p in range(self.x.shape[0]):
            row = self.x[p]
            spill = self.overflow[spilled_partition == p]
            out.append(np.concatenate([row[row != EMPTY], spill]).astype(np.int64))
        return out


def _check_hash_inputs(indices, workers, r1, r2, seeds):
    idx = np.asarray(indices)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise SparseError("indices must be a 1-D integer array")
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) > MAX_KEY):
        raise SparseError(f"indices must lie in [0, {MAX_KEY}] (0xFFFFFFFF is the EMPTY sentinel)")
    if np.unique(idx).size != idx.size:
        raise SparseError("indices must be unique")
    for name, v in (("workers", workers), ("r1", r1)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise SparseError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(r2, (int, np.integer)) or r2 < 0:
        raise SparseError(f"r2 must be a non-negative integer, got {r2!r}")
    if len(seeds) < 2:
        raise SparseError("need seeds s0 (partition) and at least one slot seed s1..sk")
    return idx.astype(np.int64)


def hierarchical_hash(indices, workers: int, r1: int, r2: int, seeds) -> HashMemory:
    """Algorithm 1, cleaned semantics (docs/sparse-models.md, Zen Z-3.3), items in the given order:
    ``p = h0(idx)``; the first of ``q = h1(idx) .. hk(idx)`` whose slot ``x[p][q]`` is EMPTY
    takes it; if all are taken the item goes to serial slot ``c[p]++`` (starting at r1); past
    ``r1 + r2`` it is an overflow.

    Evaluation: item t depends only on earlier items that share one of its probe slots, so
    each item gets a level = 1 + the highest level among those; items of one level share no
    slot and are placed together. The memory image equals the sequential loop
    (:func:`hierarchical_hash_reference`) exactly. Cost O(levels x m); at the recommended
    load (<= 0.5, k = 3) levels is about 10-40; past MAX_LEVELS (degenerate sizing such as
    r1 = 1) the sequential loop is used instead.
    """
    idx = _check_hash_inputs(indices, workers, r1, r2, seeds)
    m, k = idx.size, len(seeds) - 1
    part = partition_of(idx, workers, seeds[0])
    probes = slot_hashes(idx, r1, seeds[1:])
    flat = part[:, None] * r1 + probes                       # global slot id per probe
    # dependency levels: chain each (slot, item) to the previous item probing that slot
    pair_item = np.repeat(np.arange(m), k)
    pair_slot = flat.ravel()
    order = np.lexsort((pair_item, pair_slot))
    s_slot, s_item = pair_slot[order], pair_item[order]
    link = (s_slot[1:] == s_slot[:-1]) & (s_item[1:] != s_item[:-1])
    later, earlier = s_item[1:][link], s_item[:-1][link]
    level = np.zeros(m, np.int64)
    rounds = 0
    while later.size:
        new = level.copy()
        np.maximum.at(new, later, level[earlier] + 1)
        if np.array_equal(new, level):
            break
        level = new
        rounds += 1
        if rounds > MAX_LEVELS:
            # pathological sizing (e.g. r1 tiny): one long dependency chain; the sequential
            # loop is then cheaper and gives the identical image by definition
            return hierarchical_hash_reference(indices, workers, r1, r2, seeds)
    occupied = np.zeros(workers * r1, bool)
    x = np.full((workers, r1 + r2), EMPTY, np.uint32)
    slot = np.full(m, -1, np.int64)
    by_level = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[by_level], np.arange(level.max() + 2 if m else 1))
    for lv in range(len(bounds) - 1):
        items = by_level[bounds[lv]:bounds[lv + 1]]
        if items.size == 0:
            continue
        free = ~occupied[flat[items]]                         # (items, k)
        placed = free.any(axis=1)
        first = np.argmax(free, axis=1)
        it = items[placed]
        chosen = flat[it, first[placed]]
        occupied[chosen] = True
        slot[it] = probes[it, first[placed]]
        x[part[it], slot[it]] = idx[it]
    # serial region: unplaced items in processing order, per partition
    serial = np.flatnonzero(slot < 0)
    sp = part[serial]
    rank = np.zeros(serial.size, np.int64)
    if serial.size:
        o = np.argsort(sp, kind="stable")
        starts = np.searchsorted(sp[o], sp[o])
        rank[o] = np.arange(serial.size) - starts
    fits = rank < r2
    slot[serial[fits]] = r1 + rank[fits]
    x[sp[fits], r1 + rank[fits]] = idx[serial[fits]]
    counter = r1 + np.minimum(np.bincount(sp, minlength=workers), r2)
    overflow = idx[serial[~fits]]
    return HashMemory(x, counter.astype(np.int64), overflow, part, slot,
                      int(level.max()) + 1 if m else 0, r1)


def hierarchical_hash_reference(indices, workers: int, r1: int, r2: int, seeds) -> HashMemory:
    """Literal sequential Algorithm 1 (one item at a time); the specification the vectorized
    :func:`hierarchical_hash` and a hardware hash unit must match bit for bit."""
    idx = _check_hash_inputs(indices, workers, r1, r2, seeds)
    x = np.full((workers, r1 + r2), EMPTY, np.uint32)
    counter = np.full(workers, r1, np.int64)
    part = partition_of(idx, workers, seeds[0])
    probes = slot_hashes(idx, r1, seeds[1:])
    slot = np.full(idx.size, -1, np.int64)
    overflow = []
    for t in range(idx.size):
        p = part[t]
        for q in probes[t]:
            if x[p, q] == EMPTY:
                x[p, q] = idx[t]
                slot[t] = q
                break
        else:
            if counter[p] < r1 + r2:
                x[p, counter[p]] = idx[t]
                slot[t] = counter[p]
                counter[p] += 1
            else:
                overflow.append(idx[t])
    return HashMemory(x, counter, np.array(overflow, np.int64), part, slot, 0, r1)


# ---- hash bitmap --------------------------------------------------------------------------

def candidate_sets(elements: int, workers: int, seed0: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``U_j = sorted{idx in [0, N) : h0(idx) = j}`` for every server j, and the rank table
    ``rank[idx]`` = position of idx inside its U_j (what a streaming unit's per-partition
    counters produce on the fly). Computed once per tensor shape ("offline")."""
    if elements - 1 > MAX_KEY:
        raise SparseError(f"at most {MAX_KEY + 1} elements can be hashed as uint32 keys")
    part = partition_of(np.arange(elements, dtype=np.uint32), workers, seed0)
    order = np.argsort(part, kind="stable")
    counts = np.bincount(part, minlength=workers)
    sets = np.split(order, np.cumsum(counts)[:-1])
    rank = np.empty(elements, np.int64)
    rank[order] = np.arange(elements) - np.repeat(np.cumsum(counts) - counts, counts)
    return sets, rank


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Bitmap words: position t -> word t >> 5, bit t & 31 (LSB first), uint32 little-endian,
    padded with zeros to whole words."""
    b = np.asarray(bits, bool)
    nwords = -(-b.size // 32)
    padded = np.zeros(nwords * 32, bool)
    padded[:b.size] = b
    return np.packbits(padded, bitorder="little").view("<u4").astype(np.uint32)


def unpack_bits(words: np.ndarray, length: int) -> np.ndarray:
    w = np.asarray(words, "<u4")
    if w.size * 32 < length:
        raise SparseError(f"bitmap of {w.size} words cannot hold {length} bits")
    return np.unpackbits(w.view(np.uint8), bitorder="little")[:length].astype(bool)


def hash_bitmap_encode(values_over_U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Server side: ``values_over_U`` is the aggregated partition in U_j order. Bit t is set iff
    the value is non-zero (``!= 0.0``, so -0.0 counts as zero, A11); the values of the set bits
    follow in ascending bit position. Returns (bitmap words, values)."""
    v = np.asarray(values_over_U, np.float32)
    bits = v != 0
    return pack_bits(bits), v[bits]


def hash_bitmap_decode(U: np.ndarray, words: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Worker side: global indices ``U[flatnonzero(bits)]`` paired with ``values`` in order."""
    pos = np.flatnonzero(unpack_bits(words, len(U)))
    vals = np.asarray(values, np.float32)
    if pos.size != vals.size:
        raise SparseError(f"bitmap has {pos.size} set bits but {vals.size} values were sent")
    return np.asarray(U)[pos].astype(np.int64), vals


def bitmap_bytes(candidate_count: int) -> int:
    return INDEX_BYTES * (-(-candidate_count // 32))


# ---- metrics (paper Defs. 3-5, 8) and bounds ---------------------------------------------

def overlap_ratio(a, b) -> float:
    """Def. 3: |A ∩ B| / min(|A|, |B|)."""
    a, b = np.unique(a), np.unique(b)
    if min(a.size, b.size) == 0:
        return 0.0
    return np.intersect1d(a, b).size / min(a.size, b.size)


def skewness_ratio(nonzero_mask: np.ndarray, parts: int) -> float:
    """Def. 5: max over ``np.array_split`` contiguous partitions of (partition density / total
    density); 1 = even, ``parts`` = all in one partition."""
    m = np.asarray(nonzero_mask, bool)
    total = m.mean()
    if total == 0:
        return 0.0
    return max(chunk.mean() for chunk in np.array_split(m, parts) if chunk.size) / total


def push_imbalance(partitions_per_worker: list[np.ndarray], workers: int) -> float:
    """Def. 8 Push: max over workers i and servers j of n |I_i^j| / |I_i|."""
    worst = 0.0
    for part in partitions_per_worker:
        if part.size:
            worst = max(worst, workers * np.bincount(part, minlength=workers).max() / part.size)
    return worst


def pull_imbalance(aggregated_counts: np.ndarray) -> float:
    """Def. 8 Pull: max_j n |S_j| / |I|."""
    c = np.asarray(aggregated_counts)
    return float(c.size * c.max() / c.sum()) if c.sum() else 0.0


def imbalance_bound(workers: int, items: int, all_workers: bool = False) -> float:
    """Chernoff + union bound on the imbalance ratio (docs/sparse-models.md, Zen Z-3.3), holding
    with
    probability >= 1 - 1/n for fully random h0 and m hashed items: one worker or Pull,
    ``1 + sqrt(4 n ln n / m) + (4/3) n ln n / m``; max over all n workers (Push, n^2 bins),
    ``1 + sqrt(6 n ln n / m) + 2 n ln n / m``."""
    n, m = workers, max(1, items)
    a = n * math.log(n) / m
    return 1 + math.sqrt(6 * a) + 2 * a if all_workers else 1 + math.sqrt(4 * a) + 4 * a / 3


def union_profile(selections: list[np.ndarray], elements: int) -> dict[int, float]:
    """Measured ``d_G^g`` for g = 1, 2, 4, ... (< n, plus n itself): the density of the union of
    each aligned recursive-doubling group of g ranks, averaged over the groups
    (docs/sparse-models.md, Zen Z-A1/Z-A18).
    Non-power-of-two n: groups are aligned blocks of the power-of-two core, plus g = n."""
    n = len(selections)
    out: dict[int, float] = {}
    g = 1
    while g < n:
        dens = []
        for start in range(0, n - g + 1, g):
            touched = np.zeros(elements, bool)
            for sel in selections[start:start + g]:
                touched[sel] = True
            dens.append(np.count_nonzero(touched) / elements)
        out[g] = float(np.mean(dens))
        g *= 2
    touched = np.zeros(elements, bool)
    for sel in selections:
        touched[sel] = True
    out[n] = np.count_nonzero(touched) / elements
    return out


def choose_scheme(selections: list[np.ndarray], elements: int) -> dict:
    """Zen's scheme selection (paper §3.1, Theorem 1): evaluate Eq. 1 (Balanced Parallelism,
    COO) ``2 (n-1)/n (d + d^n)`` and Eq. 2 (Hierarchical Centralization)
    ``2 Σ_{i=1}^{log n} d^(2^(i-1))`` on the measured union profile (bandwidth only, in units
    of the dense size; n rounded down to a power of two for Eq. 2) and return the cheaper."""
    n = len(selections)
    if n < 2:
        raise SparseError("scheme selection needs at least 2 workers")
    prof = union_profile(selections, elements)
    d, dn = prof[1], prof[n]
    bp = 2 * (n - 1) / n * (d + dn)
    hc = 2 * sum(prof[1 << i] for i in range(n.bit_length() - 1))
    return {"scheme": "balanced-parallelism" if bp <= hc else "hierarchical-centralization",
            "balanced_parallelism": bp, "hierarchical_centralization": hc, "profile": prof}


# ---- the algorithm ------------------------------------------------------------------------

class Zen:
    """Zen sparse all-reduce (Balanced Parallelism: COO Push, hash-bitmap Pull).

    Per step, on every worker w: ``V_w = residual_w + g_w``; select (``select="topk"``: exact
    top-k by magnitude, k = round(density N), ties by ascending index — DGC-style input of
    docs/sparse-models.md, Zen Z-A22; ``select="nonzero"``: every non-zero, the lossless
    natural-sparsity case);
    hash the selected indices with Algorithm 1 into n pieces; residual = V with the selected
    entries zeroed.

    Step 0, Push: worker w sends piece j as COO (4 B index + 4 B value per entry) to server j
    (every worker is also a server; w -> w is free). Server j adds the pieces in ascending
    worker rank in float32 (0 + v_0 + v_1 + ..., A23) over its candidate set U_j.
    Step 1, Pull: server j sends its hash bitmap (ceil(|U_j|/32) words) plus the packed
    non-zero values to every other worker; every worker decodes all n bitmaps into the same
    dense result (computed once and copied to every row).

    Any n >= 2 works (h0 = hash mod n; Balanced Parallelism needs no power of two).

    Options: ``k_hashes`` (k of Algorithm 1, default 3), ``seeds`` (s0..sk; default
    seed, seed+1, ..., seed+k), ``paper_literal_regions`` (r1 = 2 nnz per partition instead of
    pow2ceil(2 nnz / n)), ``select``, ``check_invariants`` (False skips the full-size mass check,
    for benchmarking). ``result`` (one broadcast row) and ``residuals`` are read-only views.
    ``info`` carries the imbalance ratios, densities,
    overflow count and ``invariants``: lossless hashing, partition correctness, bitmap round
    trip, mass conservation (and ``matches_dense_sum`` for
    ``select="nonzero"``).
    """

    name = "zen"

    def __init__(self, workers, elements, density, seed=0, *, k_hashes=3, seeds=None,
                 select="topk", paper_literal_regions=False, check_invariants=True):
        self.k = check_params(workers, elements, density)
        if elements - 1 > MAX_KEY:
            raise SparseError(f"Zen hashes uint32 indices: at most {MAX_KEY + 1} elements")
        if not isinstance(k_hashes, (int, np.integer)) or not (1 <= k_hashes <= 16):
            raise SparseError(f"k_hashes must be an integer in 1..16, got {k_hashes!r}")
        if seeds is None:
            seeds = [(int(seed) + j) & 0xFFFFFFFF for j in range(k_hashes + 1)]
        seeds = [int(s) for s in seeds]
        if len(seeds) != k_hashes + 1:
            raise SparseError(f"need {k_hashes + 1} seeds (s0..s{k_hashes}), got {len(seeds)}")
        self.workers, self.elements, self.density = int(workers), int(elements), float(density)
        self.seeds, self.select = seeds, check_select_mode(select)
        self.paper_literal_regions = bool(paper_literal_regions)
        self.check_invariants = check_flag("check_invariants", check_invariants)
        self.residuals = np.zeros((workers, elements), np.float32)
        self._U = None

    def candidate_sets(self):
        if self._U is None:
            self._U = candidate_sets(self.elements, self.workers, self.seeds[0])
        return self._U

    def step(self, grads) -> SparseResult:
        P, N = self.workers, self.elements
        old = self.residuals
        V = accumulate(old, grads, P, N)
        selections = select_rows(V, self.k, self.select)
        U, rank = self.candidate_sets()
        log = TrafficLog(P)

        # hashing + Push
        memories, pieces = [], []
        lossless = partition_ok = True
        for w, sel in enumerate(selections):
            r1, r2 = region_sizes(sel.size, P, self.paper_literal_regions)
            mem = hierarchical_hash(sel, P, r1, r2, self.seeds)
            memories.append(mem)
            ps = mem.pieces()
            pieces.append(ps)
            stored = np.concatenate(ps)
            lossless &= stored.size == sel.size and np.array_equal(np.sort(stored), sel)
            partition_ok &= all(np.all(partition_of(p, P, self.seeds[0]) == j) for j, p in enumerate(ps))
        log.step()
        for w in range(P):
            for j in range(P):
                if j != w and pieces[w][j].size:
                    log.send(w, j, PAIR_BYTES * pieces[w][j].size)

        # servers aggregate, encode; Pull
        log.step()
        result_row = np.zeros(N, np.float32)
        round_trip = True
        aggregated_counts = np.zeros(P, np.int64)
        for j in range(P):
            acc = np.zeros(U[j].size, np.float32)
            for w in range(P):                               # ascending worker rank
                idx = pieces[w][j]
                acc[rank[idx]] += V[w, idx]
            words, vals = hash_bitmap_encode(acc)
            aggregated_counts[j] = vals.size
            dec_idx, dec_val = hash_bitmap_decode(U[j], words, vals)
            expect = np.flatnonzero(acc)
            round_trip &= np.array_equal(dec_idx, U[j][expect]) and np.array_equal(dec_val, acc[expect])
            result_row[dec_idx] = dec_val
            for w in range(P):
                if w != j:
                    log.send(j, w, bitmap_bytes(U[j].size) + VALUE_BYTES * vals.size)

        dense = None
        if self.select == "nonzero":                   # lossless: the plain rank-order sum
            dense = np.zeros(N, np.float32)
            for w in range(P):
                dense += V[w]
        self.residuals = mask_residuals(V, selections, in_place=True)
        invariants = {
            "lossless_hashing": bool(lossless),
            "partition_correct": bool(partition_ok),
            "bitmap_round_trip": bool(round_trip),
            "finite_result": bool(np.isfinite(result_row).all()),   # no float32 overflow
            "bitmap_bits_equal_elements": sum(u.size for u in U) == N,
        }
        if self.check_invariants:
            invariants["mass_conservation"] = mass_conserved(grads, old, result_row, self.residuals)
        if dense is not None:
            invariants["matches_dense_sum"] = bool(np.array_equal(dense, result_row))
        sent, received = log.arrays()
        info = {
            "k": self.k,
            "selected": [int(s.size) for s in selections],
            "density": float(np.mean([s.size for s in selections])) / N,
            "aggregated_density": union_density(selections, N),
            "push_imbalance": push_imbalance([m.partition for m in memories], P),
            "pull_imbalance": pull_imbalance(aggregated_counts),
            # serial-region overflow is a sizing statistic, not an invariant: overflowed
            # items are still pushed (and counted in the bytes), so the result stays exact
            "overflow": int(sum(m.overflow.size for m in memories)),
            "serial_entries": int(sum(np.count_nonzero(m.slot >= m.r1) for m in memories)),
            "hash_levels": max(m.levels for m in memories),
            "invariants": invariants,
        }
        return SparseResult(self.name, read_only(np.broadcast_to(result_row, (P, N))),
                            read_only(self.residuals), sent, received, info)


def cost(workers, elements, density, alpha, beta, *, aggregated_density=None,
         pull_format="bitmap") -> dict:
    """α–β time of one Zen all-reduce (balanced hashing assumed, docs/sparse-models.md,
    Zen Z-2.4).

    Latency: each phase is an all-to-all of n - 1 messages per node through one port:
    ``2 (n - 1) α``. Bandwidth (bytes through the busiest port, times β): Push
    ``(n-1)/n · 8 d N``; Pull with the hash bitmap ``(n-1)/n · (4 d_agg N + N/8)`` (values + the
    other servers' share of the N-bit bitmaps), with COO (``pull_format="coo"``, Balanced
    Parallelism of Eq. 1) ``(n-1)/n · 8 d_agg N``. ``aggregated_density`` d_agg defaults to
    independent random selections, ``1 - (1 - d)^n``. Normalised by the dense size 4N the
    bandwidth term is ``(n-1)/n (2d + d^n + 1/32)`` (bitmap) or ``2 (n-1)/n (d + d^n)`` (COO)."""
    check_params(workers, elements, density)
    if pull_format not in ("bitmap", "coo"):
        raise SparseError(f"pull_format must be 'bitmap' or 'coo', got {pull_format!r}")
    n, N, d = workers, elements, float(density)
    d_agg = 1 - (1 - d) ** n if aggregated_density is None else float(aggregated_density)
    if not (0.0 <= d_agg <= 1.0):
        raise SparseError(f"aggregated_density must be in [0, 1], got {aggregated_density}")
    push = (n - 1) / n * PAIR_BYTES * d * N
    if pull_format == "bitmap":
        pull = (n - 1) / n * (VALUE_BYTES * d_agg * N + N / 8)
    else:
        pull = (n - 1) / n * PAIR_BYTES * d_agg * N
    latency = 2 * (n - 1) * alpha
    bandwidth = (push + pull) * beta
    return {"latency": latency, "bandwidth": bandwidth, "total": latency + bandwidth,
            "push_bytes": push, "pull_bytes": pull, "messages": 2 * (n - 1)}
