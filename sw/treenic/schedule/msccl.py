"""Export a dense schedule as an MSCCL algorithm XML, and read one back.

The XML is the format msccl-tools' compiler emits and the MSCCL runtime for NCCL executes
(``<algo>`` → ``<gpu>`` → ``<tb>`` → ``<step>``, "old format"): an in-place all-reduce on
the input buffer ``i`` cut into the schedule's ``num_chunks`` chunks.

Mapping (one source of truth: the Schedule IR):

* every transfer and chunk becomes a send step ``s`` on the sender and a receive step on
  the receiver: ``rrc`` (receive, reduce, copy) for REDUCE, ``r`` (receive) for GATHER;
* thread blocks: one per (GPU, peer, direction) — ``send=peer recv=-1`` or
  ``send=-1 recv=peer`` — on channel 0; a connection's sends and receives are listed in the
  same (step, chunk) order on both ends, so they match FIFO;
* dependencies (``depid``/``deps``, one per step, extra ones as ``nop`` steps, as
  msccl-tools does): a send of chunk c at IR step t waits for every receive into c at the
  sender at steps < t (IR rule: a send reads the values at the end of step t−1); a receive
  into c at step t waits for the receiver's sends of c at steps ≤ t (they must read the
  value first) and for the previous contribution to c in the numeric contract's
  (step, rx_port) order, so the GPU reduces in exactly the golden executor's order.

:func:`from_xml` parses an XML back into a :class:`~treenic.schedule.ir.Schedule` on the
given topology: sends and receives are matched FIFO per connection, and each transfer's step
is its depth in the dependency graph (so the round trip is exact in value semantics; a test
executes both with the golden executor and compares bit for bit).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from .ir import Op, Schedule, ScheduleError, Transfer

__all__ = ["to_xml", "from_xml", "execute_xml", "MscclError"]

MAX_XML_BYTES = 256 << 20


class MscclError(ScheduleError):
    """An MSCCL XML that does not parse or does not describe an all-reduce we can read."""


def _ops(schedule: Schedule):
    """Per (gpu, peer, 'send'|'recv'): ordered ops [(ir_step, chunk, op, peer)]."""
    tbs = defaultdict(list)
    for t in sorted(schedule.transfers, key=lambda t: (t.step, t.src, t.dst, t.chunks)):
        for c in t.chunks:
            tbs[(t.src, t.dst, "send")].append((t.step, c, t.op))
            tbs[(t.dst, t.src, "recv")].append((t.step, c, t.op))
    return tbs


def to_xml(schedule: Schedule, name: str | None = None) -> str:
    """The schedule as an MSCCL algorithm XML string (see the module docstring)."""
    n = schedule.n
    tbs = _ops(schedule)
    gpus = defaultdict(list)
    for key in sorted(tbs):
        gpus[key[0]].append(key)
    # the position of every op: (gpu, tb index, step index) before nop expansion
    where = {}
    for g, keys in gpus.items():
        for i, key in enumerate(keys):
            for j, (step, c, op) in enumerate(tbs[key]):
                where[(g, key[1], key[2], step, c)] = (i, j)
    # per gpu and chunk: the receives (step, rx_port, peer) and sends (step, peer)
    recvs, sends = defaultdict(list), defaultdict(list)
    for t in schedule.transfers:
        for c in t.chunks:
            recvs[(t.dst, c)].append((t.step, schedule.rx_port(t), t.src))
            sends[(t.src, c)].append((t.step, t.dst))
    for v in recvs.values():
        v.sort()
    deps_of = {}
    for g, keys in gpus.items():
        for key in keys:
            peer, kind = key[1], key[2]
            for step, c, op in tbs[key]:
                if kind == "send":
                    d = [where[(g, p, "recv", s, c)] for s, _, p in recvs[(g, c)] if s < step]
                else:
                    d = [where[(g, p, "send", s, c)] for s, p in sends[(g, c)] if s <= step]
                    order = recvs[(g, c)]
                    k = next(i for i, r in enumerate(order) if r[0] == step and r[2] == peer)
                    if op == Op.REDUCE and k > 0:
                        ps, _, pp = order[k - 1]
                        d.append(where[(g, pp, "recv", ps, c)])
                deps_of[(g, peer, kind, step, c)] = sorted(set(d))
    return _emit(schedule, name or f"treenic_{schedule.algorithm}_{n}", gpus, tbs, deps_of)


def _emit(schedule, name, gpus, tbs, deps_of) -> str:
    n, C = schedule.n, schedule.num_chunks
    algo = ET.Element("algo", {
        "name": name, "proto": "Simple", "nchannels": "1", "nchunksperloop": str(C),
        "ngpus": str(n), "coll": "allreduce", "inplace": "1", "outofplace": "0",
        "minBytes": "0", "maxBytes": "0"})
    # nop expansion shifts step indices: first lay out every tb, then write
    layout = {}
    for g, keys in gpus.items():
        for i, key in enumerate(keys):
            rows = []
            for j, (step, c, op) in enumerate(tbs[key]):
                d = [x for x in deps_of[(g, key[1], key[2], step, c)] if x[0] != i]
                for extra in d[1:]:
                    rows.append(("nop", None, extra))
                rows.append((key[2], (c, op), d[0] if d else None))
                layout[(g, i, j)] = len(rows) - 1
            layout[(g, i)] = rows
    depended = {(g, dep[0], layout[(g, dep[0], dep[1])])
                for g, keys in gpus.items() for i in range(len(keys))
                for _, _, dep in layout[(g, i)] if dep is not None}
    for g in range(n):
        ge = ET.SubElement(algo, "gpu", {"id": str(g), "i_chunks": str(C), "o_chunks": "0",
                                         "s_chunks": "0"})
        for i, key in enumerate(gpus.get(g, [])):
            peer, kind = key[1], key[2]
            tb = ET.SubElement(ge, "tb", {"id": str(i),
                                          "send": str(peer if kind == "send" else -1),
                                          "recv": str(peer if kind == "recv" else -1),
                                          "chan": "0"})
            for s, (what, payload, dep) in enumerate(layout[(g, i)]):
                if what == "nop":
                    typ, off = "nop", "-1"
                else:
                    c, op = payload
                    typ = "s" if what == "send" else ("rrc" if op == Op.REDUCE else "r")
                    off = str(c)
                depid, deps = ((str(dep[0]), str(layout[(g, dep[0], dep[1])]))
                               if dep is not None else ("-1", "-1"))
                ET.SubElement(tb, "step", {
                    "s": str(s), "type": typ, "srcbuf": "i", "srcoff": off, "dstbuf": "i",
                    "dstoff": off, "cnt": "1" if typ != "nop" else "0", "depid": depid,
                    "deps": deps, "hasdep": "1" if (g, i, s) in depended else "0"})
    ET.indent(algo, space=" ")
    return ET.tostring(algo, encoding="unicode") + "\n"


def from_xml(text: str, topology) -> Schedule:
    """Parse an MSCCL all-reduce XML (as :func:`to_xml` writes it) back into a Schedule."""
    if len(text) > MAX_XML_BYTES:
        raise MscclError(f"MSCCL XML of {len(text)} bytes exceeds {MAX_XML_BYTES}")
    try:
        algo = ET.fromstring(text)
    except ET.ParseError as e:
        raise MscclError(f"MSCCL XML does not parse: {e}") from None
    if algo.tag != "algo" or algo.get("coll", "allreduce") != "allreduce":
        raise MscclError("not an MSCCL allreduce <algo>")
    try:
        n, C = int(algo.get("ngpus")), int(algo.get("nchunksperloop"))
    except (TypeError, ValueError):
        raise MscclError("<algo> lacks ngpus / nchunksperloop") from None
    if n != topology.n:
        raise MscclError(f"XML is for {n} GPUs, topology {topology.spec} has {topology.n}")
    tbs = {}                                   # (gpu, tb id) -> (send, recv, [steps])
    for ge in algo.iter("gpu"):
        g = int(ge.get("id"))
        for tb in ge.iter("tb"):
            try:
                steps = [(st.get("type"), int(st.get("srcoff")), int(st.get("depid")),
                          int(st.get("deps"))) for st in tb.iter("step")]
            except (TypeError, ValueError):
                raise MscclError(f"gpu {g}: a <step> lacks srcoff/depid/deps") from None
            bad = {t for t, *_ in steps} - {"s", "r", "rrc", "nop"}
            if bad:
                raise MscclError(f"gpu {g}: step types {sorted(bad)} are not read "
                                 f"(this reader takes s, r, rrc, nop)")
            tbs[(g, int(tb.get("id")))] = (int(tb.get("send")), int(tb.get("recv")), steps)
    return _rebuild(tbs, n, C, topology)


def _rebuild(tbs, n, C, topology) -> Schedule:
    """Match sends to receives FIFO per connection; step = dependency depth."""
    queues = defaultdict(list)                 # (src, dst) -> [(gpu, tb, idx, chunk)]
    for (g, i), (send, recv, steps) in sorted(tbs.items()):
        if send >= 0:
            queues[(g, send)] += [(g, i, j, c) for j, (t, c, _, _) in enumerate(steps) if t == "s"]
    partner, kinds = {}, {}
    for (g, i), (send, recv, steps) in sorted(tbs.items()):
        if recv < 0:
            continue
        q = [s for j, s in enumerate(steps) if s[0] in ("r", "rrc")]
        sq = queues.get((recv, g), [])
        if len(q) != len(sq):
            raise MscclError(f"connection {recv}->{g}: {len(sq)} sends, {len(q)} receives")
        k = 0
        for j, (t, c, _, _) in enumerate(steps):
            if t in ("r", "rrc"):
                s = sq[k]
                k += 1
                if s[3] != c:
                    raise MscclError(f"connection {recv}->{g}: chunk {s[3]} sent, {c} received")
                partner[(g, i, j)] = s[:3]
                kinds[(g, i, j)] = (Op.REDUCE if t == "rrc" else Op.GATHER, recv, g, c)
    depth = {}

    def level(key):                            # 1 + deepest predecessor (iterative)
        stack = [key]
        while stack:
            cur = stack[-1]
            if cur in depth:
                stack.pop()
                continue
            preds = _preds(cur, tbs, partner)
            todo = [p for p in preds if p not in depth]
            if todo:
                stack += todo
                continue
            own = 1 if cur in partner else 0
            depth[cur] = own + max((depth[p] for p in preds), default=0)
            stack.pop()
        return depth[key]

    transfers = [(level(k), *kinds[k]) for k in kinds]
    red = [x for x in transfers if x[1] == Op.REDUCE]
    rsteps = max((x[0] for x in red), default=0)
    out = [Transfer(s if op == Op.REDUCE else s + rsteps, src, dst, op, (c,), c)
           for s, op, src, dst, c in transfers]
    gsteps = max((t.step for t in out if t.op == Op.GATHER), default=rsteps) - rsteps
    return Schedule("msccl", topology, C, out, rsteps, gsteps)


def _preds(key, tbs, partner):
    g, i, j = key
    steps = tbs[(g, i)][2]
    out = []
    if j > 0:
        out.append((g, i, j - 1))
    _, _, depid, deps = steps[j]
    if depid >= 0:
        out.append((g, depid, deps))
    if key in partner:
        out.append(partner[key])
    return out


def execute_xml(text: str, buffers, *, seed: int = 0):
    """Run an MSCCL all-reduce XML the way the runtime does, on float32 ``buffers``
    ((ngpus, elements)): every thread block runs its steps in order, a step waits for its
    ``depid``/``deps`` step, a receive for the matching send on its connection (FIFO);
    among the thread blocks that can move, one is picked at random (``seed``), so a missing
    dependency shows up as a different result. ``rrc`` adds the received values to the
    local ones (local first); ``r`` overwrites. Returns the result buffers."""
    import numpy as np
    algo = ET.fromstring(text)
    n, C = int(algo.get("ngpus")), int(algo.get("nchunksperloop"))
    buf = np.array(buffers, dtype=np.float32, copy=True)
    if buf.ndim != 2 or buf.shape[0] != n:
        raise MscclError(f"buffers must have shape ({n}, elements), got {buf.shape}")
    E = buf.shape[1]
    base, extra = divmod(E, C)
    bounds = np.concatenate([[0], np.cumsum([base + (c < extra) for c in range(C)])])
    tbs = {}
    for ge in algo.iter("gpu"):
        g = int(ge.get("id"))
        for tb in ge.iter("tb"):
            tbs[(g, int(tb.get("id")))] = (int(tb.get("send")), int(tb.get("recv")),
                                           [(st.get("type"), int(st.get("srcoff")),
                                             int(st.get("depid")), int(st.get("deps")))
                                            for st in tb.iter("step")])
    pc = dict.fromkeys(tbs, 0)
    queues = defaultdict(list)
    rng = np.random.default_rng(seed)
    while True:
        ready = []
        for key, (send, recv, steps) in tbs.items():
            j = pc[key]
            if j == len(steps):
                continue
            typ, off, depid, deps = steps[j]
            if depid >= 0 and pc[(key[0], depid)] <= deps:
                continue
            if typ in ("r", "rrc") and not queues[(recv, key[0])]:
                continue
            ready.append(key)
        if not ready:
            break
        key = ready[rng.integers(len(ready))]
        send, recv, steps = tbs[key]
        typ, off, _, _ = steps[pc[key]]
        g, sl = key[0], slice(bounds[off], bounds[off + 1]) if off >= 0 else None
        if typ == "s":
            queues[(g, send)].append(buf[g, sl].copy())
        elif typ == "r":
            buf[g, sl] = queues[(recv, g)].pop(0)
        elif typ == "rrc":
            buf[g, sl] = buf[g, sl] + queues[(recv, g)].pop(0)
        pc[key] += 1
    stuck = [k for k, (_, _, steps) in tbs.items() if pc[k] < len(steps)]
    if stuck:
        raise MscclError(f"MSCCL program deadlocks: thread blocks {stuck[:6]} cannot finish")
    return buf
