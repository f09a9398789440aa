"""TopkA, TopkDSA and gTopk: the baseline sparse all-reduces of the SparDL paper (Table I).

All three start from the error-feedback accumulator ``acc_w = g_w + R_w`` and select the
exact local top-k of the whole flattened vector, ``k = max(1, round(density * N))``
(:func:`treenic.sparse.base.check_params`), with the project's one top-k
(:func:`treenic.sparse.select.topk`): |value| descending, ties by ascending index, zeros never
selected (a worker with fewer than k nonzeros sends fewer than k pairs). Sparse messages are (index u32, value f32) pairs: 8 bytes each.
Results are the plain sum (``average=True`` divides by P in float32).

* :class:`TopkA` — top-k then all-gather of every worker's k pairs (SparCML's AGsparse). The
  result is Σ_w scatter(S_w), accumulated into zero in ascending rank order; nothing is
  re-selected, so the result has ≤ P·k nonzeros. Residual: local only (R_w = acc_w with S_w
  zeroed). Conserves mass exactly (up to float32 rounding of the sum).
* :class:`TopkDSA` — SparCML's dynamic sparse allreduce: P contiguous regions of N // P
  elements (the remainder joins the last region); a direct-send reduce-scatter (P − 1 rounds,
  round r: w → (w + r) mod P) reduces region i on worker i in ascending source order, each
  message in the smaller of its representations (pairs, or the dense region at 4 bytes per
  element — the Ok-Topk code always sends pairs here; the switch only lowers bytes); then
  an all-gather of the reduced regions that switches representation: sparse (pairs) when
  2·Σ nnz < 2N/3, else dense (4 bytes per element of the region) — the rule of the Ok-Topk
  code base. Numerically identical to TopkA (every local top-k value is summed once, in the
  same order); only the traffic differs. The code's strict-threshold selection (which loses
  one value per iteration) is replaced by exact top-k (docs/sparse-models.md, S-D23).
* :class:`GTopk` — gTopk (Shi et al.): binomial-tree reduction where every merge is a proper
  sparse union (equal indices add, receiver's value first) cut back to its top-k, then a
  binomial broadcast of the k final pairs from rank 0. Residual ("partial"):
  R_w = acc_w with zeros at S_w ∩ final. Values dropped inside the tree at indices that end
  up final are lost, so gTopk does **not** conserve mass (the invariant is reported as
  ``info['mass_defect']``, not asserted). Non-power-of-two P: the binomial tree simply skips
  partners ≥ P (ceil(log2 P) rounds each way); the paper's gTopk needs P = 2^m.

All-gathers and broadcasts are charged with the Bruck / binomial patterns of
:mod:`treenic.sparse._common` (any P; per-worker totals equal recursive doubling's when P is a
power of two).

``cost(workers, elements, density, alpha, beta)`` returns the Table I α–β terms
(:class:`~treenic.sparse._common.Cost`; baseline rows use plain log2 P, as printed).
"""
from __future__ import annotations

import math

import numpy as np

from .base import PAIR_BYTES, VALUE_BYTES, SparseError, check_params, merge_add
from ._common import (Cost, ErrorFeedbackModel, log_binomial_bcast, log_bruck_payloads,
                      ragged_rows, topk_1d, topk_rows)


