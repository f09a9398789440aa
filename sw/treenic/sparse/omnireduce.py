"""OmniReduce-style block-sparse aggregation (Fei et al., SIGCOMM '21, as characterised in
the Zen paper's §2.4, Wang et al., OSDI '25; see docs/sparse-models.md, OmniReduce).

Roles: every worker is also an aggregator (co-located, as in the Zen paper's comparison).
The tensor is cut into blocks of ``block`` consecutive elements (256 by default; the last
block may be short); the blocks are split evenly and contiguously over the P aggregators
(``np.array_split`` of the block list, so any P works). Per step:

1. Push (one-shot, point-to-point): worker w sends to aggregator j every block of j's range in
   which its sparsified vector has at least one non-zero — all ``block`` values, no per-element
   indices, plus ``block_id_bytes`` of metadata per block (the block id / OmniReduce's
   next-non-zero-block pointer; 0 to ignore it). Self-traffic is free.
2. The aggregator adds the received blocks in ascending worker rank (float32, starting from 0).
3. Pull: aggregator j sends every aggregated block with at least one non-zero to every other
   worker (same block format). Every worker ends with the same dense result.

Simplification against the real system: OmniReduce streams blocks in lock-step across
workers with per-slot flow control over RDMA/DPDK; only the bytes per block and the one-shot
aggregation are modelled here. The contiguous split inherits index skew (Zen C3): the hot
aggregator's ingress is reported in ``info["push_imbalance"]``.
"""
from __future__ import annotations

import numpy as np

from .base import VALUE_BYTES, SparseError, SparseResult, TrafficLog, check_params
from .ef import (accumulate, check_flag, check_select_mode, mask_residuals, mass_conserved,
                 read_only, select_rows, union_density)


