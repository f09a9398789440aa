"""Host side of the NIC: configuration images -> host-bus writes, buffer load/readback.

The one loading path from the schedule compiler to the NIC registers, used by FabricSim,
every cocotb bench and every test:

* :func:`params_for_images` -- the NIC build (:class:`NicParams`) sized for an image set;
* :func:`host_writes` -- per node, every host-bus write that loads the images (registers,
  link map, table rows re-packed into the NIC's native row :attr:`NicParams.row`, ORDER
  table) and the gradient buffers;
* :func:`sim_read_buffers` -- read every buffer back in Amaranth's simulator.

Images are decoded and validated (:meth:`treenic.firmware.image.ConfigImage.from_bytes`:
magic, version, CRC-32, then every field's meaning) and checked against the NIC build
before a single write is produced, so a bad image changes nothing.
"""
from __future__ import annotations

import numpy as np

from treenic.firmware.image import ConfigImage, ImageSet, NO_PEER

from .params import SPARSE_IN_WORDS, NicParams, Reg, Ctrl, SparseOut

__all__ = ["host_writes", "params_for_images", "image_writes", "order_writes",
           "buffer_writes", "NicImageError", "decode_image", "decode_images",
           "sim_read_buffers", "sim_read_word", "sim_run_fabric", "check_sparse_fits",
           "sparse_push_writes", "sparse_load_writes", "sparse_dump_writes",
           "sim_write_all", "sim_read_all", "sim_sparse_dump"]


class NicImageError(ValueError):
    """A configuration image that does not fit this NIC build."""


def decode_image(image: bytes | ConfigImage) -> ConfigImage:
    """A validated :class:`ConfigImage` from its bytes (or the image itself, re-validated)."""
    if isinstance(image, ConfigImage):
        image.validate()
        return image
    return ConfigImage.from_bytes(bytes(image))


def decode_images(images) -> ImageSet:
    """An :class:`ImageSet` (validated as a set) from a set, or a list of images / bytes."""
    if isinstance(images, ImageSet):
        images.validate()
        return images
    if isinstance(images, (bytes, bytearray)):
        return ImageSet.from_bytes(images)
    return ImageSet(list(images))


def params_for_images(images, **build) -> NicParams:
    """The NIC build for an image set: ports, buffer depth (power of two >= elements, at
    least 16), nodes (at least 4), table rows (at least 8) and steps (at least 4) from the
    images; ``build`` sets the rest (``mode``, ``width``, ``sub_words``, ``credits``,
    ``packet_words``, ``banks``) and may override any derived field."""
    imgs = decode_images(images)
    derived = dict(ports=max(im.ports for im in imgs),
                   depth=1 << max(4, (max(1, imgs.elements) - 1).bit_length()),
                   max_nodes=max(4, imgs.nodes),
                   max_entries=max(8, max(len(im.table.entries) for im in imgs)),
                   max_steps=max(4, max(im.table.layout.steps for im in imgs)),
                   width=64, sub_words=16, credits=16, packet_words=64)
    return NicParams(**{**derived, **build})


def _check_fits(params: NicParams, img: ConfigImage) -> None:
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


def image_writes(params: NicParams, image: bytes | ConfigImage) -> list[tuple[int, int]]:
    """(address, value) host-bus writes that configure one NIC from its image (registers,
    link map, table rows); the ORDER table is :func:`order_writes`."""
    img = decode_image(image)
    _check_fits(params, img)
    tab = img.table
    w = [(Reg.CTRL, Ctrl.CLEAR), (Reg.NODE, img.node), (Reg.ENTRIES, len(tab.entries)),
         (Reg.LOCKSTEP, img.lockstep_cycles), (Reg.ELEMENTS, img.elements),
         (Reg.FLOWS, tab.layout.flows)]
    for port, peer in enumerate(img.link_map):
        w.append((Reg.PEER + port, 0xFFFF if peer == NO_PEER else peer))
    for i, e in enumerate(tab.entries):
        row = params.encode_row(e.op, e.flow, e.step, e.parent_port, e.child_ports,
                                e.start, e.size)
        for k in range(params.row_words):
            w.append((params.table_addr(i, k), (row >> (32 * k)) & 0xFFFFFFFF))
    return [(int(a), int(v)) for a, v in w]


