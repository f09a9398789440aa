"""Golden model of the NIC fabric's observable behaviour.

It consumes the decoded configuration images -- the same table rows the host loader writes
into the RTL (:func:`treenic.firmware.image.compile_images`,
:func:`treenic.hdl.nic.host.decode_images`), so the image encode/decode path is itself
under test -- and derives everything else from the project's single sources of truth, with
no second schedule logic: final buffers from the golden executor
(:func:`treenic.schedule.execute.execute`) run on the schedule the images' rows describe
(:func:`treenic.firmware.image.decode_schedule`), the messages each NIC port sends from the
rows, their flit counts from the link-layer golden packetiser
(:func:`treenic.hdl.link.model.packetise`), and the schedule's ideal time (per step, the
most-loaded directed link's flits, summed over the steps).
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import numpy as np

from treenic.firmware.image import decode_schedule
from treenic.schedule.execute import execute
from treenic.schedule.ir import Op

from ..link.model import packetise
from .host import decode_image, decode_images
from .params import NicParams

__all__ = ["expected_buffers", "port_messages", "message_flits", "expected_port_counters",
           "ideal_cycles", "step_link_flits"]


def expected_buffers(images, buffers: np.ndarray) -> np.ndarray:
    """Every NIC's buffer after the fabric loaded with ``images`` (an image set, or its
    images / bytes) ran on ``buffers`` (N x elements float32): the golden executor on the
    schedule the decoded rows describe."""
    return execute(decode_schedule(decode_images(images)), buffers)


def port_messages(image) -> dict[int, list[tuple]]:
    """Per local port, the messages (op, flow, step, start, size) the NIC loaded with
    ``image`` (bytes or :class:`~treenic.firmware.image.ConfigImage`) sends, in order:
    REDUCE entries with a parent send to ``parent_port``; GATHER entries to every child
    port; empty chunks send nothing."""
    out: dict[int, list[tuple]] = defaultdict(list)
    for e in decode_image(image).table.entries:
        if e.size == 0:
            continue
        if e.op == Op.REDUCE and e.parent_port is not None:
            out[e.parent_port].append((int(e.op), e.flow, e.step, e.start, e.size))
        elif e.op == Op.GATHER:
            for q in sorted(e.child_ports):
                out[q].append((int(e.op), e.flow, e.step, e.start, e.size))
    return dict(out)


@lru_cache(maxsize=4096)
def message_flits(size: int, params: NicParams) -> tuple[int, int]:
    """(total flits, head flits) of one message of ``size`` words (golden packetiser)."""
    hdr = {"vc": 0, "flow": 0, "op": 1, "step": 0, "offset": 0, "next": 0, "eject": 0,
           "dest": 0, "src": 0}
    flits = packetise(hdr, [0] * size, params.mode, params.fmt, sub_words=params.sub_words,
                      packet_words=params.packet_words)
    fmt = params.fmt
    heads = sum(1 for f in flits if fmt.split_flit(f)[0].name in ("SUB_HEAD", "HEAD",
                                                                  "HEAD_TAIL"))
    return len(flits), heads


def expected_port_counters(images, params: NicParams) -> dict[int, dict[int, dict[str, int]]]:
    """node -> port -> {tx_flits, tx_heads, tx_words} the RTL counters must show."""
    out = {}
    for u, image in enumerate(decode_images(images)):
        ports = {}
        for q, msgs in port_messages(image).items():
            fl = [message_flits(m[4], params) for m in msgs]
            ports[q] = {"tx_flits": sum(f for f, _ in fl), "tx_heads": sum(h for _, h in fl),
                        "tx_words": sum(m[4] for m in msgs)}
        out[u] = ports
    return out


def step_link_flits(images, params: NicParams) -> dict[int, dict[tuple, int]]:
    """step -> {(src, port): flits} over all NICs."""
    per: dict[int, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
    for u, image in enumerate(decode_images(images)):
        for q, msgs in port_messages(image).items():
            for (_, _, step, _, size) in msgs:
                per[step][(u, q)] += message_flits(size, params)[0]
    return {s: dict(v) for s, v in per.items()}


def ideal_cycles(images, params: NicParams) -> int:
    """Sum over steps of the most-loaded directed link's flits (no latency, no stalls)."""
    per = step_link_flits(images, params)
    return int(sum(max(v.values()) for v in per.values() if v))
