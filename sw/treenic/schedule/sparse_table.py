"""The sparse program of a NIC: MultiTree-Sparse and TopkA as per-node lists of table rows.

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
* ``residual="global"`` (SparDL's GRC, as the golden defines it): the accumulator lives in
  ``part[N:2N]`` (the host adds its gradients there, ``residual_base = N``); a first COPY
  row copies it into the work region ``part[0:N]``, where the rows above run; after the
  gather, one FIXUP row per flow writes the node's own work value at every final index
  into ``part[N:2N]`` -- which is then the residual: the accumulator except at final
  indices, where it is what the node discarded;
* END.

TopkA (:func:`compile_topka`, the baseline of ``treenic.sparse.topk_family.TopkA``): every
node selects the exact top-k of its whole accumulator into the final slot of "its" gather
tree (ROOT over ``part[0:N]``, the selection zeroed locally: the local residual), the slots
travel down the MultiTree gather trees (GSEND/GRECV), and ACC rows add the P slots into the
result region ``part[N:2N]`` in ascending rank order -- the golden's summation order. ZERO
rows first clear what the previous run left there (the slots still name every index it
wrote), so the region is +0 at every run's first ACC.

Row layout (96 bits, LSB first): op 3, step 8, chunk 8, port 4, lo 24, n 24, k 24, op_hi 1
(op code bit 3; the pad bit of version 1, so a version-1 row decodes unchanged).
``SPARSE_TABLE_VERSION`` versions this layout; :func:`unpack_row` rejects an op code it
does not know.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SparseOp", "ROW_FIELDS", "ROW_BITS", "SPARSE_TABLE_VERSION", "SparseProgram",
           "pack_row", "unpack_row", "compile_sparse", "compile_topka", "SparseTableError",
           "SPARSE_ALGORITHMS", "sparse_model", "golden_model", "program_parameters",
           "program_golden"]

#: the sparse all-reduces the sparse engine runs (:func:`sparse_model` compiles them)
SPARSE_ALGORITHMS = ("multitree-sparse", "topka")

#: 2: op codes 6..9 (ACC, ZERO, FIXUP, COPY) with the op_hi bit; version-1 rows are valid
SPARSE_TABLE_VERSION = 2


class SparseTableError(ValueError):
    """A sparse program that cannot be built or a row that cannot be decoded."""


class SparseOp(enum.IntEnum):
    END = 0      # program finished
    SEND = 1     # select top-k of part[lo:lo+n], send the pairs on port, zero them locally
    RECV = 2     # pop one pair message from port, scatter-accumulate it into part
    ROOT = 3     # select top-k of part[lo:lo+n] into the final-pair slot of chunk
    GSEND = 4    # send the final-pair slot of chunk on port
    GRECV = 5    # pop one pair message from port into the final-pair slot of chunk
    ACC = 6      # part[lo + i] += v for every pair (i, v) of the final slot of chunk
    ZERO = 7     # part[lo + i] = +0 for every pair (i, v) of the final slot of chunk
    FIXUP = 8    # part[k + i] = part[lo + i] for every pair (i, v) of the final slot of chunk
    COPY = 9     # part[k + j] = part[lo + j] for j < n
    # the message rows again, with codec messages (``treenic.sparse.codec``: a header word,
    # then pairs or the flow's bitmap + values, whichever is smaller; two words a flit)
    SEND_BM = 10
    RECV_BM = 11
    GSEND_BM = 12
    GRECV_BM = 13


#: message row -> its codec-message twin
CODEC_OPS = {SparseOp.SEND: SparseOp.SEND_BM, SparseOp.RECV: SparseOp.RECV_BM,
             SparseOp.GSEND: SparseOp.GSEND_BM, SparseOp.GRECV: SparseOp.GRECV_BM}


def message_flits(count: int, chunk: int, codec: bool) -> int:
    """Link flits of one message of ``count`` pairs over a flow of ``chunk`` elements: head,
    body, tail. Pair messages: one pair a flit; codec messages: the golden codec's words
    (:func:`treenic.sparse.codec.message_words`, its decision rule), two a flit."""
    if not codec:
        return count + 2
    from treenic.sparse.codec import message_words
    return 2 + -(-message_words(count, chunk) // 2)


ROW_FIELDS = (("op", 3), ("step", 8), ("chunk", 8), ("port", 4), ("lo", 24), ("n", 24),
              ("k", 24), ("op_hi", 1))
ROW_BITS = 96


def pack_row(**fields) -> int:
    op = int(fields.get("op", 0))
    if not 0 <= op < 16:
        raise SparseTableError(f"sparse row op {op} does not fit 4 bits")
    fields = dict(fields, op=op & 7, op_hi=op >> 3)
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
    out["op"] |= out.pop("op_hi") << 3
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
    perm: list[int] | None = None   # hash flows: buffer position -> element index (the
    #                                 golden/model side; the host path sends element order)
    ideal_cycles: int = 0  # sum over steps of the most-loaded directed link's flits at
    #                        full budgets (head + kb pairs + tail per message)
    algorithm: str = "multitree-sparse"
    residual: str = "local"
    buffer_words: int = 0  # part words the rows address: N, or 2N with a second region
    result_base: int | None = None   # TopkA: the result region part[N:2N]; else the finals
    residual_base: int = 0  # where the accumulator / residual lives (global: N)
    codec: bool = False    # messages in the codec format (pairs or bitmap + values)
    link_flits: int = 0    # flits (head, body, tail) all links carry in a run at full budgets
    hash_seed: int | None = None   # hash flows: the seed ``perm`` is derived from
    density: float = 0.0   # the top-k density the budgets were derived from

    def __post_init__(self):
        self.buffer_words = self.buffer_words or self.elements

    @property
    def dump_words(self) -> int:
        """part words a DUMP streams: up to the residual's end, or TopkA's result region's."""
        return max(self.residual_base, self.result_base or 0) + self.elements


