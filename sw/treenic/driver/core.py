"""Host driver: one API over the ``model``, ``torch`` and ``rtl`` backends.

::

    comm = open_nic("torch", rank, world, topology="ring:4", algorithm="multitree")
    comm.allreduce(t)                      # in place: t <- sum over ranks (schedule's order)
    out = comm.sparse_allreduce(g, 0.01, scheme="topka", key=bucket_index)
    comm.status()                          # backend, schedule, counters (+ NIC status)

Semantics shared by all backends (docs/architecture.md §4, §5): rank ``r`` is node ``r`` of the
schedule; ``allreduce`` leaves every rank with the element-wise **sum** (not the mean) in
binary32, bit-identical to :func:`treenic.schedule.execute.execute` on the stacked buffers.
``sparse_allreduce`` adds the rank's residual (error feedback) to its tensor, runs the sparse
scheme, writes the scheme's result into the tensor and keeps the new residual (under ``key``,
or returns it when the caller passes ``residual=`` explicitly).

Backends:

* ``model`` — golden executor. With ``fabric=LocalFabric(...)`` the ranks are threads of one
  process; otherwise the ranks are processes of an initialised ``torch.distributed`` group:
  each rank all-gathers the N buffers (gloo, CPU) and runs the executor itself. Link bytes
  counted are the schedule's (what the NICs would send), not the gather's.
* ``torch`` — the same Schedule IR executed with ``torch.distributed`` point-to-point ops
  (pipelined on gloo, one ``batch_isend_irecv`` per step elsewhere; on gloo CUDA tensors are
  staged through host memory, ``status()["staging"]``); contributions are applied
  after the step's receives complete, local value first, then in ascending ``rx_port`` order,
  so the result is bit-identical to the golden executor. Sparse: TopkA natively (each rank
  all-gathers only its own k (index, value) pairs).
* ``rtl`` — the fabric server (:mod:`treenic.driver.server`) over loopback TCP and the host
  protocol (:mod:`treenic.driver.protocol`); the server's engine is the Verilated RTL fabric
  or the golden executor.
"""
from __future__ import annotations

import contextlib
import json
import time
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from .. import algorithms
from ..schedule.execute import CANONICAL_NAN
from ..schedule.ir import Op, Schedule
from ..schedule.sparse_table import SPARSE_ALGORITHMS
from ..topology import Topology, parse
from . import protocol as P
from .errors import BadTensor, DriverError, FabricError
from .fabric import (RTL_DENSE_DESCRIPTION, RTL_SPARSE_DESCRIPTION, GoldenEngine,
                     LocalFabric, Request, check_sparse_request, link_bytes, make_engine,
                     sparse_image_set)
from .torch_backend import TorchBackend as _TorchBackend

BACKENDS = ("model", "torch", "rtl", "udp")


@dataclass
class Counters:
    collectives: int = 0              # dense all-reduces completed
    sparse_collectives: int = 0
    steps: int = 0                    # schedule/sparse steps executed
    bytes_sent: int = 0               # bytes this rank put on the network links
    bytes_received: int = 0
    host_bytes_sent: int = 0          # rtl: bytes to/from the NIC over the host link
    host_bytes_received: int = 0
    cycles: int = 0                   # rtl engine: simulated NIC cycles (0: not modelled)
    seconds: float = 0.0              # wall time inside collectives


@dataclass
class SparseOutcome:
    tensor: object                    # the input tensor, now holding the result
    residual: object                  # new residual (same type/device as the tensor)
    bytes_sent: int
    bytes_received: int


def default_topology(world: int) -> str:
    return f"ring:{world}"


def schedule_for(algorithm, topology, world: int, **options) -> Schedule:
    """``algorithm`` (a ready Schedule, or a registry name compiled on ``topology`` with the
    builder's ``options``, e.g. ``variant=``) checked against the world size."""
    if isinstance(algorithm, Schedule):
        schedule = algorithm
    else:
        topo = topology if isinstance(topology, Topology) else \
            parse(topology or default_topology(world))
        schedule = algorithms.build(algorithm, topo, **options)
    if schedule.n != world:
        raise DriverError(f"schedule {schedule.algorithm} on {schedule.topology.spec} has "
                          f"{schedule.n} nodes but the world has {world} ranks")
    return schedule


