"""Configuration images received over the host protocol: bounded, inline, checked.

A configuration that arrives from the network is untrusted input. :func:`parse_image` turns
one into a :class:`~treenic.schedule.ir.Schedule` for a fabric of ``nodes`` NICs, in this
order, so nothing expensive happens before the cheap bounds passed:

1. size bound (:data:`MAX_IMAGE_BYTES`) and JSON syntax;
2. the topology is **inline** — a spec such as ``torus:4x4`` — never a path: no file is
   opened on behalf of a client, so a client cannot read or probe the server's files;
3. the topology spec's parameters are bounded by the node count (every parameter of every
   topology kind is at most its end-node count), the declared node count must equal the
   fabric's, and the transfer/chunk counts are bounded — before any graph is built;
4. the schedule is built and the schedule checkers run on it
   (:func:`treenic.schedule.check.check_postcondition`: every node ends with every chunk
   summed over all nodes exactly once; :func:`~treenic.schedule.check.check_dependencies`):
   an empty or partial schedule — which would hand ranks back their own inputs — is refused.

Every refusal is a :class:`ConfigRejected` with a one-line reason.
"""
from __future__ import annotations

import json
import re

from ..schedule.check import check_dependencies, check_postcondition
from ..schedule.ir import Schedule, ScheduleError
from ..topology import TopologyError

#: Largest configuration image accepted (bytes).
MAX_IMAGE_BYTES = 16 << 20
#: Largest chunk count of a schedule.
MAX_CHUNKS = 1 << 16
#: Largest transfer count of a schedule, per node.
MAX_TRANSFERS_PER_NODE = 1 << 14
_INLINE_SPEC = re.compile(r"^[a-z0-9]+(?::[0-9x:]+)?$")


class ConfigRejected(ValueError):
    """A configuration image that must not be loaded (message: the reason, one line)."""


def check_inline_topology(spec, nodes: int) -> None:
    """Refuse a topology that names a file or is larger than ``nodes`` end nodes allow."""
    if not isinstance(spec, str) or len(spec) > 64 or not _INLINE_SPEC.match(spec):
        raise ConfigRejected("topology must be inline (a spec such as torus:4x4, ring:8, at "
                             "most 64 characters); "
                             "a configuration received over the protocol never names a file "
                             "and the server opens none")
    params = [int(x) for x in re.findall(r"[0-9]+", spec.partition(":")[2])]
    if any(p > nodes for p in params):
        raise ConfigRejected(f"topology {spec} has a parameter larger than the fabric's "
                             f"{nodes} nodes")


def _bound_fields(d: dict, nodes: int) -> None:
    if d.get("nodes") != nodes:
        raise ConfigRejected(f"schedule is for {d.get('nodes')!r} nodes, fabric has {nodes}")
    chunks, transfers = d.get("num_chunks"), d.get("transfers")
    if not isinstance(chunks, int) or not 1 <= chunks <= MAX_CHUNKS:
        raise ConfigRejected(f"num_chunks must be an integer in 1..{MAX_CHUNKS}")
    if not isinstance(transfers, list) or len(transfers) > MAX_TRANSFERS_PER_NODE * nodes:
        raise ConfigRejected(f"transfers must be a list of at most "
                             f"{MAX_TRANSFERS_PER_NODE * nodes} entries")


def parse_image(image: bytes, nodes: int) -> Schedule:
    """The checked Schedule of a treenic-schedule JSON image for ``nodes`` NICs."""
    if len(image) > MAX_IMAGE_BYTES:
        raise ConfigRejected(f"config image of {len(image)} bytes exceeds {MAX_IMAGE_BYTES}")
    try:
        d = json.loads(image.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigRejected(f"config image is not UTF-8 JSON: {e}") from None
    if not isinstance(d, dict):
        raise ConfigRejected("config image is not a JSON object")
    check_inline_topology(d.get("topology"), nodes)
    _bound_fields(d, nodes)
    try:
        schedule = Schedule.from_json(d)
    except (ScheduleError, TopologyError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigRejected(f"config image rejected: {e}") from None
    if schedule.n != nodes:
        raise ConfigRejected(f"schedule is for {schedule.n} nodes, fabric has {nodes}")
    try:
        check_postcondition(schedule)
        check_dependencies(schedule)
    except ScheduleError as e:
        raise ConfigRejected(f"schedule fails its checkers: {e}") from None
    return schedule