def order_writes(params: NicParams, image: bytes | ConfigImage) -> list[tuple[int, int]]:
    """The ORDER-region writes of one NIC: the step at which each REDUCE contribution
    arrives, per (flow, rx_port), from the image's ORDER table (the compiler's
    :func:`treenic.schedule.table.order_entries`)."""
    img = decode_image(image)
    return [(params.order_addr(flow, port), step) for flow, port, step in img.order]


def host_writes(params: NicParams, images, buffers=None, *, order: bool = True,
                nodes=None) -> list[list[tuple[int, int]]]:
    """Per node, the host-bus (address, value) writes that load an image set and the
    gradient buffers: configuration (:func:`image_writes`), then the ORDER table
    (``order=False`` leaves it unknown: the NIC then bounds unknown steps by what each
    link delivered, correct but slower), then the buffer (``buffers``: N x elements
    float32, or None).  ``nodes``: only these nodes' writes, in that order (a host that
    drives one NIC, e.g. a board's driver); every node by default.  Every image is
    validated and fitted before any write is made."""
    imgs = decode_images(images)
    for im in imgs:
        _check_fits(params, im)
    if buffers is not None:
        buffers = np.asarray(buffers)
        if buffers.ndim != 2 or buffers.shape[0] != imgs.nodes or \
                buffers.shape[1] != imgs.elements:
            raise NicImageError(f"buffers of shape {buffers.shape}, the images load "
                                f"({imgs.nodes}, {imgs.elements})")
    out = []
    for u in range(imgs.nodes) if nodes is None else nodes:
        im = imgs[u]
        w = image_writes(params, im)
        if order:
            w += order_writes(params, im)
        if buffers is not None:
            w += buffer_writes(params, buffers[u])
        out.append(w)
    return out


def buffer_writes(params: NicParams, values: np.ndarray) -> list[tuple[int, int]]:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if bits.size > params.depth:
        raise NicImageError(f"{bits.size} elements > buffer depth {params.depth}")
    return [(params.buf_addr(e), int(b)) for e, b in enumerate(bits)]


async def sim_load_and_start(ctx, fabric, writes) -> None:
    """Amaranth-simulator testbench helper: every node's host writes (``writes``: per node a
    list of (address, value), e.g. from :func:`host_writes`) through the fabric's ``hw``
    stream, one write per cycle, then one ``start`` pulse."""
    for u, node_writes in enumerate(writes):
        for a, v in node_writes:
            ctx.set(fabric.hw.valid, 1)
            ctx.set(fabric.hw.payload.node, u)
            ctx.set(fabric.hw.payload.addr, a)
            ctx.set(fabric.hw.payload.data, v)
            await ctx.tick()
    ctx.set(fabric.hw.valid, 0)
    ctx.set(fabric.start, 1)
    await ctx.tick()
    ctx.set(fabric.start, 0)


async def sim_read_buffers(ctx, fabric, params: NicParams, nodes: int, elements: int) -> np.ndarray:
    """Amaranth-simulator testbench helper: read every node's gradient buffer back through
    the fabric's host read stream (``hr`` requests, ``hrd`` data), one word at a time.
    Returns the raw binary32 words, shape (nodes, elements), dtype uint32."""
    res = np.zeros((nodes, elements), np.uint32)
    for u in range(nodes):
        for e in range(elements):
            res[u, e] = await sim_read_word(ctx, fabric, u, params.buf_addr(e))
    return res


async def sim_read_word(ctx, fabric, node: int, addr: int) -> int:
    """Amaranth-simulator testbench helper: one host-bus read of word ``addr`` of
    ``node`` through the fabric's host read stream."""
    ctx.set(fabric.hrd.ready, 1)
    ctx.set(fabric.hr.valid, 1)
    ctx.set(fabric.hr.payload.node, node)
    ctx.set(fabric.hr.payload.addr, addr)
    await ctx.tick()
    ctx.set(fabric.hr.valid, 0)
    while not ctx.get(fabric.hrd.valid):
        await ctx.tick()
    word = ctx.get(fabric.hrd.payload)
    await ctx.tick()
    return word


