"""Fabric engines and the rendezvous that joins N ranks into one collective.

A *fabric engine* simulates the N NICs and their links for one loaded schedule::

    engine.run(buffers)           # (N, E) float32 -> ((N, E) float32 result, cycles | None)
    engine.run_sparse(scheme, accs, density, seed, options) -> treenic.sparse.SparseResult
    engine.sparse_unsupported(scheme) -> None | reason

* :class:`GoldenEngine` — the golden executor (:func:`treenic.schedule.execute.execute`) for
  dense schedules and the :mod:`treenic.sparse` golden models for sparse schemes. It does not
  model time: ``cycles`` is ``None``.
* :class:`RTLEngine` — the Verilated NIC fabric. **Hook-up point:** :data:`RTL_MODULE`'s
  ``FabricSim(topology, schedule, elements)`` with ``run(buffers) -> (buffers, cycles)``
  (same contract as above). When that module, Verilator or a C++ compiler is missing, the
  topology has switches, or the build fails, the constructor / :meth:`RTLEngine.prepare`
  raises :class:`~treenic.driver.errors.RTLFabricUnavailable` with the reason; nothing
  fakes it. ``run_sparse`` runs the schemes the RTL implements (:attr:`RTLEngine.SPARSE_SCHEMES`:
  MultiTree-Sparse and TopkA on the Verilated fabric of combined NICs,
  :mod:`treenic.hdl.nic.sparse_nic_sim`, on the schedule's topology); any other scheme
  raises (no golden fallback), and :func:`rtl_sparse_unsupported` says so before anything
  runs. An engine loaded with a sparse image set runs the set's dense collectives on that
  same fabric too.

**Loaded sparse programs.** An engine the fabric server built from a received image set
(:func:`loaded_engine`) runs a sparse scheme that has an image encoding
(:data:`~treenic.schedule.sparse_table.SPARSE_ALGORITHMS`) from the set's sparse section
only: the RTL engine loads the engines' PROG rows decoded from it, the golden engine runs
the golden model of the program's own parameters. A request whose scheme, element count,
density, residual, flow assignment or hash seed differ from the loaded program's, or one
sent while the loaded set has no sparse program, is refused (:func:`sparse_request_refusal`)
-- never recompiled. An engine without a loaded set (in-process :class:`LocalFabric`)
compiles the request's own program.

:class:`Rendezvous` matches the k-th collective of every rank (by sequence number), checks
that all ranks asked for the same thing (mode, element count, sparse parameters), runs the
engine once and hands each rank its row. The in-process :class:`LocalFabric` (threads) and
the fabric server (one connection thread per rank) both use it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..schedule.execute import execute
from ..schedule.ir import Schedule
from ..schedule.sparse_table import SPARSE_ALGORITHMS, program_golden, program_parameters
from .errors import DriverError, FabricError, FabricTimeout, RTLFabricUnavailable

#: Name (for messages) of the module the RTL engine imports, :mod:`treenic.hdl.nic.fabric_sim`:
#: ``FabricSim(topology, schedule, elements)`` with ``run(buffers) -> (buffers, cycles)``
#: (N Verilated NIC cores wired by link models, built with :mod:`treenic.hdl.cosim`).
RTL_MODULE = "treenic.hdl.nic.fabric_sim"
RTL_DENSE_DESCRIPTION = f"Verilated NIC fabric ({RTL_MODULE}.FabricSim)"

#: The Verilated fabric of combined NICs (the sparse engine inside each NIC) the RTL engine
#: runs sparse schemes on -- and the dense collectives of a loaded sparse image set, so the
#: dense and sparse steps of one run use the same simulated NICs and links.
RTL_SPARSE_MODULE = "treenic.hdl.nic.sparse_nic_sim"
RTL_SPARSE_DESCRIPTION = f"Verilated fabric of combined NICs ({RTL_SPARSE_MODULE})"

ENGINES = ("golden", "rtl")
#: sparse schemes the RTL engine runs (docs/sparse-nic.md): those the image encodes
RTL_SPARSE = SPARSE_ALGORITHMS
#: How often a rank waiting in a collective checks that its own connection is still open.
POLL_SECONDS = 0.1


def link_bytes(schedule: Schedule, elements: int, itemsize: int = 4):
    """Bytes each node sends / receives on its links for one collective of ``elements``."""
    sent = np.zeros(schedule.n, np.int64)
    recv = np.zeros(schedule.n, np.int64)
    for t in schedule.transfers:
        b = schedule.bytes_of(t, elements, itemsize)
        sent[t.src] += b
        recv[t.dst] += b
    return sent, recv


#: Options a sparse request may carry, with their values (first: the default). The NIC's
#: sparse datapath reads them from the request: ``residual`` — which error-feedback residual
#: every node keeps (``treenic.sparse.multitree_sparse``: "local" = what it discarded,
#: "global" = SparDL's GRC); ``flow_assignment`` — how elements map onto the trees
#: ("contiguous" chunks or Zen's "hash"). Only MultiTree-Sparse has them.
SPARSE_OPTIONS = {"residual": ("local", "global"), "flow_assignment": ("contiguous", "hash")}
#: Schemes that take :data:`SPARSE_OPTIONS`.
SCHEMES_WITH_OPTIONS = ("multitree-sparse",)


def check_sparse_request(scheme: str, options: dict | None, schedule: Schedule | None) -> dict:
    """The complete, validated options of a sparse request (defaults filled in); raises
    :class:`DriverError` naming the problem. MultiTree-Sparse runs on the loaded MultiTree
    schedule (its trees are the flows), so the loaded schedule must be ``multitree``."""
    from ..sparse.base import REGISTRY
    if scheme not in REGISTRY:
        raise DriverError(f"unknown sparse scheme {scheme!r}; known: {', '.join(REGISTRY)}")
    options = dict(options or {})
    for key, value in options.items():
        if key not in SPARSE_OPTIONS:
            raise DriverError(f"unknown sparse option {key!r}; known: "
                              f"{', '.join(SPARSE_OPTIONS)}")
        if value not in SPARSE_OPTIONS[key]:
            raise DriverError(f"sparse option {key}={value!r}: must be one of "
                              f"{', '.join(SPARSE_OPTIONS[key])}")
    if scheme not in SCHEMES_WITH_OPTIONS:
        odd = {k: v for k, v in options.items() if v != SPARSE_OPTIONS[k][0]}
        if odd:
            raise DriverError(f"sparse scheme {scheme!r} has no option "
                              + ", ".join(f"{k}={v!r}" for k, v in odd.items())
                              + f" (only {', '.join(SCHEMES_WITH_OPTIONS)} has)")
        return {}
    if schedule is not None and not runs_multitree_trees(schedule):
        raise DriverError(f"sparse scheme {scheme!r} runs on the MultiTree schedule's trees; "
                          f"the loaded schedule is {schedule.algorithm!r}"
                          + (" and not the MultiTree schedule of its topology"
                             if schedule.algorithm == "image-set" else ""))
    return {k: options.get(k, vals[0]) for k, vals in SPARSE_OPTIONS.items()}


def runs_multitree_trees(schedule: Schedule) -> bool:
    """True when ``schedule`` is the MultiTree schedule MultiTree-Sparse builds for its
    topology. A schedule decoded from an image set has no algorithm name, so its transfers
    are compared with that build (once; the answer is kept in ``schedule.meta``)."""
    if schedule.algorithm == "multitree":
        return True
    if "multitree_sparse_trees" not in schedule.meta:
        from ..sparse.multitree_sparse import build_schedule
        ref = build_schedule(schedule.n, schedule.topology.spec)
        schedule.meta["multitree_sparse_trees"] = (
            [t.to_json() for t in ref.transfers] == [t.to_json() for t in schedule.transfers])
    return schedule.meta["multitree_sparse_trees"]


def run_sparse_model(scheme: str, accs: np.ndarray, density: float, seed: int,
                     options: dict | None = None, schedule: Schedule | None = None):
    """The :mod:`treenic.sparse` golden model of one sparse collective on ``accs`` (gradient
    + residual per rank; the model starts from a zero residual). MultiTree-Sparse runs on
    ``schedule``'s topology (the loaded MultiTree schedule), not its own default."""
    from ..sparse import base as sparse_base
    workers, elements = accs.shape
    opts = check_sparse_request(scheme, options, schedule)
    if opts and schedule is not None:
        opts["topology"] = schedule.topology.spec
    algo = sparse_base.make(scheme, workers=workers, elements=elements, density=density,
                            seed=seed, **opts)
    return algo.step(np.ascontiguousarray(accs, dtype=np.float32))


