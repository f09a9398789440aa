"""Helpers shared by the top-k family, Ok-Topk, SparDL and MultiTree-Sparse golden models.

* :func:`topk_1d` / :func:`topk_rows` — the project's one exact top-k
  (:func:`treenic.sparse.select.topk`), applied per vector / per row (ragged CSR result).
* :func:`bruck_steps` / :func:`log_bruck` — the Bruck all-gather pattern and its byte
  accounting (used for every all-gather, any group size).
* :class:`Cost` — α–β cost terms: ``rounds`` (α multiples) and received ``words`` (β
  multiples; one sparse entry = 2 words, index + value), with a [lo, hi] range.
* :func:`mass_invariant` — the conservation check
  ``out_sum + Σ_w R_w_new == Σ_w (g_w + R_w_old)`` against a float64 reference.
* :class:`ErrorFeedbackModel` — the skeleton of these models (parameter and option checks,
  residual state, :class:`~treenic.sparse.base.SparseResult` assembly, invariants).

Non-finite gradients are rejected before any state changes
(:class:`~treenic.sparse.base.SparseError`). A float32 overflow inside a model yields ±inf
as in hardware; a re-selection that meets it raises SparseError (the selection unit flags
non-finite input), and the failed step leaves the model's state untouched.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np

from .base import SparseError, SparseResult, TrafficLog, check_grads, check_params

F32_EPS = float(np.finfo(np.float32).eps)


# ---- exact top-k -------------------------------------------------------------------------
# The project has one top-k: treenic.sparse.select.topk (radix selection, the hardware form).
# Semantics: |v| descending, ties by ascending index, zeros never selected (a row with fewer
# than m nonzeros yields fewer than m entries), indices returned ascending, NaN/Inf rejected.

def topk_1d(v: np.ndarray, m: int) -> np.ndarray:
    """Sorted int64 indices of the exact top-m of a float32 vector (see above)."""
    from .select import topk
    if m < 1:
        raise SparseError(f"top-k budget must be >= 1, got {m}")
    return topk(np.ascontiguousarray(v, dtype=np.float32), int(m))


def topk_rows(values: np.ndarray, m) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise exact top-m of a 2-D float32 array as a ragged (CSR) selection:
    ``(ptr, idx)`` with row r's ascending column indices in ``idx[ptr[r]:ptr[r+1]]``.
    ``m`` is one budget for all rows or one per row."""
    values = np.asarray(values)
    if values.ndim != 2:
        raise SparseError(f"topk_rows needs a 2-D array, got shape {values.shape}")
    ms = np.broadcast_to(np.asarray(m, np.int64), (values.shape[0],))
    parts = [topk_1d(row, int(mi)) for row, mi in zip(values, ms)]
    ptr = np.zeros(len(parts) + 1, np.int64)
    ptr[1:] = np.cumsum([p.size for p in parts])
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return ptr, idx.astype(np.int64, copy=False)


def ragged_rows(ptr: np.ndarray) -> np.ndarray:
    """Row id of every entry of a CSR selection."""
    return np.repeat(np.arange(ptr.size - 1, dtype=np.int64), np.diff(ptr))


# ---- all-gather pattern ------------------------------------------------------------------

def bruck_steps(q: int) -> list[tuple[int, int]]:
    """Bruck all-gather in a group of ``q``: per step ``(gap, cnt)``. Member ``i`` sends the
    payloads of blocks ``i .. i+cnt-1`` (mod q) to ``i - gap`` and receives blocks
    ``i+gap .. i+gap+cnt-1`` from ``i + gap`` (the SparDL code's direction). After all
    ``ceil(log2 q)`` steps every member holds all q payloads."""
    out, gap = [], 1
    while gap < q:
        out.append((gap, min(gap, q - gap)))
        gap *= 2
    return out


def bruck_schedule(q: int) -> list[list[tuple[int, list[int], int, list[int]]]]:
    """Explicit Bruck schedule: ``[step][member] = (send_to, blocks_sent, recv_from,
    blocks_received)`` (0-indexed)."""
    return [[((i - gap) % q, [(i + b) % q for b in range(cnt)],
              (i + gap) % q, [(i + gap + b) % q for b in range(cnt)]) for i in range(q)]
            for gap, cnt in bruck_steps(q)]


