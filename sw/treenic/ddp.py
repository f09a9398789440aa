"""PyTorch DDP communication hook running gradient all-reduce through treenic.

Import name ``treenic.ddp`` (not ``treenic.torch``: a ``torch`` subpackage would shadow the
real ``torch`` for relative imports inside the package).

::

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from treenic.driver import open_nic
    from treenic.ddp import TreenicHookState, treenic_hook

    dist.init_process_group("gloo", ...)
    comm = open_nic("torch", dist.get_rank(), dist.get_world_size(),
                    topology="ring:4", algorithm="multitree")
    state = TreenicHookState(comm, scheme="topka", density=0.01, warmup_iters=50)
    model = DDP(net)
    model.register_comm_hook(state, treenic_hook)

The hook follows the conventions of ``torch.distributed.algorithms.ddp_comm_hooks``
(PowerSGD): ``hook(state, bucket) -> torch.futures.Future[torch.Tensor]`` whose value is the
bucket's **averaged** gradient; the iteration counter advances when ``bucket.is_last()``.

* dense (``scheme=None``, or during the first ``warmup_iters`` iterations): the bucket is
  summed with the communicator's schedule (MultiTree, ring, ...) and divided by the world size;
* sparse (``scheme`` in ``treenic.sparse`` names; the ``torch`` backend runs ``topka``,
  the ``model``/``rtl`` backends any registered scheme NIC-side): error feedback per bucket
  index — the residual of bucket ``i`` is added before selection and replaced by the scheme's
  new residual. DDP rebuilds its buckets after the first iteration; a bucket whose size
  changed starts again with a zero residual (warm-up is dense, so nothing is lost there).

What the sparse papers use to keep accuracy (DGC, Lin et al. 2018; RedSync), all options:

* ``momentum`` > 0 — **momentum correction**: the hook applies the momentum itself and the
  optimizer must be plain SGD (no momentum). Dense steps: ``u = m·u + mean(g)`` (torch's SGD
  momentum, bit for bit the same rule). Sparse steps: each rank keeps its own velocity
  ``u_r = m·u_r + g_r`` and the residual accumulates velocity, ``v_r += u_r`` — what is sent
  is the top-k of ``v`` (the sparse all-reduce's error-feedback accumulator), so the delayed
  updates carry their momentum. At the switch every rank's ``u_r`` starts from the dense ``u``.
* ``momentum_masking`` (default True) — **momentum factor masking**: ``u_r`` is zeroed where
  this rank's accumulator left the node (its residual became 0), so stale momentum does not
  push an element that was just applied.
* ``clip_norm`` — **local gradient clipping**: each rank clips its bucket gradient to L2 norm
  ``clip_norm / sqrt(world)`` before accumulating (DGC's N^-1/2 scaling of a global clip).
* ``warmup`` — ``"dense"`` (RedSync: dense all-reduce for ``warmup_iters`` iterations) or
  ``"ramp"`` (DGC: sparse from the start, density 25 %, 6.25 %, 1.5625 %, ... each 1/4 of
  the previous, never below ``density``, in equal stages over ``warmup_iters``).
* ``sparse_options`` — the scheme's NIC options (``residual``: "local" | "global",
  ``flow_assignment``: "contiguous" | "hash"; MultiTree-Sparse only).

State is picklable (``__getstate__`` drops the communicator, which holds sockets and process
groups). After unpickling, :meth:`TreenicHookState.attach` a new communicator, or give
``comm_config`` (``open_nic`` keyword arguments) and the state reopens it on first use.
CPU and CUDA buckets both work; results and residuals stay on the bucket's device.
``model``/``rtl`` copy through host memory; ``torch`` on gloo (CPU-only send/recv) stages the flat
bucket through host for dense calls and only the k pairs for TopkA, which selects on the
device (``comm.status()["staging"]``; tests/test_cuda_paths.py).
"""
import torch

from .driver import open_nic

__all__ = ["TreenicHookState", "treenic_hook"]


