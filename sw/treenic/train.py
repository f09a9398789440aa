"""Training demo: data-parallel MLP on scikit-learn's bundled digits, gradients all-reduced by
treenic through a DDP communication hook.

``run(backend="rtl", algorithm="multitree", ...)`` spawns ``workers`` processes (gloo on
loopback), trains a 64-64-10 MLP with DDP + :func:`treenic.ddp.treenic_hook` and returns a
summary dict (per-epoch loss/accuracy, bytes each worker put on the network links for the
dense and the sparse phases, wall time, plot path). Backends:

* ``rtl`` — fabric server process with the Verilated RTL engine. When the RTL fabric cannot
  be opened the demo prints a notice and falls back to ``model`` (golden executor); the
  summary says so (``backend``, ``requested_backend``, ``fallback``). ``engine="golden"``
  runs the server path with the golden engine instead (host protocol exercised end to end).
* ``model`` — golden executor (each process gathers the buckets and executes the schedule).
* ``torch`` — the schedule over torch.distributed point-to-point.
* ``ddp`` — reference: DDP's own all-reduce (no treenic hook).

``density`` (e.g. 0.01) switches to sparse all-reduce (``scheme``, default ``topka``) after
``warmup_iters`` dense iterations. CLI: ``treenic train --backend ... [--json]`` via
:func:`add_arguments` / :func:`main`.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

BACKENDS = ("rtl", "model", "torch", "ddp", "udp")


def _load_data(seed: int):
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = len(y) // 5
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def _train_one(rank, world, cfg, fabric):
    """One training run inside an initialised process group; returns this rank's summary."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .ddp import TreenicHookState, treenic_hook
    from .algorithms import variant_options
    from .driver import open_nic
    from .driver.core import schedule_for

    xtr, ytr, xte, yte = _load_data(cfg["seed"])
    xtr, ytr = torch.from_numpy(xtr[rank::world]), torch.from_numpy(ytr[rank::world])
    xte, yte = torch.from_numpy(xte), torch.from_numpy(yte)
    torch.manual_seed(cfg["seed"])
    net = torch.nn.Sequential(torch.nn.Linear(64, cfg["hidden"]), torch.nn.ReLU(),
                              torch.nn.Linear(cfg["hidden"], 10))
    model = DDP(net)
    state, comm = None, None
    if cfg["backend"] != "ddp":
        # a cycle-accurate RTL collective (and loading its build) takes seconds, not ms
        timeout = cfg["timeout"] if cfg["engine"] != "rtl" else max(cfg["timeout"], 600.0)
        # fabric: the server's endpoint (address + job secret); udp: board addresses
        opts = dict(fabric, timeout=timeout) if cfg["backend"] == "rtl" else {}
        if cfg["backend"] == "udp":         # boards: addresses + driver options
            opts = dict(fabric)
        schedule = schedule_for(cfg["algorithm"], cfg["topology"], world,
                                **variant_options(cfg["algorithm"], cfg["variant"]))
        comm = open_nic(cfg["backend"], rank, world, algorithm=schedule, **opts)
        sparse = cfg["density"] is not None
        corrected = sparse and cfg["momentum_correction"]
        state = TreenicHookState(comm, scheme=cfg["scheme"] if sparse else None,
                                 density=cfg["density"] or 0.01,
                                 warmup_iters=cfg["warmup_iters"], seed=cfg["seed"],
                                 momentum=MOMENTUM if corrected else 0.0,
                                 momentum_masking=cfg["momentum_masking"],
                                 clip_norm=cfg["clip_norm"] if sparse else None,
                                 warmup=cfg["warmup"],
                                 sparse_options=_sparse_options(cfg) if sparse else None)
        model.register_comm_hook(state, treenic_hook)
    # momentum correction: the hook applies the momentum, the optimizer is plain SGD
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"],
                          momentum=0.0 if state is not None and state.momentum else MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(cfg["seed"] + rank)
    bs = cfg["batch_size"]
    # the same number of steps on every rank (shards differ by at most one sample)
    steps = min(len(ytr), len(xtr)) // bs
    n_min = torch.tensor([steps])
    dist.all_reduce(n_min, op=dist.ReduceOp.MIN)
    steps = int(n_min)
    epochs = []
    bar = None
    if rank == 0 and cfg["progress"]:
        from tqdm import tqdm
        bar = tqdm(total=cfg["epochs"] * steps, desc=f"{cfg['label']}", unit="step",
                   leave=False, file=sys.stderr)
    t0 = time.perf_counter()
    for epoch in range(cfg["epochs"]):
        model.train()
        perm = torch.randperm(len(ytr), generator=gen)
        total, count = torch.zeros(1, dtype=torch.float64), 0
        dense0 = state.dense_bytes if state else 0
        sparse0 = state.sparse_bytes if state else 0
        for s in range(steps):
            idx = perm[s * bs:(s + 1) * bs]
            opt.zero_grad()
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double()
            count += 1
            if bar is not None:
                bar.update(1)
        dist.all_reduce(total)                                   # reporting only
        model.eval()
        with torch.no_grad():
            acc = float((model(xte).argmax(1) == yte).float().mean())
        epochs.append({"epoch": epoch + 1, "loss": float(total) / (count * world),
                       "accuracy": acc,
                       "dense_bytes": (state.dense_bytes - dense0) if state else None,
                       "sparse_bytes": (state.sparse_bytes - sparse0) if state else None})
        if bar is not None:
            bar.set_postfix(loss=f"{epochs[-1]['loss']:.3f}", acc=f"{acc:.3f}")
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    out = {"epochs": epochs, "seconds": seconds, "params": params,
           "steps_per_epoch": steps}
    if state is not None:
        c = comm.counters
        out.update(bytes_sent=c.bytes_sent, bytes_received=c.bytes_received,
                   host_bytes_sent=c.host_bytes_sent, cycles=c.cycles,
                   dense_bytes=state.dense_bytes, sparse_bytes=state.sparse_bytes,
                   dense_calls=state.dense_calls, sparse_calls=state.sparse_calls,
                   **_engines(comm.status()),
                   # what the workers really ran (e.g. which --variant built it)
                   schedule={"steps": comm.schedule.steps,
                             "construction": comm.schedule.meta.get("construction")})
        comm.close()
    return out


