"""Flit format of the treenic NIC link layer (MultiTree paper §IV-B, Fig. 8, Table II).

A physical flit is ``width + 3 + vc_bits`` wires: a ``width``-bit **data** field (the part
that carries payload, 64 bits by default = two binary32 words) plus the **type** (3 bits,
Table II) and **VC** fields.  As in the paper's Fig. 2/Fig. 8 accounting, the type/VC bits
are per-flit link control (sideband); payload efficiency is measured over the data field
(``payload bits / (flits * width)``), see :func:`treenic.hdl.link.model.efficiency_report`
(which also prints the figure with the sideband counted).

Bit layout (LSB first; the integer value of a flit -- as used by the golden model and the
cocotb benches -- is exactly the ``amaranth.lib.data`` value of :attr:`FlitFormat.flit`)::

    flit  [0      : W)        data  (W = width, default 64)
          [W      : W+3)      type  (FlitType, Table II)
          [W+3    : W+3+V)    vc    (V = ceil_log2(vcs), default 1)

    type  normal packet flits        all-reduce sub-packet flits
          0b100 HEAD                 0b000 HEAD      (one per message)
          0b101 BODY                 0b001 BODY
          0b110 TAIL                 0b010 SUB_TAIL  (ends a non-final sub-packet)
          0b111 HEAD_TAIL            0b011 TAIL      (ends the message)

    data of a sub-packet HEAD (Fig. 8d; defaults -> bit positions for width 64)
          next    port_bits   [0:4)    source-routed output port at the sender
          eject   port_bits   [4:8)    ejection port (identifies the child at the receiver)
          flow    flow_bits   [8:14)   tree info: flow / tree id
          op      OP_BITS     [14:16)  Op: 1 = REDUCE, 2 = GATHER
          step    step_bits   [16:24)  schedule step
          offset  offset_bits [24:44)  element offset of the message's first word
          length  length_bits [44:64)  message length in 32-bit words (>= 1)

    data of a normal packet HEAD / HEAD_TAIL (Fig. 8c)
          dest    node_bits   [0:6)    destination node
          src     node_bits   [6:12)   source node
          flow, op, step               as above          [12:18) [18:20) [20:28)
          offset  offset_bits [28:48)  element offset of this packet's first word
          length  plen_bits   [48:55)  words in this packet (0 only for HEAD_TAIL)
          (rest zero)

    data of BODY / SUB_TAIL / TAIL flits: ``width // 32`` binary32 words, word i at bits
          [32*i : 32*i+32), in message order; unused words of the last flit are zero.

Every field width is a parameter of :class:`FlitFormat`; the constructor checks that both
head layouts fit into ``width`` bits.
"""

from __future__ import annotations

import enum as _pyenum

from amaranth.hdl import Shape, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["FlitType", "Op", "OP_BITS", "ErrorCause", "FlitFormat", "LinkSignature",
           "N_CAUSES", "WORD_BITS"]

WORD_BITS = 32


class FlitType(enum.Enum, shape=3):
    """Table II codes.  Bit 2 set: normal packet flit; clear: all-reduce sub-packet flit."""
    SUB_HEAD = 0b000
    SUB_BODY = 0b001
    SUB_TAIL = 0b010     # "sub-tail": ends a non-final sub-packet
    MSG_TAIL = 0b011     # "tail": ends the all-reduce message
    HEAD = 0b100
    BODY = 0b101
    TAIL = 0b110
    HEAD_TAIL = 0b111