def _port_map(topology) -> dict[tuple[int, int], tuple[int, int]]:
    """(u, v) -> (u's port, v's port) of the link u -> v the program uses (the first one
    where a pair of nodes has several, as torus:2xN's wrap-around)."""
    from treenic.hdl.nic.fabric import wiring_plan
    out = {}
    for u, pu, v, pv in wiring_plan(topology):
        out.setdefault((u, v), (pu, pv))
    return out


def compile_sparse(model, *, codec: bool = False) -> SparseProgram:
    """The sparse program of a built ``MultiTreeSparse`` model. Hash flows (Zen's h0) are
    the golden's own permuted space: buffer position j holds element ``perm[j]``, so every
    flow is contiguous in the buffer and ascending positions are ascending indices (the
    engine's hash placer, ``treenic.hdl.nic.sparse_place``, puts them there from the rows'
    flow ranges and the program's ``hash_seed``)."""
    plan, sched = model.plan, model.schedule
    residual = model.options["residual"]
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
        op = CODEC_OPS.get(op, op) if codec else op
        return pack_row(op=op, step=step, chunk=c, port=p, lo=off[c], n=off[c + 1] - off[c],
                        k=kb[c])

    N = model.elements
    if residual == "global":                   # the accumulator part[N:2N] into part[0:N]
        for r in rows:
            r.append(pack_row(op=SparseOp.COPY, lo=N, n=N, k=0))
    link_pairs, ideal, link_flits = 0, 0, 0

    def flits(c):
        return message_flits(int(kb[c]), int(off[c + 1] - off[c]), codec)

    phases = [(SparseOp.SEND, SparseOp.RECV, plan.reduce, 1),
              (SparseOp.GSEND, SparseOp.GRECV, plan.gather, len(plan.reduce) + 1)]
    for send_op, recv_op, steps, first in phases:
        if send_op == SparseOp.GSEND:
            for c, r in enumerate(plan.roots):
                rows[r].append(row(SparseOp.ROOT, 0, c))
        for s, trans in enumerate(steps, start=first):
            load: dict[tuple[int, int], int] = {}
            for src, dst, c in trans:
                load[(src, dst)] = load.get((src, dst), 0) + flits(c)
            ideal += max(load.values(), default=0)
            for src, dst, c in trans:
                rows[src].append(row(send_op, s, c, port[(src, dst)][0]))
                link_pairs += int(kb[c])
                link_flits += flits(c)
            for src, dst, c in trans:
                q = port[(src, dst)][1]
                rows[dst].append(row(recv_op, s, c, q))
                rx[(dst, q)] = rx.get((dst, q), 0) + flits(c)
    for r in rows:
        if residual == "global":
            # final indices keep what the node discarded, the rest its accumulator
            r.extend(pack_row(op=SparseOp.FIXUP, chunk=c, lo=0, k=N)
                     for c in range(sched.num_chunks))
        r.append(pack_row(op=SparseOp.END))
    perm = None if model.perm is None else [int(i) for i in model.perm]
    return SparseProgram(topo.spec, model.elements, rows, sched.num_chunks,
                         int(np.diff(off).max()), int(kb.max()), max(rx.values(), default=1),
                         _ports(topo), [int(k) for k in kb], link_pairs, perm, ideal,
                         residual=residual, buffer_words=N * (2 if residual == "global" else 1),
                         residual_base=N if residual == "global" else 0,
                         codec=codec, link_flits=link_flits, hash_seed=model.hash_seed,
                         density=model.density)


