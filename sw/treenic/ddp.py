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

State is picklable (``__getstate__`` drops the communicator, which holds sockets and process
groups). After unpickling, :meth:`TreenicHookState.attach` a new communicator, or give
``comm_config`` (``open_nic`` keyword arguments) and the state reopens it on first use.
CPU and CUDA buckets both work: ``model``/``rtl`` copy through host memory, ``torch`` stays on
the device.
"""
import torch

from .driver import open_nic

__all__ = ["TreenicHookState", "treenic_hook"]


class TreenicHookState:
    def __init__(self, comm=None, *, scheme: str | None = None, density: float = 0.01,
                 warmup_iters: int = 10, seed: int = 0, comm_config: dict | None = None):
        if scheme is not None and not 0.0 < float(density) <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")
        if warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {warmup_iters}")
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
        return self.scheme is not None and self.iter >= self.warmup_iters


def treenic_hook(state: TreenicHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    comm = state.communicator()
    tensor = bucket.buffer()
    before = comm.counters.bytes_sent
    if state.sparse_active:
        idx = bucket.index()
        res = state.error_dict.get(idx)
        if res is not None and (res.shape != tensor.shape or res.device != tensor.device):
            if res.shape != tensor.shape:
                res = None                     # bucket rebuilt: start a fresh residual
                state.resets += 1
            else:
                res = res.to(tensor.device)
        if res is None:
            res = torch.zeros_like(tensor)
        out = comm.sparse_allreduce(tensor, state.density, scheme=state.scheme, residual=res,
                                    seed=state.seed)
        state.error_dict[idx] = out.residual
        state.sparse_bytes += comm.counters.bytes_sent - before
        state.sparse_calls += 1
    else:
        comm.allreduce(tensor)
        state.dense_bytes += comm.counters.bytes_sent - before
        state.dense_calls += 1
    tensor.div_(comm.world)
    if bucket.is_last():
        state.iter += 1
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut
