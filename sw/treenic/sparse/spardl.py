"""SparDL golden model (Zhao et al., arXiv:2304.00737v2; decisions in
docs/sparse-models.md, section SparDL).

One iteration, for P workers split into d contiguous teams of P' = P/d (worker w is team
t = w // P', local rank r = w % P'):

1. ``A_w = g_w + R_w`` zero-padded to P'·C, C = ceil(N / P'), viewed as P' contiguous blocks
   of C elements; ``Gc_w = copy(A_w)``.
2. **Spar-Reduce-Scatter** (SRS, §III-B) inside every team: bags B0 = {r},
   B_i = {r+2^(i-1) .. r+2^i-1} (i < l), B_l = {r+2^(l-1) .. r+P'-1}, l = ceil(log2 P');
   at step s = 1..l worker r sends bag B_{l-s+1} to r + 2^(l-s) and adds the bag received
   from r − 2^(l-s) into its own dense copies of those blocks (``A[dst][b][idx] += val``,
   receiver's value first). Block top-kb (the project's one top-k,
   :func:`treenic.sparse.select.topk`: |v| desc, ties by ascending index, zeros never
   selected) is applied

   * ``timing="lazy"`` (default; Algorithm 1 and the authors' code): to each bag right
     before it is sent, and to the preservation block after the last step — every block is
     sparsified exactly once;
   * ``timing="eager"`` (the first description of §III-B): to every block before step 1 and
     to every block still held after each step.

   The preservation block's final selection is top-kb (d = 1, R-SAG) or top-h (B-SAG).
3. **Spar-All-Gather** across teams among the d workers of equal local rank (d > 1):

   * ``sag="r"`` (R-SAG, d a power of two): recursive doubling, partner team t XOR 2^j;
     both sides form ``S = a + b`` (sparse union, IEEE addition is commutative so both get
     the same bits), keep top-L and credit ``share·(S − kept)`` to their discard record;
     ``rsag_share="exact"`` (1/2^(j+1), conserves mass) or ``"paper"`` (1/2).
   * ``sag="b"`` (B-SAG, any d): top-h blocks → loss-free Bruck among the d peers →
     coalesce in ascending team order → top-L when the union N_t exceeds L; the discard is
     credited ``/d`` (a no-op under GRC, kept for fidelity, ``bsag_credit``). h adapts with
     Algorithm 2 (:class:`HController`, one per local rank, code order: run, measure, adjust).
   * ``sag="auto"``: R-SAG when d is a power of two, else B-SAG.
4. **Bruck all-gather** of the final blocks inside every team (send to r − 2^s, receive from
   r + 2^s): every worker ends with all P' blocks.
5. **Global residual collection** (GRC, ``residual="global"``, default):
   ``R_w[b] = Gc_w[b]`` except at the final index set I_b, where ``R_w[b][I_b] = ξ_w[b][I_b]``
   (ξ_w = everything worker w discarded while sparsifying, including R-SAG/B-SAG credits).
   ``"partial"`` (PRES) and ``"local"`` (LRES) are the ablation variants of
   docs/sparse-models.md, SparDL S-5.5:
   S_w = ∪_b top-kb(Gc_w[b]); LRES zeroes S_w, PRES zeroes S_w ∩ I in Gc_w.

Numbers: float32 throughout; the result is the plain sum (``average=True`` divides by P).
Per-block budget ``kb = L = block_k`` or ``max(1, floor(density·C))``, ≤ C
(docs/sparse-models.md, SparDL S-D3).
Messages are COO (index u32, value f32) = 8 bytes per entry; an SRS bag is one message.
Any P ≥ 2 works for d = 1 (SRS and Bruck are non-recursive); with teams, d must divide P
(and be a power of two for R-SAG).

Mass conservation ``out + Σ R_new = Σ (g + R_old)`` holds for GRC with d = 1, B-SAG, and
R-SAG with the exact share (and the paper share when d ≤ 4); it is reported as invariant
``mass_conservation`` in those configurations.

Deviation from the analysis (docs/sparse-models.md, SparDL S-2 and S-D4): zeros are never
selected (the project's top-k), so a block with fewer than kb nonzeros sends fewer than kb
entries. The output is identical to the zeros-selected variant; byte counts can be smaller,
never larger.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import PAIR_BYTES, SparseError, check_params, merge_add
from ._common import (Cost, ErrorFeedbackModel, bruck_schedule, ceil_log2, log_bruck,
                      ragged_rows, topk_1d, topk_rows)

__all__ = ["SparDL", "HController", "srs_bags", "srs_schedule", "srs_holdings",
           "check_theorem1", "bruck_complete", "bruck_schedule", "paper_view", "cost"]


# ---- SRS schedule -------------------------------------------------------------------------

def srs_bags(w: int, p: int) -> list[list[int]]:
    """Bags [B0, B1, ..., Bl] of worker ``w`` in a team of ``p`` (block ids, 0-indexed)."""
    if p == 1:
        return [[w]]
    l = ceil_log2(p)
    e = p - 2 ** (l - 1)
    bags = [[w % p]] + [[(w + j) % p for j in range(2 ** (i - 1), 2 ** i)] for i in range(1, l)]
    bags.append([(w + j) % p for j in range(2 ** (l - 1), 2 ** (l - 1) + e)])
    return bags


@dataclass(frozen=True)
class SrsMove:
    """What one worker does in one SRS step."""
    step: int                 # 1..l
    delta: int                # 2^(l-step)
    bag: int                  # bag index sent, l-step+1
    send_blocks: tuple        # blocks of the bag sent
    target: int
    source: int
    recv_blocks: tuple        # blocks received (the first |bag| blocks still held)


def srs_schedule(p: int) -> list[list[SrsMove]]:
    """``[step-1][worker]`` → :class:`SrsMove` for a team of ``p`` workers (0-indexed)."""
    if p < 1:
        raise SparseError(f"team size must be >= 1, got {p}")
    l = ceil_log2(p)
    out = []
    for s in range(1, l + 1):
        delta = 2 ** (l - s)
        row = []
        for w in range(p):
            bag = srs_bags(w, p)[l - s + 1]
            row.append(SrsMove(s, delta, l - s + 1, tuple(bag), (w + delta) % p,
                               (w - delta) % p, tuple((w + j) % p for j in range(len(bag)))))
        out.append(row)
    return out


def srs_holdings(p: int) -> list[list[set]]:
    """Blocks each worker still holds after each SRS step (index 0: before step 1)."""
    held = [[set(range(p)) for _ in range(p)]]
    for row in srs_schedule(p):
        held.append([held[-1][w] - set(mv.send_blocks) for w, mv in enumerate(row)])
    return held


def check_theorem1(p: int) -> bool:
    """Paper Theorem 1: every received bag is a subset of what the receiver still holds, each
    worker sends every block but its own exactly once, and ends holding only its own block."""
    held = [set(range(p)) for _ in range(p)]
    sent = [[] for _ in range(p)]
    for row in srs_schedule(p):
        for w, mv in enumerate(row):
            if not set(mv.recv_blocks) <= held[w] - set(mv.send_blocks):
                return False
            if row[mv.source].send_blocks != mv.recv_blocks or row[mv.source].target != w:
                return False
        for w, mv in enumerate(row):
            held[w] -= set(mv.send_blocks)
            sent[w] += mv.send_blocks
    return all(held[w] == {w} and sorted(sent[w]) == sorted(set(range(p)) - {w})
               for w in range(p))


def paper_view(p: int) -> list[dict]:
    """The SRS schedule in the paper's 1-indexed numbering (workers and blocks 1..p):
    per worker, its bags and per step ``(send bag, to, from, received blocks)``."""
    out = []
    sched = srs_schedule(p)
    for w in range(p):
        out.append({
            "worker": w + 1,
            "bags": [[b + 1 for b in bag] for bag in srs_bags(w, p)],
            "steps": [{"send": [b + 1 for b in row[w].send_blocks], "to": row[w].target + 1,
                       "from": row[w].source + 1,
                       "receive": [b + 1 for b in row[w].recv_blocks]} for row in sched],
        })
    return out


def bruck_complete(q: int) -> bool:
    """Every member of a Bruck all-gather over ``q`` ends with all q blocks, each received
    once, and what it receives is exactly what the sender holds."""
    have = [{i} for i in range(q)]
    for row in bruck_schedule(q):
        new = [set(h) for h in have]
        for i, (to, sent, frm, recv) in enumerate(row):
            if not set(sent) <= have[i] or row[frm][0] != i or list(row[frm][1]) != recv:
                return False
            if set(recv) & have[i]:
                return False
            new[i] |= set(recv)
        have = new
    return all(h == set(range(q)) for h in have)


# ---- B-SAG h controller (Algorithm 2, integer form of the code) ---------------------------

class HController:
    """Algorithm 2 in the code's integer form and order (run B-SAG with h, measure N_t,
    adjust): ``cond = (N_t > L) XOR (step > 0)``; same direction → double the step on every
    second consecutive call; direction change → ``step = int(-0.5·step)`` (or ``-step`` when
    |step| ≤ 1); ``h = clamp(h + step, h_min, L)``.

    Deviations from the code (docs/sparse-models.md, SparDL S-6.3), both off with
    ``code_compatible=True``:
    ``step0 = max(1, (L − h_min) // 100)`` (the code's 0 freezes the controller) and the
    upper clamp h ≤ L. ``h_min = max(1, L // d)`` (the floor at 1 keeps top-h meaningful
    when L < d)."""

    def __init__(self, L: int, d: int, code_compatible: bool = False):
        if L < 1 or d < 1:
            raise SparseError(f"HController needs L >= 1 and d >= 1, got L={L}, d={d}")
        self.L, self.d, self.code_compatible = int(L), int(d), code_compatible
        self.h_min = max(1, self.L // self.d)
        self.h = self.h_min
        raw = (self.L - self.h_min) // 100
        self.step = raw if code_compatible else max(1, raw)
        self.flag = False

    def __repr__(self) -> str:
        return (f"HController(L={self.L}, d={self.d}, h={self.h}, step={self.step}, "
                f"flag={self.flag})")

    def update(self, n_t: int) -> int:
        """Feed the union size measured with the current h; returns the next h."""
        if (n_t > self.L) != (self.step > 0):
            if self.flag:
                self.step *= 2
                self.flag = False
            else:
                self.flag = True
        else:
            self.step = int(-0.5 * self.step) if abs(self.step) > 1 else -self.step
            self.flag = False
        h = max(self.h + self.step, self.h_min)
        self.h = h if self.code_compatible else min(h, self.L)
        return self.h


# ---- the model ----------------------------------------------------------------------------

def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


class SparDL(ErrorFeedbackModel):
    """SparDL (see module docstring). Options: ``teams`` (d, default 1), ``sag``
    ("auto" | "r" | "b"), ``timing`` ("lazy" | "eager"), ``rsag_share`` ("exact" | "paper"),
    ``residual`` ("global" | "partial" | "local"), ``block_k`` (kb override), ``bsag_credit``
    (bool), ``h_code_compatible`` (bool), ``average`` (bool), ``check_invariants`` (bool)."""

    name = "spardl"
    OPTIONS = {
        "teams": (1, lambda v: None if isinstance(v, (int, np.integer)) and v >= 1
                  else "must be an integer >= 1"),
        "sag": ("auto", ("auto", "r", "b")),
        "timing": ("lazy", ("lazy", "eager")),
        "rsag_share": ("exact", ("exact", "paper")),
        "residual": ("global", ("global", "partial", "local")),
        "block_k": (None, lambda v: None if v is None or (isinstance(v, (int, np.integer))
                                                         and v >= 1) else "must be >= 1"),
        "bsag_credit": (True, (False, True)),
        "h_code_compatible": (False, (False, True)),
    }
    STATE = ("h",)

    def _setup(self):
        o = self.options
        p, d = self.workers, int(o["teams"])
        if p % d:
            raise SparseError(f"spardl: teams={d} does not divide workers={p}")
        sag = o["sag"]
        if d == 1:
            sag = "none"
        elif sag == "auto":
            sag = "r" if _is_pow2(d) else "b"
        if sag == "r" and not _is_pow2(d):
            raise SparseError(f"spardl: R-SAG needs a power-of-two team count, got teams={d}")
        self.d, self.team_size, self.sag = d, p // d, sag
        self.C = -(-self.elements // self.team_size)
        kb = o["block_k"] if o["block_k"] is not None else max(1, int(self.density * self.C))
        self.kb = int(min(kb, self.C))
        self.h = [HController(self.kb, d, o["h_code_compatible"]) for _ in range(self.team_size)] \
            if sag == "b" else None
        self.schedule_ok = check_theorem1(self.team_size) and bruck_complete(self.team_size)

    def _conserves_mass(self) -> bool:
        o = self.options
        if o["residual"] != "global":
            return False
        return not (self.sag == "r" and o["rsag_share"] == "paper" and self.d > 4)

    # -- one iteration ------------------------------------------------------------------------
    def _step(self, acc, log):
        P, Pt, C, n, kb, d = self.workers, self.team_size, self.C, self.elements, self.kb, self.d
        eager = self.options["timing"] == "eager"
        padded = Pt * C
        if padded == n:
            A = acc.reshape(P, Pt, C)             # acc is ours (g + R): work in place
        else:
            A = np.zeros((P, Pt, C), np.float32)
            A.reshape(P, -1)[:, :n] = acc
        Gc = A.copy()
        # Lazy: A turns into ξ block by block (each block sparsified exactly once).
        # Eager: A holds kept/partial blocks and XI accumulates the discards.
        XI = np.zeros_like(A) if eager else None
        Aflat = A.reshape(-1)
        W = np.arange(P)
        r_of = W % Pt
        base = W - r_of
        final_k = np.full(P, kb, np.int64)
        if self.sag == "b":
            final_k = np.array([self.h[r].h for r in r_of], np.int64)
        srs_entries_max = 0

        def sparsify(ws, bs, m):
            """Top-m of blocks A[ws[i], bs[i]] (in place, no gather copy); returns the CSR
            selection (ptr, idx, vals) and records the discard ξ."""
            ms = np.broadcast_to(np.asarray(m, np.int64), ws.shape)
            parts, vparts = [], []
            for w, b, mi in zip(ws.tolist(), bs.tolist(), ms.tolist()):
                blk = A[w, b]                                  # contiguous view
                idx = topk_1d(blk, mi)
                vals = blk[idx]
                if eager:
                    disc = blk.copy()
                    disc[idx] = 0                              # before − kept (exact)
                    XI[w, b] += disc
                    blk[:] = 0
                    blk[idx] = vals
                else:
                    blk[idx] = 0                               # A[w, b] is now ξ[w, b]
                parts.append(idx)
                vparts.append(vals)
            ptr = np.zeros(len(parts) + 1, np.int64)
            ptr[1:] = np.cumsum([q.size for q in parts])
            idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            vals = np.concatenate(vparts) if vparts else np.zeros(0, np.float32)
            return ptr, idx, vals

        # ---- SRS --------------------------------------------------------------------------
        l = ceil_log2(Pt)
        if eager:
            allw = np.repeat(W, Pt)
            allb = np.tile(np.arange(Pt), P)
            sparsify(allw, allb, kb)
        for s in range(1, l + 1):
            delta = 2 ** (l - s)
            m = (Pt - 2 ** (l - 1)) if s == 1 else delta       # E for the last bag
            ws = np.repeat(W, m)
            js = np.tile(np.arange(m), P)
            bs = (r_of[ws] + delta + js) % Pt
            dst = base[ws] + (r_of[ws] + delta) % Pt
            if eager:
                X = A[ws, bs]
                rows, idx = np.nonzero(X)
                ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=ws.size))])
                vals = X[rows, idx]
                A[ws, bs] = 0                                 # sent: no longer held
            else:
                ptr, idx, vals = sparsify(ws, bs, kb)
                rows = ragged_rows(ptr)
            counts = np.diff(ptr)
            srs_entries_max = max(srs_entries_max, int(counts.max(initial=0)))
            Aflat[(dst[rows] * Pt + bs[rows]) * C + idx] += vals    # receiver first operand
            log.step()
            per_worker = np.bincount(ws, weights=counts, minlength=P).astype(np.int64)
            for w in range(P):
                log.send(w, int(base[w] + (r_of[w] + delta) % Pt), int(per_worker[w]) * PAIR_BYTES)
            if eager:
                hw = np.repeat(W, delta)
                hb = (r_of[hw] + np.tile(np.arange(delta), P)) % Pt
                sparsify(hw, hb, kb)
        # Preservation block: final top-kb (or top-h for B-SAG).
        if eager:
            if self.sag == "b" or l == 0:
                fptr, fidx, fval = sparsify(W, r_of, final_k)
            else:
                X = A[W, r_of]
                rows, fidx = np.nonzero(X)
                fptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=P))])
                fval = X[rows, fidx]
        else:
            fptr, fidx, fval = sparsify(W, r_of, final_k)
        held = [(fidx[fptr[w]:fptr[w + 1]].astype(np.uint32), fval[fptr[w]:fptr[w + 1]])
                for w in range(P)]
        xi = XI if eager else A

        # ---- SAG --------------------------------------------------------------------------
        info = {"teams": d, "team_size": Pt, "sag": self.sag, "block_k": kb,
                "timing": self.options["timing"]}
        if self.sag == "r":
            self._rsag(held, xi, log)
        elif self.sag == "b":
            info["h_used"] = [int(self.h[r].h) for r in range(Pt)]
            info["n_t"] = self._bsag(held, xi, log)
            info["h_next"] = [int(self.h[r].h) for r in range(Pt)]

        # ---- Bruck all-gather inside every team -------------------------------------------
        sizes = np.array([held[w][0].size for w in range(P)], np.int64)
        log_bruck(log, [list(range(t * Pt, (t + 1) * Pt)) for t in range(d)], sizes * PAIR_BYTES)
        # Every team's rank-r block is the same after SAG: team 0's copies are the result.
        out_p = np.zeros(padded, np.float32)
        fin_flat = np.concatenate([held[r][0].astype(np.int64) + r * C for r in range(Pt)])
        out_p[fin_flat] = np.concatenate([held[r][1] for r in range(Pt)])

        # ---- residuals ------------------------------------------------------------------------
        R = Gc.reshape(P, padded)
        mode = self.options["residual"]
        if mode == "global":
            R[:, fin_flat] = xi.reshape(P, padded)[:, fin_flat]
        else:
            sw = np.repeat(W, Pt)
            sb = np.tile(np.arange(Pt), P)
            sptr, sidx = topk_rows(Gc[sw, sb], kb)
            srow = ragged_rows(sptr)
            flat = sb[srow] * C + sidx
            wrow = sw[srow]
            if mode == "partial":
                in_final = np.zeros(padded, bool)
                in_final[fin_flat] = True
                keep = in_final[flat]
                wrow, flat = wrow[keep], flat[keep]
            R[wrow, flat] = 0
        new_res = R[:, :n] if padded == n else np.ascontiguousarray(R[:, :n])

        L_bound = kb
        inv = {
            "srs_schedule_theorem1_and_bruck": self.schedule_ok,
            "srs_message_entries_le_kb": srs_entries_max <= kb,
            "final_block_entries_le_L": bool(sizes.max(initial=0) <= L_bound),
            "output_nnz_le_teamsize_L": int(np.count_nonzero(out_p)) <= Pt * L_bound,
        }
        info["final_entries"] = int(fin_flat.size)
        return out_p[:n].copy(), new_res, info, inv

    def _rsag(self, held, xi, log):
        P, Pt, d, L = self.workers, self.team_size, self.d, self.kb
        paper = self.options["rsag_share"] == "paper"
        for j in range(ceil_log2(d)):
            share = np.float32(0.5 if paper else 1.0 / 2 ** (j + 1))
            log.step()
            for w in range(P):
                t, r = divmod(w, Pt)
                log.send(w, (t ^ (1 << j)) * Pt + r, held[w][0].size * PAIR_BYTES)
            new = list(held)
            for w in range(P):
                t, r = divmod(w, Pt)
                q = (t ^ (1 << j)) * Pt + r
                if q < w:
                    continue
                s_idx, s_val = merge_add(*held[w], *held[q])      # a + b == b + a (IEEE)
                keep = topk_1d(s_val, L)
                drop = np.ones(s_idx.size, bool)
                drop[keep] = False
                d_idx = s_idx[drop].astype(np.int64)
                d_val = s_val[drop] * share
                for v in (w, q):
                    xi[v, r, d_idx] += d_val
                    new[v] = (s_idx[keep], s_val[keep])
            held[:] = new

    def _bsag(self, held, xi, log):
        P, Pt, d, L = self.workers, self.team_size, self.d, self.kb
        groups = [[t * Pt + r for t in range(d)] for r in range(Pt)]
        sizes = np.array([held[w][0].size for w in range(P)], np.int64)
        log_bruck(log, groups, sizes * PAIR_BYTES)
        credit = self.options["bsag_credit"]
        n_t = []
        for r, group in enumerate(groups):
            u_idx, u_val = held[group[0]]
            for w in group[1:]:                                  # ascending team order
                u_idx, u_val = merge_add(u_idx, u_val, *held[w])
            n = int(u_idx.size)
            n_t.append(n)
            if n > L:
                keep = topk_1d(u_val, L)
                drop = np.ones(n, bool)
                drop[keep] = False
                if credit:
                    d_idx = u_idx[drop].astype(np.int64)
                    d_val = u_val[drop] / np.float32(d)
                    for w in group:
                        xi[w, r, d_idx] += d_val
                u_idx, u_val = u_idx[keep], u_val[keep]
            for w in group:
                held[w] = (u_idx, u_val)
            self.h[r].update(n)
        return n_t

    @classmethod
    def cost(cls, workers, elements, density, alpha=1.0, beta=1.0, teams=1, sag="auto",
             corrected=True) -> Cost:
        return cost(workers, elements, density, alpha, beta, teams=teams, sag=sag,
                    corrected=corrected)


# ---- α–β cost (Table I, Eqs. 2–10) ---------------------------------------------------------

def cost(workers, elements, density, alpha=1.0, beta=1.0, teams=1, sag="auto",
         corrected=True) -> Cost:
    """SparDL rows of Table I with ceil(log2 ·) round counts (the derivation's Eqs. 2–10),
    words received per worker (sparse entry = 2 words). B-SAG's bandwidth is a range; its
    lower bound is the corrected ``2k(dP + P − 2d)/(Pd)`` unless ``corrected=False`` (the
    printed ``2k(d² + P − 2d)/(Pd)``, which omits the SRS term; docs/sparse-models.md,
    SparDL S-9 erratum)."""
    k = check_params(workers, elements, density)
    p, d = workers, teams
    if d < 1 or p % d:
        raise SparseError(f"teams={d} must divide workers={p}")
    if d == 1:
        w = 4 * (p - 1) / p * k
        return Cost(2 * ceil_log2(p), w, w, alpha, beta)
    if sag == "auto":
        sag = "r" if _is_pow2(d) else "b"
    lat = 2 * ceil_log2(p // d)
    if sag == "r":
        if not _is_pow2(d):
            raise SparseError(f"R-SAG needs a power-of-two team count, got {d}")
        lg = ceil_log2(d)
        w = 2 * ((2 * p - 2 * d) / p + (d / p) * lg) * k
        return Cost(lat + lg, w, w, alpha, beta)
    if sag != "b":
        raise SparseError(f"sag must be 'r' or 'b', got {sag!r}")
    lo = (2 * (d * p + p - 2 * d) / (p * d) * k if corrected
          else 2 * (d * d + p - 2 * d) / (p * d) * k)
    hi = 2 * (d * d + 2 * p - 3 * d) / p * k
    return Cost(lat + ceil_log2(d), lo, hi, alpha, beta)