def _describe(p: dict) -> str:
    """One line of sparse request / program parameters."""
    seed = "" if p["seed"] is None else f" seed={p['seed']}"
    opts = "" if p["algorithm"] not in SCHEMES_WITH_OPTIONS else \
        f" residual={p['residual']} flow_assignment={p['flow_assignment']}{seed}"
    return f"{p['algorithm']} of {p['elements']} elements at density={p['density']!r}{opts}"


def sparse_request_refusal(engine, scheme: str, elements: int, density: float, seed: int,
                           options: dict | None) -> tuple[str, str] | None:
    """``(error code name, one-line reason)`` when ``engine``, loaded from an image set, must
    not run this sparse request (validated ``options``, :func:`check_sparse_request`), else
    None. The loaded program's parameters are the contract: a scheme with an image encoding
    runs only the set's sparse program, so a set without one (``NOT_READY``), another
    element count (``SIZE_MISMATCH``) or other parameters (``CONFIG_MISMATCH``) are refused
    -- nothing is recompiled. An engine without a loaded set, or a scheme without an image
    encoding (the golden engine's other models), is not refused here."""
    if getattr(engine, "images", None) is None or scheme not in SPARSE_ALGORITHMS:
        return None
    program = engine.sparse_program
    cid = getattr(engine, "config_id", None)
    where = "the loaded image set" + ("" if cid is None else f" {cid:#010x}")
    if program is None:
        return "NOT_READY", (f"no sparse program loaded: {where} is dense-only; load the "
                             f"image set of {scheme} at density {density!r} "
                             "(compile_images(..., density=...)) before a sparse START")
    options = options or {}
    flow = options.get("flow_assignment", SPARSE_OPTIONS["flow_assignment"][0])
    asked = dict(algorithm=scheme, elements=int(elements), density=float(density),
                 residual=options.get("residual", SPARSE_OPTIONS["residual"][0]),
                 flow_assignment=flow, seed=int(seed) if flow == "hash" else None)
    held = program_parameters(program)
    differ = [k for k in asked if asked[k] != held[k]]
    if "flow_assignment" in differ and "seed" in differ:
        differ.remove("seed")             # a hash seed exists on one side only
    if not differ:
        return None
    code = "SIZE_MISMATCH" if differ == ["elements"] else "CONFIG_MISMATCH"
    return code, (f"sparse START asks for {_describe(asked)} but {where} holds "
                  f"{_describe(held)} (they differ in {', '.join(differ)}); nothing ran: "
                  "load the request's image set first")


