"""NIC configuration image: what the host loads into one NIC before an all-reduce.

The schedule compiler (:func:`compile_images`) emits one image per node as an
:class:`ImageSet`; images are generated from the Schedule IR, never hand-written.  The host
loader (:func:`treenic.hdl.nic.host.host_writes`), the golden NIC model
(:mod:`treenic.hdl.nic.model`) and the driver all consume the decoded images.  One image,
little-endian::

    offset size  field
    0      4     magic "TNCF" (treenic config; the host protocol's frames use "TNIC")
    4      2     version (DENSE_VERSION = 2; VERSION = 3 with a sparse section, below)
    6      2     header_bytes (HEADER.size = 36; version 3: 40)
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

Version 3 adds the sparse program (:mod:`treenic.schedule.sparse_table`): the header grows
to 40 bytes, ``sparse_bytes u32`` at offset 36 (header_bytes = 40), and the sparse section
(:class:`SparseSection`) follows the ORDER table; the CRC at offset 28 covers it too. The
writer emits version 2 -- byte for byte what it always did -- for an image without a sparse
section, version 3 for one with; the reader takes both and names any other version. The
sparse section, little-endian::

    offset size  field
    0      4     magic "TNSP"
    4      2     sparse table version (SPARSE_TABLE_VERSION; 1 and 2 are read)
    6      1     algorithm (1 multitree-sparse, 2 topka)
    7      1     flags: bit 0 codec messages (pairs or bitmap + values, else pair flits),
                 bit 1 global residual (else local), bit 2 hash flows (else contiguous)
    8      2     chunks          flows F (<= 256: a row's chunk field is 8 bits)
    10     2     ports           ports the rows address (<= the image's ports)
    12     8     hash_seed       seed of Zen's h0 (hash flows; 0 otherwise): the host's
                                 buffer order (treenic.sparse.multitree_sparse.hash_flows)
    20     8     density         top-k density (float64) the budgets were derived from
    28     4     max_flow        largest flow (elements): the top-k unit's scan length
    32     4     max_k           largest budget: the final-pair slot size
    36     4     rx_flits        most flits any (node, port) receives in a run: RX FIFO depth
    40     4     buffer_words    part words the rows address (N, or 2N)
    44     4     residual_base   where the host adds gradients / the residual lives
    48     4     result_base     TopkA's result region (0xFFFFFFFF: none)
    52     4     link_pairs      pairs all links carry at full budgets
    56     4     link_flits      flits all links carry at full budgets
    60     4     ideal_cycles    the program's no-contention cycle bound
    64     4     rows            R, this node's program length (<= MAX_SPARSE_ROWS)
    68     4·F   budgets kb per flow (u32)
    ...    12·R  rows: 96-bit rows (sparse_table.pack_row), little-endian, END last

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

import dataclasses
import struct
import zlib
from dataclasses import dataclass, field

from treenic.schedule.ir import Op, Schedule, ScheduleError, Transfer
from treenic.schedule.sparse_table import (SPARSE_ALGORITHMS, SPARSE_TABLE_VERSION, SparseOp,
                                           SparseProgram, SparseTableError, sparse_model,
                                           unpack_row)
from treenic.schedule.table import (TableImage, TableLayout, all_node_entries, node_entries,
                                    order_entries)
from treenic.topology import TopologyError, is_switch
from treenic.topology import parse as parse_topology

__all__ = ["MAGIC", "VERSION", "DENSE_VERSION", "NO_PEER", "ImageError", "ConfigImage",
           "ImageSet", "SparseSection", "compile_images", "build_image", "build_images",
           "lockstep_estimate", "decode_schedule", "peek_set_header", "sparse_images",
           "decode_sparse_program", "compile_sparse_images", "MAX_SPARSE_ROWS"]

MAGIC = b"TNCF"
#: 3: the sparse section; an image without one is still written (and read) as version 2
VERSION = 3
DENSE_VERSION = 2
HEADER = struct.Struct("<4sHHHHHHIIIII")
HEADER_V3 = struct.Struct("<4sHHHHHHIIIIII")     # + sparse_bytes
SPARSE_MAGIC = b"TNSP"
SPARSE_HEADER = struct.Struct("<4sHBBHHQdIIIIIIIIII")
#: sparse table versions whose rows the decoder reads (version 1: op codes 0..5 only)
SPARSE_TABLE_VERSIONS = (1, SPARSE_TABLE_VERSION)
SPARSE_ALGORITHM_IDS = {1: "multitree-sparse", 2: "topka"}
FLAG_CODEC, FLAG_GLOBAL, FLAG_HASH = 1, 2, 4
NO_RESULT_BASE = 0xFFFFFFFF
#: most rows one node's sparse program may hold (checked before any row is read)
MAX_SPARSE_ROWS = 1 << 16
#: most flows: a row's chunk field is 8 bits
MAX_SPARSE_CHUNKS = 256
ROW_BYTES = 12
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
class SparseSection:
    """One node's sparse program in its image (version 3): the node's rows and what the
    engine and its host sequence need -- the program's sizes, the algorithm, residual, flow
    assignment (hash seed), message format and budgets. :func:`decode_sparse_program`
    rebuilds the :class:`~treenic.schedule.sparse_table.SparseProgram` from a set of them."""
    algorithm: str
    residual: str
    codec: bool
    hash_seed: int | None       # None: contiguous flows
    density: float
    chunks: int
    ports: int
    max_flow: int
    max_k: int
    rx_flits: int
    buffer_words: int
    residual_base: int
    result_base: int | None
    link_pairs: int
    link_flits: int
    ideal_cycles: int
    kb: list[int]
    rows: list[int]
    table_version: int = SPARSE_TABLE_VERSION

    @property
    def flow_assignment(self) -> str:
        return "contiguous" if self.hash_seed is None else "hash"

    @classmethod
    def of_program(cls, prog: SparseProgram, node: int) -> "SparseSection":
        return cls(prog.algorithm, prog.residual, prog.codec, prog.hash_seed, prog.density,
                   prog.chunks, prog.ports, prog.max_flow, prog.max_k, prog.rx_flits,
                   prog.buffer_words, prog.residual_base, prog.result_base, prog.link_pairs,
                   prog.link_flits, prog.ideal_cycles, list(prog.kb), list(prog.rows[node]))

    def common(self) -> "SparseSection":
        """The fields every node's section shares (the rows are the node's own)."""
        return dataclasses.replace(self, rows=[])

    def to_bytes(self, node: int) -> bytes:
        algo = {name: i for i, name in SPARSE_ALGORITHM_IDS.items()}
        _require(self.algorithm in algo, node, f"sparse algorithm {self.algorithm!r} has no "
                 f"image encoding ({', '.join(algo)})")
        seed = 0 if self.hash_seed is None else self.hash_seed
        _require(0 <= seed < 1 << 64, node, f"sparse hash_seed={seed} does not fit 64 bits")
        flags = ((FLAG_CODEC if self.codec else 0) |
                 (FLAG_GLOBAL if self.residual == "global" else 0) |
                 (FLAG_HASH if self.hash_seed is not None else 0))
        result_base = NO_RESULT_BASE if self.result_base is None else self.result_base
        try:
            head = SPARSE_HEADER.pack(
                SPARSE_MAGIC, self.table_version, algo[self.algorithm], flags, self.chunks,
                self.ports, seed, self.density, self.max_flow, self.max_k, self.rx_flits,
                self.buffer_words, self.residual_base, result_base, self.link_pairs,
                self.link_flits, self.ideal_cycles, len(self.rows))
            kb = struct.pack(f"<{len(self.kb)}I", *self.kb)
            rows = b"".join(int(r).to_bytes(ROW_BYTES, "little") for r in self.rows)
        except (struct.error, OverflowError) as e:
            raise ImageError(f"node {node}: sparse section field does not fit: {e}") from None
        return head + kb + rows

    @classmethod
    def from_bytes(cls, data: bytes, node: int) -> "SparseSection":
        """Decode one section; the sizes are checked against ``len(data)`` before any
        budget or row is read. :meth:`validate` then checks the meaning."""
        def need(ok, what):
            _require(ok, node, f"sparse section: {what}")

        need(len(data) >= SPARSE_HEADER.size, f"{len(data)} bytes, shorter than its "
             f"{SPARSE_HEADER.size}-byte header (truncated)")
        (magic, version, algo, flags, chunks, ports, seed, density, max_flow, max_k, rx_flits,
         buffer_words, residual_base, result_base, link_pairs, link_flits, ideal,
         n_rows) = SPARSE_HEADER.unpack_from(data)
        need(magic == SPARSE_MAGIC, f"magic {magic!r}, expected {SPARSE_MAGIC!r}")
        need(version in SPARSE_TABLE_VERSIONS, f"sparse table version {version} unsupported "
             f"(reads {' and '.join(map(str, SPARSE_TABLE_VERSIONS))})")
        need(algo in SPARSE_ALGORITHM_IDS, f"algorithm id {algo} unknown (known: "
             + ", ".join(f"{i} {n}" for i, n in SPARSE_ALGORITHM_IDS.items()) + ")")
        need(flags & ~(FLAG_CODEC | FLAG_GLOBAL | FLAG_HASH) == 0,
             f"flags {flags:#04x} has unknown bits")
        need(1 <= chunks <= MAX_SPARSE_CHUNKS, f"chunks={chunks} outside "
             f"1..{MAX_SPARSE_CHUNKS}")
        need(n_rows <= MAX_SPARSE_ROWS, f"row count {n_rows} exceeds the bound "
             f"{MAX_SPARSE_ROWS}")
        want = SPARSE_HEADER.size + 4 * chunks + ROW_BYTES * n_rows
        need(len(data) == want, f"{len(data)} bytes, its header says {want} "
             f"({chunks} budgets, {n_rows} rows){' (truncated)' if len(data) < want else ''}")
        need(flags & FLAG_HASH or seed == 0, f"hash_seed={seed} with contiguous flows")
        kb = list(struct.unpack_from(f"<{chunks}I", data, SPARSE_HEADER.size))
        at = SPARSE_HEADER.size + 4 * chunks
        rows = [int.from_bytes(data[at + ROW_BYTES * i:at + ROW_BYTES * (i + 1)], "little")
                for i in range(n_rows)]
        return cls(SPARSE_ALGORITHM_IDS[algo], "global" if flags & FLAG_GLOBAL else "local",
                   bool(flags & FLAG_CODEC), seed if flags & FLAG_HASH else None, density,
                   chunks, ports, max_flow, max_k, rx_flits, buffer_words, residual_base,
                   None if result_base == NO_RESULT_BASE else result_base, link_pairs,
                   link_flits, ideal, kb, rows, version)

    # ---- semantic validation -----------------------------------------------------------
    def validate(self, image: "ConfigImage") -> None:
        """Reject sizes and rows that make no sense for ``image`` (its node, elements and
        ports), naming the field: every row's op known to its table version, its chunk,
        port and buffer ranges inside the program's sizes, END last and only last."""
        v, N, W = image.node, image.elements, self.buffer_words

        def field(ok, what):
            _require(ok, v, f"sparse field {what}")

        field(self.algorithm in SPARSE_ALGORITHMS, f"algorithm={self.algorithm!r} not one "
              f"of {', '.join(SPARSE_ALGORITHMS)}")
        field(self.residual in ("local", "global"), f"residual={self.residual!r}")
        field(self.algorithm != "topka" or (self.residual, self.hash_seed) == ("local", None),
              "topka keeps the local residual and has no hash flows")
        field(0 < self.density <= 1, f"density={self.density} outside (0, 1]")
        field(1 <= self.ports <= image.ports, f"ports={self.ports} outside "
              f"1..{image.ports} (the image's)")
        field(len(self.kb) == self.chunks, f"kb has {len(self.kb)} budgets for "
              f"{self.chunks} chunks")
        field(1 <= self.max_flow <= N, f"max_flow={self.max_flow} outside 1..{N} (elements)")
        field(all(1 <= k <= self.max_k for k in self.kb), f"kb (budgets) outside "
              f"1..max_k={self.max_k}")
        field(self.max_k <= self.max_flow, f"max_k={self.max_k} above max_flow="
              f"{self.max_flow}")
        field(N <= W <= 2 * N, f"buffer_words={W} outside {N}..{2 * N} (elements..2x)")
        for name, base in (("residual_base", self.residual_base),
                           ("result_base", self.result_base)):
            field(base is None or base + N <= W, f"{name}={base}: {name} + {N} elements "
                  f"beyond buffer_words={W}")
        field(self.rx_flits >= 1, f"rx_flits={self.rx_flits} must be >= 1")
        field(bool(self.rows), "rows: the program is empty (END missing)")
        for i, word in enumerate(self.rows):
            self._validate_row(v, i, word, N)

    def _validate_row(self, v: int, i: int, word: int, elements: int) -> None:
        def row(ok, what):
            _require(ok, v, f"sparse row {i}: {what}")

        row(0 <= word < 1 << 8 * ROW_BYTES, "does not fit 96 bits")
        try:
            r = unpack_row(word)
        except SparseTableError as e:
            raise ImageError(f"node {v}: sparse row {i}: {e}") from None
        op, W = r["op"], self.buffer_words
        row(self.table_version >= 2 or op <= SparseOp.GRECV, f"op {op.name} needs sparse "
            f"table version 2 (the section says {self.table_version})")
        row((op == SparseOp.END) == (i == len(self.rows) - 1),
            "END must be the last row and only the last" if op == SparseOp.END else
            f"the last row is {op.name}, not END")
        row(r["chunk"] < self.chunks, f"chunk={r['chunk']} outside 0..{self.chunks - 1}")
        row(r["port"] < self.ports, f"port={r['port']} outside 0..{self.ports - 1}")
        row(r["lo"] + r["n"] <= W, f"lo+n={r['lo'] + r['n']} beyond buffer_words={W}")
        if op in (SparseOp.ACC, SparseOp.ZERO, SparseOp.FIXUP):   # lo + a flow index
            row(r["lo"] + elements <= W, f"{op.name} lo={r['lo']} + {elements} elements "
                f"beyond buffer_words={W}")
        if op in (SparseOp.FIXUP, SparseOp.COPY):                 # k: the target region
            span = elements if op == SparseOp.FIXUP else r["n"]
            row(r["k"] + span <= W, f"{op.name} k={r['k']} + {span} beyond buffer_words={W}")
        elif op not in (SparseOp.ACC, SparseOp.ZERO, SparseOp.END):
            row(r["k"] <= self.max_k, f"k={r['k']} above max_k={self.max_k}")


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
    #: the node's sparse program (version 3); None: a dense-only image (version 2)
    sparse: SparseSection | None = None

    def to_bytes(self) -> bytes:
        table = self.table.to_bytes()
        links = struct.pack(f"<{self.ports}H", *self.link_map)
        order = b"".join(ORDER_ENTRY.pack(*o) for o in self.order)
        fields = (self.node, self.nodes, self.ports, self.flit_bits, self.elements,
                  self.lockstep_cycles, len(table), 0, len(self.order))
        if self.sparse is None:            # version 2, byte for byte
            head, sparse = HEADER.pack(MAGIC, DENSE_VERSION, HEADER.size, *fields), b""
        else:
            sparse = self.sparse.to_bytes(self.node)
            head = HEADER_V3.pack(MAGIC, VERSION, HEADER_V3.size, *fields, len(sparse))
        crc = zlib.crc32(head + links + table + order + sparse)
        head = head[:28] + struct.pack("<I", crc) + head[32:]
        return head + links + table + order + sparse

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
        if version not in (DENSE_VERSION, VERSION):
            raise ImageError(f"config image version {version} unsupported (reads "
                             f"{DENSE_VERSION} and {VERSION})")
        head = HEADER if version == DENSE_VERSION else HEADER_V3
        if hbytes != head.size:
            raise ImageError(f"config image header is {hbytes} bytes, expected {head.size} "
                             f"(version {version})")
        if len(data) < head.size:
            raise ImageError(f"config image too short ({len(data)} bytes) for its version "
                             f"{version} header")
        sparse_bytes = head.unpack_from(data)[-1] if head is HEADER_V3 else 0
        if head is HEADER_V3 and sparse_bytes == 0:
            raise ImageError("config image version 3 without a sparse section (a dense-only "
                             "image is version 2)")
        expect_len = (head.size + 2 * ports + table_bytes + ORDER_ENTRY.size * n_order +
                      sparse_bytes)
        if len(data) != expect_len:
            raise ImageError(f"config image is {len(data)} bytes, header says {expect_len}")
        zeroed = data[:28] + b"\0\0\0\0" + data[32:]
        if zlib.crc32(zeroed) != crc:
            raise ImageError(f"config image CRC mismatch (stored {crc:#010x}, "
                             f"computed {zlib.crc32(zeroed):#010x})")
        links = list(struct.unpack_from(f"<{ports}H", data, head.size))
        table_at = head.size + 2 * ports
        try:
            table = TableImage.from_bytes(data[table_at:table_at + table_bytes])
        except ImageError:
            raise
        except ScheduleError as e:          # the table's own checks (magic, op code, ...)
            raise ImageError(f"node {node}: table: {e}") from None
        order = [ORDER_ENTRY.unpack_from(data, table_at + table_bytes + ORDER_ENTRY.size * i)
                 for i in range(n_order)]
        sparse = (SparseSection.from_bytes(data[len(data) - sparse_bytes:], node)
                  if sparse_bytes else None)
        img = cls(node, nodes, ports, flit_bits, elements, lockstep, links, table, order,
                  sparse)
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
        if self.sparse is not None:
            self.sparse.validate(self)

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
        self._validate_sparse()

    def _validate_sparse(self) -> None:
        """Either no image has a sparse section or every one has, all of one program."""
        first = self.images[0].sparse
        for u, im in enumerate(self.images):
            _require((im.sparse is None) == (first is None), u, "sparse section " +
                     ("missing; node 0 has one" if im.sparse is None else
                      "present; node 0 has none"))
            if first is not None and im.sparse.common() != first.common():
                diff = next(f.name for f in dataclasses.fields(SparseSection)
                            if getattr(im.sparse, f.name) != getattr(first, f.name))
                raise ImageError(f"node {u}: sparse field {diff}={getattr(im.sparse, diff)!r} "
                                 f"differs from node 0's {getattr(first, diff)!r}")

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
                   flit_bits: int = 64, link_latency_cycles: int = 4,
                   density: float | None = None, **sparse) -> ImageSet:
    """The schedule compiler's output: the configuration image of every node.

    ``algorithm`` is an algorithm name for :func:`treenic.algorithms.build` (with
    ``topology`` a spec such as ``"torus:4x4"`` or a Topology) or an already built
    :class:`~treenic.schedule.ir.Schedule` (``topology`` then may be None).  Each node's
    table (``node_entries``) is derived exactly once here.  A sparse algorithm
    (``"multitree-sparse"``, ``"topka"``) needs ``density`` and takes the sparse options
    ``seed``, ``flow_assignment``, ``residual``, ``codec``
    (:func:`compile_sparse_images`): version-3 images with a sparse section."""
    if isinstance(algorithm, str) and algorithm in SPARSE_ALGORITHMS:
        if density is None:
            raise ImageError(f"{algorithm} images need a density")
        return compile_sparse_images(topology, algorithm, elements, density,
                                     flit_bits=flit_bits,
                                     link_latency_cycles=link_latency_cycles, **sparse)
    if density is not None or sparse:
        raise ImageError(f"density / sparse options ({', '.join(sparse) or 'density'}) are "
                         f"for {' and '.join(SPARSE_ALGORITHMS)} images, not {algorithm!r}")
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


