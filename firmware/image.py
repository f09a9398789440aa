"""NIC configuration image: what the host loads into one NIC before an all-reduce.

The schedule compiler (:func:`compile_images`) emits one image per node as an
:class:`ImageSet`; images are generated from the Schedule IR, never hand-written.  The host
loader (:func:`treenic.hdl.nic.host.host_writes`), the golden NIC model
(:mod:`treenic.hdl.nic.model`) and the driver all consume the decoded images.  One image,
little-endian::

    offset size  field
    0      4     magic "TNCF" (treenic config; the host protocol's frames use "TNIC")
    4      2     version (VERSION)
    6      2     header_bytes (HEADER.size = 36)
    8      2     node            this NIC's node id
    10     2     nodes           N
    12     2     ports           P (link map entries that follow the header)
    14     2     flit_bits       link flit width the lockstep estimate assumes (32..512,
                                 a multiple of 32)
    16     4     elements        float32 elements in the gradient buffer
    20     4     lockstep_cycles step-time estimate loaded into the lockstep down-counter
    24     4     table_bytes     length of the table image that follows the link map
    28     4     crc32           CRC-32 (IEEE 802.3, zlib.crc32) of the whole image with
                                 this field zeroed
    32     4     order_entries   ORDER table entries after the table image
    36     2·P   link map: peer node id per local port (0xFFFF: a switch)
    ...          table image (treenic.schedule.table.TableImage.to_bytes)
    ...    6·K   ORDER table: K × (flow u16, rx_port u16, step u16)
                 (treenic.schedule.table.order_entries)

An image set (:meth:`ImageSet.to_bytes`) is ``magic "TNIS" | version u16 | count u16 |
crc32 u32`` (CRC-32 of what follows), ``spec_length u16`` and the topology spec it was
compiled for (UTF-8, e.g. ``torus:4x4``; may be empty), then, per node in node order,
``length u32`` and the image.

Decoding checks the container (magic, version, lengths, CRC) and then the meaning
(:meth:`ConfigImage.validate`): a CRC-valid image whose fields make no sense -- a flit
width of 0, a link-map peer that is the node itself, a table row whose step lies outside
the schedule -- is rejected with an :class:`ImageError` naming the field.

The lockstep estimate follows the MultiTree paper (§IV-A): the serialization latency of the
largest message of the schedule assuming no contention -- payload flits of the largest
chunk, one head and one tail flit, plus the link latency -- so a NOP holds a node for one
step's worth of time.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from treenic.schedule.ir import Op, Schedule, ScheduleError, Transfer
from treenic.schedule.table import (TableImage, TableLayout, all_node_entries, node_entries,
                                    order_entries)
from treenic.topology import TopologyError, is_switch
from treenic.topology import parse as parse_topology

__all__ = ["MAGIC", "VERSION", "NO_PEER", "ImageError", "ConfigImage", "ImageSet",
           "compile_images", "build_image", "build_images", "lockstep_estimate",
           "decode_schedule", "peek_set_header"]

MAGIC = b"TNCF"
VERSION = 2
HEADER = struct.Struct("<4sHHHHHHIIIII")
ORDER_ENTRY = struct.Struct("<HHH")
NO_PEER = 0xFFFF
#: flit widths an image may name (the link layer's data field is whole binary32 words)
FLIT_BITS_RANGE = range(32, 513, 32)

SET_MAGIC = b"TNIS"
SET_VERSION = 1
SET_HEADER = struct.Struct("<4sHHI")


class ImageError(ScheduleError):
    """A configuration image that is malformed, corrupted, of another version, or whose
    fields make no sense; the message names the field."""


def lockstep_estimate(schedule: Schedule, elements: int, flit_bits: int = 64,
                      link_latency_cycles: int = 4) -> int:
    bounds = schedule.chunk_bounds(elements)
    largest = int(max(bounds[1:] - bounds[:-1])) * 4
    flit_bytes = flit_bits // 8
    return -(-largest // flit_bytes) + 2 + link_latency_cycles


def _require(ok: bool, node: int, what: str) -> None:
    if not ok:
        raise ImageError(f"node {node}: {what}")


@dataclass
class ConfigImage:
    node: int
    nodes: int
    ports: int
    flit_bits: int
    elements: int
    lockstep_cycles: int
    link_map: list[int]
    table: TableImage
    #: ORDER table: (flow, rx_port, step) per REDUCE contribution received
    order: list[tuple[int, int, int]] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        table = self.table.to_bytes()
        links = struct.pack(f"<{self.ports}H", *self.link_map)
        order = b"".join(ORDER_ENTRY.pack(*o) for o in self.order)
        head = HEADER.pack(MAGIC, VERSION, HEADER.size, self.node, self.nodes, self.ports,
                           self.flit_bits, self.elements, self.lockstep_cycles, len(table), 0,
                           len(self.order))
        crc = zlib.crc32(head + links + table + order)
        head = head[:28] + struct.pack("<I", crc) + head[32:]
        return head + links + table + order

    @classmethod
    def from_bytes(cls, data: bytes) -> "ConfigImage":
        """Decode and validate one image (container checks, then :meth:`validate`)."""
        data = bytes(data)
        if len(data) < HEADER.size:
            raise ImageError(f"config image too short ({len(data)} bytes)")
        (magic, version, hbytes, node, nodes, ports, flit_bits, elements, lockstep,
         table_bytes, crc, n_order) = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ImageError(f"not a treenic config image (magic {magic!r})")
        if version != VERSION:
            raise ImageError(f"config image version {version} unsupported (expected {VERSION})")
        if hbytes != HEADER.size:
            raise ImageError(f"config image header is {hbytes} bytes, expected {HEADER.size}")
        expect_len = HEADER.size + 2 * ports + table_bytes + ORDER_ENTRY.size * n_order
        if len(data) != expect_len:
            raise ImageError(f"config image is {len(data)} bytes, header says {expect_len}")
        zeroed = data[:28] + b"\0\0\0\0" + data[32:]
        if zlib.crc32(zeroed) != crc:
            raise ImageError(f"config image CRC mismatch (stored {crc:#010x}, "
                             f"computed {zlib.crc32(zeroed):#010x})")
        links = list(struct.unpack_from(f"<{ports}H", data, HEADER.size))
        table_at = HEADER.size + 2 * ports
        try:
            table = TableImage.from_bytes(data[table_at:table_at + table_bytes])
        except ImageError:
            raise
        except ScheduleError as e:          # the table's own checks (magic, op code, ...)
            raise ImageError(f"node {node}: table: {e}") from None
        order = [ORDER_ENTRY.unpack_from(data, table_at + table_bytes + ORDER_ENTRY.size * i)
                 for i in range(n_order)]
        img = cls(node, nodes, ports, flit_bits, elements, lockstep, links, table, order)
        img.validate()
        return img

    # ---- semantic validation -----------------------------------------------------------
    def validate(self) -> None:
        """Reject fields that make no sense, naming the field (:class:`ImageError`)."""
        v, L = self.node, self.table.layout
        _require(self.nodes >= 1, v, f"field nodes={self.nodes} must be >= 1")
        _require(0 <= v < self.nodes, v, f"field node={v} outside 0..{self.nodes - 1}")
        _require(self.ports >= 1, v, f"field ports={self.ports} must be >= 1")
        _require(self.flit_bits in FLIT_BITS_RANGE, v, f"field flit_bits={self.flit_bits} "
                 f"must be a multiple of 32 in {FLIT_BITS_RANGE.start}..{FLIT_BITS_RANGE[-1]}")
        _require(self.lockstep_cycles >= 1, v,
                 f"field lockstep_cycles={self.lockstep_cycles} must be >= 1")
        _require(len(self.link_map) == self.ports, v,
                 f"field link_map has {len(self.link_map)} entries for {self.ports} ports")
        for port, peer in enumerate(self.link_map):
            _require(peer == NO_PEER or (peer < self.nodes and peer != v), v,
                     f"field link_map[{port}]={peer}: a peer must be another node "
                     f"(0..{self.nodes - 1}, not {v}) or {NO_PEER:#x} (a switch)")
        tab = self.table
        for name, got, want in (("node", tab.node, v), ("nodes", L.nodes, self.nodes),
                                ("ports", L.ports, self.ports),
                                ("elements", tab.elements, self.elements)):
            _require(got == want, v, f"field table.{name}={got} differs from the image's {want}")
        _require(L.steps >= 1 and L.flows >= 1, v,
                 f"field table.steps={L.steps} / table.flows={L.flows} must be >= 1")
        for i, e in enumerate(tab.entries):
            self._validate_row(i, e, L)
        for i, (flow, port, step) in enumerate(self.order):
            _require(flow < L.flows, v, f"field order[{i}].flow={flow} outside "
                     f"0..{L.flows - 1}")
            _require(port < self.ports, v, f"field order[{i}].rx_port={port} outside "
                     f"0..{self.ports - 1}")
            _require(1 <= step <= L.steps, v, f"field order[{i}].step={step} outside "
                     f"1..{L.steps}")

    def _validate_row(self, i: int, e, L: TableLayout) -> None:
        v = self.node

        def row(ok, name, val, rng):
            _require(ok, v, f"field table row {i} {name}={val} outside {rng}")

        row(1 <= e.step <= L.steps, "step", e.step, f"1..{L.steps}")
        if e.op == Op.NOP:
            return
        row(e.flow < L.flows, "flow", e.flow, f"0..{L.flows - 1}")
        row(e.parent is None or (e.parent < self.nodes and e.parent != v), "parent", e.parent,
            f"the other nodes of 0..{self.nodes - 1}")
        row(v not in e.children, "children", sorted(e.children),
            f"the other nodes of 0..{self.nodes - 1}")
        row(e.parent_port is None or e.parent_port < self.ports, "parent_port", e.parent_port,
            f"0..{self.ports - 1}")
        row(e.start + e.size <= self.elements, "start+size", e.start + e.size,
            f"0..{self.elements} (elements)")


@dataclass
class ImageSet:
    """The configuration images of every node of one schedule, in node order, and the spec
    of the topology they were compiled for (:meth:`check_topology` holds them to it)."""
    images: list[ConfigImage]
    topology: str = ""

    def __post_init__(self):
        self.images = [im if isinstance(im, ConfigImage) else ConfigImage.from_bytes(im)
                       for im in self.images]
        self.validate()

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self):
        return iter(self.images)

    def __getitem__(self, node: int) -> ConfigImage:
        return self.images[node]

    @property
    def nodes(self) -> int:
        return len(self.images)

    @property
    def elements(self) -> int:
        return self.images[0].elements

    def validate(self) -> None:
        """Every image valid on its own, image i is node i of the same N nodes and element
        count, and the link maps agree (a peer names this node on one of its ports)."""
        if not self.images:
            raise ImageError("image set is empty")
        n = len(self.images)
        for u, im in enumerate(self.images):
            im.validate()
            _require(im.node == u, u, f"field node={im.node}: the set's image {u} must be "
                     f"node {u}")
            _require(im.nodes == n, u, f"field nodes={im.nodes}, the set has {n} images")
            _require(im.elements == self.images[0].elements, u,
                     f"field elements={im.elements} differs from node 0's "
                     f"{self.images[0].elements}")
            for port, peer in enumerate(im.link_map):
                _require(peer == NO_PEER or u in self.images[peer].link_map, u,
                         f"field link_map[{port}]={peer}: node {peer} has no port back to {u}")

    def check_topology(self, topology) -> None:
        """Every image's link map is ``topology``'s port list of its node (switch ports
        :data:`NO_PEER`): the images can be loaded into a fabric wired as ``topology``."""
        if topology.n != self.nodes:
            raise ImageError(f"image set has {self.nodes} nodes, topology {topology.spec} "
                             f"{topology.n}")
        for u, im in enumerate(self.images):
            want = _link_map(topology, u)
            for port, (got, exp) in enumerate(zip(im.link_map, want)):
                _require(got == exp, u, f"field link_map[{port}]={got}, topology "
                         f"{topology.spec} has {exp} there")
            _require(len(im.link_map) == len(want), u, f"field ports={im.ports}, topology "
                     f"{topology.spec} has {len(want)}")

    def to_bytes(self) -> bytes:
        spec = self.topology.encode()
        body = struct.pack("<H", len(spec)) + spec + b"".join(
            struct.pack("<I", len(b)) + b for b in (im.to_bytes() for im in self.images))
        return SET_HEADER.pack(SET_MAGIC, SET_VERSION, len(self.images), zlib.crc32(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> "ImageSet":
        data = bytes(data)
        count, crc = peek_set_header(data)
        body = data[SET_HEADER.size:]
        if zlib.crc32(body) != crc:
            raise ImageError("image set CRC mismatch")
        (spec_len,) = struct.unpack_from("<H", body) if len(body) >= 2 else (len(body),)
        if 2 + spec_len > len(body):
            raise ImageError("image set truncated inside its topology spec")
        try:
            spec = body[2:2 + spec_len].decode()
        except UnicodeDecodeError:
            raise ImageError("image set topology spec is not UTF-8") from None
        images, at = [], 2 + spec_len
        for i in range(count):
            if at + 4 > len(body):
                raise ImageError(f"image set truncated before image {i} of {count}")
            (size,) = struct.unpack_from("<I", body, at)
            if at + 4 + size > len(body):
                raise ImageError(f"image set truncated inside image {i} of {count}")
            images.append(ConfigImage.from_bytes(body[at + 4:at + 4 + size]))
            at += 4 + size
        if at != len(body):
            raise ImageError(f"image set has {len(body) - at} bytes after its {count} images")
        return cls(images, spec)


def peek_set_header(data: bytes) -> tuple[int, int]:
    """``(image count, body CRC-32)`` of a serialized image set after checking its magic
    and version: what a receiver reads before it spends any work on the images."""
    if len(data) < SET_HEADER.size:
        raise ImageError(f"image set too short ({len(data)} bytes)")
    magic, version, count, crc = SET_HEADER.unpack_from(data)
    if magic != SET_MAGIC:
        raise ImageError(f"not a treenic image set (magic {magic!r})")
    if version != SET_VERSION:
        raise ImageError(f"image set version {version} unsupported (expected {SET_VERSION})")
    return count, crc


def _link_map(topology, node: int) -> list[int]:
    """The link map of ``node``: peer node per port, :data:`NO_PEER` for a switch."""
    peers = [NO_PEER if is_switch(p.peer) else p.peer for p in topology.ports(node)]
    return peers + [NO_PEER] * (topology.max_ports() - len(peers))


def build_image(schedule: Schedule, node: int, elements: int, *, flit_bits: int = 64,
                link_latency_cycles: int = 4) -> ConfigImage:
    """One node's image; :func:`compile_images` builds the whole set."""
    layout = TableLayout.for_schedule(schedule, elements)
    table = TableImage(node, layout, elements, node_entries(schedule, node, elements))
    image = ConfigImage(node, schedule.n, schedule.topology.max_ports(), flit_bits, elements,
                        lockstep_estimate(schedule, elements, flit_bits, link_latency_cycles),
                        _link_map(schedule.topology, node), table,
                        order_entries(schedule, node))
    image.validate()
    return image


