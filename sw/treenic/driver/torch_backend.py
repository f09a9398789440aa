"""``torch`` backend: the Schedule IR executed with ``torch.distributed`` point-to-point ops.

Semantics (shared with every backend, :mod:`treenic.driver.core`): rank ``r`` is node ``r``;
contributions are applied after their receive completes, per element the local value first,
then in the schedule's order (step, then ascending ``rx_port``), so the result is
bit-identical to :func:`treenic.schedule.execute.execute`.

Plan (per buffer size, cached): the schedule's transfers in its global order, each step's
transfers to one peer merged into **one message** (one contiguous buffer: a slice when the
spans are adjacent, else a gather through a precomputed index tensor -- no per-span Python
loop), cut into pieces of at most ``piece_elements`` (the same cut on both sides).

Executors:

* ``pipelined`` (gloo, CPU tensors): every receive of the collective is posted up front,
  each message with its own tag; a send is posted as soon as the receives it depends on
  (earlier steps, overlapping elements) have been applied (step by step; within a
  step in the order their inputs become ready), so the reduction of one step's
  first pieces overlaps the next step's transfers. A receive is applied after every
  earlier receive that overlaps it (per element that is the numeric order above; disjoint
  receives land in any order); a receive that overwrites elements an in-flight send reads
  waits for that send first.
* ``stepwise`` (any other process-group backend, e.g. NCCL on CUDA, where posting
  receives ahead of sends can deadlock): one ``batch_isend_irecv`` per step, receives
  applied in order after the step's transfers complete.

``status()["executor"]`` says which one runs.

Device tensors (``status()["staging"]``): gloo's send/recv take CPU tensors only (they hand
the tensor's raw pointer to the TCP transport, which cannot read device memory), so on gloo a
CUDA tensor is **staged through host memory**: a dense all-reduce copies the flat tensor to
host once, runs the CPU path above and copies the result back once; a sparse TopkA call
selects its top-k on the device and stages only the k (index, value) pairs it all-gathers
(torch documents gloo's all-gather as CPU-only too; 8 bytes a pair, so one rule for both).
``"staging": "host"`` on gloo (printed once per backend the first time it happens;
``status()["staged_collectives"]`` counts them), ``"device"`` on a transport that moves
device memory itself (e.g. NCCL). CPU tensors are never copied.

Duplex sockets (pipelined executor on the default group): gloo carries both directions
between two ranks over one socket, and its device thread holds that pair's lock while it
reads an incoming message, so an ``isend`` to a peer that is sending to us waited for the
whole incoming piece (profiled: up to 26 ms in one MultiTree call, where every rank sends to
and receives from both neighbours in the same step). A second gloo group over the same
ranks carries the traffic from higher to lower ranks between ranks that exchange both ways
in the schedule, so each socket streams one way.
``duplex``: None (default) = on where it applies (the default group, pipelined executor),
True = required (error where it cannot be), False = off. ``status()["duplex"]`` says
whether it runs.
"""
from __future__ import annotations

import sys
import zlib

from ..schedule.ir import Op
from .errors import DriverError, FabricError

__all__ = ["TorchBackend"]


class _Message:
    """One piece of one step's traffic to or from one peer."""
    __slots__ = ("kind", "peer", "step", "op", "spans", "size", "index", "tag", "lo", "hi",
                 "needs", "deps", "preds", "blocks", "reverse")

    def __init__(self, kind, peer, step, op, spans, tag):
        self.kind, self.peer, self.step, self.op, self.spans = kind, peer, step, op, spans
        self.size = sum(b - a for a, b in spans)
        self.tag = tag
        self.index = None                 # element index tensor when spans are not one slice
        self.reverse = False              # on the duplex group (see module docstring)
        self.lo = min(a for a, _ in spans)
        self.hi = max(b for _, b in spans)

    def overlaps(self, other) -> bool:
        if self.hi <= other.lo or other.hi <= self.lo:
            return False
        return any(a < d and c < b for a, b in self.spans for c, d in other.spans)


