"""Host side of the NIC: config image -> register/table writes, buffer load/readback.

The host (driver, cocotb bench, co-simulation) parses and verifies the firmware image
(:class:`treenic.firmware.image.ConfigImage`: magic, version, CRC-32) and streams the
result into the NIC over its host bus as word writes: configuration registers, the link
map (PEER), and the schedule table rows re-packed into the NIC's native row layout
(:attr:`NicParams.row`, parent/children resolved to ports -- the NIC never routes).
Images that do not fit the NIC's build parameters are refused here with a clear error.
"""
from __future__ import annotations

import numpy as np

from treenic.firmware.image import ConfigImage, NO_PEER

from ..link.flit import Op
from .params import NicParams, Reg, Ctrl

__all__ = ["image_writes", "order_writes", "buffer_writes", "NicImageError", "decode_image"]


class NicImageError(ValueError):
    """A configuration image that does not fit this NIC build."""


def decode_image(image: bytes | ConfigImage) -> ConfigImage:
    return image if isinstance(image, ConfigImage) else ConfigImage.from_bytes(bytes(image))


def image_writes(params: NicParams, image: bytes | ConfigImage) -> list[tuple[int, int]]:
    """(address, value) host-bus writes that configure one NIC from its image."""
    img = decode_image(image)
    tab = img.table
    L = tab.layout
    checks = [(img.ports <= params.ports, f"image has {img.ports} ports, NIC {params.ports}"),
              (L.flows <= params.max_nodes, f"{L.flows} flows > max_nodes {params.max_nodes}"),
              (img.elements <= params.depth, f"{img.elements} elements > depth {params.depth}"),
              (len(tab.entries) <= params.max_entries,
               f"{len(tab.entries)} table rows > max_entries {params.max_entries}"),
              (L.steps <= params.max_steps, f"{L.steps} steps > max_steps {params.max_steps}"),
              (img.nodes <= params.max_nodes, f"{img.nodes} nodes > max_nodes {params.max_nodes}")]
    for ok, msg in checks:
        if not ok:
            raise NicImageError(f"node {img.node}: {msg}")
    w = [(Reg.CTRL, Ctrl.CLEAR), (Reg.NODE, img.node), (Reg.ENTRIES, len(tab.entries)),
         (Reg.LOCKSTEP, img.lockstep_cycles), (Reg.ELEMENTS, img.elements),
         (Reg.FLOWS, L.flows)]
    for port, peer in enumerate(img.link_map):
        w.append((Reg.PEER + port, 0xFFFF if peer == NO_PEER else peer))
    for i, e in enumerate(tab.entries):
        row = params.encode_row(int(e.op), e.flow, e.step, e.parent_port, e.child_ports,
                                e.start, e.size)
        for k in range(params.row_words):
            w.append((params.table_addr(i, k), (row >> (32 * k)) & 0xFFFFFFFF))
    return [(int(a), int(v)) for a, v in w]


def order_writes(params: NicParams, images) -> list[list[tuple[int, int]]]:
    """Per node, the ORDER-region writes: for every REDUCE contribution a node receives,
    the step it arrives at -- the sender's REDUCE entry step, joined over the images of
    all nodes through their link maps (sender's parent port -> receiver, receiver's port
    back to the sender).  Pure data from the images, no schedule logic."""
    imgs = [decode_image(i) for i in images]
    out = [[] for _ in imgs]
    for v, img in enumerate(imgs):
        for e in img.table.entries:
            if e.op != Op.REDUCE or e.parent_port is None:
                continue
            u = img.link_map[e.parent_port]
            if u == NO_PEER or u >= len(imgs):
                continue
            q = imgs[u].link_map.index(v)     # first port of u toward v (= rx port)
            out[u].append((params.order_addr(e.flow, q), e.step))
    return out


def buffer_writes(params: NicParams, values: np.ndarray) -> list[tuple[int, int]]:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if bits.size > params.depth:
        raise NicImageError(f"{bits.size} elements > buffer depth {params.depth}")
    return [(params.buf_addr(e), int(b)) for e, b in enumerate(bits)]


async def sim_read_buffers(ctx, fabric, params: NicParams, nodes: int, elements: int) -> np.ndarray:
    """Amaranth-simulator testbench helper: read every node's gradient buffer back through
    the fabric's host read stream (``hr`` requests, ``hrd`` data), one word at a time.
    Returns the raw binary32 words, shape (nodes, elements), dtype uint32."""
    res = np.zeros((nodes, elements), np.uint32)
    ctx.set(fabric.hrd.ready, 1)
    for u in range(nodes):
        for e in range(elements):
            ctx.set(fabric.hr.valid, 1)
            ctx.set(fabric.hr.payload.node, u)
            ctx.set(fabric.hr.payload.addr, params.buf_addr(e))
            await ctx.tick()
            ctx.set(fabric.hr.valid, 0)
            while not ctx.get(fabric.hrd.valid):
                await ctx.tick()
            res[u, e] = ctx.get(fabric.hrd.payload)
            await ctx.tick()
    return res