def loaded_engine(name: str, data: bytes, nodes: int):
    """``(schedule, engine)`` of a received image set (the fabric server's LOAD_CONFIG):
    checked (:func:`~treenic.driver.config.parse_image_set`, and its sparse section
    :func:`~treenic.driver.config.parse_sparse_program`) and engine ``name`` built to run
    exactly it. Raises ConfigRejected or RTLFabricUnavailable."""
    from .config import parse_image_set, parse_sparse_program
    images, schedule = parse_image_set(data, nodes)
    return schedule, make_engine(name, schedule, images, parse_sparse_program(images))


def sparse_image_set(topology: str, scheme: str, elements: int, density: float, seed: int,
                     options: dict | None = None):
    """The configuration image set a rank loads for a sparse request of ``scheme`` (one of
    :data:`~treenic.schedule.sparse_table.SPARSE_ALGORITHMS`) with validated ``options``:
    the schedule compiler's :func:`~treenic.firmware.image.compile_images` (``density=``),
    the one source of the program both engines run. The seed is compiled in only where it
    is part of the program (hash flows), so requests differing in nothing else share a
    set."""
    from ..firmware.image import compile_images
    options = dict(options or {})
    hashed = options.get("flow_assignment") == "hash"
    return compile_images(topology, scheme, elements, density=float(density),
                          seed=int(seed) if hashed else 0, **options)