def sim_run_fabric(fabric, params: NicParams, writes, nodes: int, elements: int, *,
                   max_cycles: int = 5000, read_words=()) -> dict:
    """Run one all-reduce on ``fabric`` in Amaranth's simulator: the host ``writes`` and
    START (:func:`sim_load_and_start`), clock until ``done`` or ``max_cycles``, then read
    every buffer back and the words ``read_words`` ((node, address) pairs).  Returns
    ``cycles`` (after START), ``done``, ``error``, ``res`` (uint32, nodes x elements) and
    ``words`` (the read words, in order)."""
    from amaranth.sim import Simulator
    sim = Simulator(fabric)
    sim.add_clock(1e-8)
    out = {}

    async def tb(ctx):
        await sim_load_and_start(ctx, fabric, writes)
        for c in range(max_cycles):
            await ctx.tick()
            if ctx.get(fabric.done):
                break
        out.update(cycles=c, done=ctx.get(fabric.done), error=ctx.get(fabric.error))
        out["res"] = await sim_read_buffers(ctx, fabric, params, nodes, elements)
        out["words"] = [await sim_read_word(ctx, fabric, u, a) for u, a in read_words]

    sim.add_testbench(tb)
    sim.run()
    return out


# ---------------------------------------------------------------------------------------
# the sparse engine inside the NIC (NicParams.sparse): its HOST_IN words as register writes

#: sparse rows that put a head flit on a link (their fields travel in the head)
_MESSAGE_OPS = ("SEND", "RECV", "GSEND", "GRECV", "SEND_BM", "RECV_BM", "GSEND_BM",
                "GRECV_BM")


def check_sparse_fits(params: NicParams, program) -> None:
    """Raise :class:`NicImageError` unless the NIC's sparse build runs ``program`` (a
    :class:`~treenic.schedule.sparse_table.SparseProgram`): the engine's sizes, and every
    message row's flow, step, offset and budget within the NIC's head-flit fields."""
    from treenic.schedule.sparse_table import unpack_row
    from .params import SPARSE_ENGINE_FMT, SparseParams
    sp = params.sparse
    if sp is None:
        raise NicImageError("this NIC has no sparse engine (NicParams.sparse is None)")
    need = SparseParams.for_program(program, lanes=sp.lanes)
    checks = [(program.ports <= params.ports, f"{program.ports} ports > {params.ports}"),
              (program.codec == sp.codec, f"codec={program.codec}, the engine codec={sp.codec}")]
    for name in ("depth", "max_flow", "chunks", "slot", "rows", "rx_depth"):
        checks.append((getattr(need, name) <= getattr(sp, name),
                       f"{name} {getattr(need, name)} > the engine's {getattr(sp, name)}"))
    fmt = SPARSE_ENGINE_FMT                  # the engine's head layout
    limits = {"chunk": fmt.flow_bits, "step": fmt.step_bits, "lo": fmt.offset_bits,
              "k": fmt.length_bits}
    for u, rows in enumerate(program.rows):
        for r in map(unpack_row, rows):
            if r["op"].name not in _MESSAGE_OPS:
                continue
            for field, bits in limits.items():
                checks.append((r[field] < 1 << bits, f"node {u}: {r['op'].name} row "
                               f"{field}={r[field]} does not fit the head's {bits} bits"))
    for ok, msg in checks:
        if not ok:
            raise NicImageError(f"sparse program: {msg}")


def sparse_push_writes(word: int) -> list[tuple[int, int]]:
    """The register writes that push one packed ``HOST_IN`` word: its non-zero low words
    into SP_IN[k] (SP_PUSH clears them), its top word with SP_PUSH."""
    if not 0 <= word < 1 << (32 * (SPARSE_IN_WORDS + 1)):
        raise ValueError(f"HOST_IN word {word:#x} is wider than "
                         f"{32 * (SPARSE_IN_WORDS + 1)} bits")
    parts = [(word >> (32 * k)) & 0xFFFFFFFF for k in range(SPARSE_IN_WORDS + 1)]
    out = [(int(Reg.SP_IN) + k, v) for k, v in enumerate(parts[:-1]) if v]
    return out + [(int(Reg.SP_PUSH), parts[-1])]