def schedule_image(schedule: Schedule) -> bytes:
    """The schedule's canonical JSON: what the in-process backends (``model``, ``torch``)
    compare across ranks; their config id is its CRC-32. The ``rtl`` backend sends the
    fabric the compiler's image set instead (:class:`_RTLBackend`)."""
    return json.dumps(schedule.to_json(), sort_keys=True, separators=(",", ":")).encode()


def _to_numpy(tensor):
    """(1-D float32 numpy copy-or-view, kind) of a torch tensor or numpy array."""
    if isinstance(tensor, np.ndarray):
        arr = tensor
        kind = "numpy"
        if not arr.flags.writeable:
            raise BadTensor("the result is written into the caller's array, which is "
                              "read-only")
    else:
        arr = tensor.detach()
        if arr.device.type != "cpu":
            arr = arr.cpu()
        arr = arr.numpy()
        kind = "torch"
    if arr.dtype != np.float32:
        raise BadTensor(f"treenic NICs reduce binary32 only; got dtype {arr.dtype}")
    return np.ascontiguousarray(arr).reshape(-1), kind


def _write_back(tensor, values: np.ndarray):
    if isinstance(tensor, np.ndarray):
        # values are in C order (_to_numpy flattened a C-ordered copy); a strided or
        # Fortran-ordered array gets them element by element — reshape(-1) of such an array
        # is a copy, and writing into it left the caller's array unchanged
        np.copyto(tensor, values.reshape(tensor.shape))
    else:
        import torch
        values = np.ascontiguousarray(values)
        if not values.flags.writeable:
            values = values.copy()
        src = torch.from_numpy(values).view(tensor.shape)
        tensor.copy_(src)
    return tensor


def _canonicalize_nan_tensor(tensor) -> None:
    """The numeric contract's NaN rule (:data:`treenic.schedule.execute.CANONICAL_NAN`) on a
    torch result: torch/CUDA adds keep NaN payloads (and give 0xFFC00000 for inf - inf on
    x86). Whether an element is NaN does not depend on payloads, so canonicalising the result
    gives the bits the per-addition rule gives (every element went through an addition).
    Screened by ``amax`` first (NaN-propagating, one read pass, nothing allocated): the
    element-wise ``isnan`` mask costs ~40x more and a NaN-free result -- the common case --
    does not need it."""
    import torch
    if tensor.dtype != torch.float32 or tensor.numel() == 0:
        return
    if not bool(torch.isnan(tensor.amax())):
        return
    nan = torch.isnan(tensor)
    if bool(nan.any()):
        bits = torch.tensor(CANONICAL_NAN, dtype=torch.int64).to(torch.int32)
        tensor.masked_fill_(nan, bits.view(torch.float32).item())


def _like(tensor, values: np.ndarray):
    if isinstance(tensor, np.ndarray):
        return values.reshape(tensor.shape).copy()
    import torch
    return torch.from_numpy(values.copy()).view(tensor.shape).to(tensor.device)


