"""The sparse program of a NIC: MultiTree-Sparse as a per-node list of table rows.

One compiler from the golden model's own plan (:class:`treenic.sparse.multitree_sparse.
MultiTreeSparse`: its :class:`TreePlan`, flow bounds and budgets) to the rows the sparse
engine (:mod:`treenic.hdl.nic.sparse_engine`) executes in order. Per node:

* reduce step s: first every SEND of step s (select the top-kb of the flow's partial, send
  the pairs on the port towards the parent, zero them locally), then every RECV of step s
  in the IR's transfer order (scatter-accumulate the child's pairs) -- the order the golden
  adds contributions in;
* one ROOT row per flow the node is the root of (select the final block into the flow's
  final-pair slot; the unselected rest stays as the residual);
* gather step s: GSEND rows (copy a final block to a port), then GRECV rows;
* END.

Row layout (96 bits, LSB first): op 3, step 8, chunk 8, port 4, lo 24, n 24, k 24.
``SPARSE_TABLE_VERSION`` versions this layout; :func:`unpack_row` rejects an op code it
does not know.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SparseOp", "ROW_FIELDS", "ROW_BITS", "SPARSE_TABLE_VERSION", "SparseProgram",
           "pack_row", "unpack_row", "compile_sparse", "SparseTableError"]

SPARSE_TABLE_VERSION = 1


class SparseTableError(ValueError):
    """A sparse program that cannot be built or a row that cannot be decoded."""


class SparseOp(enum.IntEnum):
    END = 0      # program finished
    SEND = 1     # select top-k of part[lo:lo+n], send the pairs on port, zero them locally
    RECV = 2     # pop one pair message from port, scatter-accumulate it into part
    ROOT = 3     # select top-k of part[lo:lo+n] into the final-pair slot of chunk
    GSEND = 4    # send the final-pair slot of chunk on port
    GRECV = 5    # pop one pair message from port into the final-pair slot of chunk


ROW_FIELDS = (("op", 3), ("step", 8), ("chunk", 8), ("port", 4), ("lo", 24), ("n", 24),
              ("k", 24))
ROW_BITS = 96


def pack_row(**fields) -> int:
    word, pos = 0, 0
    for name, width in ROW_FIELDS:
        v = int(fields.get(name, 0))
        if not 0 <= v < 1 << width:
            raise SparseTableError(f"sparse row field {name}={v} does not fit {width} bits")
        word |= v << pos
        pos += width
    return word


def unpack_row(word: int) -> dict:
    out, pos = {}, 0
    for name, width in ROW_FIELDS:
        out[name] = (word >> pos) & ((1 << width) - 1)
        pos += width
    if out["op"] not in SparseOp._value2member_map_:
        raise SparseTableError(f"sparse row op code {out['op']} is not a SparseOp")
    out["op"] = SparseOp(out["op"])
    return out


@dataclass
class SparseProgram:
    """Rows per node and the sizes the engine must be built for."""
    topology: str
    elements: int
    rows: list[list[int]]
    chunks: int
    max_flow: int          # largest flow (elements): top-k chunk size
    max_k: int             # largest budget: final-pair slot size
    rx_flits: int          # most flits any (node, port) receives in one run
    ports: int
    kb: list[int] = field(default_factory=list)
    link_pairs: int = 0    # pair flits every link carries together at full budgets
    perm: list[int] | None = None   # hash flows: buffer position -> element index
    ideal_cycles: int = 0  # sum over steps of the most-loaded directed link's flits at
    #                        full budgets (head + kb pairs + tail per message)


def _port_map(topology) -> dict[tuple[int, int], tuple[int, int]]:
    """(u, v) -> (u's port, v's port) of the link u -> v the program uses (the first one
    where a pair of nodes has several, as torus:2xN's wrap-around)."""
    from treenic.hdl.nic.fabric import wiring_plan
    out = {}
    for u, pu, v, pv in wiring_plan(topology):
        out.setdefault((u, v), (pu, pv))
    return out


def compile_sparse(model) -> SparseProgram:
    """The sparse program of a built ``MultiTreeSparse`` model. Hash flows (Zen's h0) are
    the golden's own permuted space: buffer position j holds element ``perm[j]``, so every
    flow is contiguous in the buffer and ascending positions are ascending indices."""
    plan, sched = model.plan, model.schedule
    if model.options["residual"] != "local":
        raise SparseTableError("the sparse engine keeps residual='local' only")
    topo = sched.topology
    port = _port_map(topo)
    off, kb = model.offsets, model.kb
    if int(np.diff(off).min()) < 1:
        raise SparseTableError(f"{model.elements} elements give an empty flow over "
                               f"{sched.num_chunks} flows; need at least one per flow")
    P = model.workers
    rows: list[list[int]] = [[] for _ in range(P)]
    rx = {}

    def row(op, step, c, p=0):
        return pack_row(op=op, step=step, chunk=c, port=p, lo=off[c], n=off[c + 1] - off[c],
                        k=kb[c])

    link_pairs, ideal = 0, 0
    phases = [(SparseOp.SEND, SparseOp.RECV, plan.reduce, 1),
              (SparseOp.GSEND, SparseOp.GRECV, plan.gather, len(plan.reduce) + 1)]
    for send_op, recv_op, steps, first in phases:
        if send_op == SparseOp.GSEND:
            for c, r in enumerate(plan.roots):
                rows[r].append(row(SparseOp.ROOT, 0, c))
        for s, trans in enumerate(steps, start=first):
            load: dict[tuple[int, int], int] = {}
            for src, dst, c in trans:
                load[(src, dst)] = load.get((src, dst), 0) + int(kb[c]) + 2
            ideal += max(load.values(), default=0)
            for src, dst, c in trans:
                rows[src].append(row(send_op, s, c, port[(src, dst)][0]))
                link_pairs += int(kb[c])
            for src, dst, c in trans:
                q = port[(src, dst)][1]
                rows[dst].append(row(recv_op, s, c, q))
                rx[(dst, q)] = rx.get((dst, q), 0) + int(kb[c]) + 2
    for r in rows:
        r.append(pack_row(op=SparseOp.END))
    ports = max(p.index for u in topo.nodes for p in topo.ports(u)) + 1
    perm = None if model.perm is None else [int(i) for i in model.perm]
    return SparseProgram(topo.spec, model.elements, rows, sched.num_chunks,
                         int(np.diff(off).max()), int(kb.max()), max(rx.values(), default=1),
                         ports, [int(k) for k in kb], link_pairs, perm, ideal)