class LocalTopk:
    """Every worker's exact local top-k as a CSR selection: worker w's ascending indices are
    ``idx[ptr[w]:ptr[w+1]]``, values ``val[...]``, ``rows`` the worker id of each entry."""

    def __init__(self, acc: np.ndarray, k: int):
        self.ptr, self.idx = topk_rows(acc, k)
        self.rows = ragged_rows(self.ptr)
        self.val = acc[self.rows, self.idx]
        self.counts = np.diff(self.ptr)

    def of(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        s = slice(self.ptr[w], self.ptr[w + 1])
        return self.idx[s], self.val[s]

    def sum_ascending(self, n: int) -> np.ndarray:
        """Σ_w scatter(S_w) in float32, accumulated into zero in ascending rank order."""
        out = np.zeros(n, np.float32)
        for w in range(self.counts.size):
            i, v = self.of(w)
            out[i] += v                      # indices unique within one worker
        return out

    def local_residual(self, acc: np.ndarray) -> np.ndarray:
        """acc with every worker's own selection zeroed (exact masking)."""
        res = acc.copy()
        res[self.rows, self.idx] = 0
        return res


class TopkA(ErrorFeedbackModel):
    """Top-k + all-gather (see module docstring)."""

    name = "topka"

    def _step(self, acc, log):
        sel = LocalTopk(acc, self.k)
        out = sel.sum_ascending(self.elements)
        new_res = sel.local_residual(acc)
        log_bruck_payloads(log, sel.counts * PAIR_BYTES)
        nnz = int(np.count_nonzero(out))
        inv = {"result_nnz_le_Pk": nnz <= self.workers * self.k,
               "message_entries_le_k": bool(np.all(sel.counts <= self.k))}
        return out, new_res, {"result_nnz": nnz}, inv

    @classmethod
    def cost(cls, workers, elements, density, alpha=1.0, beta=1.0) -> Cost:
        """Table I: log P·α + 2(P−1)k·β."""
        k = check_params(workers, elements, density)
        p = workers
        return Cost(math.log2(p), 2 * (p - 1) * k, 2 * (p - 1) * k, alpha, beta)


def regions(elements: int, workers: int) -> np.ndarray:
    """TopkDSA region bounds (P+1): P regions of N // P, remainder in the last one."""
    base = elements // workers
    b = np.arange(workers + 1, dtype=np.int64) * base
    b[-1] = elements
    return b


class TopkDSA(ErrorFeedbackModel):
    """Top-k + dynamic sparse allreduce (see module docstring)."""

    name = "topkdsa"

    def _step(self, acc, log):
        p, n = self.workers, self.elements
        sel = LocalTopk(acc, self.k)
        bounds = regions(n, p)
        reg = np.searchsorted(bounds, sel.idx, side="right") - 1        # region of each entry
        counts = np.zeros((p, p), np.int64)                              # [src, region]
        np.add.at(counts, (sel.rows, reg), 1)
        # Reduce-scatter by direct sends, round r: w -> (w + r) mod P. Each message switches
        # to the dense representation (4 bytes per element of the region) when that is
        # smaller than its pairs (8 bytes each).
        sparse_b = counts * PAIR_BYTES
        dense_b = np.broadcast_to(np.diff(bounds) * VALUE_BYTES, (p, p))
        msg_bytes = np.minimum(sparse_b, dense_b)
        for r in range(1, p):
            log.step()
            for w in range(p):
                dst = (w + r) % p
                log.send(w, dst, int(msg_bytes[w, dst]))
        off_diag = ~np.eye(p, dtype=bool)
        dense_msgs = int(((dense_b < sparse_b) & off_diag).sum())
        out = sel.sum_ascending(n)       # = each region owner's ascending-source sum
        nnz = np.array([np.count_nonzero(out[bounds[i]:bounds[i + 1]]) for i in range(p)],
                       np.int64)
        sparse = 2 * int(nnz.sum()) < (2 * n) / 3
        payload = nnz * PAIR_BYTES if sparse else np.diff(bounds) * VALUE_BYTES
        log_bruck_payloads(log, payload)
        new_res = sel.local_residual(acc)
        info = {"allgather": "sparse" if sparse else "dense", "result_nnz": int(nnz.sum()),
                "reduce_scatter_dense_messages": dense_msgs,
                "region_bounds": bounds.tolist()}
        inv = {"result_nnz_le_Pk": int(nnz.sum()) <= p * self.k}
        return out, new_res, info, inv

    @classmethod
    def cost(cls, workers, elements, density, alpha=1.0, beta=1.0) -> Cost:
        """Table I: (P + 2 log P)·α; bandwidth in [4(P−1)/P·k, (P−1)/P·(2k + n)]·β."""
        k = check_params(workers, elements, density)
        p, n = workers, elements
        return Cost(p + 2 * math.log2(p), 4 * (p - 1) / p * k, (p - 1) / p * (2 * k + n),
                    alpha, beta)


def binomial_reduce_pairs(p: int) -> list[list[tuple[int, int]]]:
    """gTopk's tree: per round, (receiver, sender) pairs. Round i (dist = 2^i): every rank
    r ≡ 0 (mod 2^(i+1)) receives from r + 2^i when that rank exists."""
    rounds, dist = [], 1
    while dist < p:
        rounds.append([(r, r + dist) for r in range(0, p, 2 * dist) if r + dist < p])
        dist *= 2
    return rounds


class GTopk(ErrorFeedbackModel):
    """Global top-k by tree merges with re-selection (see module docstring)."""

    name = "gtopk"
    CONSERVES_MASS = False

    def _step(self, acc, log):
        p, n, k = self.workers, self.elements, self.k
        sel = LocalTopk(acc, k)
        held = {w: (sel.of(w)[0].astype(np.uint32), sel.of(w)[1]) for w in range(p)}
        for pairs in binomial_reduce_pairs(p):
            log.step()
            for dst, src in pairs:
                s_idx, s_val = held.pop(src)
                log.send(src, dst, s_idx.size * PAIR_BYTES)
                u_idx, u_val = merge_add(*held[dst], s_idx, s_val)       # receiver first
                keep = topk_1d(u_val, k)
                held[dst] = (u_idx[keep], u_val[keep])
        g_idx, g_val = held[0]
        log_binomial_bcast(log, g_idx.size * PAIR_BYTES, root=0)
        out = np.zeros(n, np.float32)
        out[g_idx.astype(np.int64)] = g_val
        # Residual: zero exactly at (local selection ∩ final set).
        final = np.zeros(n, bool)
        final[g_idx.astype(np.int64)] = True
        new_res = acc.copy()
        hit = final[sel.idx]
        new_res[sel.rows[hit], sel.idx[hit]] = 0
        lhs = out.astype(np.float64) + new_res.sum(0, dtype=np.float64)
        rhs = acc.sum(0, dtype=np.float64)
        info = {"final_entries": int(g_idx.size),
                "mass_defect": float(np.abs(lhs - rhs).max())}
        inv = {"final_entries_le_k": g_idx.size <= k}
        return out, new_res, info, inv

    @classmethod
    def cost(cls, workers, elements, density, alpha=1.0, beta=1.0) -> Cost:
        """Table I: 2 log P·α + 4 log P·k·β."""
        k = check_params(workers, elements, density)
        lg = math.log2(workers)
        return Cost(2 * lg, 4 * lg * k, 4 * lg * k, alpha, beta)


def cost(workers, elements, density, alpha=1.0, beta=1.0, algorithm="topka") -> Cost:
    """Table I terms of ``algorithm`` ("topka" | "topkdsa" | "gtopk")."""
    classes = {"topka": TopkA, "topkdsa": TopkDSA, "gtopk": GTopk}
    if algorithm not in classes:
        raise SparseError(f"cost: unknown algorithm {algorithm!r}; known: {', '.join(classes)}")
    return classes[algorithm].cost(workers, elements, density, alpha, beta)
