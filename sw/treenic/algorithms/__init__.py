"""Dense all-reduce algorithms: each compiles a topology into the Schedule IR.

``build(name, topology)`` is the one entry point every consumer (CLI, RTL images, driver,
benchmarks) uses. Modules load lazily so one algorithm's import error cannot hide the rest.
"""
from __future__ import annotations

import importlib
import time

from ..schedule.ir import Schedule, ScheduleError
from ..topology import Topology, parse

#: CLI/driver name -> "module:function(topology) -> Schedule"
ALGORITHMS: dict[str, str] = {
    "ring": "treenic.algorithms.ring:build",
    "dbtree": "treenic.algorithms.dbtree:build",
    "ring2d": "treenic.algorithms.ring2d:build",
    "halving-doubling": "treenic.algorithms.halving_doubling:build",
    "hdrm": "treenic.algorithms.halving_doubling:build_hdrm",
    "multitree": "treenic.algorithms.multitree:build",
}


#: algorithms with construction variants (``--variant``); each module lists its own in
#: ``VARIANTS``, the first being its default
VARIANT_ALGORITHMS = ("multitree",)


def variants(name: str) -> tuple[str, ...]:
    """The construction variants algorithm ``name`` accepts (empty: none)."""
    if name not in VARIANT_ALGORITHMS:
        return ()
    return importlib.import_module(ALGORITHMS[name].split(":")[0]).VARIANTS


def variant_options(name: str, variant: str | None) -> dict:
    """Builder options for a user's ``--variant`` (None: the algorithm's default). A variant
    for an algorithm without variants, or one it does not know, is a ScheduleError."""
    if variant is None:
        return {}
    known = variants(name)
    if not known:
        raise ScheduleError(f"--variant applies to {', '.join(VARIANT_ALGORITHMS)} only, "
                            f"not to algorithm {name!r}")
    if variant not in known:
        raise ScheduleError(f"unknown {name} variant {variant!r}; known: {', '.join(known)}")
    return {"variant": variant}


def build(name: str, topology: Topology | str, **options) -> Schedule:
    """Compile ``topology`` with algorithm ``name``; ``options`` go to the algorithm's builder
    (e.g. ``priority=`` for multitree, ``pipeline=`` for dbtree)."""
    if name not in ALGORITHMS:
        raise ScheduleError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    topo = parse(topology) if not isinstance(topology, Topology) else topology
    module, fn = ALGORITHMS[name].split(":")
    t0 = time.perf_counter()
    builder = getattr(importlib.import_module(module), fn)
    try:
        schedule = builder(topo, **options)
    except TypeError as e:
        if options and "unexpected keyword" in str(e):
            raise ScheduleError(f"{name}: unsupported option(s) {sorted(options)}") from None
        raise
    schedule.build_seconds = time.perf_counter() - t0
    return schedule