def _ports(topo) -> int:
    return max(p.index for u in topo.nodes for p in topo.ports(u)) + 1


def rank_slots(plan, workers: int) -> list[int]:
    """TopkA: the gather tree (flow) that carries each node's selection -- the first flow
    the node is the root of."""
    slots = []
    for w in range(workers):
        mine = [c for c, r in enumerate(plan.roots) if r == w]
        if not mine:
            raise SparseTableError(f"topka: node {w} roots no gather tree of the schedule")
        slots.append(mine[0])
    return slots


def compile_topka(model, topology: str | None = None, *, codec: bool = False) -> SparseProgram:
    """The sparse program of a ``TopkA`` golden model on the MultiTree gather trees of
    ``topology`` (default: MultiTree-Sparse's default for the worker count); see the module
    docstring. The sum order is the golden's: slots added in ascending rank order."""
    from treenic.sparse.multitree_sparse import TreePlan, build_schedule
    P, N, k = model.workers, model.elements, int(model.k)
    sched = build_schedule(P, topology)
    plan, topo = TreePlan(sched), sched.topology
    port, slot = _port_map(topo), rank_slots(plan, P)
    rank_of = {c: w for w, c in enumerate(slot)}
    rows: list[list[int]] = [[pack_row(op=SparseOp.ZERO, chunk=c, lo=N) for c in slot]
                             for _ in range(P)]
    have = [{w} for w in range(P)]          # ranks whose selection a node holds
    summed = [0] * P                         # ranks added so far, in ascending order
    rx, link_pairs, ideal = {}, 0, 0
    gsend, grecv = ((SparseOp.GSEND_BM, SparseOp.GRECV_BM) if codec else
                    (SparseOp.GSEND, SparseOp.GRECV))
    flits = message_flits(k, N, codec)

    def add_ready(u):
        while summed[u] < P and summed[u] in have[u]:
            rows[u].append(pack_row(op=SparseOp.ACC, chunk=slot[summed[u]], lo=N))
            summed[u] += 1

    for w in range(P):
        rows[w].append(pack_row(op=SparseOp.ROOT, chunk=slot[w], lo=0, n=N, k=k))
    for s, trans in enumerate(plan.gather, start=1):
        trans = [t for t in trans if t[2] in rank_of]
        load: dict[tuple[int, int], int] = {}
        for src, dst, c in trans:
            rows[src].append(pack_row(op=gsend, step=s, chunk=c,
                                      port=port[(src, dst)][0], lo=0, n=N, k=k))
            load[(src, dst)] = load.get((src, dst), 0) + flits
            link_pairs += k
        ideal += max(load.values(), default=0)
        for u in range(P):                  # add while the messages of this step travel
            add_ready(u)
        for src, dst, c in trans:
            q = port[(src, dst)][1]
            rows[dst].append(pack_row(op=grecv, step=s, chunk=c, port=q, lo=0,
                                      n=N, k=k))
            rx[(dst, q)] = rx.get((dst, q), 0) + flits
            have[dst].add(rank_of[c])
    for u in range(P):
        add_ready(u)
        if summed[u] != P:
            raise SparseTableError(f"topka: node {u} never receives every selection")
        rows[u].append(pack_row(op=SparseOp.END))
    return SparseProgram(topo.spec, N, rows, sched.num_chunks, N, k, max(rx.values(), default=1),
                         _ports(topo), [k] * sched.num_chunks, link_pairs, None, ideal,
                         algorithm="topka", buffer_words=2 * N, result_base=N, codec=codec,
                         link_flits=link_pairs // k * flits, density=model.density)


def golden_model(algorithm: str, topology: str, elements: int, density: float, *,
                 seed: int = 0, flow_assignment: str = "contiguous",
                 residual: str = "local"):
    """A fresh golden model of one sparse all-reduce the engine runs (no residual kept
    yet). TopkA has no flows and keeps the local residual (its golden defines no other)."""
    from treenic.topology import parse
    P = parse(topology).n
    if algorithm == "topka":
        if flow_assignment != "contiguous" or residual != "local":
            raise ValueError("topka has no flow assignment and keeps the local residual only")
        from treenic.sparse.topk_family import TopkA
        return TopkA(P, elements, density, seed=seed)
    if algorithm != "multitree-sparse":
        raise ValueError(f"the sparse engine runs {' and '.join(SPARSE_ALGORITHMS)}, not "
                         f"{algorithm!r}")
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    return MultiTreeSparse(P, elements, density, seed=seed, topology=topology,
                           flow_assignment=flow_assignment, residual=residual)


def sparse_model(algorithm: str, topology: str, elements: int, density: float, *,
                 seed: int = 0, flow_assignment: str = "contiguous", residual: str = "local",
                 codec: bool = False):
    """(golden model, its sparse program) of one sparse all-reduce on the engine
    (:func:`golden_model`). ``codec``: messages in the codec format (pairs or bitmap +
    values, the golden codec's rule) instead of pair flits. The configuration image
    (:func:`treenic.firmware.image.compile_images`) and the fabric sims build their
    programs here."""
    golden = golden_model(algorithm, topology, elements, density, seed=seed,
                          flow_assignment=flow_assignment, residual=residual)
    if algorithm == "topka":
        return golden, compile_topka(golden, topology, codec=codec)
    return golden, compile_sparse(golden, codec=codec)


def program_parameters(program: SparseProgram) -> dict:
    """The parameters ``program`` was compiled for (:func:`sparse_model`'s arguments, the
    codec flag included): what a sparse request must match to run it. ``seed`` is the hash
    seed of hash flows and None otherwise (contiguous flows and TopkA do not depend on
    it)."""
    return dict(algorithm=program.algorithm, topology=program.topology,
                elements=program.elements, density=program.density, seed=program.hash_seed,
                flow_assignment="contiguous" if program.hash_seed is None else "hash",
                residual=program.residual, codec=program.codec)


def program_golden(program: SparseProgram, seed: int = 0):
    """A fresh golden model of the all-reduce ``program`` runs (its own parameters; ``seed``
    only where the program has none: contiguous flows, TopkA)."""
    p = program_parameters(program)
    return golden_model(p["algorithm"], p["topology"], p["elements"], p["density"],
                        seed=seed if p["seed"] is None else p["seed"],
                        flow_assignment=p["flow_assignment"], residual=p["residual"])