class TorchBackend:
    """Schedule IR over torch.distributed P2P (see module docstring)."""

    def __init__(self, comm, group=None, verify: bool = True, piece_elements: int = 1 << 19,
                 executor: str = "auto", duplex: bool | None = None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise DriverError("backend 'torch' needs an initialised torch.distributed group")
        if dist.get_world_size(group) != comm.world or dist.get_rank(group) != comm.rank:
            raise DriverError(f"torch.distributed rank/world {dist.get_rank(group)}/"
                              f"{dist.get_world_size(group)} != {comm.rank}/{comm.world}")
        if executor not in ("auto", "pipelined", "stepwise"):
            raise DriverError(f"torch executor must be auto, pipelined or stepwise, got "
                              f"{executor!r}")
        self.comm = comm
        self.group = group
        self.verify = verify
        self.piece_elements = max(1, int(piece_elements))
        self.dist = dist
        transport = dist.get_backend(group)
        if executor == "auto":
            executor = "pipelined" if transport == "gloo" else "stepwise"
        elif executor == "pipelined" and transport != "gloo":
            raise DriverError(f"the pipelined torch executor needs gloo (tagged P2P, receives "
                              f"posted ahead); this group runs {transport}: use "
                              "executor='stepwise'")
        self.executor = executor
        # gloo's send/recv/all_gather take CPU tensors only: device tensors go through host
        self.staging = "host" if transport == "gloo" else "device"
        self.staged = 0                      # collectives whose tensor was staged via host
        self._reverse = self._reverse_group(duplex)
        self._plans: dict = {}
        self._bufs: dict = {}
        # global rank of each group rank (P2P ops address global ranks)
        self._peer = [r if group is None else dist.get_global_rank(group, r)
                      for r in range(comm.world)]

    def _reverse_group(self, duplex):
        """The second gloo group for higher-to-lower-rank traffic, or None (see module
        docstring). Created over the whole default group: every rank constructs the backend
        (the configuration check that follows is collective too)."""
        if duplex not in (None, True, False):
            raise DriverError(f"duplex must be None, True or False, got {duplex!r}")
        why_not = ("the stepwise executor posts one batch per step" if
                   self.executor != "pipelined" else
                   "a second group needs every rank of the default group; this backend "
                   "runs on a sub-group" if self.group is not None else None)
        if duplex is False or (duplex is None and why_not):
            return None
        if why_not:
            raise DriverError(f"duplex sockets unavailable: {why_not}")
        return self.dist.new_group(backend="gloo")

    def load(self, schedule, image):
        from .core import _check_same_config
        _check_same_config(self.comm, zlib.crc32(image), self.group)
        self._plans.clear()
        self._bufs.clear()
        self.schedule = schedule

    # ---- plan ---------------------------------------------------------------------------
    def _plan(self, elements: int, device):
        """(messages in global order, grouped by step; bytes sent; bytes received).

        Per step, one message per (direction, peer): the transfers' spans merged in the
        schedule's order (for receives the order contributions are applied in), cut into
        pieces. The k-th message between two ranks is the same on both sides (same
        schedule, same cut), and its tag is its position in the collective's traffic."""
        key = (elements, str(device))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        import torch
        s, me = self.schedule, self.comm.rank
        bounds = [int(b) for b in s.chunk_bounds(elements)]
        piece = self.piece_elements
        sent = recv = 0
        steps = []
        tag = 0
        for step, transfers in sorted(s.by_step().items()):
            groups: dict = {}
            for t in transfers:            # global order: both ends see the same sequence
                if me not in (t.src, t.dst):
                    continue
                spans = _spans(t.chunks, bounds)
                if not any(b > a for a, b in spans):
                    continue
                kind, peer = ("send", t.dst) if t.src == me else ("recv", t.src)
                # one message per (peer, link, op): contributions from different links of
                # one peer keep their rx_port order; a REDUCE and a GATHER stay apart
                groups.setdefault((kind, peer, s.rx_port(t), int(t.op)), []).extend(spans)
            msgs = []
            for (kind, peer, _, op), spans in groups.items():
                spans = _merge(spans)
                size = sum(b - a for a, b in spans)
                if kind == "send":
                    sent += 4 * size
                else:
                    recv += 4 * size
                for part in _cut(spans, piece):
                    m = _Message(kind, peer, step, op, part, None)
                    if len(part) > 1:
                        m.index = torch.cat([torch.arange(a, b) for a, b in part]).to(device)
                    msgs.append(m)
            steps.append(msgs)
        # tags: per ordered pair, the message's position in that pair's traffic
        count: dict = {}
        for msgs in steps:
            for m in msgs:
                pair = (me, m.peer) if m.kind == "send" else (m.peer, me)
                m.tag = count.get(pair, 0)
                count[pair] = m.tag + 1
        msgs = [m for ms in steps for m in ms]
        # duplex: only pairs with traffic both ways, higher-to-lower rank (both ends agree)
        two_way = ({m.peer for m in msgs if m.kind == "send"}
                   & {m.peer for m in msgs if m.kind == "recv"})
        for m in msgs:
            sender, receiver = (me, m.peer) if m.kind == "send" else (m.peer, me)
            m.reverse = m.peer in two_way and sender > receiver
        _link_dependencies(msgs)
        plan = (msgs, sent, recv)
        self._plans[key] = plan
        return plan

    def _stage(self, tensor) -> bool:
        """Whether ``tensor`` must travel through host memory (a device tensor on a transport
        that moves CPU tensors only); counts it and prints the notice once."""
        if tensor.device.type == "cpu" or self.staging != "host":
            return False
        if not self.staged:
            print(f"treenic: torch backend rank {self.comm.rank}: "
                  f"{self.dist.get_backend(self.group)} moves CPU tensors only; "
                  f"{tensor.device.type} tensors are staged through host memory (one copy "
                  "each way per collective; status()['staging'] == 'host')",
                  file=sys.stderr, flush=True)
        self.staged += 1
        return True

    def _check_sizes(self, tensor, what):
        import torch
        dist = self.dist
        me = torch.tensor([tensor.numel(), _dtype_code(tensor.dtype)], dtype=torch.int64,
                          device="cpu" if self.staging == "host" else tensor.device)
        allv = [torch.empty_like(me) for _ in range(self.comm.world)]
        dist.all_gather(allv, me, group=self.group)
        vals = [tuple(int(x) for x in v.cpu()) for v in allv]
        if len(set(vals)) != 1:
            raise FabricError(f"rank {self.comm.rank}: ranks disagree on {what} "
                              f"#{self.comm._seq}: " + "; ".join(
                                  f"rank {r}: {n} elements dtype {_DTYPE_NAMES.get(d, d)}"
                                  for r, (n, d) in enumerate(vals)), code="SIZE_MISMATCH")

    # ---- dense ------------------------------------------------------------------------------
    def dense(self, tensor, seq):
        if self._stage(tensor):
            # one copy to host, the CPU path, one copy back (nothing written on an error)
            import torch
            host = tensor.detach().to("cpu", memory_format=torch.contiguous_format)
            moved = self._dense(host)
            tensor.copy_(host)
            return moved
        return self._dense(tensor)

    def _dense(self, tensor):
        if self.verify:     # first, so a bad tensor on one rank fails every rank, naming it
            self._check_sizes(tensor, "all-reduce")
        if not tensor.is_floating_point():
            raise DriverError(f"allreduce needs a floating-point tensor, got {tensor.dtype}")
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
        msgs, sent, recv = self._plan(flat.numel(), flat.device)
        if self.executor == "pipelined":
            self._run_pipelined(flat, msgs)
        else:
            self._run_stepwise(flat, msgs)
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view(tensor.shape))
        return sent, recv

    def _send_buffer(self, flat, m):
        """(tensor to send, whether it is a view of ``flat``)."""
        if m.index is None:
            return flat[m.lo:m.hi], True
        return flat.index_select(0, m.index), False

    def _recv_buffers(self, msgs, flat):
        """Receive buffers, allocated once per plan and dtype and reused by every collective
        (each collective's receives complete before the next one starts); fresh buffers
        would page-fault their whole size on every call."""
        import torch
        key = (id(msgs), flat.dtype, str(flat.device))
        bufs = self._bufs.get(key)
        if bufs is None:
            bufs = [torch.empty(m.size, dtype=flat.dtype, device=flat.device)
                    for m in msgs if m.kind == "recv"]
            self._bufs = {key: bufs}         # only the latest plan's: bounded memory
        return bufs

    def _run_pipelined(self, flat, msgs):
        import torch
        dist, peer = self.dist, self._peer
        way = (self.group, self.group if self._reverse is None else self._reverse)
        recvs = []
        bufs = self._recv_buffers(msgs, flat)
        for m, buf in zip((m for m in msgs if m.kind == "recv"), bufs):
            # every receive posted up front, tagged
            recvs.append((m, buf, dist.irecv(buf, peer[m.peer], group=way[m.reverse],
                                             tag=m.tag)))
        sends = {}                           # message id -> (work, reads flat in place)
        applied = [False] * len(recvs)

        def ensure(r):
            """Apply receive r after every earlier receive that overlaps it (per element,
            contributions land in plan order; disjoint receives may land in any order)."""
            stack = [r]
            while stack:
                top = stack[-1]
                todo = [q for q in recvs[top][0].preds if not applied[q]]
                if todo:
                    stack.extend(reversed(todo))
                    continue
                stack.pop()
                if not applied[top]:
                    self._apply(flat, recvs[top], sends)
                    applied[top] = True

        # sends step by step (every send of a step is posted before any receive of that
        # step can land: a receive waits for the posted sends that read what it writes);
        # within a step in the order their inputs become ready (tags fix the matching)
        order = sorted((i for i, m in enumerate(msgs) if m.kind == "send"),
                       key=lambda i: (msgs[i].step, msgs[i].needs, i))
        for i in order:
            m = msgs[i]
            for r in m.deps:                 # receives this send's data depends on
                ensure(r)
            buf, view = self._send_buffer(flat, m)
            sends[i] = (dist.isend(buf, peer[m.peer], group=way[m.reverse], tag=m.tag),
                        view)
        for r in range(len(recvs)):
            ensure(r)
        for work, _ in sends.values():       # (gloo's wait is not idempotent: once each)
            work.wait()

    @staticmethod
    def _apply(flat, item, sends):
        m, buf, work = item
        work.wait()
        for j in m.blocks:                   # in-flight sends reading what this overwrites
            w = sends.get(j)
            if w is not None and w[1]:
                w[0].wait()
                del sends[j]                 # completed: never waited on again
        _combine(flat, m, buf)

    def _run_stepwise(self, flat, msgs):
        import torch
        dist, group, peer = self.dist, self.group, self._peer
        i = 0
        while i < len(msgs):
            step = msgs[i].step
            j = i
            while j < len(msgs) and msgs[j].step == step:
                j += 1
            p2p, pending = [], []
            for m in msgs[i:j]:
                if m.kind == "send":
                    buf, _ = self._send_buffer(flat, m)
                    p2p.append(dist.P2POp(dist.isend, buf, peer[m.peer], group))
                else:
                    buf = torch.empty(m.size, dtype=flat.dtype, device=flat.device)
                    p2p.append(dist.P2POp(dist.irecv, buf, peer[m.peer], group))
                    pending.append((m, buf))
            for req in dist.batch_isend_irecv(p2p):
                req.wait()                   # sends read the buffer before any receive lands
            for m, buf in pending:
                _combine(flat, m, buf)
            i = j

    def sparse(self, tensor, residual, scheme, density, seed, seq, options=None):
        import torch
        dist = self.dist
        if scheme != "topka":
            raise DriverError(f"backend 'torch' runs sparse scheme 'topka' natively; "
                              f"{scheme!r} runs on the 'model' and 'rtl' backends (NIC-side)")
        if self.verify:
            self._check_sizes(tensor, "sparse all-reduce")
        if tensor.dtype != torch.float32:
            raise DriverError(f"sparse all-reduce needs float32, got {tensor.dtype}")
        flat = tensor.reshape(-1)
        # acc = g + R (R = 0 at first: -0.0 + 0.0 = +0.0, as the golden models compute)
        acc = flat + (0.0 if residual is None else residual.reshape(-1))
        n = acc.numel()
        k = max(1, int(round(density * n)))
        # exact top-k by magnitude, ties by ascending index (stable descending sort)
        idx = _topk_indices(acc, k)
        vals = acc[idx]
        new_res = acc.clone()
        new_res[idx[vals != 0]] = 0
        idx32 = idx.to(torch.int32)                 # u32 index + f32 value: 8 bytes a pair
        staged = self._stage(acc)
        if staged:                                  # only the k pairs go through host
            idx32, vals = idx32.cpu(), vals.cpu()
        all_idx = [torch.empty_like(idx32) for _ in range(self.comm.world)]
        all_val = [torch.empty_like(vals) for _ in range(self.comm.world)]
        dist.all_gather(all_idx, idx32, group=self.group)
        dist.all_gather(all_val, vals, group=self.group)
        if staged:                                  # back in one copy per kind
            all_idx = torch.stack(all_idx).to(acc.device).unbind(0)
            all_val = torch.stack(all_val).to(acc.device).unbind(0)
        out = torch.zeros_like(acc)
        for i, v in zip(all_idx, all_val):          # ascending rank, left operand first
            i = i.long()
            out[i] = out[i] + v
        tensor.copy_(out.view(tensor.shape))
        moved = 8 * k * (self.comm.world - 1)       # what the all-gather moves per rank
        return new_res.view(tensor.shape), moved, moved, self.comm.world - 1

    def status(self):
        return {"engine": "torch.distributed P2P",
                "dense_engine": "torch.distributed P2P (the schedule)",
                "sparse_engine": "torch.distributed (TopkA all-gather of each rank's top-k)",
                "transport": self.dist.get_backend(self.group), "executor": self.executor,
                "duplex": self._reverse is not None, "staging": self.staging,
                "staged_collectives": self.staged}

    def close(self):
        """Release the duplex group (ours); the caller's process group stays."""
        rev, self._reverse = self._reverse, None
        if rev is not None and self.dist.is_initialized():
            self.dist.destroy_process_group(rev)




