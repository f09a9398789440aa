"""Ok-Topk golden model (Li & Hoefler, PPoPP'22), as run by the SparDL paper's baselines
(the Ok-Topk authors' code; docs/sparse-models.md, Ok-Topk S-8.4).

Per iteration t (``acc_w = g_w + R_w``, k = max(1, round(density·N))):

1. **Local selection.** Every ``threshold_period`` iterations (t mod period = 0, so the first
   iteration too) the local threshold is recomputed exactly: S_w = exact top-k of acc_w (the
   project's one top-k: |v| desc, ties by ascending index, zeros never selected) and
   thr_loc = the smallest selected magnitude. Otherwise the previous thr_loc is reused after
   "add2residual": while ``#{|acc| > thr} > 1.5k`` (at most 5 times) thr ← 1.03·thr; then
   S_w = {i : |acc_w[i]| > thr} (strict, as in the code).
2. **Region repartition** every ``repartition_period`` iterations: each worker proposes the
   boundaries ``S_w[i·(|S_w| // P)]`` (i = 1..P−1; an equal split when |S_w| < P), the
   proposals are all-reduced and floor-averaged. Regions are contiguous; they stay fixed in
   between (the drift the SparDL paper criticises). Initial regions: equal split.
3. **Split and reduce**: direct sends, P − 1 rounds (round r: w → (w + r) mod P) of the
   selected pairs of region i to worker i, which sums them into zero in ascending source
   order.
4. Local threshold adaptation for the next iteration: ×1.092 when |S_w| > 5k/4, ÷1.092 when
   |S_w| < 3k/4.
5. **Global selection**: on a threshold iteration the nonzeros of all reduced regions are
   all-gathered, the exact global top-k G is taken and thr_glob = its smallest magnitude;
   otherwise every region owner keeps its reduced entries with |v| > thr_glob, those are
   all-gathered (G may exceed k: the SparDL paper's point (ii)), and thr_glob adapts
   (÷1.1 when |G| < 3k/4, ×1.008 when |G| > 5k/4).
6. Result: the reduced values at G. Residual: ``R_w = acc_w`` with zeros at S_w ∩ G.
   Regions are reduced without loss and a global pick takes the whole reduced value, so
   mass is conserved (invariant ``mass_conservation``).

The paper's balancing step before the final all-gather is commented out in the public code
and does not change values; it is not modelled. All-gathers are charged as Bruck (any P);
the repartition's all-reduce of P−1 int32 proposals is charged as a Bruck all-gather of
them. Options: ``threshold_period`` (default 32), ``repartition_period`` (default 64).
"""
from __future__ import annotations

import math

import numpy as np

from .base import INDEX_BYTES, PAIR_BYTES, check_params
from ._common import Cost, ErrorFeedbackModel, log_bruck_payloads, topk_1d


def _positive_int(v):
    return None if isinstance(v, (int, np.integer)) and v >= 1 else "must be an integer >= 1"