class Communicator:
    """One rank's handle on the NIC fabric (see module docstring)."""

    def __init__(self, backend: str, rank: int, world: int, schedule: Schedule, **opts):
        if backend not in BACKENDS:
            raise DriverError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
        if not (isinstance(world, int) and world >= 2 and 0 <= rank < world):
            raise DriverError(f"bad rank/world {rank}/{world}")
        self.backend = backend
        self.rank, self.world = rank, world
        self.opts = opts
        self.counters = Counters()
        self.residuals: dict = {}
        self._seq = 0
        self._impl = {"model": _ModelBackend, "torch": _TorchBackend,
                      "rtl": _RTLBackend, "udp": _udp_backend}[backend](self, **opts)
        self.schedule: Schedule | None = None
        self.load_schedule(schedule)

    # ---- configuration ----------------------------------------------------------------
    def load_schedule(self, schedule, topology=None) -> int:
        """Load a Schedule (or an algorithm name + topology); returns the config id (CRC-32
        of the configuration image). Every rank must load the same schedule."""
        schedule = schedule_for(schedule, topology, self.world)
        image = schedule_image(schedule)
        loaded = self._impl.load(schedule, image)
        # the rtl backend's id is the loaded image set's (0 until its first collective)
        self.config_id = zlib.crc32(image) if loaded is None else loaded
        self.schedule = schedule
        return self.config_id

    # ---- collectives ------------------------------------------------------------------
    def allreduce(self, tensor):
        """In-place sum over all ranks; returns ``tensor``."""
        t0 = time.perf_counter()
        self._seq += 1
        with self._aborting_on_bad_tensor():
            sent, recv = self._impl.dense(tensor, self._seq)
        if self.backend == "torch":
            _canonicalize_nan_tensor(tensor)
        c = self.counters
        c.collectives += 1
        c.steps += self.schedule.steps
        c.bytes_sent += sent
        c.bytes_received += recv
        c.seconds += time.perf_counter() - t0
        return tensor

    def sparse_allreduce(self, tensor, density: float, *, scheme: str = "topka", key=None,
                         residual=None, seed: int = 0,
                         options: dict | None = None) -> SparseOutcome:
        """Sparse all-reduce with error feedback. ``residual`` given: used and the new one
        returned (caller keeps state, e.g. the DDP hook); else kept in ``self.residuals[key]``
        (reset when the tensor size changes). ``options``: the scheme's NIC options
        (:data:`~treenic.driver.fabric.SPARSE_OPTIONS`: ``residual``, ``flow_assignment``;
        MultiTree-Sparse only), validated before anything is sent."""
        if not 0.0 < float(density) <= 1.0:
            raise DriverError(f"density must be in (0, 1], got {density}")
        options = check_sparse_request(scheme, options, self.schedule)
        t0 = time.perf_counter()
        own = residual is None
        if own:
            residual = self.residuals.get(key)
            if residual is not None and residual.shape != tensor.shape:
                residual = None
        self._seq += 1
        with self._aborting_on_bad_tensor():
            new_res, sent, recv, steps = self._impl.sparse(tensor, residual, scheme,
                                                           float(density), int(seed), self._seq,
                                                           options)
        if own:
            self.residuals[key] = new_res
        c = self.counters
        c.sparse_collectives += 1
        c.steps += steps
        c.bytes_sent += sent
        c.bytes_received += recv
        c.seconds += time.perf_counter() - t0
        return SparseOutcome(tensor, new_res, sent, recv)

    def plan_sparse(self, scheme: str, density: float, *, seed: int = 0,
                    options: dict | None = None) -> None:
        """Announce the sparse request this communicator's later sparse collectives make
        (a DDP hook's dense warm-up before its sparse steps). Where the backend loads image
        sets (``rtl``), dense collectives then run from that request's sparse set when its
        dense part is exactly the schedule's dense set: on the ``rtl`` engine the warm-up
        and the sparse steps run on one fabric of combined NICs. Validated like a request;
        nothing is sent."""
        if not 0.0 < float(density) <= 1.0:
            raise DriverError(f"density must be in (0, 1], got {density}")
        options = check_sparse_request(scheme, options, self.schedule)
        plan = getattr(self._impl, "plan_sparse", None)
        if plan is not None:
            plan(scheme, float(density), int(seed), options)

    @contextlib.contextmanager
    def _aborting_on_bad_tensor(self):
        """A bad tensor on this rank fails the collective for every rank at once, naming
        this rank (the peers would otherwise wait for their timeout)."""
        try:
            yield
        except BadTensor as e:
            abort = getattr(self._impl, "abort", None)
            if abort is not None:
                try:
                    abort(self._seq, str(e))
                except FabricError:
                    pass                       # the fabric is gone: nobody left to tell
            raise BadTensor(f"rank {self.rank}: {e}") from None

    # ---- status -----------------------------------------------------------------------
    def status(self) -> dict:
        s = self.schedule
        out = {"backend": self.backend, "rank": self.rank, "world": self.world,
               "algorithm": s.algorithm, "topology": s.topology.spec, "steps": s.steps,
               "num_chunks": s.num_chunks, "config_id": self.config_id,
               "counters": asdict(self.counters)}
        out.update(self._impl.status())
        return out

    def close(self) -> None:
        self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_nic(backend: str, rank: int, world: int, topology=None, algorithm="multitree",
             **opts) -> Communicator:
    """Open rank ``rank``'s NIC. ``algorithm`` is a registry name (``treenic.algorithms``)
    or a ready :class:`Schedule`; ``topology`` a spec or Topology (default ``ring:<world>``).

    Options: ``model``: ``fabric`` (LocalFabric; else torch.distributed), ``group``,
    ``engine`` ("golden"), ``timeout`` (seconds per collective; default: the fabric's
    own); ``torch``: ``group``, ``verify`` (check sizes across ranks per call, default
    True); ``rtl``: ``address`` (host, port) of the fabric server (required), ``secret``
    (the job secret its starter generated; default ``$TREENIC_FABRIC_SECRET``), ``timeout``
    (seconds per request, default 30)."""
    schedule = schedule_for(algorithm, topology, world)
    return Communicator(backend, rank, world, schedule, **opts)