def sparse_load_writes(params: NicParams, program, node: int, grads,
                       *, rows: bool = True) -> list[tuple[int, int]]:
    """Register writes that load ``node``'s program rows (``rows=False``: only the
    gradients, as later error-feedback iterations do) and add its gradient, through the
    engine's host protocol (:func:`~treenic.hdl.nic.sparse_fabric.load_words`)."""
    from .sparse_fabric import load_words
    check_sparse_fits(params, program)
    words = load_words(program, node, grads)
    if not rows:
        words = words[len(program.rows[node]):]
    return [w for word in words for w in sparse_push_writes(word)]


def sparse_dump_writes(program) -> list[tuple[int, int]]:
    """Register writes that request the engine's DUMP of ``program``'s run."""
    from .sparse_fabric import dump_request
    return sparse_push_writes(dump_request(program))


async def sim_write_all(ctx, fabric, per_node) -> None:
    """Amaranth-simulator testbench helper: per node a list of (address, value) writes,
    through the fabric's all-node write stream ``hwa`` (every NIC's next write in the
    same cycle)."""
    for i in range(max(map(len, per_node), default=0)):
        en = 0
        for u, w in enumerate(per_node):
            if i < len(w):
                en |= 1 << u
                ctx.set(fabric.hwa.payload.addr[u], w[i][0])
                ctx.set(fabric.hwa.payload.data[u], w[i][1])
        ctx.set(fabric.hwa.payload.en, en)
        ctx.set(fabric.hwa.valid, 1)
        await ctx.tick()
    ctx.set(fabric.hwa.valid, 0)


async def sim_read_all(ctx, fabric, addrs) -> list[list[int]]:
    """Amaranth-simulator testbench helper: all-node reads (``hra`` -> ``hrda``),
    pipelined; ``addrs``: one address per read (every NIC reads it).  Returns per read
    the words of every NIC."""
    nodes = len(fabric.hrda.payload)
    got, issued = [], 0
    ctx.set(fabric.hrda.ready, 1)
    ctx.set(fabric.hra.payload.en, (1 << nodes) - 1)
    while len(got) < len(addrs):
        if issued < len(addrs):
            for u in range(nodes):
                ctx.set(fabric.hra.payload.addr[u], addrs[issued])
        ctx.set(fabric.hra.valid, issued < len(addrs))
        _, _, ready, valid, data = await ctx.tick().sample(
            fabric.hra.ready, fabric.hrda.valid, fabric.hrda.payload)
        if issued < len(addrs) and ready:
            issued += 1
        if valid:
            got.append([int(data[u]) for u in range(nodes)])
    ctx.set(fabric.hra.valid, 0)
    return got


async def sim_sparse_dump(ctx, fabric, *, batch: int = 16,
                          max_reads: int = 1_000_000) -> list[list[int]]:
    """Amaranth-simulator testbench helper: every NIC's sparse engine output words up to
    its END word (the engine's ``HOST_OUT`` packed: index, value << 32, final << 64),
    read as SP_OUT_POP, SP_OUT_INDEX, SP_OUT_VALUE triples on every NIC at once."""
    nodes = len(fabric.hrda.payload)
    words: list[list[int]] = [[] for _ in range(nodes)]
    ended = [False] * nodes
    reads = 0
    while not all(ended):
        triples = await sim_read_all(ctx, fabric, [int(Reg.SP_OUT_POP), int(Reg.SP_OUT_INDEX),
                                                   int(Reg.SP_OUT_VALUE)] * batch)
        for t in range(batch):
            flags, index, value = triples[3 * t:3 * t + 3]
            for u in range(nodes):
                if ended[u] or not flags[u] & SparseOut.VALID:
                    continue
                if flags[u] & SparseOut.END:
                    ended[u] = True
                else:
                    final = 1 if flags[u] & SparseOut.FINAL else 0
                    words[u].append(index[u] | value[u] << 32 | final << 64)
        reads += 3 * batch
        if reads > max_reads:
            raise TimeoutError(f"sparse dump: no END word after {reads} reads")
    return words