class Op(enum.IntEnum, shape=2):
    """The one operation code of treenic, defined here and nowhere else.

    The Schedule IR (``treenic.schedule.ir``), the schedule table rows
    (``treenic.schedule.table``), the configuration image, the host loader, the head flits
    and the NIC's table row (:attr:`treenic.hdl.nic.params.NicParams.row`) all use this
    enum; every op field is ``shape=Op``, so its width is :data:`OP_BITS` everywhere.  An
    ``IntEnum`` so that software sorts and serializes it as a number and gateware compares
    plain values with it.  Further operations take the next codes, widening ``shape`` --
    and with it every op field at once.  ``SPARSE`` (code 3) heads a pair message of the sparse engine
    (:mod:`treenic.hdl.nic.sparse_engine`); the dense NIC still rejects it in a table row
    and on its links (the sparse program has its own row format, versioned separately).
    """
    NOP = 0          # a table row that only holds the lockstep; never valid on the link
    REDUCE = 1       # receiver adds the carried partial sums into its chunk
    GATHER = 2       # receiver overwrites its chunk with the carried final values
    SPARSE = 3       # a sparse message: (index u32, value f32) pair flits (docs/sparse-nic.md)


#: width of every op field (flit heads, schedule table rows, the NIC's native row)
OP_BITS = Shape.cast(Op).width


class ErrorCause(_pyenum.IntEnum):
    """Receive-side error causes (index into the depacketiser's counters)."""
    NONE = 0
    ORPHAN = 1       # body / sub-tail / tail with no message open on its VC
    SEQ = 2          # wrong flit type for the position (missing sub-tail/tail, early tail, ...)
    FLOW = 3         # head flit names a flow that is not enabled
    OP = 4           # head flit op is not REDUCE/GATHER
    LENGTH = 5       # head length invalid (0 for a message; 0 / > max for a packet)
    OVERFLOW = 6     # flit arrived on a VC with a full buffer (sender ignored credits)


N_CAUSES = len(ErrorCause)


