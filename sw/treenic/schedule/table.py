"""NIC schedule tables (MultiTree paper §IV-A, Fig. 5) derived from the Schedule IR.

Each node gets an ordered list of entries ``(op, flow, step, parent, children, parent_port,
child_ports, start, size)``. ``flow`` is the chunk id (every tree in treenic carries one chunk;
for MultiTree flow f = chunk f = the tree rooted at node f). Per flow a node has:

* ``REDUCE`` — one entry per partial it sends: ``parent`` = the receiver, ``children`` = the
  nodes whose contributions must have been accumulated first (arrivals at earlier steps),
  ``step`` = the send step. The root has one entry with ``parent = NIL`` (no send) and
  ``step`` = its last arrival step: it retires once every child's contribution is in.
* ``GATHER`` — one entry per send step: ``parent`` = where the final values came from (NIL at
  the root), ``children`` = receivers at that step. A leaf gets a receive-only entry
  (``children = ∅``, ``step`` = arrival step).
* ``NOP`` — one per step in ``1..steps`` at which the node has no other entry: the lockstep
  down-counter holds the node for one estimated step time (§IV-A).

MultiTree thus has 2N non-NOP entries per node (one REDUCE and one GATHER per tree) when
every node serves all its children of a tree in one step, as in the paper's Fig. 5. Algorithm 1
may connect a parent's children at different all-gather steps; serving them all at the first
one would use links allocated to other trees then, so such a node gets one GATHER entry per
send step (the tables stay exact and contention-free; the count exceeds 2N by those extras). Entries are ordered by
``(step, op, flow)`` with NOP < REDUCE < GATHER; the NIC inspects the head entry only.

Ports: ``parent_port`` is the local port of the first hop toward the parent (also the port the
parent's data arrives on in direct networks), ``child_ports`` the mask of ports toward the
children; NIL = all ones. ``start``/``size`` are the chunk's element range for the buffer size
the table is encoded for.

Binary row (LSB first, widths from :class:`TableLayout`)::

    op[OP_BITS] | flow[wF] | step[wS] | parent[wN] | children[N] | parent_port[wP] | child_ports[P]
          | start[wA] | size[wA]

A table image is a 32-byte little-endian header followed by the rows, each padded to whole
bytes (``row_bytes``)::

    magic "TNTB" | version u16 | node u16 | nodes u16 | ports u16 | steps u16 | flows u16
    | entries u32 | elements u32 | address_bits u8 | reserved[7]
"""
from __future__ import annotations

import struct
from collections import defaultdict
from dataclasses import dataclass, field

from amaranth.utils import bits_for

from ..hdl.link.flit import OP_BITS
from .ir import Op, Schedule, ScheduleError

MAGIC = b"TNTB"
VERSION = 1
_HEADER = struct.Struct("<4sHHHHHHIIB7x")


@dataclass(frozen=True)
class TableLayout:
    nodes: int
    ports: int
    steps: int
    flows: int
    address_bits: int

    @classmethod
    def for_schedule(cls, schedule: Schedule, elements: int) -> "TableLayout":
        return cls(schedule.n, schedule.topology.max_ports(), schedule.steps,
                   schedule.num_chunks, bits_for(elements))

    @property
    def fields(self) -> list[tuple[str, int]]:
        return [("op", OP_BITS), ("flow", bits_for(self.flows - 1)),
                ("step", bits_for(self.steps)), ("parent", bits_for(self.nodes)), ("children", self.nodes),
                ("parent_port", bits_for(self.ports)), ("child_ports", self.ports),
                ("start", self.address_bits), ("size", self.address_bits)]

    @property
    def row_bits(self) -> int:
        return sum(w for _, w in self.fields)

    @property
    def row_bytes(self) -> int:
        return (self.row_bits + 7) // 8

    @property
    def node_nil(self) -> int:
        return (1 << bits_for(self.nodes)) - 1

    @property
    def port_nil(self) -> int:
        return (1 << bits_for(self.ports)) - 1


@dataclass(frozen=True)
class Entry:
    op: Op
    flow: int
    step: int
    parent: int | None = None
    children: frozenset = field(default_factory=frozenset)
    parent_port: int | None = None
    child_ports: frozenset = field(default_factory=frozenset)
    start: int = 0
    size: int = 0

    def sort_key(self):
        return (self.step, int(self.op), self.flow)


def _first_hop_port(schedule: Schedule, node: int, peer: int, route) -> int:
    if route is None:
        # a neighbour's deterministic shortest path is the direct link (one hop)
        port = schedule.topology.port_to(node, peer)
        if port is not None:
            return port
    path = route if route is not None else schedule.topology.route(node, peer)
    if path[0] != node:           # a route stored in the peer → node direction
        path = path[::-1]
    return schedule.topology.port_to(node, path[1])