def log_bruck(log: TrafficLog, groups: list[list[int]], payload_bytes: np.ndarray) -> int:
    """Charge a Bruck all-gather run in parallel in every group (global worker ids, member
    order = position in the list). ``payload_bytes[w]`` is worker w's own payload. Returns the
    number of steps (groups of equal size run in lockstep)."""
    q = len(groups[0])
    if any(len(g) != q for g in groups):
        raise SparseError("Bruck groups must have equal size")
    for gap, cnt in bruck_steps(q):
        log.step()
        for g in groups:
            for i, w in enumerate(g):
                nbytes = int(sum(payload_bytes[g[(i + b) % q]] for b in range(cnt)))
                log.send(w, g[(i - gap) % q], nbytes)
    return len(bruck_steps(q))


def log_bruck_payloads(log: TrafficLog, payload_bytes: np.ndarray) -> int:
    """Bruck all-gather among all workers of the log."""
    return log_bruck(log, [list(range(log.workers))], payload_bytes)


def log_binomial_bcast(log: TrafficLog, nbytes: int, root: int = 0) -> int:
    """Binomial-tree broadcast of ``nbytes`` from ``root``: ceil(log2 P) steps, any P."""
    p = log.workers
    dist, steps = 1, 0
    while dist < p:
        dist *= 2
    dist //= 2
    while dist >= 1:
        log.step()
        for rel in range(0, p, 2 * dist):
            if rel + dist < p:
                log.send((root + rel) % p, (root + rel + dist) % p, nbytes)
        dist //= 2
        steps += 1
    return steps


def ceil_log2(x: int) -> int:
    """ceil(log2 x) for integers x >= 1, exact (0 for x = 1)."""
    return 0 if x <= 1 else (int(x) - 1).bit_length()