class TreenicHookState:
    def __init__(self, comm=None, *, scheme: str | None = None, density: float = 0.01,
                 warmup_iters: int = 10, seed: int = 0, comm_config: dict | None = None,
                 momentum: float = 0.0, momentum_masking: bool = True,
                 clip_norm: float | None = None, warmup: str = "dense",
                 sparse_options: dict | None = None):
        if scheme is not None and not 0.0 < float(density) <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")
        if warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {warmup_iters}")
        if not 0.0 <= float(momentum) < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if clip_norm is not None and not float(clip_norm) > 0.0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        if warmup not in WARMUPS:
            raise ValueError(f"warmup must be one of {', '.join(WARMUPS)}, got {warmup!r}")
        self.momentum = float(momentum)
        self.momentum_masking = bool(momentum_masking)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.warmup = warmup
        self.sparse_options = dict(sparse_options or {})
        self.velocity: dict[int, torch.Tensor] = {}
        self.comm = comm
        self.comm_config = comm_config
        self.scheme = scheme
        self.density = float(density)
        self.warmup_iters = int(warmup_iters)
        self.seed = int(seed)
        self.iter = 0
        self.error_dict: dict[int, torch.Tensor] = {}
        # bytes this rank put on the network links, per phase
        self.dense_bytes = 0
        self.sparse_bytes = 0
        self.dense_calls = 0
        self.sparse_calls = 0
        self.resets = 0

    # ---- pickling -------------------------------------------------------------------------
    def __getstate__(self):
        d = self.__dict__.copy()
        d["comm"] = None                       # sockets / process groups never pickle
        d["error_dict"] = {k: v.detach().cpu() for k, v in self.error_dict.items()}
        d["velocity"] = {k: v.detach().cpu() for k, v in self.velocity.items()}
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)

    def attach(self, comm) -> "TreenicHookState":
        self.comm = comm
        return self

    def communicator(self):
        if self.comm is None:
            if self.comm_config is None:
                raise RuntimeError("TreenicHookState has no communicator: attach() one or "
                                   "give comm_config (open_nic keyword arguments)")
            self.comm = open_nic(**self.comm_config)
        return self.comm

    @property
    def sparse_active(self) -> bool:
        if self.scheme is None:
            return False
        return self.warmup == "ramp" or self.iter >= self.warmup_iters

    def current_density(self) -> float:
        """The density of this iteration: ``density``, or during a ``ramp`` warm-up DGC's
        exponential schedule 25 %, 6.25 %, ... (each stage 1/4 of the previous, floored at
        ``density``) in equal stages over ``warmup_iters``."""
        if self.warmup != "ramp" or self.iter >= self.warmup_iters:
            return self.density
        stages = _ramp_stages(self.density)
        stage = self.iter * len(stages) // max(1, self.warmup_iters)
        return stages[stage]


WARMUPS = ("dense", "ramp")


def _ramp_stages(density: float) -> list[float]:
    """DGC's warm-up densities 0.25, 0.0625, ... down to (not including) ``density``."""
    out, d = [], 0.25
    while d > density:
        out.append(d)
        d /= 4
    return out or [density]


def _slot(store: dict, idx: int, like: torch.Tensor, state) -> torch.Tensor:
    """Bucket ``idx``'s state tensor in ``store`` (zeros when new or resized: DDP rebuilds
    its buckets after the first iteration)."""
    t = store.get(idx)
    if t is not None and t.shape != like.shape:
        t = None
        state.resets += 1
    if t is None:
        t = torch.zeros_like(like)
    return t.to(like.device)


def _clip_local(state, tensor: torch.Tensor, world: int) -> None:
    """DGC local gradient clipping: L2 norm at most ``clip_norm / sqrt(world)``."""
    if state.clip_norm is None:
        return
    limit = state.clip_norm / world ** 0.5
    norm = float(tensor.norm())
    if norm > limit:
        tensor.mul_(limit / norm)


def treenic_hook(state: TreenicHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    comm = state.communicator()
    tensor = bucket.buffer()
    before = comm.counters.bytes_sent
    idx = bucket.index()
    if state.sparse_active:
        _sparse_step(state, comm, idx, tensor)
        state.sparse_bytes += comm.counters.bytes_sent - before
        state.sparse_calls += 1
    else:
        if state.scheme is not None and hasattr(comm, "plan_sparse"):
            # the dense warm-up of a sparse run: where the backend loads image sets, run it
            # from the sparse steps' set (on the rtl engine: the same fabric of combined NICs)
            comm.plan_sparse(state.scheme, state.density, seed=state.seed,
                             options=state.sparse_options)
        comm.allreduce(tensor)
        tensor.div_(comm.world)
        if state.momentum:
            # torch SGD's momentum rule (no dampening) on the averaged gradient
            u = _slot(state.velocity, idx, tensor, state)
            u.mul_(state.momentum).add_(tensor)
            state.velocity[idx] = u
            tensor.copy_(u)
        state.dense_bytes += comm.counters.bytes_sent - before
        state.dense_calls += 1
    if bucket.is_last():
        state.iter += 1
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def _sparse_step(state: TreenicHookState, comm, idx: int, tensor: torch.Tensor) -> None:
    """One sparse all-reduce of bucket ``idx`` in place (the mean update), with the options
    of :class:`TreenicHookState` (momentum correction and masking, local clipping)."""
    res = _slot(state.error_dict, idx, tensor, state)
    _clip_local(state, tensor, comm.world)
    if state.momentum:
        # u_r = m*u_r + g_r; the all-reduce adds u_r to the residual v_r (v_r += u_r)
        u = _slot(state.velocity, idx, tensor, state)
        u.mul_(state.momentum).add_(tensor)
        state.velocity[idx] = u
        tensor.copy_(u)
        acc_nonzero = (tensor + res) != 0
    out = comm.sparse_allreduce(tensor, state.current_density(), scheme=state.scheme,
                                residual=res, seed=state.seed,
                                options=state.sparse_options)
    state.error_dict[idx] = out.residual
    if state.momentum and state.momentum_masking:
        # what left this rank has residual exactly 0: its momentum is dropped there
        sent = acc_nonzero & (out.residual == 0)
        u.masked_fill_(sent, 0.0)
    tensor.div_(comm.world)