_DTYPE_NAMES = {1: "float32", 2: "float64", 3: "float16", 4: "bfloat16", 5: "int64",
                6: "int32", 7: "int16", 8: "int8", 9: "uint8", 10: "bool"}


def _dtype_code(dtype) -> int:
    import torch
    return {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4,
            torch.int64: 5, torch.int32: 6, torch.int16: 7, torch.int8: 8, torch.uint8: 9,
            torch.bool: 10}.get(dtype, 0)


def _topk_indices(acc, k: int):
    """Exact top-k of |acc| as ascending indices, k of them: magnitude descending, ties by
    ascending index (treenic.sparse.select.topk). Zeros are never *selected*: when fewer than
    k entries are nonzero the rest of the k slots hold zero-valued entries (padding that adds
    nothing), so every rank all-gathers exactly k pairs. Threshold selection (k-th largest
    magnitude, then all above it and the lowest-index ties) instead of a full sort."""
    import numpy as np
    import torch
    mag = acc.abs()
    n = mag.numel()
    if k >= n:
        return torch.arange(n, device=acc.device)
    if mag.device.type == "cpu":
        m = mag.numpy()
        thr = m.dtype.type(np.partition(m, n - k)[n - k])
        thr = torch.tensor(float(thr), dtype=mag.dtype)
    else:
        thr = torch.topk(mag, k, sorted=False).values.min()
    above = torch.nonzero(mag > thr).view(-1)
    ties = torch.nonzero(mag == thr).view(-1)[:k - above.numel()]
    return torch.sort(torch.cat([above, ties])).values