def _engines(status: dict) -> dict:
    """What ran the dense and the sparse collectives (the communicator's own words)."""
    engine = status.get("engine")
    return {"engine_name": engine, "dense_engine": status.get("dense_engine", engine),
            "sparse_engine": status.get("sparse_engine", engine),
            # the rtl backend: how many dense collectives ran from the schedule's dense set
            # and how many from a loaded sparse set (on the rtl engine: its fabric of
            # combined NICs, the one the sparse steps ran on)
            "dense_collectives_by_set": status.get("dense_collectives_by_set"),
            # the rtl backend: the image sets (config ids) the sparse steps ran from
            "sparse_images": status.get("sparse_images")}


def _sparse_options(cfg) -> dict:
    """The NIC options of the sparse request (MultiTree-Sparse's; none for other schemes)."""
    from .driver.fabric import SCHEMES_WITH_OPTIONS
    if cfg["scheme"] not in SCHEMES_WITH_OPTIONS:
        return {}
    return {"residual": cfg["residual"], "flow_assignment": cfg["flow_assignment"]}


def _world_worker(rank, world, cfgs, fabric):
    return [_train_one(rank, world, cfg, fabric) for cfg in cfgs]


#: Momentum of the training's SGD (applied by the hook under momentum correction).
MOMENTUM = 0.9
#: Sparse-training techniques (DGC / RedSync) and their defaults; see docs/training.md for
#: what each is worth, measured.
#: ``flow_assignment="hash"``: contiguous flows give each layer of the bucket the budget of
#: the trees its position falls on; Zen's hash spreads every layer over all trees, so each
#: tree's top-k is close to a global top-k (measured: -0.84 vs -1.95 points at 8 epochs).
SPARSE_DEFAULTS = dict(momentum_correction=True, momentum_masking=True, clip_norm=None,
                       warmup="dense", residual="local", flow_assignment="hash")