def compile_sparse_images(topology, algorithm: str, elements: int, density: float, *,
                          seed: int = 0, flow_assignment: str = "contiguous",
                          residual: str = "local", codec: bool = False, flit_bits: int = 64,
                          link_latency_cycles: int = 4) -> ImageSet:
    """The image set of one sparse all-reduce (``algorithm`` one of
    :data:`~treenic.schedule.sparse_table.SPARSE_ALGORITHMS`): the program from
    :func:`~treenic.schedule.sparse_table.sparse_model` (``compile_sparse`` /
    ``compile_topka``, the one compiler), into :func:`sparse_images`."""
    spec = topology if isinstance(topology, str) else getattr(topology, "spec", None)
    if not spec:
        raise ImageError(f"a sparse image set needs a topology spec, got {topology!r}")
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 1:
        raise ImageError(f"elements must be an int >= 1, got {elements!r}")
    try:
        _, program = sparse_model(algorithm, spec, elements, density, seed=seed,
                                  flow_assignment=flow_assignment, residual=residual,
                                  codec=codec)
    except (ValueError, TopologyError) as e:      # SparseError, SparseTableError included
        raise ImageError(f"sparse program: {e}") from None
    return sparse_images(program, flit_bits=flit_bits,
                         link_latency_cycles=link_latency_cycles)


