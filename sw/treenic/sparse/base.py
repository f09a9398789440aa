"""Shared vocabulary of the sparse all-reduce golden models.

Sparse streams (docs/architecture.md §5) are ``(index uint32, value float32)`` pairs in strictly
ascending index order, held as two numpy arrays. A merge of two streams adds values of equal
index, left operand first. Byte accounting counts 4 bytes per index and 4 per value unless an
algorithm documents its own encoding (bitmaps, quantized values, dense blocks).

Every algorithm is a class with error-feedback state carried across iterations::

    algo = make("spardl", workers=P, elements=N, density=0.01, seed=0, **options)
    res = algo.step(grads)          # grads: (P, N) float32, one row per worker
    res.result                      # (P, N) float32: what each worker ends up with
    res.residuals                   # (P, N) float32: residuals after this iteration
    res.sent, res.received          # (steps, P) int64 bytes per step per worker

Mass conservation, where an algorithm has it, reads
``result[w] + residuals.sum(0) == grads.sum(0) + old_residuals.sum(0)`` (up to float32
rounding; tests compare against a float64 reference with a documented tolerance).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

INDEX_BYTES = 4
VALUE_BYTES = 4
PAIR_BYTES = INDEX_BYTES + VALUE_BYTES


class SparseError(ValueError):
    """Bad parameters or inputs for a sparse algorithm."""


@dataclass
class SparseResult:
    algorithm: str
    result: np.ndarray            # (P, N) float32
    residuals: np.ndarray         # (P, N) float32
    sent: np.ndarray              # (steps, P) int64
    received: np.ndarray          # (steps, P) int64
    info: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.sent.shape[0])

    def bytes_sent_per_worker(self) -> np.ndarray:
        return self.sent.sum(axis=0)

    def bytes_received_per_worker(self) -> np.ndarray:
        return self.received.sum(axis=0)


class TrafficLog:
    """Accumulates per-step, per-worker byte counts: ``log.step()`` opens a step,
    ``log.send(src, dst, nbytes)`` charges the sender and the receiver."""

    def __init__(self, workers: int):
        self.workers = workers
        self._sent: list[np.ndarray] = []
        self._recv: list[np.ndarray] = []

    def step(self) -> None:
        self._sent.append(np.zeros(self.workers, np.int64))
        self._recv.append(np.zeros(self.workers, np.int64))

    def send(self, src: int, dst: int, nbytes: int) -> None:
        if not self._sent:
            self.step()
        self._sent[-1][src] += nbytes
        self._recv[-1][dst] += nbytes

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._sent:
            z = np.zeros((0, self.workers), np.int64)
            return z, z.copy()
        return np.stack(self._sent), np.stack(self._recv)


# ---- sparse streams -------------------------------------------------------------------

def to_stream(dense: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (index, value) stream of ``dense`` at ``indices`` (sorted ascending)."""
    idx = np.unique(np.asarray(indices, dtype=np.int64)).astype(np.uint32)
    return idx, np.asarray(dense, dtype=np.float32)[idx]


def merge_add(a_idx, a_val, b_idx, b_val) -> tuple[np.ndarray, np.ndarray]:
    """Merge two ascending streams, adding values of equal index (a's value first)."""
    idx = np.union1d(a_idx, b_idx).astype(np.uint32)
    val = np.zeros(idx.shape, np.float32)
    ia = np.searchsorted(idx, a_idx)
    ib = np.searchsorted(idx, b_idx)
    val[ia] = a_val
    val[ib] = val[ib] + np.asarray(b_val, np.float32)   # float32 add, left operand first
    return idx, val