def _refuse_loaded_mismatch(engine, scheme, accs, density, seed, options) -> None:
    refusal = sparse_request_refusal(engine, scheme, accs.shape[1], density, seed, options)
    if refusal:
        raise FabricError(refusal[1], code=refusal[0])


class GoldenEngine:
    """The golden executor. Loaded from an image set (the fabric server), ``schedule`` is
    the one the set's rows describe (:func:`treenic.firmware.image.decode_schedule`), so
    the golden engine runs what the RTL's tables hold."""
    name = "golden"
    description = "golden executor (treenic.schedule.execute) + treenic.sparse golden models"
    #: what ran each kind of collective (results and JSON name it)
    dense_description = "golden executor (treenic.schedule.execute)"
    sparse_description = "golden (treenic.sparse models)"

    def __init__(self, schedule: Schedule, images=None, sparse_program=None):
        self.schedule = schedule
        #: the loaded :class:`~treenic.firmware.image.ImageSet` (None: in-process fabric)
        self.images = images
        #: the set's checked sparse program (None: dense-only set, or no set)
        self.sparse_program = sparse_program
        #: the loaded set's config id (the fabric server sets it; messages name it)
        self.config_id = None

    def sparse_unsupported(self, scheme: str, options: dict | None = None) -> str | None:
        """None: :meth:`run_sparse` runs ``scheme`` with ``options``; else why not."""
        return None

    def run(self, buffers: np.ndarray):
        return execute(self.schedule, buffers), None

    def run_sparse(self, scheme: str, accs: np.ndarray, density: float, seed: int,
                   options: dict | None = None):
        """The golden model of the loaded sparse program (its own parameters, which the
        request must match), or, with no set loaded or a scheme without an image encoding,
        of the request."""
        _refuse_loaded_mismatch(self, scheme, accs, density, seed, options)
        if self.images is not None and scheme in SPARSE_ALGORITHMS:
            res = program_golden(self.sparse_program, seed).step(
                np.ascontiguousarray(accs, dtype=np.float32))
            res.info["program"] = "loaded image set"
            return res
        return run_sparse_model(scheme, accs, density, seed, options, self.schedule)