def sparse_images(program: SparseProgram, *, flit_bits: int = 64,
                  link_latency_cycles: int = 4) -> ImageSet:
    """The image set that carries ``program``: the dense MultiTree images of its topology
    (the trees the sparse program runs on, so one loaded set serves dense and sparse
    all-reduces) with every node's :class:`SparseSection`."""
    from treenic.sparse.multitree_sparse import build_schedule
    schedule = build_schedule(len(program.rows), program.topology)
    dense = compile_images(None, schedule, program.elements, flit_bits=flit_bits,
                           link_latency_cycles=link_latency_cycles)
    images = [dataclasses.replace(im, sparse=SparseSection.of_program(program, u))
              for u, im in enumerate(dense)]
    return ImageSet(images, dense.topology)


def decode_sparse_program(images: ImageSet) -> SparseProgram:
    """The :class:`~treenic.schedule.sparse_table.SparseProgram` an image set loads into
    its sparse engines -- what the engine's host sequence (PROG rows, the hash flows' buffer
    order, the residual and result regions) and its sizes come from. Exact inverse of
    :func:`sparse_images`: the compiled program comes back equal, field for field (hash
    flows: the buffer order is recomputed from the seed by the golden's own
    :func:`~treenic.sparse.multitree_sparse.hash_flows`)."""
    images.validate()
    first = images[0].sparse
    if first is None:
        raise ImageError("image set has no sparse section (a dense-only set)")
    if not images.topology:
        raise ImageError("image set names no topology")
    try:
        images.check_topology(parse_topology(images.topology))
    except TopologyError as e:
        raise ImageError(f"image set topology: {e}") from None
    perm = None
    if first.hash_seed is not None:
        from treenic.sparse.multitree_sparse import hash_flows
        order, offsets = hash_flows(images.elements, first.chunks, first.hash_seed)
        sizes = [int(x) for x in offsets[1:] - offsets[:-1]]
        _require(max(sizes) == first.max_flow, 0, f"sparse field max_flow={first.max_flow} "
                 f"is not the hash flows' largest ({max(sizes)})")
        perm = [int(i) for i in order]
    return SparseProgram(images.topology, images.elements, [im.sparse.rows for im in images],
                         first.chunks, first.max_flow, first.max_k, first.rx_flits,
                         first.ports, list(first.kb), first.link_pairs, perm,
                         first.ideal_cycles, first.algorithm, first.residual,
                         first.buffer_words, first.result_base, first.residual_base,
                         first.codec, first.link_flits, first.hash_seed, first.density)


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