# ---- cost terms --------------------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """α–β cost: ``rounds`` sequential message rounds (× α) and received ``words`` per worker
    (× β; a sparse entry is 2 words) as a range [words_lo, words_hi]."""
    rounds: float
    words_lo: float
    words_hi: float
    alpha: float = 1.0
    beta: float = 1.0

    @property
    def latency(self) -> float:
        return self.rounds * self.alpha

    @property
    def bandwidth(self) -> float:
        return self.words_lo * self.beta

    @property
    def bandwidth_max(self) -> float:
        return self.words_hi * self.beta

    @property
    def time(self) -> float:
        return self.latency + self.bandwidth

    @property
    def time_max(self) -> float:
        return self.latency + self.bandwidth_max

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "words": [self.words_lo, self.words_hi],
                "latency": self.latency, "bandwidth": [self.bandwidth, self.bandwidth_max],
                "time": [self.time, self.time_max]}


# ---- invariants --------------------------------------------------------------------------

def mass_invariant(out_sum: np.ndarray, new_res: np.ndarray, grads: np.ndarray,
                   old_res: np.ndarray, chunk: int = 1 << 15) -> tuple[bool, float]:
    """``out_sum + Σ R_new == Σ (g + R_old)`` element-wise, checked in float64 against the
    float32 rounding bound ``(2P + 8)·eps32·Σ_w(|g_w| + |R_old_w|)`` (every value in the
    models is a float32 sum of at most P + log2-depth inputs, each rounding at most eps/2
    relative). Column chunks keep the float64 partial sums in cache. Returns
    (holds, worst |defect| / bound)."""
    p, n = grads.shape
    ok, worst = True, 0.0
    tiny = np.finfo(np.float64).tiny
    for c in range(0, n, chunk):
        sl = slice(c, min(n, c + chunk))
        rhs = grads[:, sl].sum(axis=0, dtype=np.float64) + old_res[:, sl].sum(axis=0, dtype=np.float64)
        scale = (np.abs(grads[:, sl]).sum(axis=0, dtype=np.float64)
                 + np.abs(old_res[:, sl]).sum(axis=0, dtype=np.float64))
        bound = (2 * p + 8) * F32_EPS * scale
        lhs = out_sum[sl].astype(np.float64) + new_res[:, sl].sum(axis=0, dtype=np.float64)
        defect = np.abs(lhs - rhs)
        ok &= bool(np.all(defect <= bound))
        ratio = np.where(np.isfinite(defect), defect / np.maximum(bound, tiny), np.inf)
        worst = max(worst, float(np.max(ratio, initial=0.0)))
    return ok, worst


def check_options(name: str, options: dict, allowed: dict) -> dict:
    """Fill defaults, reject unknown option names and values outside ``allowed``:
    ``{name: (default, validator_or_choices)}``."""
    unknown = set(options) - set(allowed)
    if unknown:
        raise SparseError(f"{name}: unknown option(s) {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(allowed))}")
    out = {}
    for key, (default, check) in allowed.items():
        val = options.get(key, default)
        if isinstance(check, (tuple, list, set, frozenset)):
            if val not in check:
                raise SparseError(f"{name}: option {key}={val!r} not in {sorted(map(str, check))}")
        elif check is not None:
            msg = check(val)
            if msg:
                raise SparseError(f"{name}: option {key}={val!r}: {msg}")
        out[key] = val
    return out


# ---- error-feedback model skeleton -------------------------------------------------------

class ErrorFeedbackModel:
    """Common skeleton: parameter checks, residual state, result assembly and invariants.

    Subclasses set ``name``/``OPTIONS`` and implement ``_step(acc, log) -> (out_sum, new_res,
    info, invariants)`` where ``acc = grads + residuals`` (float32, P × N), ``out_sum`` is the
    non-averaged reduced vector every worker ends with, ``new_res`` the residuals for the next
    iteration. ``SparseResult.result`` rows are ``out_sum`` (or ``out_sum / P`` in float32 with
    option ``average=True``), returned as a read-only broadcast view (every worker of these
    models ends with the same vector); ``residuals`` is the model's state, also read-only. The mass invariant is added by this class when the subclass
    declares ``CONSERVES_MASS`` (or returns it from ``_conserves_mass()``)."""

    name = "?"
    OPTIONS: dict = {}
    CONSERVES_MASS = True
    STATE: tuple = ()        # attributes besides the residuals that a step updates

    def __init__(self, workers, elements, density, seed=0, **options):
        self.k = self._check_params(workers, elements, density)
        self.workers = int(workers)
        self.elements = int(elements)
        self.density = float(density)
        self.seed = seed
        allowed = {"average": (False, (False, True)), "check_invariants": (True, (False, True))}
        allowed.update(self.OPTIONS)
        self.options = check_options(self.name, options, allowed)
        self.iteration = 0
        self.residuals = np.zeros((self.workers, self.elements), np.float32)
        self._setup()

    @staticmethod
    def _check_params(workers, elements, density) -> int:
        return check_params(workers, elements, density)

    def _setup(self) -> None:
        pass

    def _conserves_mass(self) -> bool:
        return self.CONSERVES_MASS

    def step(self, grads) -> SparseResult:
        """One iteration on ``grads`` (P × N float32); updates the residual state."""
        g = check_grads(grads, self.workers, self.elements)
        if not np.isfinite(g).all():
            raise SparseError(f"{self.name}: gradients contain NaN or Inf")
        t0 = time.perf_counter()
        with np.errstate(over="ignore"):
            acc = g + self.residuals
        log = TrafficLog(self.workers)
        # float32 overflow to ±inf is IEEE, as in hardware (docs/architecture.md §5):
        # it shows up in the invariants, not as numpy warnings.
        saved = copy.deepcopy({a: getattr(self, a) for a in self.STATE})
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                out_sum, new_res, info, inv = self._step(acc, log)
        except Exception:
            for a, v in saved.items():          # a failed step changes nothing
                setattr(self, a, v)
            raise
        seconds = time.perf_counter() - t0
        inv = dict(inv)
        if self.options["check_invariants"] and self._conserves_mass():
            with np.errstate(over="ignore", invalid="ignore"):
                ok, worst = mass_invariant(out_sum, new_res, g, self.residuals)
            inv["mass_conservation"] = ok
            info["mass_defect_over_bound"] = worst
        out = out_sum / np.float32(self.workers) if self.options["average"] else out_sum
        out = out.astype(np.float32, copy=False)
        sent, recv = log.arrays()
        info.update(iteration=self.iteration, k=self.k, model_seconds=seconds,
                    invariants=inv)
        new_res.flags.writeable = False     # the model's state: callers get a read-only view
        self.residuals = new_res
        self.iteration += 1
        # Every worker provably ends with the same vector: rows are a read-only broadcast.
        return SparseResult(self.name, np.broadcast_to(out, (self.workers, self.elements)),
                            new_res, sent, recv, info)
