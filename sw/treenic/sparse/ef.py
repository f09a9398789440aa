"""Error-feedback bookkeeping shared by the sparse all-reduce golden models (Zen, SparCML,
OmniReduce, RedSync).

Per worker w and iteration: ``V_w = residual_w + grad_w`` (one float32 rounding per element),
a selection picks the indices that are communicated, and the new residual is ``V_w`` with the
selected entries set to exactly 0 (residual masking). Mass conservation then reads, per element,
``result + Σ_w new_residual_w == Σ_w grad_w + Σ_w old_residual_w`` up to float32 rounding.
"""
from __future__ import annotations

import numpy as np

from .base import SparseError, check_grads
from .select import magnitude_keys, radix_topk

SELECT_MODES = ("topk", "nonzero")
FLOAT32_ULP = 2.0 ** -23


def check_select_mode(mode: str) -> str:
    if mode not in SELECT_MODES:
        raise SparseError(f"select must be one of {SELECT_MODES}, got {mode!r}")
    return mode


def accumulate(residuals: np.ndarray, grads: np.ndarray, workers: int, elements: int) -> np.ndarray:
    """``V = residuals + grads`` in float32 (grads validated: shape (P, N), float32). Raises
    SparseError if V is not finite (NaN/Inf gradients, or float32 overflow of residual +
    gradient) before the caller changes any state."""
    g = check_grads(grads, workers, elements)
    with np.errstate(over="ignore", invalid="ignore"):     # detected and reported below
        V = residuals + g
    if not np.isfinite(V).all():
        bad = "gradients contain NaN or Inf" if not np.isfinite(g).all() else \
            "residual + gradient overflows float32"
        raise SparseError(bad)
    return V


def select_rows(V: np.ndarray, k: int, mode: str) -> list[np.ndarray]:
    """Per-worker selection, ascending indices: ``topk`` = exact top-k by magnitude (radix
    select, ties by ascending index, zeros never selected); ``nonzero`` = every non-zero
    (natural sparsity: the algorithm is then lossless)."""
    if mode == "nonzero":
        return [np.flatnonzero(row) for row in V]
    return [radix_topk(magnitude_keys(row), k).indices for row in V]


def mask_residuals(V: np.ndarray, selections: list[np.ndarray], in_place: bool = False) -> np.ndarray:
    """V with every worker's selected entries set to 0 (residual masking); ``in_place`` reuses
    V's storage (callers gather the sent values first)."""
    residuals = V if in_place else V.copy()
    for w, sel in enumerate(selections):
        residuals[w, sel] = 0.0
    return residuals


def mass_conserved(grads: np.ndarray, old_residuals: np.ndarray, result_row: np.ndarray,
                   new_residuals: np.ndarray) -> bool:
    """``result + Σ new_res == Σ grads + Σ old_res`` elementwise, within the float32 rounding the
    algorithm can commit: one rounding per worker in ``V = res + grad`` and at most P roundings
    in the reduction, each bounded by 2^-24 of the running magnitude ``Σ_w (|res_w| + |g_w|)``;
    the tolerance is twice that bound. Evaluated in float64."""
    P, N = grads.shape
    lhs = result_row.astype(np.float64)
    rhs = np.zeros(N, np.float64)
    scale = np.zeros(N, np.float64)
    for w in range(P):                       # row by row: float64 temporaries stay at N elements
        lhs += new_residuals[w]
        rhs += grads[w]
        rhs += old_residuals[w]
        scale += np.abs(grads[w])
        scale += np.abs(old_residuals[w])
    tol = (P + 1) * FLOAT32_ULP * scale
    return bool(np.all(np.abs(lhs - rhs) <= tol))


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view: results and residual states are handed out without copies (the
    models never write into an array after returning it; callers copy if they need to)."""
    v = a.view()
    v.flags.writeable = False
    return v


def check_flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SparseError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def union_density(selections: list[np.ndarray], elements: int) -> float:
    """Density of the union of the workers' selections (d_G^n of the Zen paper)."""
    if not selections:
        return 0.0
    touched = np.zeros(elements, bool)
    for sel in selections:
        touched[sel] = True
    return float(np.count_nonzero(touched)) / elements