class OkTopk(ErrorFeedbackModel):
    """Ok-Topk (see module docstring)."""

    name = "oktopk"
    OPTIONS = {"threshold_period": (32, _positive_int),
               "repartition_period": (64, _positive_int)}
    STATE = ("thr_loc", "thr_glob", "bounds")

    def _setup(self):
        p, n = self.workers, self.elements
        self.thr_loc = np.zeros(p, np.float64)
        self.thr_glob = 0.0
        self.bounds = (np.arange(p + 1, dtype=np.int64) * n) // p

    def _repartition(self, sels, log) -> None:
        p, n = self.workers, self.elements
        props = np.zeros((p, p - 1), np.int64)
        for w, s in enumerate(sels):
            step = s.size // p
            props[w] = (s[np.arange(1, p) * step] if step > 0
                        else (np.arange(1, p, dtype=np.int64) * n) // p)
        inner = props.sum(axis=0) // p
        self.bounds = np.concatenate([[0], np.maximum.accumulate(inner), [n]]).astype(np.int64)
        log_bruck_payloads(log, np.full(p, (p - 1) * INDEX_BYTES, np.int64))

    def _step(self, acc, log):
        p, n, k, t = self.workers, self.elements, self.k, self.iteration
        exact = t % self.options["threshold_period"] == 0
        mag = np.abs(acc)
        sels = []
        for w in range(p):
            if exact:
                s = topk_1d(acc[w], k)
                self.thr_loc[w] = float(mag[w, s].min()) if s.size else 0.0
            else:
                thr = self.thr_loc[w]
                loops = 0
                while np.count_nonzero(mag[w] > thr) > 1.5 * k and loops < 5:
                    thr *= 1.03
                    loops += 1
                self.thr_loc[w] = thr
                s = np.flatnonzero(mag[w] > thr)
            sels.append(s)
        repartitioned = t % self.options["repartition_period"] == 0
        if repartitioned:
            self._repartition(sels, log)
        b = self.bounds

        # Split and reduce: region i's entries go to worker i, summed in ascending source order.
        counts = np.zeros((p, p), np.int64)
        red = np.zeros(n, np.float32)
        for w, s in enumerate(sels):
            counts[w] = np.bincount(np.searchsorted(b, s, side="right") - 1, minlength=p)[:p]
            red[s] += acc[w, s]
        for r in range(1, p):
            log.step()
            for w in range(p):
                log.send(w, (w + r) % p, int(counts[w, (w + r) % p]) * PAIR_BYTES)
        local = np.array([s.size for s in sels])
        self.thr_loc = np.where(local > 1.25 * k, self.thr_loc * 1.092,
                                np.where(local < 0.75 * k, self.thr_loc / 1.092, self.thr_loc))

        # Global selection.
        region_of = lambda idx: np.searchsorted(b, idx, side="right") - 1   # noqa: E731
        if exact:
            nz = np.flatnonzero(red)
            payload = np.bincount(region_of(nz), minlength=p)[:p] * PAIR_BYTES
            G = topk_1d(red, k)
            self.thr_glob = float(np.abs(red[G]).min()) if G.size else 0.0
        else:
            G = np.flatnonzero(np.abs(red) > self.thr_glob)
            payload = np.bincount(region_of(G), minlength=p)[:p] * PAIR_BYTES
            if G.size < 0.75 * k:
                self.thr_glob /= 1.1
            elif G.size > 1.25 * k:
                self.thr_glob *= 1.008
        log_bruck_payloads(log, payload.astype(np.int64))
        out = np.zeros(n, np.float32)
        out[G] = red[G]

        chosen = np.zeros(n, bool)
        chosen[G] = True
        new_res = acc.copy()
        for w, s in enumerate(sels):
            new_res[w, s[chosen[s]]] = 0
        loads = counts.sum(axis=0)
        info = {"exact_threshold_iteration": exact, "repartitioned": repartitioned,
                "global_selected": int(G.size), "local_selected": local.tolist(),
                "region_bounds": b.tolist(), "region_load_max": int(loads.max()),
                "region_load_mean": float(loads.mean()), "thr_glob": self.thr_glob}
        inv = {"regions_partition_index_space":
               bool(b[0] == 0 and b[-1] == n and np.all(np.diff(b) >= 0)),
               "global_exact_topk_le_k": (not exact) or G.size <= k}
        return out, new_res, info, inv

    @classmethod
    def cost(cls, workers, elements, density, alpha=1.0, beta=1.0) -> Cost:
        """Table I: 2(P + log P)·α; bandwidth in [2(P−1)/P·k, 6(P−1)/P·k]·β."""
        k = check_params(workers, elements, density)
        p = workers
        return Cost(2 * (p + math.log2(p)), 2 * (p - 1) / p * k, 6 * (p - 1) / p * k, alpha, beta)


def cost(workers, elements, density, alpha=1.0, beta=1.0) -> Cost:
    """Table I terms of Ok-Topk (see :meth:`OkTopk.cost`)."""
    return OkTopk.cost(workers, elements, density, alpha, beta)