class RTLEngine:
    """The Verilated NIC fabric (:data:`RTL_MODULE`, ``FabricSim``): N NIC cores wired by
    link models, loaded with the firmware images of the schedule, run to DONE; cycles are the
    fabric's ``start .. done`` counter. One Verilated build per buffer size (cached on disk
    under ``build/cosim``), so the first collective of a new size pays the build. Given
    ``images`` (the fabric server: the image set a rank loaded), the fabric loads exactly
    those images and runs their element count only. Given a sparse set (``sparse_program``),
    the fabric is one of combined NICs (:data:`RTL_SPARSE_MODULE`,
    ``CombinedFabricSim``) loaded with the set: its dense collectives and its sparse
    program's run on the same NICs and links."""

    name = "rtl"
    #: Sparse schemes :meth:`run_sparse` runs on the Verilated fabric; any other is an error
    #: on this engine (never handed to the golden models behind the caller's back).
    SPARSE_SCHEMES: tuple = RTL_SPARSE
    #: Values of each sparse option (:data:`SPARSE_OPTIONS`) :meth:`run_sparse` runs on the
    #: fabric; a request with another value is an error on this engine, never a golden run.
    #: Hash flows: the host sends element order; the engines' hash placers lay the buffer
    #: out in the hash's flow order (SparseFabricSim, treenic.hdl.nic.sparse_place).
    SPARSE_OPTION_VALUES: dict = {"residual": ("local", "global"),
                                  "flow_assignment": ("contiguous", "hash")}

    def __init__(self, schedule: Schedule, images=None, sparse_program=None):
        self.schedule = schedule
        self.images = images
        self.sparse_program = sparse_program
        self.config_id = None
        if not schedule.topology.is_direct:
            raise RTLFabricUnavailable(f"RTL fabric engine unavailable: the RTL fabric wires "
                                       f"direct networks only; {schedule.topology.spec} has "
                                       "switches")
        try:
            from ..hdl.nic import fabric_sim as mod     # the RTL fabric: a visible dependency
        except ImportError as e:
            raise RTLFabricUnavailable(
                f"RTL fabric engine unavailable: {RTL_MODULE} cannot be imported ({e}); the "
                "Verilated NIC fabric is not part of this checkout") from None
        self._cls = getattr(mod, "FabricSim", None)
        if self._cls is None:
            raise RTLFabricUnavailable(f"RTL fabric engine unavailable: {RTL_MODULE} has no "
                                       "FabricSim")
        try:
            from ..hdl.cosim import cosim_available
            ok = cosim_available()
        except ImportError as e:
            ok, why = False, str(e)
        else:
            why = "verilator or a C++ compiler is not on PATH"
        if not ok:
            raise RTLFabricUnavailable(f"RTL fabric engine unavailable: cannot build the "
                                       f"Verilated fabric ({why})")
        self._sims: dict[int, object] = {}
        #: fabrics of combined NICs of an engine without a loaded set, per sparse request
        self._sparse: dict[tuple, object] = {}
        #: a loaded sparse set: one fabric of combined NICs runs its dense and sparse steps
        self.combined = images is not None and sparse_program is not None
        self.description = RTL_SPARSE_DESCRIPTION if self.combined else RTL_DENSE_DESCRIPTION
        self.dense_description = self.description
        self.sparse_description = RTL_SPARSE_DESCRIPTION

    def sparse_unsupported(self, scheme: str, options: dict | None = None) -> str | None:
        """None: :meth:`run_sparse` runs ``scheme`` with ``options`` on the fabric; else why
        not."""
        return rtl_sparse_unsupported(scheme, options)

    def prepare(self, elements: int):
        """Build (or load from the cache) the fabric for ``elements`` per node."""
        sim = self._sims.get(elements)
        if sim is None and self.images is not None and elements != self.images.elements:
            raise FabricError(f"the loaded image set is for {self.images.elements} elements, "
                              f"not {elements}", code="SIZE_MISMATCH")
        if sim is None:
            if self.combined:
                sim = _build_fabric(elements, self._combined_sim, self.images,
                                    self.sparse_program)
            elif self.images is None:
                sim = _build_fabric(elements, self._cls, self.schedule.topology,
                                    self.schedule, elements)
            else:
                sim = _build_fabric(elements, self._cls, self.schedule.topology, None, None,
                                    images=self.images)
            self._sims[elements] = sim
        return sim

    @staticmethod
    def _combined_sim(images, program):
        from ..hdl.nic.sparse_nic_sim import CombinedFabricSim
        return CombinedFabricSim(images, program)

    def _request_fabric(self, scheme: str, elements: int, density: float, seed: int,
                        options: dict):
        """The fabric of combined NICs for a sparse request of an engine without a loaded
        set: built from the request's own image set (:func:`sparse_image_set`), cached per
        program (the Verilated build is cached on disk per size)."""
        from ..firmware.image import decode_sparse_program
        hashed = options.get("flow_assignment") == "hash"
        key = (scheme, elements, float(density), int(seed) if hashed else None,
               tuple(sorted(options.items())))
        sim = self._sparse.get(key)
        if sim is None:
            images = sparse_image_set(self.schedule.topology.spec, scheme, elements, density,
                                      seed, options)
            sim = self._sparse[key] = _build_fabric(
                elements, self._combined_sim, images, decode_sparse_program(images))
        return sim

    def run(self, buffers: np.ndarray):
        sim = self.prepare(int(buffers.shape[1]))
        out, cycles = sim.dense(buffers) if self.combined else sim.run(buffers)
        out = np.asarray(out)
        if out.shape != buffers.shape or out.dtype != np.float32:
            raise FabricError(f"RTL fabric returned {out.dtype}{out.shape}, expected "
                              f"float32{buffers.shape}")
        return out, (None if cycles is None else int(cycles))

    def run_sparse(self, scheme, accs, density, seed, options=None):
        """MultiTree-Sparse or TopkA of ``accs`` on the Verilated fabric of combined NICs
        of the schedule's topology (results and residuals from the RTL, a fresh all-reduce
        per call: the driver keeps error feedback on the host); ``info["engine"]`` names
        it. Loaded from an image set, the fabric is the set's (its dense collectives run
        there too) and runs the set's sparse program, which the request must match; else
        the request's own image set is compiled."""
        why = rtl_sparse_unsupported(scheme, options)
        if why:
            raise FabricError(why)
        _refuse_loaded_mismatch(self, scheme, accs, density, seed, options)
        accs = np.ascontiguousarray(accs, np.float32)
        if self.images is not None:
            sim = self.prepare(int(accs.shape[1]))
        else:
            sim = self._request_fabric(scheme, int(accs.shape[1]), density, seed,
                                       check_sparse_request(scheme, options, self.schedule))
        try:
            res, _ = sim.run_fresh(accs, seed)
        except (ValueError, TimeoutError) as e:
            raise FabricError(f"RTL sparse fabric: {e}") from None
        if self.images is not None:
            res.info["program"] = "loaded image set"
        return res


