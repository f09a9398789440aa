"""MultiTree-Sparse: the co-designed sparse all-reduce the NIC runs (docs/architecture.md §3).

The schedule is the MultiTree schedule of the topology, taken from the Schedule IR
(``treenic.algorithms.build("multitree", topology)``): chunk c = flow c = the tree rooted at
node c; REDUCE transfers climb the reduce trees, GATHER transfers descend the gather trees.
This model never builds trees itself: any IR schedule whose reduce phase sends each
(node, chunk) at most once and never delivers a chunk to a node after that node has sent it
works (MultiTree, ring reduce-scatter/all-gather, ...).

Per iteration, on the error-feedback accumulator ``acc_w = g_w + R_w`` (float32):

1. **Flows.** Every element belongs to one flow. ``flow_assignment="contiguous"``: the IR's
   contiguous chunks (:meth:`Schedule.chunk_bounds`). ``"hash"``: Zen's first-level hash
   h0(i) = MurmurHash3_x86_32(i, seed) mod F (:func:`treenic.sparse.zen.partition_of`),
   balancing hot index ranges over the trees. Inside a flow, elements keep ascending index
   order. Flow c has budget ``kb_c = block_k`` or ``max(1, floor(density·|flow c|))``.
2. **Reduce with re-selection at every hop.** A node sending flow c to its parent first takes
   the exact block top-kb_c of its partial for c (the project's one top-k: |v| desc, ties by
   ascending index, zeros never selected) and sends those (index u32, value f32) pairs
   (8 bytes each); what it did not send stays with it (its discard ξ). A receiver adds the
   pairs into its dense partial: local value first, contributions in ascending
   (step, rx_port) order — the IR's transfer order, the same rule the RTL honours. Transfers
   of one step read the partials as they were at the end of the previous step.
   SparDL's cure for sparse gradient accumulation: every hop's message has ≤ kb_c entries,
   however many children were summed.
3. **Root.** The root of flow c takes top-kb_c of its full partial: the final block.
4. **Gather.** Final blocks are broadcast along the GATHER transfers unchanged; every node
   ends with all F final blocks (checked: invariant ``gather_complete``).
5. **Residuals.** ``residual="local"`` (default): every node keeps exactly what it discarded,
   R_w = ξ_w (values stay where they were dropped; no extra traffic). ``"global"``: SparDL's
   GRC — R_w = acc_w except at final indices, where R_w = ξ_w. Both conserve mass exactly
   (each message is received once): ``out + Σ R_new = Σ (g + R_old)``.

With ``density=1`` (kb_c = |flow c|) nothing is dropped and the result equals the dense
golden executor (:func:`treenic.schedule.execute.execute`) on the same schedule bit for bit.

Options: ``topology`` — any :func:`treenic.topology.parse` spec with P end nodes; default
``torus:XxY`` with X the largest divisor of P not above √P (``ring:P`` when P is prime);
``flow_assignment`` ("contiguous" | "hash"); ``residual`` ("local" | "global");
``block_k``; ``hash_seed`` (default: the model seed).
"""
from __future__ import annotations

import math

import numpy as np

from .base import PAIR_BYTES, SparseError, check_params
from ._common import Cost, ErrorFeedbackModel, topk_1d


def default_topology(workers: int) -> str:
    """``torus:XxY`` for the most square X·Y = P (X ≤ Y), ``ring:P`` when P is prime."""
    x = max(d for d in range(1, math.isqrt(workers) + 1) if workers % d == 0)
    return f"ring:{workers}" if x == 1 else f"torus:{x}x{workers // x}"


def build_schedule(workers: int, topology: str | None = None):
    """The MultiTree schedule for ``topology`` (default :func:`default_topology`)."""
    from .. import algorithms
    from ..topology import TopologyError, parse
    spec = topology or default_topology(workers)
    try:
        topo = parse(spec)
    except (TopologyError, ValueError) as e:
        raise SparseError(f"multitree-sparse: bad topology {spec!r}: {e}") from None
    if topo.n != workers:
        raise SparseError(f"multitree-sparse: topology {spec} has {topo.n} nodes, "
                          f"but workers={workers}")
    return algorithms.build("multitree", topo)


