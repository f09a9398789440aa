"""Configuration image sets received over the host protocol: bounded, inline, checked.

A configuration that arrives from the network is untrusted input. The client compiled it
once (:func:`treenic.firmware.image.compile_images`) and sent the image set -- the bytes the
RTL loads, not a schedule for the server to rebuild. :func:`parse_image_set` decodes one for
a fabric of ``nodes`` NICs, in this order, so nothing expensive happens before the cheap
bounds passed:

1. size bound (:data:`~treenic.driver.protocol.MAX_IMAGE_SET_BYTES`; the frame header was
   already held to it before the bytes were received), the set header's magic, version and
   image count (must be ``nodes``);
2. the image checks: container and CRC-32 of the set and of every image, then every field's
   meaning (:meth:`~treenic.firmware.image.ConfigImage.validate`,
   :meth:`~treenic.firmware.image.ImageSet.validate`); the element count must fit one
   ``WRITE_BUFFER``;
3. the topology the set names is **inline** -- a spec such as ``torus:4x4`` -- never a path:
   no file is opened on behalf of a client; its parameters are bounded by the node count
   (every parameter of every topology kind is at most its end-node count) before any graph
   is built;
4. the schedule the rows describe is read back
   (:func:`~treenic.firmware.image.decode_schedule`: the link maps must be the topology's
   and the set exactly the compiler's encoding of that schedule) and the schedule checkers
   run on it (:func:`treenic.schedule.check.check_postcondition`: every node ends with
   every chunk summed over all nodes exactly once;
   :func:`~treenic.schedule.check.check_dependencies`): an empty or partial set -- which
   would hand ranks back their own inputs -- is refused;
5. a set with a sparse section (image version 3, :func:`parse_sparse_program`): the
   program is decoded (:func:`~treenic.firmware.image.decode_sparse_program`, every row
   field checked) and must be exactly what the sparse compiler
   (:func:`~treenic.schedule.sparse_table.sparse_model`) emits for the parameters the
   section names (algorithm, density, residual, flow assignment and hash seed, codec), so
   the golden engine's model and the RTL engine's rows are one program.

Every refusal is a :class:`ConfigRejected` with a one-line reason.
"""
from __future__ import annotations

import re

from ..firmware.image import (ImageError, ImageSet, decode_schedule, decode_sparse_program,
                              peek_set_header)
from ..schedule.sparse_table import SparseProgram, program_parameters, sparse_model
from ..schedule.check import check_dependencies, check_postcondition
from ..schedule.ir import Schedule, ScheduleError
from ..topology import TopologyError
from .protocol import MAX_IMAGE_SET_BYTES, MAX_PAYLOAD

#: Largest element count an image set may be compiled for: one WRITE_BUFFER must carry it.
MAX_ELEMENTS = MAX_PAYLOAD // 4
_INLINE_SPEC = re.compile(r"^[a-z0-9]+(?::[0-9x:]+)?$")


class ConfigRejected(ValueError):
    """A configuration image set that must not be loaded (message: the reason, one line)."""


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


def _decode_set(data: bytes, nodes: int) -> ImageSet:
    """Steps 1 and 2: bounds, header, then the image checks."""
    if len(data) > MAX_IMAGE_SET_BYTES:
        raise ConfigRejected(f"image set of {len(data)} bytes exceeds {MAX_IMAGE_SET_BYTES}")
    try:
        count, _ = peek_set_header(data)
        if count != nodes:
            raise ConfigRejected(f"image set holds {count} images, the fabric has {nodes} "
                                 "NICs")
        images = ImageSet.from_bytes(data)
    except ImageError as e:
        raise ConfigRejected(f"image set rejected: {e}") from None
    if images.elements > MAX_ELEMENTS:
        raise ConfigRejected(f"image set is for {images.elements} elements, more than one "
                             f"WRITE_BUFFER carries ({MAX_ELEMENTS})")
    return images


def parse_image_set(data: bytes, nodes: int) -> tuple[ImageSet, Schedule]:
    """The checked image set for ``nodes`` NICs and the schedule its rows describe."""
    images = _decode_set(data, nodes)
    check_inline_topology(images.topology, nodes)
    try:
        schedule = decode_schedule(images)
    except (ImageError, TopologyError) as e:
        raise ConfigRejected(f"image set rejected: {e}") from None
    try:
        check_postcondition(schedule)
        check_dependencies(schedule)
    except ScheduleError as e:
        raise ConfigRejected(f"the schedule of the image set fails its checkers: {e}") \
            from None
    return images, schedule


def parse_sparse_program(images: ImageSet) -> SparseProgram | None:
    """Step 5: the sparse program of a checked set (:func:`parse_image_set`), or None for a
    dense-only set. Refused (:class:`ConfigRejected`, naming node and field) unless it is
    the compiler's program for the parameters its sections name."""
    if images[0].sparse is None:
        return None
    try:
        program = decode_sparse_program(images)
        params = program_parameters(program)
        _, want = sparse_model(params.pop("algorithm"), params.pop("topology"),
                               params.pop("elements"), params.pop("density"),
                               **dict(params, seed=params["seed"] or 0))
    except (ImageError, TopologyError, ValueError) as e:
        raise ConfigRejected(f"image set's sparse program rejected: {e}") from None
    for name in program.__dataclass_fields__:
        got, exp = getattr(program, name), getattr(want, name)
        if got == exp:
            continue
        if name == "rows":
            node = next(u for u, (a, b) in enumerate(zip(got, exp)) if a != b)
            raise ConfigRejected(f"image set's sparse program: node {node}'s rows are not "
                                 f"the compiler's program for its parameters")
        raise ConfigRejected(f"image set's sparse program: field {name}={got!r} is not the "
                             f"compiler's {exp!r} for its parameters")
    return program