def _build_fabric(elements: int, make, *args, **kw):
    """``make(*args, **kw)``: a Verilated fabric, built or loaded from ``build/cosim``; a
    failure is :class:`RTLFabricUnavailable` with the reason (a compiler log shortened to
    its first and last lines)."""
    try:
        return make(*args, **kw)
    except Exception as e:
        text = str(e).strip()
        lines = text.splitlines()
        if len(text) > 600:
            text = " | ".join(lines[:1] + ["..."] + lines[-2:])[:600]
        raise RTLFabricUnavailable(f"RTL fabric engine unavailable: building the fabric for "
                                   f"{elements} elements failed: {type(e).__name__}: "
                                   f"{text}") from None


def rtl_sparse_unsupported(scheme: str, options: dict | None = None) -> str | None:
    """None when the ``rtl`` engine runs sparse ``scheme`` with ``options`` on the Verilated
    fabric, else the reason (a one-line error; the caller must not fall back silently)."""
    if scheme not in RTLEngine.SPARSE_SCHEMES:
        runs = ", ".join(RTLEngine.SPARSE_SCHEMES) or "none yet"
        return (f"the rtl engine does not run sparse scheme {scheme!r} on the Verilated NIC "
                f"fabric (sparse schemes in the RTL: {runs}); use --engine golden, or request "
                "the golden fallback explicitly")
    for key, value in (options or {}).items():
        runs = RTLEngine.SPARSE_OPTION_VALUES.get(key, ())
        if value not in runs:
            return (f"the rtl engine runs sparse scheme {scheme!r} with {key} "
                    f"{' or '.join(runs) or '(none)'} only, not {value!r}; use "
                    + (f"--{key.replace('_', '-')} {runs[0]}, " if runs else "")
                    + "--engine golden, or request the golden fallback explicitly")
    return None


def make_engine(name: str, schedule: Schedule, images=None, sparse_program=None):
    """Engine ``name`` for ``schedule``; with ``images`` (an ImageSet whose rows describe
    ``schedule``, and ``sparse_program`` its checked sparse program or None) the engine runs
    that image set."""
    if name == "golden":
        return GoldenEngine(schedule, images, sparse_program)
    if name == "rtl":
        return RTLEngine(schedule, images, sparse_program)
    raise DriverError(f"unknown fabric engine {name!r}; known: {', '.join(ENGINES)}")


def rtl_unavailable_reason(schedule: Schedule, elements: int | None = None) -> str | None:
    """None when the RTL engine can be opened for ``schedule`` (and, given ``elements``,
    its fabric built for that size), else the reason it cannot."""
    try:
        engine = RTLEngine(schedule)
        if elements is not None:
            engine.prepare(elements)
    except RTLFabricUnavailable as e:
        return str(e)
    return None


# ---- rendezvous ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """What one rank asks for in one collective."""
    mode: str                          # "dense" | "sparse"
    data: np.ndarray                   # (E,) float32: gradient (dense) or grad+residual
    scheme: str = ""
    density: float = 0.0
    seed: int = 0
    #: validated sparse options (:func:`check_sparse_request`) as sorted (key, value) pairs
    options: tuple = ()
    #: the rank's loaded configuration ``(config_id, schedule, engine)``; None: the
    #: rendezvous' own (in-process fabric). Ranks with different ids get CONFIG_MISMATCH.
    config: tuple | None = field(default=None, compare=False, repr=False)

    def signature(self):
        return (self.mode, int(self.data.shape[0]), self.scheme, float(self.density),
                int(self.seed), self.options)


