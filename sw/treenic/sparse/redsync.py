"""RedSync (RGC) sparse synchronisation (Fang, Fu, Yang and Hsieh, arXiv:1808.04357;
decisions in docs/sparse-models.md, section RedSync).

Each rank selects its own communication set from its residual (trimmed top-k, threshold
binary search, its histogram replay, threshold reuse, or exact radix top-k), packs
``[L][indices][values]`` (or ``[L][indices][mean]`` when quantized) into one message, and all
messages are **allgathered**; every rank decompresses all P messages into the same dense
result. Ranks never agree on indices (R-4), so there is no reduction in the network.

Allgather: Bruck's algorithm, ceil(log2 P) steps for any P (it equals recursive doubling's
volume for powers of two, the paper's cost model): in step s rank r sends the
``min(2^s, P - 2^s)`` messages it holds (its own and those of ranks r+1, ..., r+2^s-1 mod P)
to rank r - 2^s mod P. Every rank receives exactly the P - 1 other messages.

Decompression (A15): a zeroed float32 buffer, ranks 0 .. P-1 added in order, each message in
its (ascending index) order; ``average=True`` then multiplies by fl32(1/P). The default is the
plain sum, the contract every model of ``treenic.sparse`` shares.
"""
from __future__ import annotations

import math

import numpy as np

from .base import SparseError, SparseResult, TrafficLog, check_params
from .ef import accumulate, check_flag, mass_conserved, read_only, union_density
from .select import (ThresholdReuse, binary_search_histogram, quantize_mean, sign_for_step,
                     threshold_binary_search, topk, trimmed_topk)

SELECTIONS = ("exact", "trimmed", "binary", "histogram", "reuse")
WORD_BYTES = 4


def pack(indices, values=None, mean=None) -> np.ndarray:
    """One message as uint32 words (docs/sparse-models.md, RedSync R-4 and R-A14):
    ``[L][idx_0..idx_L-1][payload]``
    with payload the L values (bit-cast float32) or, when ``mean`` is given, the one quantized
    mean (a quantized message with L = 0 is just ``[0]``)."""
    idx = np.asarray(indices)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= 1 << 32):
        raise SparseError("indices must fit in uint32")
    head = [np.array([idx.size], np.uint32), idx.astype(np.uint32)]
    if mean is not None:
        tail = np.array([mean], np.float32).view(np.uint32) if idx.size else np.zeros(0, np.uint32)
    else:
        vals = np.asarray(values, np.float32)
        if vals.size != idx.size:
            raise SparseError(f"{idx.size} indices but {vals.size} values")
        tail = vals.view(np.uint32)
    return np.concatenate(head + [tail])