# ---- backends -----------------------------------------------------------------------------

def _udp_backend(comm, **opts):
    """``udp``: boards over the host protocol (:mod:`treenic.driver.udp`)."""
    from .udp import UDPBackend
    return UDPBackend(comm, **opts)


class _ModelBackend:
    def __init__(self, comm: Communicator, fabric: LocalFabric | None = None, group=None,
                 engine: str = "golden", timeout: float | None = None):
        self.comm = comm
        self.fabric = fabric
        self.group = group
        self.engine_name = engine
        self.timeout = timeout
        if fabric is None:
            import torch.distributed as dist
            if not dist.is_initialized():
                raise DriverError("backend 'model' needs fabric=LocalFabric(...) (threads) or "
                                  "an initialised torch.distributed group (processes)")
            if dist.get_world_size(group) != comm.world or dist.get_rank(group) != comm.rank:
                raise DriverError(f"torch.distributed rank/world {dist.get_rank(group)}/"
                                  f"{dist.get_world_size(group)} != {comm.rank}/{comm.world}")
        elif fabric.world != comm.world:
            raise DriverError(f"fabric has {fabric.world} nodes, world is {comm.world}")
        self._link_cache = {}

    def load(self, schedule, image):
        if self.fabric is not None:
            if schedule_image(self.fabric.schedule) != image:
                raise FabricError(f"rank {self.comm.rank}: schedule differs from the one "
                                  "loaded into the shared fabric")
            self.engine = self.fabric.engine
        else:
            self.engine = make_engine(self.engine_name, schedule)
            _check_same_config(self.comm, zlib.crc32(image), self.group)
        self._link_cache.clear()

    def _gather(self, data: np.ndarray, signature: tuple) -> np.ndarray:
        """Processes: all ranks' buffers via torch.distributed (after checking that every
        rank asks for the same collective)."""
        import torch
        import torch.distributed as dist
        sigs = [None] * self.comm.world
        dist.all_gather_object(sigs, signature, group=self.group)
        if len(set(sigs)) != 1:
            raise FabricError(f"rank {self.comm.rank}: ranks disagree on collective "
                              f"#{self.comm._seq}: " + "; ".join(
                                  f"rank {r}: {s}" for r, s in enumerate(sigs)),
                              code="SIZE_MISMATCH")
        src = torch.from_numpy(data)
        out = [torch.empty_like(src) for _ in range(self.comm.world)]
        dist.all_gather(out, src, group=self.group)
        return np.stack([o.numpy() for o in out])

    def dense(self, tensor, seq):
        data, _ = _to_numpy(tensor)
        if self.fabric is not None:
            out = self.fabric.rendezvous.submit(seq, self.comm.rank, Request("dense", data),
                                                timeout=self.timeout)
            _write_back(tensor, out.result)
            return out.sent, out.received
        stacked = self._gather(data, ("dense", data.shape[0]))
        result, _ = self.engine.run(stacked)
        _write_back(tensor, result[self.comm.rank])
        e = data.shape[0]
        if e not in self._link_cache:
            self._link_cache[e] = link_bytes(self.comm.schedule, e)
        sent, recv = self._link_cache[e]
        return int(sent[self.comm.rank]), int(recv[self.comm.rank])

    def sparse(self, tensor, residual, scheme, density, seed, seq, options=None):
        data, _ = _to_numpy(tensor)
        acc = data.copy() if residual is None else data + _to_numpy(residual)[0]
        opts = tuple(sorted((options or {}).items()))
        if self.fabric is not None:
            out = self.fabric.rendezvous.submit(
                seq, self.comm.rank, Request("sparse", acc, scheme, density, seed, opts),
                timeout=self.timeout)
            _write_back(tensor, out.result)
            return _like(tensor, out.residual), out.sent, out.received, out.steps
        stacked = self._gather(acc, ("sparse", acc.shape[0], scheme, density, seed, opts))
        res = self.engine.run_sparse(scheme, stacked, density, seed, dict(opts))
        r = self.comm.rank
        _write_back(tensor, np.asarray(res.result[r], np.float32))
        return (_like(tensor, np.asarray(res.residuals[r], np.float32)),
                int(res.bytes_sent_per_worker()[r]), int(res.bytes_received_per_worker()[r]),
                res.steps)

    def abort(self, seq, reason):
        if self.fabric is not None:
            self.fabric.rendezvous.fail(seq, self.comm.rank, reason)
            return
        # the peers are in _gather's signature exchange: they see this one and refuse
        import torch.distributed as dist
        sigs = [None] * self.comm.world
        dist.all_gather_object(sigs, ("aborted", reason), group=self.group)

    def status(self):
        return {"engine": self.engine.name,
                "dense_engine": self.engine.dense_description,
                "sparse_engine": self.engine.sparse_description,
                "transport": "in-process fabric" if self.fabric else "torch.distributed gather"}

    def close(self):
        pass