def _config(backend="rtl", algorithm="multitree", topology=None, density=None, workers=4,
            epochs=8, scheme="topka", warmup_iters=20, lr=0.05, batch_size=16, hidden=64,
            seed=0, timeout=30.0, progress=True, engine="rtl", label=None, boards=None,
            simulated_boards=False, sparse_fallback=False, variant=None,
            host_addresses=None, **sparse):
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if density is not None and not 0.0 < float(density) <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    unknown = set(sparse) - set(SPARSE_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown sparse training option(s) {', '.join(sorted(unknown))}")
    topology = topology or f"ring:{workers}"
    if host_addresses is not None:
        host_addresses = _host_addresses(host_addresses, backend, boards, workers)
    return dict(backend=backend, algorithm=algorithm, variant=variant, topology=topology,
                density=float(density) if density else None, workers=workers, epochs=epochs,
                scheme=scheme, warmup_iters=warmup_iters, lr=lr, batch_size=batch_size,
                hidden=hidden, seed=seed, timeout=timeout, progress=progress, engine=engine,
                boards=boards, simulated_boards=simulated_boards,
                host_addresses=host_addresses,
                sparse_fallback=bool(sparse_fallback), **{**SPARSE_DEFAULTS, **sparse},
                label=label or f"{backend}/{algorithm}" + (f"[{variant}]" if variant else "")
                + (f"/{scheme}@{density}"
                                                           if density else ""))


def run_many(configs: list[dict], *, timeout: float = 600.0, log=print) -> list[dict]:
    """Run several training configs (same worker count) in one spawned world."""
    from .driver.fabric import rtl_unavailable_reason
    from .driver.launch import run_world
    from .driver.server import ServerProcess
    from .driver.core import schedule_for
    from .algorithms import variant_options

    workers = configs[0]["workers"]
    if any(c["workers"] != workers for c in configs):
        raise ValueError("run_many: every config needs the same worker count")
    server, engine = None, None
    for c in configs:
        c["requested_backend"], c["fallback"] = c["backend"], None
        c["requested_engine"] = c["engine"]
        if c["backend"] == "rtl" and c["engine"] == "golden" and c["label"].startswith("rtl/"):
            c["label"] = c["label"].replace("rtl/", "rtl-server[golden engine]/", 1)
        if c["backend"] == "rtl":
            _sparse_engine_check(c, log)
            if c["engine"] == "rtl":
                # build (or load from build/cosim) the fabric for the model's one DDP bucket
                h = c["hidden"]
                elements = 64 * h + h + h * 10 + 10
                sched = schedule_for(c["algorithm"], c["topology"], workers,
                                     **variant_options(c["algorithm"], c["variant"]))
                combined = _dense_on_combined(c, sched)
                if combined:
                    # warm-up and sparse steps run on one fabric of combined NICs (the
                    # sparse set's; Communicator.plan_sparse): the probe builds and times it
                    reason = rtl_unavailable_reason(sched)
                    if reason is None:
                        _probe_rtl_sparse(c, elements, log, dense=True)
                else:
                    reason = rtl_unavailable_reason(sched, elements=elements)
                if reason is None and not combined:
                    # one cycle-accurate collective, timed, so the user knows what is coming
                    import numpy as np
                    from .driver.fabric import RTLEngine
                    try:
                        eng = RTLEngine(sched)
                        t0 = time.perf_counter()
                        _, cycles = eng.run(np.zeros((workers, elements), np.float32))
                        dt = time.perf_counter() - t0
                    except Exception as e:        # a fabric that builds but does not run
                        reason = (f"RTL fabric engine unavailable: a test collective failed: "
                                  f"{type(e).__name__}: {str(e)[:300]}")
                    else:
                        steps = _steps(c)
                        log(f"NOTICE: RTL fabric: one all-reduce of {elements} elements = "
                            f"{cycles} cycles, {dt:.2f}s of simulation; ~{steps} steps ≈ "
                            f"{steps * dt / 60:.1f} min (--engine golden runs the same path "
                            "with the golden executor)")
                        if c["density"]:
                            _probe_rtl_sparse(c, elements, log)
                if reason:
                    log(f"NOTICE: {reason}.\nNOTICE: falling back from backend 'rtl' to "
                        "'model' (golden executor): results are the golden model's, not "
                        "the RTL's.")
                    c["backend"], c["fallback"] = "model", reason
                    c["label"] = "model (rtl unavailable)/" + c["label"].split("/", 1)[1]
                    continue
            if engine not in (None, c["engine"]):
                raise ValueError("run_many: one fabric server engine per call")
            engine = c["engine"]
    boardsim = None
    try:
        if engine is not None:
            # idle until the first rtl config's ranks connect: earlier configs of the same
            # world train first (the server is stopped below; idle_exit only catches orphans)
            server = ServerProcess(workers, engine, collective_timeout=60.0,
                                   idle_exit=max(120.0, timeout))
        addr = server.endpoint if server else None
        if any(c["backend"] == "udp" for c in configs):
            addr, boardsim = _udp_boards(configs, workers, log)
        t0 = time.perf_counter()
        per_rank = run_world(_world_worker, workers, configs, addr, timeout=timeout)
        wall = time.perf_counter() - t0
    finally:
        if server is not None:
            server.stop()
        if boardsim is not None:
            boardsim.stop()
    return [_summarise(cfg, [r[i] for r in per_rank], wall) for i, cfg in enumerate(configs)]


def _sparse_engine_check(c: dict, log) -> None:
    """A sparse run on ``--engine rtl`` whose scheme the RTL does not run: an error, unless
    the golden fallback was asked for (``sparse_fallback``): then the whole run uses the
    fabric server's golden engine, with a printed notice, the ``fallback`` field and a label
    that names the golden engine."""
    from .driver.fabric import rtl_sparse_unsupported
    if c["engine"] != "rtl" or not c["density"]:
        return
    reason = rtl_sparse_unsupported(c["scheme"], _sparse_options(c))
    if reason is None:
        return
    if not c["sparse_fallback"]:
        raise ValueError(f"--backend rtl --engine rtl: {reason}")
    log(f"NOTICE: {reason}.\nNOTICE: --sparse-fallback: this run uses the fabric server's "
        "golden engine for every step (dense warm-up included); results are the golden "
        "models', not the RTL's.")
    c["engine"], c["fallback"] = "golden", f"sparse fallback to the golden engine: {reason}"
    c["label"] = c["label"].replace("rtl/", "rtl-server[golden engine]/", 1)


#: training samples of :func:`_load_data`: scikit-learn's 1797 digits less the fifth held out
TRAIN_SAMPLES = 1797 - 1797 // 5


def _steps(c: dict) -> int:
    """Training steps of a run, as :func:`_train_one` counts them: ``epochs`` passes over
    the smallest rank's share of the training digits, ``batch_size`` a step."""
    return c["epochs"] * (TRAIN_SAMPLES // c["workers"] // c["batch_size"])


def _dense_on_combined(c: dict, sched) -> bool:
    """Whether a run's dense (warm-up) steps run from its sparse image set: a sparse scheme
    the image encodes on the MultiTree schedule (the sparse set's dense part is then the
    schedule's dense set; the driver's ``_configure``)."""
    from .driver.fabric import RTL_SPARSE, runs_multitree_trees
    return bool(c["density"]) and c["scheme"] in RTL_SPARSE and runs_multitree_trees(sched)


def _probe_rtl_sparse(c: dict, elements: int, log, *, dense: bool = False) -> None:
    """One sparse collective (and with ``dense`` one dense collective first) on the RTL
    engine before the world starts, loaded the way the fabric server loads it (the rank's
    sparse image set through LOAD_CONFIG's checks,
    :func:`~treenic.driver.fabric.loaded_engine`): it builds (or loads from build/cosim)
    the Verilated fabric of combined NICs the server will run, here, not inside the first
    training step (where a build outlasts the ranks' request timeout), and times it. A
    failure is an error: the rtl engine was asked for and cannot serve."""
    import numpy as np
    from .driver.fabric import loaded_engine, sparse_image_set
    t0 = time.perf_counter()
    options = _sparse_options(c)
    zeros = np.zeros((c["workers"], elements), np.float32)
    try:
        images = sparse_image_set(c["topology"], c["scheme"], elements, c["density"],
                                  c["seed"], options)
        _, eng = loaded_engine("rtl", images.to_bytes(), c["workers"])
        cycles = eng.run(zeros)[1] if dense else None
        res = eng.run_sparse(c["scheme"], zeros, c["density"], c["seed"], options)
    except Exception as e:
        raise ValueError(f"--engine rtl: the RTL sparse fabric failed a test collective: "
                         f"{type(e).__name__}: {str(e)[:300]}") from None
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()        # a second call, built: what each sparse step costs
    eng.run_sparse(c["scheme"], zeros, c["density"], c["seed"], options)
    step = time.perf_counter() - t1
    steps = _steps(c)
    if c.get("warmup", "dense") == "dense":     # a ramp's warm-up steps are sparse too
        steps = max(0, steps - c["warmup_iters"])
    log(f"NOTICE: {eng.sparse_description}: one {c['scheme']} all-reduce of {elements} "
        f"elements at {c['density']:g} = {res.info.get('cycles')} cycles"
        + (f", one dense all-reduce on the same fabric = {cycles} cycles" if dense else "")
        + f", {dt:.2f}s (build included); {step:.2f}s a sparse collective: ~{steps} sparse "
        f"steps ≈ {steps * step / 60:.1f} min (--sparse-engine golden runs them on the "
        "golden models)")


def _udp_boards(configs, workers, log):
    """Driver options of the ``udp`` backend: the boards' addresses (``--boards``), or
    simulated boards started here (``--simulated-boards``; returned to be stopped)."""
    c = next(c for c in configs if c["backend"] == "udp")
    if c["density"]:
        raise ValueError("backend 'udp': sparse schemes are not in the NIC RTL yet")
    if c["simulated_boards"]:
        from .boards.boardsim import SIM_NIC, BoardSim
        sim = BoardSim(c["topology"], log=log)
        boards = sim.start()
        log(f"NOTICE: {sim.describe()}")
        # a simulated datagram takes ~0.1-1 s of wall time: generous per-try timeouts
        return {"boards": boards, "local_port": 0, "nic_params": SIM_NIC, "timeout": 60.0,
                "retries": 3, "run_timeout": 3600.0, "engine": sim.describe()}, sim
    if not c["boards"] or len(c["boards"]) != workers:
        raise ValueError(f"backend 'udp' needs --boards with {workers} addresses or "
                         "--simulated-boards")
    opts = {"boards": c["boards"]}
    if c["host_addresses"]:       # one host address per rank: each binds UDP 7411 there
        opts["host_addresses"] = c["host_addresses"]
    return opts, None


def _host_addresses(spec, backend, boards, workers) -> list[str]:
    """``--host-addresses``, checked before any process starts (ValueError)."""
    from .driver.errors import DriverError
    from .driver.udp import train_host_addresses
    try:
        return train_host_addresses(spec, workers, backend=backend, boards=boards)
    except DriverError as e:
        raise ValueError(str(e)) from None


def _summarise(cfg, ranks, wall):
    import numpy as np
    r0 = ranks[0]
    s = {k: cfg[k] for k in ("backend", "requested_backend", "fallback", "algorithm",
                             "variant", "topology", "workers", "density", "epochs",
                             "warmup_iters", "label", "lr", "seed")}
    s["requested_engine"] = cfg["requested_engine"]
    s["server_engine"] = cfg["engine"] if cfg["backend"] == "rtl" else None
    s["scheme"] = cfg["scheme"] if cfg["density"] else None
    s["sparse_training"] = ({k: cfg[k] for k in SPARSE_DEFAULTS} | {
        "sparse_options": _sparse_options(cfg)} if cfg["density"] else None)
    s["losses"] = [e["loss"] for e in r0["epochs"]]
    s["accuracies"] = [e["accuracy"] for e in r0["epochs"]]
    s["final_accuracy"] = s["accuracies"][-1]
    s["final_loss"] = s["losses"][-1]
    s["train_seconds"] = r0["seconds"]
    s["world_wall_seconds"] = wall
    s["steps_per_epoch"] = r0["steps_per_epoch"]
    s["params_identical_across_ranks"] = bool(all(
        np.array_equal(r["params"].view(np.uint32), r0["params"].view(np.uint32))
        for r in ranks))
    s["params"] = r0["params"]
    # the trained weights' digest: two runs (backends) are bit-exact when it matches
    s["params_sha256"] = hashlib.sha256(
        np.ascontiguousarray(r0["params"]).view(np.uint8).tobytes()).hexdigest()
    if "bytes_sent" in r0:
        # "engine": what ran the sparse steps of a sparse run, the dense ones of a dense run
        s["dense_engine"], s["sparse_engine"] = r0["dense_engine"], r0["sparse_engine"]
        s["dense_collectives_by_set"] = r0["dense_collectives_by_set"]
        s["engine"] = r0["sparse_engine"] if r0["sparse_calls"] else r0["dense_engine"]
        s["sparse_images"] = r0["sparse_images"]
        s["schedule"] = r0["schedule"]
        s["bytes_sent_per_worker"] = [int(r["bytes_sent"]) for r in ranks]
        s["dense_bytes_per_worker"] = [int(r["dense_bytes"]) for r in ranks]
        s["sparse_bytes_per_worker"] = [int(r["sparse_bytes"]) for r in ranks]
        s["dense_calls"] = r0["dense_calls"]
        s["sparse_calls"] = r0["sparse_calls"]
        s["host_bytes_sent_per_worker"] = [int(r["host_bytes_sent"]) for r in ranks]
        s["cycles"] = r0["cycles"] or None
        d = s["dense_bytes_per_worker"][0] / max(1, r0["dense_calls"])
        sp = s["sparse_bytes_per_worker"][0] / max(1, r0["sparse_calls"])
        s["bytes_per_dense_call"] = d if r0["dense_calls"] else None
        s["bytes_per_sparse_call"] = sp if r0["sparse_calls"] else None
        s["epoch_bytes"] = [{"dense": e["dense_bytes"], "sparse": e["sparse_bytes"]}
                            for e in r0["epochs"]]
    else:
        s["engine"] = s["dense_engine"] = "torch DDP all_reduce"
        s["sparse_engine"] = s["sparse_images"] = None
        s["bytes_sent_per_worker"] = None
    return s


def plot(summaries: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    for s in summaries:
        ep = range(1, len(s["losses"]) + 1)
        ax[0].plot(ep, s["losses"], marker="o", label=s["label"])
        ax[1].plot(ep, s["accuracies"], marker="o", label=s["label"])
        if s.get("epoch_bytes"):
            tot = [((e["dense"] or 0) + (e["sparse"] or 0)) / 1e3 for e in s["epoch_bytes"]]
            ax[2].plot(ep, tot, marker="o", label=s["label"])
    ax[0].set(title="training loss", xlabel="epoch")
    ax[1].set(title="test accuracy", xlabel="epoch")
    ax[2].set(title="bytes sent per worker per epoch (kB)", xlabel="epoch", yscale="log")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(backend="rtl", algorithm="multitree", topology=None, density=None, workers=4,
        epochs=8, *, scheme="topka", warmup_iters=20, lr=0.05, batch_size=16, seed=0,
        engine="rtl", compare_dense=True, out_dir="build/demo", progress=True,
        log=print, boards=None, simulated_boards=False, sparse_fallback=False,
        variant=None, sparse_engine=None, host_addresses=None, **sparse) -> dict:
    """Train, print per-epoch loss/accuracy and traffic, save a plot; returns the summary.

    With ``density`` and ``compare_dense`` a dense run of the same backend is trained in the
    same world so the summary (``dense_reference``) and the plot compare the two.
    ``sparse``: the techniques of :data:`SPARSE_DEFAULTS`. ``sparse_engine``: the fabric
    server engine of the sparse run (default ``engine``; the dense reference keeps
    ``engine``)."""
    cfg = _config(backend, algorithm, topology, density, workers, epochs, scheme,
                  warmup_iters, lr, batch_size, seed=seed, progress=progress,
                  engine=(sparse_engine or engine) if density else engine,
                  boards=boards, simulated_boards=simulated_boards,
                  sparse_fallback=sparse_fallback, variant=variant,
                  host_addresses=host_addresses, **sparse)
    cfgs = [cfg]
    if density and sparse_engine and sparse_engine != engine and backend == "rtl":
        log(f"NOTICE: the sparse run uses the fabric server's {sparse_engine} engine "
            f"(--sparse-engine {sparse_engine}); the dense run uses {engine}")
    if density and compare_dense:
        cfgs.append(_config(backend, algorithm, topology, None, workers, epochs, scheme,
                            warmup_iters, lr, batch_size, seed=seed, progress=progress,
                            engine=engine, variant=variant))
    # one world per config: the dense run may use the RTL engine while the sparse run needs
    # the golden one (a fabric server runs one engine)
    summaries = [run_many([c], log=log)[0] for c in cfgs]
    main_s = summaries[0]
    for s in summaries:
        s.pop("params", None)
    if len(summaries) > 1:
        main_s["dense_reference"] = {k: summaries[1][k] for k in (
            "final_accuracy", "final_loss", "bytes_sent_per_worker", "bytes_per_dense_call",
            "losses", "accuracies", "engine", "label")}
    path = plot(summaries, Path(out_dir) / f"train_{main_s['backend']}_{algorithm}"
                f"{'_' + variant if variant else ''}{'_sparse' if density else ''}.png")
    main_s["plot"] = str(path)
    for s in summaries:
        images = ", ".join(i["config_id"] for i in s.get("sparse_images") or [])
        engines = (f"dense steps: {s['dense_engine']}; sparse steps: {s['sparse_engine']}"
                   + (f" from image set {images}" if images else "")
                   if s.get("sparse_calls") else f"engine: {s.get('engine')}")
        log(f"== {s['label']} (backend {s['backend']}, {s['topology']}, {workers} workers; "
            f"{engines})")
        for e, (l, a) in enumerate(zip(s["losses"], s["accuracies"]), 1):
            log(f"   epoch {e:2d}  loss {l:.4f}  test accuracy {a:.4f}")
        if s.get("bytes_sent_per_worker"):
            log(f"   bytes on the wire per worker: {s['bytes_sent_per_worker']}"
                + (f"; per dense step {s['bytes_per_dense_call']:.0f}"
                   if s.get("bytes_per_dense_call") else "")
                + (f"; per sparse step {s['bytes_per_sparse_call']:.0f}"
                   if s.get("bytes_per_sparse_call") else ""))
    log(f"plot: {path}")
    return main_s


def add_arguments(parser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="rtl")
    parser.add_argument("--algorithm", default="multitree")
    from .cli import add_variant_argument
    add_variant_argument(parser)
    parser.add_argument("--topology", default=None, help="default ring:<workers>")
    parser.add_argument("--density", type=float, default=None,
                        help="sparse all-reduce at this density after the warm-up")
    parser.add_argument("--scheme", default="topka", help="sparse scheme (treenic.sparse)")
    parser.add_argument("--warmup-iters", type=int, default=20,
                        help="iterations of warm-up (dense, or the density ramp)")
    d = SPARSE_DEFAULTS
    parser.add_argument("--warmup", choices=("dense", "ramp"), default=d["warmup"],
                        help="warm-up: dense all-reduce (RedSync) or DGC's density ramp "
                             "25%%, 6.25%%, ... down to --density")
    parser.add_argument("--no-momentum-correction", dest="momentum_correction",
                        action="store_false", default=d["momentum_correction"],
                        help="sparse: momentum in the optimizer (default: DGC momentum "
                             "correction, the residual accumulates velocity)")
    parser.add_argument("--no-momentum-masking", dest="momentum_masking",
                        action="store_false", default=d["momentum_masking"],
                        help="sparse: keep the momentum of elements just sent")
    parser.add_argument("--clip-norm", type=float, default=d["clip_norm"],
                        help="sparse: local gradient clipping at this global L2 norm "
                             "(per rank: / sqrt(workers)); default off")
    parser.add_argument("--residual", choices=("local", "global"), default=None,
                        help="multitree-sparse: residual each node keeps (NIC option; "
                             f"default {d['residual']})")
    parser.add_argument("--flow-assignment", choices=("contiguous", "hash"), default=None,
                        help="multitree-sparse: elements to trees (NIC option; default "
                             f"{d['flow_assignment']})")
    parser.add_argument("--sparse-engine", choices=("rtl", "golden"), default=None,
                        help="fabric server engine of the sparse run (default: --engine)")
    parser.add_argument("--sparse-fallback", action="store_true",
                        help="--engine rtl: when the RTL does not run the sparse scheme, use "
                             "the golden engine (printed notice, JSON 'fallback'); else error")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--engine", choices=("rtl", "golden"), default="rtl",
                        help="fabric server engine for --backend rtl")
    parser.add_argument("--boards", type=lambda s: s.split(","), default=None,
                        help="--backend udp: one board address (host[:port]) per worker")
    parser.add_argument("--host-addresses", default=None,
                        help="--backend udp with --boards: one IPv4 address of this host per "
                             "worker (a,b,...); each rank binds UDP 7411 on its own, since "
                             "the boards reply to that port")
    parser.add_argument("--simulated-boards", action="store_true",
                        help="--backend udp: start simulated boards (treenic boardsim)")
    parser.add_argument("--out", default="build/demo")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args) -> int:
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    s = run(args.backend, args.algorithm, args.topology, args.density, args.workers,
            args.epochs, scheme=args.scheme, warmup_iters=args.warmup_iters,
            engine=args.engine, out_dir=args.out, progress=not args.json, log=log,
            boards=getattr(args, "boards", None), lr=args.lr, seed=args.seed,
            simulated_boards=getattr(args, "simulated_boards", False),
            host_addresses=getattr(args, "host_addresses", None),
            sparse_fallback=args.sparse_fallback, sparse_engine=args.sparse_engine,
            variant=getattr(args, "variant", None),
            **{k: getattr(args, k) for k in SPARSE_DEFAULTS if getattr(args, k) is not None})
    if args.json:
        print(json.dumps(s, indent=1, default=float))
    return 0


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(prog="python -m treenic.train")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
