"""SparCML-style hierarchical centralization: sparse all-reduce by recursive doubling
(SSAR_Recursive_double; Renggli et al., SC '19, as characterised in the Zen paper's Def. 7,
Wang et al., OSDI '25; see docs/sparse-models.md, SparCML), with SparCML's sparse -> dense
switch.

Every worker ends with the full sum: in round i = 1..log2 P' rank r exchanges its current
accumulated vector with ``r XOR 2^(i-1)`` and both merge (sum values of equal index, union of
indices). The left operand of every merge is the vector of the lower-ranked group; because
binary32 addition is commutative both partners compute the bit-identical sum, so all ranks
hold the same vector after every round.

Message format: COO (4 B index + 4 B value per non-zero, ascending index) while the vector is
sparse; dense (4 B per element) once its non-zero count exceeds ``switch_density * N``. The
default break-even ``switch_density = 4 / 8 = 0.5`` is where COO bytes equal dense bytes. A
vector that switched stays dense (its support only grows).

Non-powers of two: P' = 2^floor(log2 P) core ranks. Each excess rank r >= P' first sends its
vector to r - P' (which merges own + excess), the core runs the log2 P' rounds, and finally
core rank r - P' sends the result back to r: floor(log2 P) + 2 steps (the standard fold,
docs/sparse-models.md, Zen Z-A19).
"""
from __future__ import annotations

import math

import numpy as np

from .base import (PAIR_BYTES, VALUE_BYTES, SparseError, SparseResult, TrafficLog,
                   check_params)
from .ef import (accumulate, check_flag, check_select_mode, mask_residuals, mass_conserved,
                 read_only, select_rows, union_density)


class _Vec:
    """An accumulated vector: COO (idx ascending, val) or dense."""
    __slots__ = ("idx", "val", "dense")

    def __init__(self, idx=None, val=None, dense=None):
        self.idx, self.val, self.dense = idx, val, dense

    @property
    def is_dense(self) -> bool:
        return self.dense is not None

    def nbytes(self, elements: int) -> int:
        return VALUE_BYTES * elements if self.is_dense else PAIR_BYTES * self.idx.size

    def to_dense(self, elements: int) -> np.ndarray:
        if self.is_dense:
            return self.dense
        out = np.zeros(elements, np.float32)
        out[self.idx] = self.val
        return out


def merge_sorted(a_idx, a_val, b_idx, b_val) -> tuple[np.ndarray, np.ndarray]:
    """Merge two ascending, duplicate-free streams, adding values of equal index with the
    left (a) operand first — the semantics of :func:`treenic.sparse.base.merge_add`,
    computed by a stable sort of the concatenation (two sorted runs: linear for timsort),
    the way a two-input merge unit walks both streams."""
    idx = np.concatenate([np.asarray(a_idx, np.int64), np.asarray(b_idx, np.int64)])
    val = np.concatenate([np.asarray(a_val, np.float32), np.asarray(b_val, np.float32)])
    order = np.argsort(idx, kind="stable")           # on equal index a's entry comes first
    idx, val = idx[order], val[order]
    first = np.ones(idx.size, bool)
    first[1:] = idx[1:] != idx[:-1]
    out_idx, out_val = idx[first], val[first]
    repeat = np.flatnonzero(~first)                  # b's entry right after a's equal index
    slot = np.cumsum(first)[repeat] - 1
    out_val[slot] = out_val[slot] + val[repeat]
    return out_idx, out_val


def _merge(left: _Vec, right: _Vec, elements: int, switch_at: float) -> _Vec:
    """left + right (left operand first), switching to dense above ``switch_at`` non-zeros."""
    if not left.is_dense and not right.is_dense:
        idx, val = merge_sorted(left.idx, left.val, right.idx, right.val)
        if idx.size <= switch_at:
            return _Vec(idx.astype(np.int64), val)
        return _Vec(dense=_Vec(idx.astype(np.int64), val).to_dense(elements))
    if right.is_dense:
        return _Vec(dense=left.to_dense(elements) + right.dense)
    out = left.dense.copy()
    out[right.idx] = out[right.idx] + right.val
    return _Vec(dense=out)