def _check_same_config(comm: Communicator, config_id: int, group) -> None:
    import torch.distributed as dist
    ids = [None] * comm.world
    dist.all_gather_object(ids, config_id, group=group)
    if len(set(ids)) != 1:
        raise FabricError(f"rank {comm.rank}: ranks loaded different schedules (config ids "
                          + ", ".join(f"rank {r}: {i:#010x}" for r, i in enumerate(ids)) + ")",
                          code="CONFIG_MISMATCH")


class _RTLBackend:
    def __init__(self, comm: Communicator, address=None, timeout: float = 30.0,
                 connect_timeout: float = 10.0, secret: str | bytes | None = None):
        from .client import NICClient
        if address is None:
            raise DriverError("backend 'rtl' needs address=(host, port) of a fabric server "
                              "(treenic.driver.server.ServerProcess)")
        self.comm = comm
        self.client = NICClient(address, comm.rank, comm.world, timeout, connect_timeout,
                                secret=secret)
        self._last_cycles = None

    def load(self, schedule, image):
        """Nothing is sent yet: an image set is for one element count (and a sparse one for
        one sparse request), so each collective loads the set it needs when another is
        loaded (:meth:`_configure`). Returns the config id now loaded (0: none)."""
        self.schedule = schedule
        self._loaded_key = None
        self._image_sets: dict[tuple, bytes] = {}       # what the set is for -> its bytes
        #: sparse set key -> whether its dense part is this schedule's dense set
        self._dense_parts: dict[tuple, bool] = {}
        #: config id -> what the sparse collectives that ran from that image set asked for
        self._sparse_images: dict[int, dict] = {}
        #: dense collectives run from the schedule's dense set / from a loaded sparse set
        self._dense_from = {"dense set": 0, "sparse set": 0}
        #: sparse set key -> its request (scheme, density, seed, options)
        self._sparse_args: dict[tuple, tuple] = {}
        self._planned = None
        return 0

    def plan_sparse(self, scheme, density, seed, options) -> None:
        """The sparse request later collectives make (:meth:`Communicator.plan_sparse`)."""
        self._planned = (scheme, density, seed, options) if scheme in SPARSE_ALGORITHMS \
            else None

    def _configure(self, elements: int, seq: int, sparse: tuple | None = None) -> None:
        """Load, before collective ``seq``, the image set it runs when another is loaded:
        the dense set of the schedule for ``elements``, or -- for ``sparse`` = (scheme,
        density, seed, options) of a scheme the image encodes -- the sparse set of that
        request (:func:`~treenic.driver.fabric.sparse_image_set`: the dense MultiTree
        images + every node's sparse program), whose program the fabric runs. A dense
        collective runs from the loaded sparse set, or else from the planned one
        (:meth:`plan_sparse`), when its dense part is exactly the schedule's dense set (its
        bytes without the sparse sections): the rtl engine then runs the dense and the
        sparse steps on the same fabric of combined NICs, with no LOAD_CONFIG between.
        Each set is compiled once (a job's buckets alternate between a few); the config id
        is the CRC-32 of the bytes sent."""
        if sparse is None:
            planned = self._planned and self._sparse_key(elements, self._planned)
            for cand in (self._loaded_key, planned):
                if cand and cand[:2] == ("sparse", elements) and \
                        self._dense_part_is_ours(cand, elements, seq):
                    return self._load(cand, elements, seq)
            return self._load(("dense", elements), elements, seq)
        return self._load(self._sparse_key(elements, sparse), elements, seq)

    def _sparse_key(self, elements: int, sparse: tuple) -> tuple:
        scheme, density, seed, options = sparse
        hashed = options.get("flow_assignment") == "hash"
        key = ("sparse", elements, scheme, density, seed if hashed else None,
               tuple(sorted(options.items())))
        self._sparse_args[key] = sparse
        return key

    def _load(self, key: tuple, elements: int, seq: int) -> None:
        if self._loaded_key == key:
            return
        image_set = self._image_set(key, elements, seq)
        self.comm.config_id, _, _ = self.client.load_config(
            image_set, what=f"collective #{seq} step LOAD_CONFIG")
        self._loaded_key = key

    def _image_set(self, key: tuple, elements: int, seq: int) -> bytes:
        image_set = self._image_sets.get(key)
        sparse = self._sparse_args.get(key) if key[0] == "sparse" else None
        if image_set is None:
            from ..firmware.image import ImageError, compile_images
            try:
                images = (compile_images(None, self.schedule, elements) if sparse is None else
                          sparse_image_set(self.schedule.topology.spec, sparse[0],
                                           elements, *sparse[1:]))
            except ImageError as e:
                raise DriverError(f"rank {self.comm.rank}: collective #{seq}: cannot compile "
                                  f"its image set: {e}") from None
            image_set = images.to_bytes()
            if len(self._image_sets) >= 16:                # bounded: oldest first
                self._image_sets.pop(next(iter(self._image_sets)))
            self._image_sets[key] = image_set
        return image_set

    def _dense_part_is_ours(self, key: tuple, elements: int, seq: int) -> bool:
        """Whether the sparse set ``key`` holds, without its sparse sections,
        exactly the schedule's dense set for ``elements`` (the MultiTree schedule's does)."""
        verdict = self._dense_parts.get(key)
        if verdict is None:
            import dataclasses
            from ..firmware.image import ImageSet
            loaded = ImageSet.from_bytes(self._image_set(key, elements, seq))
            dense = ImageSet([dataclasses.replace(im, sparse=None) for im in loaded],
                             loaded.topology)
            verdict = dense.to_bytes() == self._image_set(("dense", elements), elements, seq)
            if len(self._dense_parts) >= 16:
                self._dense_parts.pop(next(iter(self._dense_parts)))
            self._dense_parts[key] = verdict
        return verdict

    def _account(self):
        c = self.comm.counters
        c.host_bytes_sent = self.client.host_tx
        c.host_bytes_received = self.client.host_rx

    def dense(self, tensor, seq):
        data, _ = _to_numpy(tensor)
        self._configure(data.shape[0], seq)
        self._dense_from["sparse set" if self._loaded_key[0] == "sparse" else "dense set"] += 1
        result, _, info = self.client.collective(seq, data)
        _write_back(tensor, result)
        if info["cycles"] is not None:
            self.comm.counters.cycles += info["cycles"]
        self._last_cycles = info["cycles"]
        self._account()
        return info["sent"], info["received"]

    def sparse(self, tensor, residual, scheme, density, seed, seq, options=None):
        data, _ = _to_numpy(tensor)
        acc = data.copy() if residual is None else data + _to_numpy(residual)[0]
        options = dict(options or {})
        # a scheme the image encodes runs the program of the set loaded for it; the golden
        # engine's other models run on the dense set (the rtl engine refuses them)
        imaged = scheme in SPARSE_ALGORITHMS
        self._configure(acc.shape[0], seq,
                        (scheme, density, seed, options) if imaged else None)
        result, new_res, info = self.client.collective(seq, acc,
                                                       sparse=(scheme, density, seed, options))
        if imaged:
            self._record_sparse_image(scheme, acc.shape[0], density, seed, options)
        if info["cycles"] is not None:
            self.comm.counters.cycles += info["cycles"]
        _write_back(tensor, result)
        self._account()
        return _like(tensor, new_res), info["sent"], info["received"], info["steps"]

    def _record_sparse_image(self, scheme, elements, density, seed, options) -> None:
        """Which image set (config id, as the fabric acknowledged it) a sparse collective
        ran from, for status(); bounded (oldest first)."""
        cid = self.comm.config_id
        entry = self._sparse_images.get(cid)
        if entry is None:
            while len(self._sparse_images) >= 64:
                self._sparse_images.pop(next(iter(self._sparse_images)))
            entry = self._sparse_images[cid] = dict(
                config_id=f"{cid:#010x}", scheme=scheme, elements=int(elements),
                density=float(density), **options, collectives=0)
            if options.get("flow_assignment") == "hash":
                entry["seed"] = int(seed)
        entry["collectives"] += 1
        self._last_sparse_image = entry["config_id"]

    def abort(self, seq, reason):
        self.client.abort(seq, reason)

    def status(self):
        # the server runs one engine for both kinds; the golden one's sparse side is the
        # treenic.sparse models (the rtl engine refuses a sparse scheme it does not run).
        # On the rtl engine a dense collective ran on the dense set's NIC fabric, or -- from
        # a loaded sparse set -- on that set's fabric of combined NICs (_configure)
        golden = self.client.engine_id == P.ENGINE_IDS["golden"]
        used = {GoldenEngine.dense_description if golden else RTL_DENSE_DESCRIPTION:
                self._dense_from["dense set"]}
        sparse_fabric = GoldenEngine.dense_description if golden else RTL_SPARSE_DESCRIPTION
        used[sparse_fabric] = used.get(sparse_fabric, 0) + self._dense_from["sparse set"]
        ran = {k: n for k, n in used.items() if n}
        dense = (next(iter(ran)) if len(ran) == 1 else
                 "; ".join(f"{k} ({n} collectives)" for k, n in ran.items()) if ran else
                 (GoldenEngine.dense_description if golden else self.client.engine_description))
        return {"engine": self.client.engine_description,
                "dense_engine": dense,
                "dense_collectives_by_set": dict(self._dense_from),
                "sparse_engine": (GoldenEngine.sparse_description if golden
                                  else RTL_SPARSE_DESCRIPTION),
                "last_cycles": self._last_cycles,
                # the image sets the sparse collectives ran from (the program is the set's
                # sparse section; the fabric refuses a request that does not match it)
                "sparse_image": getattr(self, "_last_sparse_image", None),
                "sparse_images": list(self._sparse_images.values()),
                "nic": self.client.status()}

    def close(self):
        self.client.close()