def compile_images(topology=None, algorithm="multitree", elements: int = 1024, *,
                   flit_bits: int = 64, link_latency_cycles: int = 4) -> ImageSet:
    """The schedule compiler's output: the configuration image of every node.

    ``algorithm`` is an algorithm name for :func:`treenic.algorithms.build` (with
    ``topology`` a spec such as ``"torus:4x4"`` or a Topology) or an already built
    :class:`~treenic.schedule.ir.Schedule` (``topology`` then may be None).  Each node's
    table (``node_entries``) is derived exactly once here."""
    if isinstance(algorithm, Schedule):
        schedule = algorithm
    else:
        from treenic.algorithms import build
        schedule = build(algorithm, topology)
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 0:
        raise ImageError(f"elements must be an int >= 0, got {elements!r}")
    return ImageSet([build_image(schedule, v, elements, flit_bits=flit_bits,
                                 link_latency_cycles=link_latency_cycles)
                     for v in range(schedule.n)], schedule.topology.spec)


def build_images(schedule: Schedule, elements: int, **kw) -> list[bytes]:
    """Serialized images for every node, in node order (:func:`compile_images`)."""
    return [im.to_bytes() for im in compile_images(None, schedule, elements, **kw)]


# ---- reading a schedule back out of an image set ---------------------------------------