def block_ranges(elements: int, workers: int, block: int) -> np.ndarray:
    """(P, 2) first and one-past-last block id owned by each aggregator."""
    nblocks = -(-elements // block)
    sizes = np.array([len(c) for c in np.array_split(np.arange(nblocks), workers)])
    ends = np.cumsum(sizes)
    return np.stack([ends - sizes, ends], axis=1)


class OmniReduce:
    """OmniReduce block-sparse all-reduce with error feedback.

    Per step: ``V_w = residual_w + g_w``; select (``topk``: exact top-k by magnitude, ties by
    ascending index; ``nonzero``: every non-zero, the lossless case); residual = V with the
    selection zeroed; then Push / aggregate / Pull as in the module docstring. Options:
    ``block`` (elements per block, default 256), ``block_id_bytes`` (default 4), ``select``,
    ``check_invariants`` (False skips the full-size mass check). ``result`` and ``residuals``
    are read-only views.
    ``info``: non-zero block counts, per-aggregator ingress, push imbalance (max / mean ingress),
    ``invariants`` (mass conservation, the blocks sent are exactly the non-zero blocks).
    """

    name = "omnireduce"

    def __init__(self, workers, elements, density, seed=0, *, block=256, block_id_bytes=4,
                 select="topk", check_invariants=True):
        self.k = check_params(workers, elements, density)
        if not isinstance(block, (int, np.integer)) or block < 1:
            raise SparseError(f"block must be a positive integer, got {block!r}")
        if not isinstance(block_id_bytes, (int, np.integer)) or block_id_bytes < 0:
            raise SparseError(f"block_id_bytes must be a non-negative integer, got {block_id_bytes!r}")
        self.workers, self.elements, self.density = int(workers), int(elements), float(density)
        self.block, self.block_id_bytes = int(block), int(block_id_bytes)
        self.select = check_select_mode(select)
        self.check_invariants = check_flag("check_invariants", check_invariants)
        self.residuals = np.zeros((workers, elements), np.float32)
        self.ranges = block_ranges(self.elements, self.workers, self.block)
        self.nblocks = int(self.ranges[-1, 1])
        self.block_len = np.full(self.nblocks, self.block, np.int64)
        self.block_len[-1] = self.elements - (self.nblocks - 1) * self.block
        self.owner = np.repeat(np.arange(self.workers), self.ranges[:, 1] - self.ranges[:, 0])

    def _block_bytes(self, blocks: np.ndarray) -> np.ndarray:
        return VALUE_BYTES * self.block_len[blocks] + self.block_id_bytes

    def step(self, grads) -> SparseResult:
        P, N, B = self.workers, self.elements, self.block
        old = self.residuals
        V = accumulate(old, grads, P, N)
        selections = select_rows(V, self.k, self.select)
        sparse = np.zeros((P, N), np.float32)          # what each worker contributes
        for w, sel in enumerate(selections):
            sparse[w, sel] = V[w, sel]
        log = TrafficLog(P)

        log.step()                                     # Push
        sent_blocks_nonzero = True
        nonzero_blocks = []
        padded = np.zeros(self.nblocks * B, np.float32)
        for w in range(P):
            blocks = np.unique(selections[w] // B)
            nonzero_blocks.append(blocks.size)
            padded[:N] = sparse[w]
            data_blocks = np.flatnonzero(padded.reshape(self.nblocks, B).any(axis=1))
            sent_blocks_nonzero &= bool(np.array_equal(blocks, data_blocks))
            dest = self.owner[blocks]
            nbytes = np.bincount(dest, weights=self._block_bytes(blocks), minlength=P).astype(np.int64)
            for j in np.flatnonzero(nbytes):
                if j != w:
                    log.send(w, int(j), int(nbytes[j]))
        ingress = log.arrays()[1][0].copy()

        result_row = np.zeros(N, np.float32)           # aggregators, ascending worker rank
        for w in range(P):
            result_row += sparse[w]

        log.step()                                     # Pull
        padded[:N] = result_row
        agg_nonzero = np.flatnonzero(padded.reshape(self.nblocks, B).any(axis=1))
        per_aggregator = np.bincount(self.owner[agg_nonzero],
                                     weights=self._block_bytes(agg_nonzero), minlength=P).astype(np.int64)
        for j in range(P):
            if per_aggregator[j]:
                for w in range(P):
                    if w != j:
                        log.send(j, w, int(per_aggregator[j]))

        self.residuals = mask_residuals(V, selections, in_place=True)
        sent, received = log.arrays()
        invariants = {
            "sent_blocks_are_nonzero_blocks": bool(sent_blocks_nonzero),
            "finite_result": bool(np.isfinite(result_row).all()),   # no float32 overflow
        }
        if self.check_invariants:
            invariants["mass_conservation"] = mass_conserved(grads, old, result_row, self.residuals)
        info = {
            "k": self.k,
            "selected": [int(s.size) for s in selections],
            "aggregated_density": union_density(selections, N),
            "nonzero_blocks": nonzero_blocks,
            "aggregated_nonzero_blocks": int(agg_nonzero.size),
            "blocks": self.nblocks,
            "aggregator_ingress": ingress,
            "push_imbalance": float(ingress.max() / ingress.mean()) if ingress.sum() else 0.0,
            "invariants": invariants,
        }
        return SparseResult(self.name, read_only(np.broadcast_to(result_row, (P, N))),
                            read_only(self.residuals), sent, received, info)


def cost(workers, elements, density, alpha, beta, *, block=256, block_id_bytes=4) -> dict:
    """α–β time of one OmniReduce all-reduce for independent uniformly random selections (no
    skew; skew only makes the hot aggregator worse). A worker's block is non-zero with
    probability ``f1 = 1 - (1 - d)^block``, an aggregated block with ``fP = 1 - (1 - d)^(block P)``.
    Push: the busiest port carries ``(P-1)/P · (N/block) · f1 · (4 block + id)`` bytes
    (each aggregator receives that from the others); Pull: ``(P-1)/P · (N/block) · fP ·
    (4 block + id)`` (each worker receives every other aggregator's blocks). Latency: two
    all-to-all phases of P - 1 messages, ``2 (P - 1) α``."""
    check_params(workers, elements, density)
    P, N, d = workers, elements, float(density)
    blocks = N / block
    per_block = VALUE_BYTES * block + block_id_bytes
    f1 = 1 - (1 - d) ** block
    fP = 1 - (1 - d) ** (block * P)
    push = (P - 1) / P * blocks * f1 * per_block
    pull = (P - 1) / P * blocks * fP * per_block
    latency = 2 * (P - 1) * alpha
    return {"latency": latency, "bandwidth": (push + pull) * beta,
            "total": latency + (push + pull) * beta, "push_bytes": push, "pull_bytes": pull}