class _NodeTransfers:
    """What one node sends and receives, per chunk (the input of its table)."""
    __slots__ = ("red_in", "red_out", "gat_in", "gat_out")

    def __init__(self):
        self.red_in = defaultdict(list)          # chunk -> [(step, src, route)]
        self.red_out = {}                        # chunk -> (step, dst, route)
        self.gat_in = {}                         # chunk -> (step, src, route)
        self.gat_out = defaultdict(lambda: defaultdict(list))   # chunk -> step -> [(dst, route)]


def _collect(schedule: Schedule, nodes) -> dict:
    """One pass over the transfers: node -> :class:`_NodeTransfers` for ``nodes``."""
    per = {u: _NodeTransfers() for u in nodes}
    for t in schedule.transfers:
        src, dst = per.get(t.src), per.get(t.dst)
        for c in t.chunks:
            if t.op == Op.REDUCE:
                if dst is not None:
                    dst.red_in[c].append((t.step, t.src, t.route))
                if src is not None:
                    src.red_out[c] = (t.step, t.dst, t.route)
            else:
                if dst is not None:
                    dst.gat_in[c] = (t.step, t.src, t.route)
                if src is not None:
                    src.gat_out[c][t.step].append((t.dst, t.route))
    return per


def node_entries(schedule: Schedule, node: int, elements: int = 0) -> list[Entry]:
    """The schedule table of one node (see module docstring)."""
    if not 0 <= node < schedule.n:
        raise ScheduleError(f"node {node} outside 0..{schedule.n - 1}")
    return _entries(schedule, node, schedule.chunk_bounds(elements),
                    _collect(schedule, [node])[node])


def all_node_entries(schedule: Schedule, elements: int = 0) -> list[list[Entry]]:
    """Every node's table (:func:`node_entries` for each node, one pass over the
    transfers instead of one per node)."""
    bounds = schedule.chunk_bounds(elements)
    per = _collect(schedule, range(schedule.n))
    return [_entries(schedule, u, bounds, per[u]) for u in range(schedule.n)]


def _entries(schedule: Schedule, node: int, bounds, io: _NodeTransfers) -> list[Entry]:
    red_in, red_out, gat_in, gat_out = io.red_in, io.red_out, io.gat_in, io.gat_out
    entries = []
    for c in range(schedule.num_chunks):
        rng = dict(start=int(bounds[c]), size=int(bounds[c + 1] - bounds[c]))
        ins = red_in.get(c, [])
        if c in red_out:
            step, dst, route = red_out[c]
            kids = [(s, src, r) for s, src, r in ins if s < step]
            entries.append(Entry(Op.REDUCE, c, step, dst, frozenset(k for _, k, _ in kids),
                                 _first_hop_port(schedule, node, dst, route),
                                 frozenset(_first_hop_port(schedule, node, k, r) for _, k, r in kids),
                                 **rng))
        elif ins:
            entries.append(Entry(Op.REDUCE, c, max(s for s, _, _ in ins), None,
                                 frozenset(k for _, k, _ in ins), None,
                                 frozenset(_first_hop_port(schedule, node, k, r) for _, k, r in ins),
                                 **rng))
        parent = gat_in.get(c)
        pnode = parent[1] if parent else None
        pport = _first_hop_port(schedule, node, parent[1], parent[2]) if parent else None
        for step, dsts in sorted(gat_out.get(c, {}).items()):
            entries.append(Entry(Op.GATHER, c, step, pnode, frozenset(d for d, _ in dsts), pport,
                                 frozenset(_first_hop_port(schedule, node, d, r) for d, r in dsts),
                                 **rng))
        if parent and c not in gat_out:
            entries.append(Entry(Op.GATHER, c, parent[0], pnode, frozenset(), pport, frozenset(),
                                 **rng))
    busy = {e.step for e in entries}
    entries += [Entry(Op.NOP, 0, s) for s in range(1, schedule.steps + 1) if s not in busy]
    return sorted(entries, key=Entry.sort_key)


def order_entries(schedule: Schedule, node: int) -> list[tuple[int, int, int]]:
    """The ORDER table of one node: ``(flow, rx_port, step)`` for every REDUCE contribution
    it receives on a physical port -- the step at which the sender's partial for that flow
    arrives there (the NIC's receive order gate waits only for contributions that precede
    in ``(step, rx_port)`` order).  Contributions from non-neighbours arrive on virtual ports
    (:meth:`Schedule.rx_port`), which the NIC does not have: they are left out."""
    if not 0 <= node < schedule.n:
        raise ScheduleError(f"node {node} outside 0..{schedule.n - 1}")
    ports = schedule.topology.max_ports()
    out = []
    for t in schedule.transfers:
        if t.op != Op.REDUCE or t.dst != node:
            continue
        q = schedule.rx_port(t)
        if q < ports:
            out += [(c, q, t.step) for c in t.chunks]
    return sorted(out)