@dataclass
class Outcome:
    result: np.ndarray
    residual: np.ndarray | None
    sent: int                         # bytes this rank's NIC sent on its links
    received: int
    steps: int
    cycles: int | None


@dataclass
class _Record:
    requests: dict = field(default_factory=dict)
    outcomes: list | None = None
    error: Exception | None = None
    collected: int = 0
    created: float = field(default_factory=time.monotonic)


class Rendezvous:
    """Joins the k-th collective of ``world`` ranks; thread-safe, every wait bounded."""

    def __init__(self, world: int, engine, schedule: Schedule, timeout: float = 60.0):
        self.world = world
        self.engine = engine
        self.schedule = schedule
        self.timeout = float(timeout)
        self._cv = threading.Condition()
        self._records: dict[int, _Record] = {}
        self.completed = 0
        self._link_bytes_cache: dict[int, tuple] = {}
        #: ranks whose connection closed, and why: their peers' collectives abort at once
        self.departed: dict[int, str] = {}
        # seq -> (error, ranks that have not seen it yet): a rank gave up on collective seq;
        # forgotten once every other rank met it, so a reopened communicator (sequence
        # numbers from 1 again) is not failed by an old abort
        self._failed: dict[int, tuple[FabricError, set]] = {}

    def busy(self) -> bool:
        with self._cv:
            return any(r.outcomes is None and r.error is None for r in self._records.values())

    def abort_rank(self, rank: int, reason: str) -> None:
        """Rank ``rank`` is gone (``reason``, e.g. "disconnected"): every collective in flight
        fails for every rank at once, and so does every later one until the rank rejoins."""
        with self._cv:
            self.departed[rank] = reason
            for seq, rec in self._records.items():
                if rec.outcomes is None and rec.error is None:
                    rec.error = self._departed_error(seq)
            self._cv.notify_all()

    def fail(self, seq: int, rank: int, reason: str) -> None:
        """Rank ``rank`` gives up collective ``seq`` (its tensor is bad): every rank's part of
        it fails at once with the reason, naming the rank."""
        err = FabricError(f"rank {rank} aborted collective #{seq}: {reason}", code="ABORTED")
        with self._cv:
            unseen = set(range(self.world)) - {rank}
            rec = self._records.get(seq)
            if rec is not None and rec.outcomes is None and rec.error is None:
                rec.error = err
                unseen -= set(rec.requests)                  # they are waiting: told now
            if unseen:
                self._failed[seq] = (err, unseen)
            while len(self._failed) > 256:                  # bounded: oldest first
                self._failed.pop(next(iter(self._failed)))
            self._cv.notify_all()

    def rejoin(self, rank: int) -> None:
        with self._cv:
            self.departed.pop(rank, None)

    def forget_departed(self) -> None:
        """No rank is connected any more: a new job starts with a clean slate."""
        with self._cv:
            self.departed.clear()

    def _departed_error(self, seq: int) -> FabricError:
        who = "; ".join(f"rank {r} {why}" for r, why in sorted(self.departed.items()))
        return FabricError(f"{who} (collective #{seq} aborted)", code="ABORTED")

    def reload(self, engine, schedule):
        with self._cv:
            if any(r.outcomes is None and r.error is None for r in self._records.values()):
                raise FabricError("cannot load a new schedule while a collective is in flight")
            self.engine, self.schedule = engine, schedule
            self._link_bytes_cache.clear()

    def submit(self, seq: int, rank: int, req: Request, timeout: float | None = None,
               alive=None) -> Outcome:
        """Rank ``rank``'s part of collective ``seq``; blocks until every rank submitted (or
        an error). ``alive()`` (optional) is polled every :data:`POLL_SECONDS` while waiting:
        False means the rank's connection closed, which aborts the collective for all."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cv:
            rec = self._records.setdefault(seq, _Record())
            if rank in rec.requests:
                raise FabricError(f"rank {rank} started collective #{seq} twice")
            failed = self._failed.get(seq)
            if failed is not None and rank in failed[1]:
                failed[1].discard(rank)
                if not failed[1]:
                    del self._failed[seq]
                if rec.error is None and rec.outcomes is None:
                    rec.error = failed[0]
            if rec.error is None and rec.outcomes is None and self.departed:
                rec.error = self._departed_error(seq)
            if rec.error is None and rec.outcomes is None:
                rec.requests[rank] = req
                if len(rec.requests) == self.world:
                    self._run(seq, rec)
                    self._cv.notify_all()
            while rec.outcomes is None and rec.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.world)) - set(rec.requests))
                    rec.error = FabricTimeout(
                        f"collective #{seq}: rank {rank} waited {timeout:.1f}s at START; "
                        f"rank(s) {missing} never started it")
                    self._cv.notify_all()
                    break
                if alive is not None and not alive():
                    self.abort_rank(rank, "disconnected")      # re-entrant: RLock
                    break
                self._cv.wait(left if alive is None else min(left, POLL_SECONDS))
            rec.collected += 1
            if rec.collected >= self.world or (rec.error is not None
                                                and rec.collected >= len(rec.requests)):
                self._records.pop(seq, None)
            if rec.error is not None:
                raise rec.error
            return rec.outcomes[rank]

    def _run(self, seq: int, rec: _Record) -> None:
        reqs = [rec.requests[r] for r in range(self.world)]
        # sizes first: ranks of different element counts also loaded different image sets,
        # and the size is what the user must fix
        sigs = [q.signature() for q in reqs]
        if len(set(sigs)) != 1:
            desc = "; ".join(f"rank {r}: {s[0]} {s[1]} elements"
                             + (f" {s[2]} density={s[3]} seed={s[4]} {dict(s[5])}"
                                if s[0] == "sparse" else "")
                             for r, s in enumerate(sigs))
            rec.error = FabricError(f"collective #{seq}: ranks disagree ({desc})",
                                    code="SIZE_MISMATCH")
            return
        ids = [q.config[0] if q.config else None for q in reqs]
        if len(set(ids)) != 1:
            desc = ", ".join(f"rank {r}: {'none' if i is None else f'{i:#010x}'}"
                             for r, i in enumerate(ids))
            rec.error = FabricError(f"collective #{seq}: ranks loaded different "
                                    f"configurations ({desc})", code="CONFIG_MISMATCH")
            return
        _, schedule, engine = reqs[0].config or (None, self.schedule, self.engine)
        try:
            data = np.stack([q.data for q in reqs])
            req = reqs[0]
            if req.mode == "dense":
                out, cycles = engine.run(data)
                e = data.shape[1]
                key = (ids[0], e)
                if key not in self._link_bytes_cache:
                    if len(self._link_bytes_cache) > 64:
                        self._link_bytes_cache.clear()
                    self._link_bytes_cache[key] = link_bytes(schedule, e)
                sent, recv = self._link_bytes_cache[key]
                rec.outcomes = [Outcome(out[r], None, int(sent[r]), int(recv[r]),
                                        schedule.steps, cycles) for r in range(self.world)]
            else:
                res = engine.run_sparse(req.scheme, data, req.density, req.seed,
                                        dict(req.options))
                sent, recv = res.bytes_sent_per_worker(), res.bytes_received_per_worker()
                # the RTL engine's run reports its cycles; the golden models do not model time
                cycles = res.info.get("cycles")
                rec.outcomes = [Outcome(np.asarray(res.result[r], np.float32),
                                        np.asarray(res.residuals[r], np.float32),
                                        int(sent[r]), int(recv[r]), res.steps,
                                        None if cycles is None else int(cycles))
                                for r in range(self.world)]
            self.completed += 1
        except Exception as e:        # engine failure: every rank gets the same error
            rec.error = FabricError(f"collective #{seq}: fabric engine "
                                    f"{getattr(engine, 'name', '?')} failed: "
                                    f"{type(e).__name__}: {e}", code="ENGINE")


class LocalFabric:
    """In-process shared fabric for ``world`` ranks living in threads of one process
    (backend ``model`` without torch.distributed). Create one, pass it to every rank's
    :func:`~treenic.driver.open_nic` as ``fabric=``."""

    def __init__(self, schedule: Schedule, engine: str = "golden", timeout: float = 30.0):
        self.schedule = schedule
        self.engine = make_engine(engine, schedule)
        self.rendezvous = Rendezvous(schedule.n, self.engine, schedule, timeout)

    @property
    def world(self) -> int:
        return self.schedule.n