class SparCML:
    """SparCML sparse all-reduce (recursive doubling, incremental aggregation, dense switch).

    Per step: ``V_w = residual_w + g_w``; select (``topk``: exact top-k by magnitude, ties by
    ascending index; ``nonzero``: lossless); residual = V with the selection zeroed; all-reduce
    the selected (index, value) streams as described in the module docstring.
    ``sent``/``received`` have one row per communication step (rounds, plus fold-in/fold-out
    for non-powers of two). Options: ``select``, ``dense_switch`` (default True),
    ``switch_density`` (default 0.5, the COO/dense break-even), ``check_invariants`` (False
    skips the full-size mass check). ``result`` and ``residuals`` are read-only views.
    ``info["invariants"]``: mass conservation, support = union of selections (while sparse),
    every message in the cheaper-by-rule format.
    """

    name = "sparcml"

    def __init__(self, workers, elements, density, seed=0, *, select="topk", dense_switch=True,
                 switch_density=VALUE_BYTES / PAIR_BYTES, check_invariants=True):
        self.k = check_params(workers, elements, density)
        if not (0.0 < float(switch_density) <= 1.0):
            raise SparseError(f"switch_density must be in (0, 1], got {switch_density}")
        self.workers, self.elements, self.density = int(workers), int(elements), float(density)
        self.select = check_select_mode(select)
        self.dense_switch = bool(dense_switch)
        self.switch_density = float(switch_density)
        self.check_invariants = check_flag("check_invariants", check_invariants)
        self.residuals = np.zeros((workers, elements), np.float32)

    def step(self, grads) -> SparseResult:
        P, N = self.workers, self.elements
        old = self.residuals
        V = accumulate(old, grads, P, N)
        selections = select_rows(V, self.k, self.select)
        switch_at = self.switch_density * N if self.dense_switch else math.inf
        vec = []
        for w, sel in enumerate(selections):
            v = _Vec(sel.astype(np.int64), V[w, sel])
            vec.append(v if sel.size <= switch_at else _Vec(dense=v.to_dense(N)))
        log = TrafficLog(P)
        core = 1 << (P.bit_length() - 1)
        formats_ok = True

        def send(src, dst, v):
            nonlocal formats_ok
            nnz = int(np.count_nonzero(v.dense)) if v.is_dense else v.idx.size
            formats_ok &= v.is_dense or nnz <= switch_at
            log.send(src, dst, v.nbytes(N))

        if core < P:                                 # fold excess ranks into the core
            log.step()
            for r in range(core, P):
                send(r, r - core, vec[r])
                vec[r - core] = _merge(vec[r - core], vec[r], N, switch_at)
        dist = 1
        while dist < core:
            log.step()
            for r in range(core):
                partner = r ^ dist
                if r < partner:
                    send(r, partner, vec[r])
                    send(partner, r, vec[partner])
                    # both partners compute merge(lower, higher); binary32 addition is
                    # commutative, so their results are bit-identical: compute it once
                    merged = _merge(vec[r], vec[partner], N, switch_at)
                    vec[r] = vec[partner] = merged
            dist <<= 1
        if core < P:                                 # fold out
            log.step()
            for r in range(core, P):
                send(r - core, r, vec[r - core])
                vec[r] = vec[r - core]

        final = vec[0]
        result_row = final.to_dense(N)
        self.residuals = mask_residuals(V, selections, in_place=True)
        touched = np.zeros(N, bool)
        for sel in selections:
            touched[sel] = True
        invariants = {
            "support_is_union": bool(final.is_dense or np.array_equal(final.idx, np.flatnonzero(touched))),
            "message_formats": bool(formats_ok),
            "finite_result": bool(np.isfinite(result_row).all()),   # no float32 overflow
        }
        if self.check_invariants:
            invariants["mass_conservation"] = mass_conserved(grads, old, result_row, self.residuals)
        sent, received = log.arrays()
        info = {
            "k": self.k,
            "selected": [int(s.size) for s in selections],
            "aggregated_density": union_density(selections, N),
            "final_dense": final.is_dense,
            "core_ranks": core,
            "invariants": invariants,
        }
        return SparseResult(self.name, read_only(np.broadcast_to(result_row, (P, N))),
                            read_only(self.residuals), sent, received, info)


def cost(workers, elements, density, alpha, beta, *, dense_switch=True,
         switch_density=VALUE_BYTES / PAIR_BYTES, union_density=None) -> dict:
    """α–β time of one SparCML all-reduce, assuming independent random selections (no
    systematic overlap): the union of g workers' selections has density
    ``u(g) = 1 - (1 - d)^g``. Round i of the log2 P' core rounds sends one message of the
    2^(i-1)-worker union: ``min(8 u N, 4 N)`` bytes with the switch, ``8 u N`` without. Non-powers
    of two add a fold-in step (a single worker's 8 d N) and a fold-out step (the full union).
    Latency: one α per step. ``union_density(g)`` (a callable) replaces the independence
    assumption, e.g. ``lambda g: d`` for full overlap or ``lambda g: g * d`` for disjoint
    selections; it is Zen's Eq. 2 with ``d_G^g = union_density(g)``."""
    check_params(workers, elements, density)
    P, N, d = workers, elements, float(density)
    core = 1 << (P.bit_length() - 1)

    def msg(union_workers):
        u = (1 - (1 - d) ** union_workers) if union_density is None else float(union_density(union_workers))
        sparse = PAIR_BYTES * u * N
        return min(sparse, VALUE_BYTES * N) if dense_switch and u > switch_density else sparse

    rounds = [msg(1 << i) for i in range(core.bit_length() - 1)]
    steps = list(rounds)
    if core < P:
        steps = [msg(1)] + steps + [msg(P)]
    bandwidth_bytes = float(sum(steps))
    latency = len(steps) * alpha
    return {"latency": latency, "bandwidth": bandwidth_bytes * beta,
            "total": latency + bandwidth_bytes * beta, "steps": len(steps),
            "bytes_per_step": steps}