# ---- binary form ----------------------------------------------------------------------

def encode_entry(e: Entry, layout: TableLayout) -> int:
    vals = {
        "op": int(e.op), "flow": e.flow, "step": e.step,
        "parent": layout.node_nil if e.parent is None else e.parent,
        "children": sum(1 << k for k in e.children),
        "parent_port": layout.port_nil if e.parent_port is None else e.parent_port,
        "child_ports": sum(1 << p for p in e.child_ports),
        "start": e.start, "size": e.size,
    }
    word, shift = 0, 0
    for name, width in layout.fields:
        v = vals[name]
        if not 0 <= v < (1 << width):
            raise ScheduleError(f"table field {name}={v} does not fit {width} bits")
        word |= v << shift
        shift += width
    return word


#: op codes a dense schedule table row may carry (``Op.SPARSE`` heads sparse link messages;
#: the sparse engine's rows are :mod:`treenic.schedule.sparse_table`)
DENSE_TABLE_OPS = frozenset((Op.NOP, Op.REDUCE, Op.GATHER))


def decode_entry(word: int, layout: TableLayout) -> Entry:
    vals, shift = {}, 0
    for name, width in layout.fields:
        vals[name] = (word >> shift) & ((1 << width) - 1)
        shift += width
    if vals["op"] not in DENSE_TABLE_OPS:     # Op.SPARSE lives in the sparse program only
        raise ScheduleError(f"table row has unknown op code {vals['op']}")
    return Entry(Op(vals["op"]), vals["flow"], vals["step"],
                 None if vals["parent"] == layout.node_nil else vals["parent"],
                 frozenset(k for k in range(layout.nodes) if vals["children"] >> k & 1),
                 None if vals["parent_port"] == layout.port_nil else vals["parent_port"],
                 frozenset(p for p in range(layout.ports) if vals["child_ports"] >> p & 1),
                 vals["start"], vals["size"])


@dataclass
class TableImage:
    node: int
    layout: TableLayout
    elements: int
    entries: list[Entry]

    def rows(self) -> list[int]:
        return [encode_entry(e, self.layout) for e in self.entries]

    def to_bytes(self) -> bytes:
        L = self.layout
        head = _HEADER.pack(MAGIC, VERSION, self.node, L.nodes, L.ports, L.steps, L.flows,
                            len(self.entries), self.elements, L.address_bits)
        return head + b"".join(r.to_bytes(L.row_bytes, "little") for r in self.rows())

    @classmethod
    def from_bytes(cls, data: bytes) -> "TableImage":
        if len(data) < _HEADER.size:
            raise ScheduleError(f"table image too short ({len(data)} bytes)")
        magic, ver, node, n, p, steps, flows, count, elements, abits = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ScheduleError(f"not a table image (magic {magic!r})")
        if ver != VERSION:
            raise ScheduleError(f"table image version {ver} unsupported (expected {VERSION})")
        layout = TableLayout(n, p, steps, flows, abits)
        body = data[_HEADER.size:]
        if len(body) != count * layout.row_bytes:
            raise ScheduleError(f"table image holds {len(body)} row bytes, header says "
                                f"{count} rows of {layout.row_bytes}")
        rb = layout.row_bytes
        entries = [decode_entry(int.from_bytes(body[i * rb:(i + 1) * rb], "little"), layout)
                   for i in range(count)]
        return cls(node, layout, elements, entries)


def table_image(schedule: Schedule, node: int, elements: int) -> TableImage:
    return TableImage(node, TableLayout.for_schedule(schedule, elements), elements,
                      node_entries(schedule, node, elements))


def format_table(schedule: Schedule, node: int, elements: int = 0) -> str:
    """Readable per-node printout in the style of the paper's Fig. 5."""
    def fmt(v):
        return "nil" if v is None or v == frozenset() else (
            ",".join(map(str, sorted(v))) if isinstance(v, frozenset) else str(v))
    rows = [("Op", "FlowID", "Parent", "Children", "Step", "PPort", "CPorts", "Start", "Size")]
    for e in node_entries(schedule, node, elements):
        if e.op == Op.NOP:
            rows.append(("NOP", "-", "-", "-", str(e.step), "-", "-", "-", "-"))
        else:
            rows.append((e.op.name.capitalize(), str(e.flow), fmt(e.parent), fmt(e.children),
                         str(e.step), fmt(e.parent_port), fmt(e.child_ports), str(e.start),
                         str(e.size)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"Accelerator {node} — {schedule.algorithm} on {schedule.topology.spec}"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
