"""NIC configuration image: what the host loads into one NIC before an all-reduce.

One image per node, generated from the Schedule IR (never hand-written). Little-endian::

    offset size  field
    0      4     magic "TNCF" (treenic config; the host protocol's frames use "TNIC")
    4      2     version (VERSION)
    6      2     header_bytes (HEADER.size = 36)
    8      2     node            this NIC's node id
    10     2     nodes           N
    12     2     ports           P (link map entries that follow the header)
    14     2     flit_bits       link flit width the lockstep estimate assumes
    16     4     elements        float32 elements in the gradient buffer
    20     4     lockstep_cycles step-time estimate loaded into the lockstep down-counter
    24     4     table_bytes     length of the table image that follows the link map
    28     4     crc32           CRC-32 (IEEE 802.3, zlib.crc32) of the whole image with
                                 this field zeroed
    32     4     reserved (0)
    36     2·P   link map: peer node id per local port (0xFFFF: a switch)
    ...          table image (treenic.schedule.table.TableImage.to_bytes)

The lockstep estimate follows the paper (§IV-A): the serialization latency of the largest
message of the schedule assuming no contention — payload flits of the largest chunk, one head
and one tail flit, plus the link latency — so a NOP holds a node for one step's worth of time.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from treenic.schedule.ir import Schedule, ScheduleError
from treenic.schedule.table import TableImage, table_image
from treenic.topology import is_switch

MAGIC = b"TNCF"
VERSION = 1
HEADER = struct.Struct("<4sHHHHHHIIIII")
NO_PEER = 0xFFFF


class ImageError(ScheduleError):
    """A configuration image that is malformed, corrupted or of another version."""


def lockstep_estimate(schedule: Schedule, elements: int, flit_bits: int = 64,
                      link_latency_cycles: int = 4) -> int:
    bounds = schedule.chunk_bounds(elements)
    largest = int(max(bounds[1:] - bounds[:-1])) * 4
    flit_bytes = flit_bits // 8
    return -(-largest // flit_bytes) + 2 + link_latency_cycles


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

    def to_bytes(self) -> bytes:
        table = self.table.to_bytes()
        links = struct.pack(f"<{self.ports}H", *self.link_map)
        head = HEADER.pack(MAGIC, VERSION, HEADER.size, self.node, self.nodes, self.ports,
                           self.flit_bits, self.elements, self.lockstep_cycles, len(table), 0, 0)
        crc = zlib.crc32(head + links + table)
        head = head[:28] + struct.pack("<I", crc) + head[32:]
        return head + links + table

    @classmethod
    def from_bytes(cls, data: bytes) -> "ConfigImage":
        if len(data) < HEADER.size:
            raise ImageError(f"config image too short ({len(data)} bytes)")
        (magic, version, hbytes, node, nodes, ports, flit_bits, elements, lockstep,
         table_bytes, crc, _) = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ImageError(f"not a treenic config image (magic {magic!r})")
        if version != VERSION:
            raise ImageError(f"config image version {version} unsupported (expected {VERSION})")
        if hbytes != HEADER.size:
            raise ImageError(f"config image header is {hbytes} bytes, expected {HEADER.size}")
        expect_len = HEADER.size + 2 * ports + table_bytes
        if len(data) != expect_len:
            raise ImageError(f"config image is {len(data)} bytes, header says {expect_len}")
        zeroed = data[:28] + b"\0\0\0\0" + data[32:]
        if zlib.crc32(zeroed) != crc:
            raise ImageError(f"config image CRC mismatch (stored {crc:#010x}, "
                             f"computed {zlib.crc32(zeroed):#010x})")
        links = list(struct.unpack_from(f"<{ports}H", data, HEADER.size))
        table = TableImage.from_bytes(data[HEADER.size + 2 * ports:])
        if table.node != node or table.layout.nodes != nodes:
            raise ImageError(f"table is for node {table.node} of {table.layout.nodes}, image "
                             f"for node {node} of {nodes}")
        if table.elements != elements:
            raise ImageError(f"table encodes {table.elements} elements, image {elements}")
        return cls(node, nodes, ports, flit_bits, elements, lockstep, links, table)


def build_image(schedule: Schedule, node: int, elements: int, *, flit_bits: int = 64,
                link_latency_cycles: int = 4) -> ConfigImage:
    topo = schedule.topology
    ports = topo.max_ports()
    peers = [NO_PEER if is_switch(p.peer) else p.peer for p in topo.ports(node)]
    peers += [NO_PEER] * (ports - len(peers))
    return ConfigImage(node, schedule.n, ports, flit_bits, elements,
                       lockstep_estimate(schedule, elements, flit_bits, link_latency_cycles),
                       peers, table_image(schedule, node, elements))


def build_images(schedule: Schedule, elements: int, **kw) -> list[bytes]:
    """Serialized config images for every node, in node order."""
    return [build_image(schedule, v, elements, **kw).to_bytes() for v in range(schedule.n)]