def scatter_accumulate(dense, messages) -> tuple[np.ndarray, list[tuple[int, np.float32]]]:
    """Golden of the scatter-accumulate unit: add each message's (index, value) pairs into a
    copy of the float32 ``dense`` buffer, ``buf[i] = fl32(buf[i] + v)`` -- the buffer's value
    is the left operand (local value first) and messages are applied in the given order,
    i.e. ascending (step, rx_port), the receive rule of ``multitree_sparse``. Returns the new
    buffer and the sequence of (index, written value) in application order. Indices must be
    in range; within a message they are ascending (each appears at most once)."""
    buf = np.array(dense, dtype=np.float32, copy=True)
    writes = []
    for idx, val in messages:
        idx = np.asarray(idx, np.int64)
        val = np.asarray(val, np.float32)
        if idx.size and (idx.min() < 0 or idx.max() >= buf.size):
            raise SparseError(f"scatter index out of range [0, {buf.size})")
        if np.any(np.diff(idx) <= 0):
            raise SparseError("scatter message indices must be strictly ascending")
        with np.errstate(over="ignore", invalid="ignore"):
            buf[idx] = buf[idx] + val
        writes += list(zip(idx.tolist(), buf[idx].tolist()))
    return buf, writes


def message_fits(idx, *, lo: int, n: int, k: int) -> bool:
    """A received pair message is well formed: at most ``k`` pairs (its budget), every index
    in its flow ``[lo, lo + n)``, strictly ascending -- what every sender emits."""
    idx = np.asarray(idx, np.int64)
    return bool(idx.size <= k and np.all((idx >= lo) & (idx < lo + n)) and
                np.all(np.diff(idx) > 0))


def receive_message(dense, idx, val, *, lo: int, n: int, k: int, intact: bool = True):
    """Golden of the sparse engine's receive rule (a RECV row): a well-formed message
    (:func:`message_fits`) is scatter-accumulated (:func:`scatter_accumulate`); a malformed
    one -- or one whose framing was not ``intact`` (a tail count that disagrees, a flit
    type a sparse message never has, a cut-short codec message) -- contributes nothing.
    Returns (the new buffer, whether the message was taken)."""
    if not intact or not message_fits(idx, lo=lo, n=n, k=k):
        return np.array(dense, dtype=np.float32, copy=True), False
    return scatter_accumulate(dense, [(idx, val)])[0], True


def densify(idx, val, elements: int) -> np.ndarray:
    out = np.zeros(elements, np.float32)
    out[np.asarray(idx, np.int64)] = val
    return out


def check_params(workers: int, elements: int, density: float) -> int:
    """Validate common parameters; returns k = max(1, round(density * elements))."""
    if not isinstance(workers, (int, np.integer)) or workers < 2:
        raise SparseError(f"need at least 2 workers, got {workers}")
    if not isinstance(elements, (int, np.integer)) or elements < 1:
        raise SparseError(f"need at least 1 element, got {elements}")
    if not (0.0 < float(density) <= 1.0):
        raise SparseError(f"density must be in (0, 1], got {density}")
    k = int(round(float(density) * elements))
    if k == 0:
        raise SparseError(f"density {density} selects k = 0 of {elements} elements")
    return k


def check_grads(grads: np.ndarray, workers: int, elements: int) -> np.ndarray:
    g = np.asarray(grads)
    if g.shape != (workers, elements):
        raise SparseError(f"gradients must have shape ({workers}, {elements}), got {g.shape}")
    if g.dtype != np.float32:
        raise SparseError(f"gradients must be float32, got {g.dtype}")
    return g


# ---- registry -------------------------------------------------------------------------
# name -> "module:Class"; modules import lazily so one broken algorithm cannot hide the rest.
REGISTRY: dict[str, str] = {
    "topka": "treenic.sparse.topk_family:TopkA",
    "topkdsa": "treenic.sparse.topk_family:TopkDSA",
    "gtopk": "treenic.sparse.topk_family:GTopk",
    "oktopk": "treenic.sparse.oktopk:OkTopk",
    "spardl": "treenic.sparse.spardl:SparDL",
    "zen": "treenic.sparse.zen:Zen",
    "sparcml": "treenic.sparse.sparcml:SparCML",
    "omnireduce": "treenic.sparse.omnireduce:OmniReduce",
    "redsync": "treenic.sparse.redsync:RedSync",
    "multitree-sparse": "treenic.sparse.multitree_sparse:MultiTreeSparse",
}


def make(name: str, **kwargs):
    if name not in REGISTRY:
        raise SparseError(f"unknown sparse algorithm {name!r}; known: {', '.join(REGISTRY)}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)
