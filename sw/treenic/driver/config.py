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
   would hand ranks back their own inputs -- is refused.

Every refusal is a :class:`ConfigRejected` with a one-line reason.
"""
from __future__ import annotations

import re

from ..firmware.image import ImageError, ImageSet, decode_schedule, peek_set_header
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