def _spans(chunks, bounds):
    """Merge a transfer's chunks into contiguous element ranges (in chunk order)."""
    spans = []
    for c in chunks:
        a, b = bounds[c], bounds[c + 1]
        if spans and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((a, b))
    return spans


def _combine(flat, m, buf):
    """Apply one received message: REDUCE adds (local value left operand), GATHER copies."""
    if m.index is None:
        dst = flat[m.lo:m.hi]
        if m.op == Op.REDUCE:
            dst.add_(buf)
        else:                                # Op.GATHER
            dst.copy_(buf)
    elif m.op == Op.REDUCE:
        flat.index_add_(0, m.index, buf)
    else:
        flat.index_copy_(0, m.index, buf)


def _link_dependencies(msgs):
    """``send.deps``: the receives (indices in plan order among receives) of earlier steps
    that overlap the send -- applied before the send reads the buffer; ``send.needs``: one
    past the last of them (sort key); ``recv.preds``: earlier receives that overlap it (they
    land first); ``recv.blocks``: sends at the same or an earlier step that read elements it
    writes (they complete before it lands)."""
    recvs = [m for m in msgs if m.kind == "recv"]
    for m in msgs:
        m.needs, m.deps, m.preds, m.blocks = 0, (), (), ()
    for m in msgs:
        if m.kind == "send":
            m.deps = tuple(r for r, rm in enumerate(recvs)
                           if rm.step < m.step and rm.overlaps(m))
            m.needs = (m.deps[-1] + 1) if m.deps else 0
    for r, rm in enumerate(recvs):
        rm.preds = tuple(q for q in range(r) if recvs[q].overlaps(rm))
        rm.blocks = tuple(k for k, m in enumerate(msgs)
                          if m.kind == "send" and m.step <= rm.step and m.overlaps(rm))


def _merge(spans):
    """Sort and merge element ranges."""
    out = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and out[-1][1] >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _cut(spans, piece):
    """Cut merged ranges into consecutive pieces of at most ``piece`` elements."""
    parts, cur, n = [], [], 0
    for a, b in spans:
        while a < b:
            take = min(b - a, piece - n)
            cur.append((a, a + take))
            n += take
            a += take
            if n == piece:
                parts.append(cur)
                cur, n = [], 0
    if cur:
        parts.append(cur)
    return parts