def _row_transfers(images: ImageSet) -> list[Transfer]:
    """The transfers the NICs loaded with ``images`` perform: each REDUCE row with a parent
    sends that flow's partial to it, each GATHER row sends the flow's values to every child
    (one chunk per transfer: a table flow is a chunk)."""
    out = []
    for u, im in enumerate(images):
        for e in im.table.entries:
            if e.op == Op.REDUCE and e.parent is not None:
                out.append(Transfer(e.step, u, e.parent, Op.REDUCE, (e.flow,), e.flow))
            elif e.op == Op.GATHER:
                out += [Transfer(e.step, u, d, Op.GATHER, (e.flow,), e.flow)
                        for d in sorted(e.children)]
    return out


def decode_schedule(images: ImageSet, topology=None) -> Schedule:
    """The schedule an image set makes its NICs run, read back from the table rows.

    This is how a golden engine consumes the images the RTL consumes: the result is what
    :func:`treenic.schedule.execute.execute` runs.  The set must be exactly the compiler's
    encoding of that schedule -- every node's table rows, ORDER table and link map equal
    what :func:`compile_images` emits for it -- else :class:`ImageError` names the first
    node and field that differ (rows that disagree between nodes, a chunk range that is not
    the flow's, a missing contribution).  ``topology`` (a Topology) defaults to the set's
    own spec, which must then be non-empty."""
    images.validate()
    if topology is None:
        if not images.topology:
            raise ImageError("image set names no topology")
        try:
            topology = parse_topology(images.topology)
        except TopologyError as e:
            raise ImageError(f"image set topology: {e}") from None
    images.check_topology(topology)
    layouts = {(im.table.layout.steps, im.table.layout.flows) for im in images}
    if len(layouts) != 1:
        raise ImageError(f"images disagree on (steps, flows): {sorted(layouts)}")
    ((steps, flows),) = layouts
    transfers = _row_transfers(images)
    reduce_steps = max((t.step for t in transfers if t.op == Op.REDUCE), default=0)
    try:
        schedule = Schedule("image-set", topology, flows, transfers, reduce_steps,
                            steps - reduce_steps, meta={"decoded_from": "image set"})
    except ScheduleError as e:
        raise ImageError(f"image set rows: {e}") from None
    _check_canonical(images, schedule)
    return schedule


def _check_canonical(images: ImageSet, schedule: Schedule) -> None:
    """Every image equals the compiler's image of ``schedule`` (rows, ORDER, layout)."""
    elements = images.elements
    want_layout = TableLayout.for_schedule(schedule, elements)
    for u, (im, rows) in enumerate(zip(images, all_node_entries(schedule, elements))):
        _require(im.table.layout == want_layout, u, f"field table layout {im.table.layout} "
                 f"differs from the schedule's {want_layout}")
        for i, (got, want) in enumerate(zip(im.table.entries, rows)):
            _require(got == want, u, f"field table row {i} {got} is not the schedule's "
                     f"{want} (rows of different nodes disagree)")
        _require(len(im.table.entries) == len(rows), u, f"field table has "
                 f"{len(im.table.entries)} rows, the schedule it encodes {len(rows)}")
        want_order = order_entries(schedule, u)
        _require(sorted(im.order) == want_order, u, f"field order ({len(im.order)} entries) "
                 f"is not the schedule's ORDER table ({len(want_order)} entries)")