def unpack(words, quantized: bool) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack`: (indices int64, per-index float32 values); a quantized message
    expands its mean to every index. Raises on a length field that does not match."""
    w = np.asarray(words, np.uint32)
    if w.size < 1:
        raise SparseError("empty message (no length word)")
    L = int(w[0])
    expected = 1 + L + ((1 if L else 0) if quantized else L)
    if w.size != expected:
        raise SparseError(f"message length {w.size} words does not match L = {L} "
                          f"({'quantized' if quantized else 'values'}: {expected} words)")
    idx = w[1:1 + L].astype(np.int64)
    if quantized:
        vals = np.full(L, w[1 + L:].view(np.float32)[0] if L else 0, np.float32)
    else:
        vals = w[1 + L:].view(np.float32).copy()
    return idx, vals


def bruck_received(sizes: np.ndarray) -> np.ndarray:
    """(steps, P) bytes each rank receives in each Bruck allgather step for message sizes
    ``sizes`` (bytes per rank): at step s rank r gets the messages of ranks
    r + 2^s + j (mod P), j < min(2^s, P - 2^s)."""
    P = sizes.size
    doubled = np.concatenate([[0], np.cumsum(np.concatenate([sizes, sizes, sizes]))])
    out = []
    dist = 1
    while dist < P:
        count = min(dist, P - dist)
        start = np.arange(P) + dist
        out.append(doubled[start + count] - doubled[start])
        dist <<= 1
    return np.array(out, np.int64).reshape(-1, P)


class RedSync:
    """RedSync residual gradient compression with allgather synchronisation.

    Per step, rank w: ``V_w = residual_w + g_w``; select (``selection``): ``"trimmed"``
    (exact top-k through the trimmed candidate set), ``"binary"`` (threshold binary search,
    k <= L < 2k when converged), ``"histogram"`` (the same search replayed from histograms,
    identical selection), ``"reuse"`` (threshold reuse every ``reuse_interval`` iterations
    with the 4k cap of A5), ``"exact"`` (radix top-k). With ``quantize=True`` the key is
    sign-alternating (s = +1 on even steps, -1 on odd ones, A10) and the message carries one
    mean; the selected residuals are zeroed (faithful, A12) or, with ``q_error_feedback``,
    reduced by the mean. ``reuse`` cannot be combined with quantization (SparseError).

    k = ``check_params``' round(density N) (docs/sparse-models.md, RedSync R-k, recommends floor
    with an exact rational; the shared contract wins). The momentum correction of Alg. 4 and
    local clipping belong to the training loop, not to this synchronisation model.

    ``check_invariants=False`` skips the full-size checks (error-feedback exactness, mass
    conservation) for benchmarking. ``result`` (one broadcast row) and ``residuals`` are
    read-only views.

    ``info["invariants"]``: message round trip, allgather completeness, error-feedback
    exactness (sent value == V before masking, bitwise), mass conservation (non-quantized sum
    mode), signed-mode sign rule (quantized), binary-search window (converged searches).
    """

    name = "redsync"

    def __init__(self, workers, elements, density, seed=0, *, selection="trimmed",
                 quantize=False, depth=16, hist_bits=8, strict=False, lower="mean",
                 reuse_interval=5, cap_factor=4, average=False, q_error_feedback=False,
                 check_invariants=True):
        self.k = check_params(workers, elements, density)
        if selection not in SELECTIONS:
            raise SparseError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        if quantize and selection == "reuse":
            raise SparseError("threshold reuse cannot be combined with quantization "
                              "(the cached threshold belongs to the other sign, "
                              "docs/sparse-models.md, RedSync R-2.4)")
        if q_error_feedback and not quantize:
            raise SparseError("q_error_feedback only applies with quantize=True")
        if not isinstance(depth, (int, np.integer)) or not (1 <= depth <= 30):
            raise SparseError(f"depth must be an integer in 1..30, got {depth!r}")
        self.workers, self.elements, self.density = int(workers), int(elements), float(density)
        self.selection, self.quantize = selection, bool(quantize)
        self.depth, self.hist_bits, self.strict, self.lower = depth, hist_bits, bool(strict), lower
        self.average, self.q_error_feedback = bool(average), bool(q_error_feedback)
        self.check_invariants = check_flag("check_invariants", check_invariants)
        self.residuals = np.zeros((workers, elements), np.float32)
        self.steps_done = 0
        self.reusers = ([ThresholdReuse(self.k, interval=reuse_interval, depth=depth,
                                        cap_factor=cap_factor, strict=strict, lower=lower)
                         for _ in range(workers)] if selection == "reuse" else None)

    def _select(self, w: int, v: np.ndarray, sign: int):
        k = self.k
        if self.selection == "exact":
            return topk(v, k, sign), None
        if self.selection == "trimmed":
            return trimmed_topk(v, k, sign).indices, None
        if self.selection == "binary":
            r = threshold_binary_search(v, k, depth=self.depth, strict=self.strict, sign=sign,
                                        lower=self.lower)
            return r.indices, r
        if self.selection == "histogram":
            r = binary_search_histogram(v, k, depth=self.depth, hist_bits=self.hist_bits,
                                        strict=self.strict, sign=sign, lower=self.lower)
            return r.indices, r
        r = self.reusers[w].select(v)
        return r.indices, None

    def step(self, grads) -> SparseResult:
        P, N = self.workers, self.elements
        old = self.residuals
        V = accumulate(old, grads, P, N)
        sign = sign_for_step(self.steps_done) if self.quantize else 0
        messages, selections, means = [], [], []
        window_ok = sign_ok = round_trip = True
        searches = []
        for w in range(P):
            sel, search = self._select(w, V[w], sign)
            vals = V[w, sel]
            if search is not None:
                searches.append(search)
                if search.converged:
                    lo = self.k + 1 if self.strict else self.k
                    window_ok &= lo <= sel.size < 2 * self.k
            if self.quantize:
                mean = quantize_mean(vals) if sel.size else None
                sign_ok &= bool(np.all(sign * vals > 0)) and (mean is None or sign * mean > 0)
                msg = pack(sel, mean=mean if mean is not None else np.float32(0))
                means.append(mean)
            else:
                msg = pack(sel, vals)
            dec_idx, dec_val = unpack(msg, self.quantize)
            round_trip &= np.array_equal(dec_idx, sel) and (
                self.quantize or np.array_equal(dec_val.view(np.uint32), vals.view(np.uint32)))
            messages.append(msg)
            selections.append(sel)

        sizes = np.array([m.size * WORD_BYTES for m in messages], np.int64)
        received = bruck_received(sizes)
        log = TrafficLog(P)
        dist = 1
        for s in range(received.shape[0]):
            log.step()
            for r in range(P):
                src = (r + dist) % P
                log.send(src, r, int(received[s, r]))
            dist <<= 1
        sent_arr, recv_arr = log.arrays()
        gathered = recv_arr.sum(0) + sizes
        allgather_complete = bool(np.all(gathered == sizes.sum()))

        result_row = np.zeros(N, np.float32)
        for msg in messages:                            # rank 0 .. P-1, message order
            idx, vals = unpack(msg, self.quantize)
            result_row[idx] += vals                     # indices unique within a message
        if self.average:
            result_row *= np.float32(1.0 / P)

        keep_v = self.check_invariants and not self.quantize       # V_before for R-10 invariant 4
        residuals = V.copy() if keep_v else V
        ef_exact = True
        for w, sel in enumerate(selections):
            if self.q_error_feedback and means[w] is not None:
                residuals[w, sel] = V[w, sel] - means[w]
            else:
                residuals[w, sel] = 0.0
            if not self.quantize and self.check_invariants:
                # docs/sparse-models.md, RedSync R-10 invariant 4: V_before[i] == (i sent ? sent
                # value : V_after[i]), bitwise
                idx, vals = unpack(messages[w], False)
                rebuilt = residuals[w].copy()
                rebuilt[idx] = vals
                ef_exact &= bool(np.array_equal(rebuilt.view(np.uint32), V[w].view(np.uint32)))
                ef_exact &= bool(np.all(residuals[w, idx] == 0))
        self.residuals = residuals
        self.steps_done += 1

        invariants = {
            "message_round_trip": bool(round_trip),
            "allgather_complete": allgather_complete,
            "finite_result": bool(np.isfinite(result_row).all()),   # no float32 overflow
        }
        if not self.quantize and self.check_invariants:
            invariants["error_feedback_exact"] = bool(ef_exact)
        if not self.quantize and not self.average and self.check_invariants:
            invariants["mass_conservation"] = mass_conserved(grads, old, result_row, residuals)
        if self.quantize:
            invariants["signed_selection"] = bool(sign_ok)
        if searches:
            invariants["search_window"] = bool(window_ok)
        info = {
            "k": self.k,
            "selected": [int(s.size) for s in selections],
            "sign": sign,
            "message_bytes": sizes,
            "aggregated_density": union_density(selections, N),
            "searches_converged": [bool(s.converged) for s in searches],
            "search_probes": [len(s.trace) for s in searches],
            "invariants": invariants,
        }
        return SparseResult(self.name, read_only(np.broadcast_to(result_row, (P, N))),
                            read_only(residuals), sent_arr, recv_arr, info)


def cost(workers, elements, density, alpha, beta, *, quantized=False, c_dec=0.0,
         t_select=0.0) -> dict:
    """Byte-explicit RedSync cost (docs/sparse-models.md, RedSync R-5): with L = d N selected
    per rank and message S = 4 (1 + 2L) bytes (quantized: 4 (2 + L)),
    ``T = t_select + ceil(lg P) α + (P - 1) S β + P c_dec L``.
    Non-powers of two use ceil(lg P) (Bruck allgather, exact in steps and volume)."""
    check_params(workers, elements, density)
    P, N, d = workers, elements, float(density)
    L = d * N
    S = WORD_BYTES * ((2 + L) if quantized else (1 + 2 * L))
    latency = math.ceil(math.log2(P)) * alpha
    bandwidth = (P - 1) * S * beta
    return {"latency": latency, "bandwidth": bandwidth,
            "total": t_select + latency + bandwidth + P * c_dec * L, "message_bytes": S}


__all__ = ["RedSync", "pack", "unpack", "bruck_received", "cost"]