class FlitFormat:
    """All widths of the link layer.

    Args:
        width: data bits per flit (multiple of 32).
        vcs: number of virtual channels.
        ports: ports per node (route info next/eject).
        nodes: nodes (normal-packet dest/src).
        flows: flow (tree) ids.
        steps: schedule steps.
        offset_bits, length_bits: element offset / message length (words) fields.
        max_packet_words: largest normal-packet payload (words), 64 = 256 B.
    """

    def __init__(self, *, width=64, vcs=2, ports=16, nodes=64, flows=64, steps=256,
                 offset_bits=20, length_bits=20, max_packet_words=64):
        if width % WORD_BITS or width <= 0:
            raise ValueError(f"flit width {width} must be a positive multiple of 32")
        if vcs < 1:
            raise ValueError("need at least one VC")
        self.width = width
        self.lanes = width // WORD_BITS
        self.vcs = vcs
        self.vc_bits = max(1, ceil_log2(vcs))
        self.ports, self.nodes, self.flows, self.steps = ports, nodes, flows, steps
        self.port_bits = max(1, ceil_log2(ports))
        self.node_bits = max(1, ceil_log2(nodes))
        self.flow_bits = max(1, ceil_log2(flows))
        self.step_bits = max(1, ceil_log2(steps))
        self.offset_bits = offset_bits
        self.length_bits = length_bits
        if max_packet_words % self.lanes:
            raise ValueError("max_packet_words must be a multiple of the words per flit")
        self.max_packet_words = max_packet_words
        self.plen_bits = max_packet_words.bit_length()

        self.sub_head = data.StructLayout({
            "next": self.port_bits, "eject": self.port_bits, "flow": self.flow_bits,
            "op": Op, "step": self.step_bits, "offset": offset_bits,
            "length": length_bits})
        self.pkt_head = data.StructLayout({
            "dest": self.node_bits, "src": self.node_bits, "flow": self.flow_bits,
            "op": Op, "step": self.step_bits, "offset": offset_bits,
            "length": self.plen_bits})
        for name, lay in (("sub-packet", self.sub_head), ("packet", self.pkt_head)):
            if lay.size > width:
                raise ValueError(f"{name} head info needs {lay.size} bits > flit width {width}")
        self.flit = data.StructLayout({"data": width, "type": FlitType, "vc": self.vc_bits})
        self.words = data.ArrayLayout(unsigned(WORD_BITS), self.lanes)
        # message / fragment header: packetiser input, depacketiser output
        self.header = data.StructLayout({
            "vc": self.vc_bits,
            "packet": 1,     # out: fragment came from normal packets (packet mode)
            "last": 1,       # out: fragment ends its message
            "next": self.port_bits, "eject": self.port_bits,
            "dest": self.node_bits, "src": self.node_bits,
            "flow": self.flow_bits, "op": Op, "step": self.step_bits,
            "offset": offset_bits, "length": length_bits})
        self.in_beat = self.words
        self.out_beat = data.StructLayout({"data": self.words, "last": 1})

    @property
    def flit_bits(self):
        return self.flit.size

    def __repr__(self):
        return (f"FlitFormat(width={self.width}, vcs={self.vcs}, ports={self.ports}, "
                f"nodes={self.nodes}, flows={self.flows}, steps={self.steps}, "
                f"offset_bits={self.offset_bits}, length_bits={self.length_bits}, "
                f"max_packet_words={self.max_packet_words})")

    def __eq__(self, other):
        return isinstance(other, FlitFormat) and repr(self) == repr(other)

    def __hash__(self):
        return hash(repr(self))

    # integer helpers (golden model and benches) -------------------------------------
    def _pack(self, layout, fields):
        v = 0
        for name, f in layout:
            x = int(fields.get(name, 0))
            if x < 0 or x >= (1 << f.width):
                raise ValueError(f"field {name}={x} does not fit {f.width} bits")
            v |= x << f.offset
        return v

    def _unpack(self, layout, v):
        return {name: (v >> f.offset) & ((1 << f.width) - 1) for name, f in layout}

    def make_flit(self, ftype, vc, data_bits):
        ftype = int(FlitType(ftype).value)
        if not 0 <= vc < self.vcs:
            raise ValueError(f"vc {vc} out of range")
        if not 0 <= data_bits < (1 << self.width):
            raise ValueError("flit data does not fit the flit width")
        return data_bits | (ftype << self.width) | (vc << (self.width + 3))

    def split_flit(self, f):
        w = self.width
        return (FlitType((f >> w) & 7), (f >> (w + 3)) & ((1 << self.vc_bits) - 1),
                f & ((1 << w) - 1))

    def pack_sub_head(self, **fields):
        return self._pack(self.sub_head, fields)

    def pack_pkt_head(self, **fields):
        return self._pack(self.pkt_head, fields)

    def unpack_sub_head(self, v):
        return self._unpack(self.sub_head, v)

    def unpack_pkt_head(self, v):
        return self._unpack(self.pkt_head, v)

    def pack_words(self, words):
        v = 0
        for i, w in enumerate(words):
            v |= (int(w) & 0xFFFF_FFFF) << (WORD_BITS * i)
        return v

    def unpack_words(self, v, n=None):
        n = self.lanes if n is None else n
        return [(v >> (WORD_BITS * i)) & 0xFFFF_FFFF for i in range(n)]

    def pack_header(self, **fields):
        return self._pack(self.header, fields)

    def unpack_header(self, v):
        return self._unpack(self.header, v)


class LinkSignature(wiring.Signature):
    """One direction of a NIC link, seen from the sender (``Out``) side.

    * ``valid``/``flit``: a flit is transferred in every cycle ``valid`` is high (there is
      no ``ready``: the sender may only send with a credit for the flit's VC);
    * ``credit``: one bit per VC, flowing back; each cycle bit ``v`` is high returns one
      buffer slot of VC ``v`` to the sender.

    A packetiser has ``tx: Out(LinkSignature(fmt))``, a depacketiser ``rx: In(...)``; they
    (and :class:`~treenic.hdl.link.link.LinkChannel` in between) connect with
    ``wiring.connect``.
    """

    def __init__(self, fmt: FlitFormat):
        self.fmt = fmt
        super().__init__({"valid": Out(1), "flit": Out(fmt.flit), "credit": In(fmt.vcs)})

    def __eq__(self, other):
        return isinstance(other, LinkSignature) and self.fmt == other.fmt

    def __hash__(self):
        return hash(self.fmt)

    def __repr__(self):
        return f"LinkSignature({self.fmt!r})"