def hash_flows(elements: int, flows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Zen's hash flow assignment: ``(perm, offsets)`` -- buffer position -> element index
    (flows contiguous, indices ascending within a flow) and the ``flows + 1`` flow bounds in
    that order. The golden model and the configuration image's decoder
    (:mod:`treenic.firmware.image`, which stores only the seed) both call this."""
    from .zen import partition_of
    flow = partition_of(np.arange(elements, dtype=np.uint32), flows, int(seed))
    perm = np.argsort(flow, kind="stable")
    return perm, np.concatenate([[0], np.cumsum(np.bincount(flow, minlength=flows))])


class TreePlan:
    """What the model needs from a schedule: per reduce step the (src, dst, chunk) sends in
    IR order, the root of every chunk, per gather step the (src, dst, chunk) copies."""

    def __init__(self, schedule):
        from ..schedule.ir import Op
        self.schedule = schedule
        f = schedule.num_chunks
        self.reduce: list[list[tuple[int, int, int]]] = []
        self.gather: list[list[tuple[int, int, int]]] = []
        sent_at: dict[tuple[int, int], int] = {}
        by_step = schedule.by_step()
        for s in range(1, schedule.steps + 1):
            row = [(t.src, t.dst, c) for t in by_step[s] for c in t.chunks]
            if s <= schedule.reduce_steps:
                for src, dst, c in row:
                    if (src, c) in sent_at:
                        raise SparseError(f"schedule {schedule.algorithm}: node {src} sends "
                                          f"chunk {c} twice in the reduce phase")
                    sent_at[(src, c)] = s
                self.reduce.append(row)
            else:
                if any(t.op != Op.GATHER for t in by_step[s]):
                    raise SparseError("schedule: non-GATHER transfer in the gather phase")
                self.gather.append(row)
        for s, row in enumerate(self.reduce, start=1):
            for src, dst, c in row:
                if (dst, c) in sent_at and sent_at[(dst, c)] <= s:
                    raise SparseError(f"schedule {schedule.algorithm}: node {dst} receives "
                                      f"chunk {c} in step {s} after sending it")
        self.roots = []
        for c in range(f):
            roots = [v for v in range(schedule.n) if (v, c) not in sent_at]
            if len(roots) != 1:
                raise SparseError(f"schedule {schedule.algorithm}: chunk {c} has "
                                  f"{len(roots)} roots, need exactly one")
            self.roots.append(roots[0])


class MultiTreeSparse(ErrorFeedbackModel):
    """MultiTree-Sparse (see module docstring)."""

    name = "multitree-sparse"
    OPTIONS = {
        "topology": (None, lambda v: None if v is None or isinstance(v, str) else "must be a spec string"),
        "flow_assignment": ("contiguous", ("contiguous", "hash")),
        "residual": ("local", ("local", "global")),
        "block_k": (None, lambda v: None if v is None or (isinstance(v, (int, np.integer))
                                                         and v >= 1) else "must be >= 1"),
        "hash_seed": (None, lambda v: None if v is None or isinstance(v, (int, np.integer))
                      else "must be an integer"),
    }

    def _setup(self):
        o = self.options
        self.schedule = build_schedule(self.workers, o["topology"])
        self.plan = TreePlan(self.schedule)
        n, f = self.elements, self.schedule.num_chunks
        self.hash_seed = None
        if o["flow_assignment"] == "contiguous":
            self.perm = None
            self.offsets = self.schedule.chunk_bounds(n)
        else:
            seed = self.seed if o["hash_seed"] is None else o["hash_seed"]
            self.hash_seed = int(seed)
            self.perm, self.offsets = hash_flows(n, f, self.hash_seed)
        sizes = np.diff(self.offsets)
        kb = (np.full(f, o["block_k"]) if o["block_k"] is not None
              else np.maximum(1, np.floor(self.density * sizes).astype(np.int64)))
        self.kb = np.minimum(kb, np.maximum(sizes, 1)).astype(np.int64)
        self.flow_sizes = sizes

    def _step(self, acc, log):
        P, n = self.workers, self.elements
        off, kb = self.offsets, self.kb
        part = acc if self.perm is None else acc[:, self.perm]   # permuted space: flows contiguous
        Gc = part.copy() if self.options["residual"] == "global" else None
        entries_max = 0

        def select(node, c):
            lo, hi = off[c], off[c + 1]
            if hi == lo:
                return np.zeros(0, np.int64), np.zeros(0, np.float32)
            idx = topk_1d(part[node, lo:hi], int(kb[c])) + lo
            vals = part[node, idx]
            part[node, idx] = 0            # the unsent rest of the partial is this node's ξ
            return idx, vals

        for row in self.plan.reduce:
            log.step()
            msgs = [select(src, c) for src, _, c in row]        # end-of-previous-step values
            for (src, dst, c), (idx, vals) in zip(row, msgs):   # IR order: (dst, rx_port)
                part[dst, idx] += vals
                log.send(src, dst, idx.size * PAIR_BYTES)
                entries_max = max(entries_max, idx.size)
        finals = [select(self.plan.roots[c], c) for c in range(self.schedule.num_chunks)]

        have = np.zeros((P, len(finals)), bool)
        have[self.plan.roots, np.arange(len(finals))] = True
        gather_ok = True
        for row in self.plan.gather:
            log.step()
            snap = have.copy()
            for src, dst, c in row:
                gather_ok &= bool(snap[src, c])
                have[dst, c] = True
                log.send(src, dst, finals[c][0].size * PAIR_BYTES)
        gather_ok &= bool(have.all())

        out_p = np.zeros(n, np.float32)
        fin = np.concatenate([i for i, _ in finals]) if finals else np.zeros(0, np.int64)
        out_p[fin] = np.concatenate([v for _, v in finals])
        if Gc is not None:
            Gc[:, fin] = part[:, fin]
            part = Gc
        if self.perm is None:
            out, res = out_p, part
        else:
            out = np.empty(n, np.float32)
            out[self.perm] = out_p
            res = np.empty_like(part)
            res[:, self.perm] = part
        fin_sizes = np.array([i.size for i, _ in finals])
        info = {"topology": self.schedule.topology.spec, "schedule_steps": self.schedule.steps,
                "flow_assignment": self.options["flow_assignment"],
                "flow_sizes": [int(self.flow_sizes.min()), int(self.flow_sizes.max())],
                "final_entries": int(fin_sizes.sum())}
        inv = {"gather_complete": gather_ok,
               "message_entries_le_block_k": entries_max <= int(kb.max(initial=1)),
               "final_entries_le_block_k": bool(np.all(fin_sizes <= kb))}
        return out, res, info, inv

    @classmethod
    def cost(cls, workers, elements, density, alpha=1.0, beta=1.0, topology=None,
             flow_assignment="contiguous") -> Cost:
        """α–β terms read off the schedule: rounds = reduce + gather steps; words received
        per node = 2·(entries per message) × (messages received), with every message at its
        budget kb_c = max(1, floor(density·|flow|)) (contiguous flows). Range: [mean, max]
        over nodes (trees can give nodes unequal in-degree)."""
        check_params(workers, elements, density)
        sched = build_schedule(workers, topology)
        plan = TreePlan(sched)
        sizes = np.diff(sched.chunk_bounds(elements))
        kb = np.minimum(np.maximum(1, np.floor(density * sizes).astype(np.int64)), sizes)
        words = np.zeros(workers)
        for row in plan.reduce + plan.gather:
            for _, dst, c in row:
                words[dst] += 2 * kb[c]
        return Cost(sched.steps, float(words.mean()), float(words.max()), alpha, beta)


def cost(workers, elements, density, alpha=1.0, beta=1.0, topology=None) -> Cost:
    """α–β terms of MultiTree-Sparse on ``topology`` (see :meth:`MultiTreeSparse.cost`)."""
    return MultiTreeSparse.cost(workers, elements, density, alpha, beta, topology=topology)
