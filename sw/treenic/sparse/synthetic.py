"""Synthetic sparse-gradient workloads (docs/sparse-models.md, Zen Z-4.5) reproducing the Zen
paper's characterisation without real models:

* :func:`zipf_embedding_grads` — natural sparsity of an embedding layer: ``rows`` x ``dim``
  table with rows ordered by token frequency; each worker's batch draws tokens from a
  truncated Zipf(s) law, and every touched row becomes a block of ``dim`` non-zero
  gradients. This gives skew (C3: low row ids are hot), overlap between workers (C1: popular
  rows are shared) and sub-linear densification (C2), fresh every call.
* :func:`tokens_for_density` — calibrates the tokens per worker to a target per-worker
  density (e.g. Table 1's 1.13 %, 2.80 %, 2.47 %).
* :func:`gaussian_shared_grads` — the sparsification case: i.i.d. Gaussian gradients with a
  component shared by all workers (so top-k selections overlap) and a per-layer scale.

All generators are deterministic functions of their ``seed`` and return float32 (P, N).
"""
from __future__ import annotations

import numpy as np

from .base import SparseError


def zipf_probabilities(rows: int, s: float) -> np.ndarray:
    """p(r) ∝ 1 / (r + 1)^s for row r = 0..rows-1 (row 0 is the most frequent)."""
    if rows < 1:
        raise SparseError(f"need at least one row, got {rows}")
    if s < 0:
        raise SparseError(f"Zipf exponent must be >= 0, got {s}")
    w = 1.0 / np.arange(1, rows + 1, dtype=np.float64) ** s
    return w / w.sum()


def expected_row_density(rows: int, tokens: int, s: float) -> float:
    """Expected fraction of rows touched by ``tokens`` independent draws:
    ``mean_r 1 - (1 - p_r)^tokens``."""
    p = zipf_probabilities(rows, s)
    return float(np.mean(-np.expm1(tokens * np.log1p(-np.minimum(p, 1 - 1e-16)))))


def tokens_for_density(rows: int, density: float, s: float = 1.1) -> int:
    """Smallest token count whose expected row density reaches ``density`` (bisection on the
    monotone :func:`expected_row_density`)."""
    if not (0 < density < 1):
        raise SparseError(f"density must be in (0, 1), got {density}")
    lo, hi = 0, 1
    while expected_row_density(rows, hi, s) < density:
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            raise SparseError("density not reachable")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if expected_row_density(rows, mid, s) < density:
            lo = mid
        else:
            hi = mid
    return hi


def zipf_embedding_grads(workers: int, rows: int, dim: int, tokens: int, *, s: float = 1.1,
                         seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """(workers, rows * dim) float32: worker w's gradient of an embedding table after a batch of
    ``tokens`` Zipf(s)-distributed tokens. A touched row r gets ``count_r * N(0, scale^2)``
    in each of its ``dim`` elements (a row seen c times accumulates c token gradients,
    approximated by scaling one draw); untouched rows are exactly 0. Element ``r * dim + c``
    is row r, column c (row-major, rows in frequency order)."""
    if workers < 1 or dim < 1 or tokens < 0:
        raise SparseError("workers and dim must be >= 1 and tokens >= 0")
    p = zipf_probabilities(rows, s)
    rng = np.random.default_rng(seed)
    out = np.zeros((workers, rows * dim), np.float32)
    for w in range(workers):
        counts = rng.multinomial(tokens, p)
        hot = np.flatnonzero(counts)
        vals = rng.standard_normal((hot.size, dim)) * (scale * counts[hot])[:, None]
        out[w].reshape(rows, dim)[hot] = vals.astype(np.float32)
    return out


def gaussian_shared_grads(workers: int, elements: int, *, shared: float = 0.5,
                          layers: int = 1, seed: int = 0) -> np.ndarray:
    """(workers, elements) float32 ``sqrt(shared) Z + sqrt(1 - shared) E_w``, times a per-layer
    scale 10^u (u uniform in [-2, 0]) over ``layers`` equal contiguous layers. ``Z`` is common to
    all workers, ``E_w`` private; ``shared`` in [0, 1] sets the correlation between workers
    and therefore the overlap of their top-k selections."""
    if not (0.0 <= shared <= 1.0):
        raise SparseError(f"shared must be in [0, 1], got {shared}")
    if layers < 1 or layers > elements:
        raise SparseError(f"layers must be in 1..elements, got {layers}")
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(elements, dtype=np.float32)
    private = rng.standard_normal((workers, elements), dtype=np.float32)
    g = np.float32(np.sqrt(shared)) * common + np.float32(np.sqrt(1 - shared)) * private
    bounds = np.linspace(0, elements, layers + 1).astype(np.int64)
    scales = 10.0 ** rng.uniform(-2, 0, layers)
    for (a, b), sc in zip(zip(bounds[:-1], bounds[1:]), scales):
        g[:, a:b] *= np.float32(sc)
    return g.astype(np.float32, copy=False)
