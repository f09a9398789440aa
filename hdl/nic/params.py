"""NIC parameters, native table-row layout and register map (shared by RTL, host helpers,
benches and the golden model).

Register map (host bus, 32-bit words; word address = region << (AW-2) | offset)::

    region 0  registers
      0x00 ID          RO  0x544E4943 ("TNIC")
      0x01 CTRL        WO  bit0 START (scan the table, then run; with SP_MODE SPARSE:
                           queue a sparse run), bit1 CLEAR (errors, counters, run state;
                           table/buffer kept)
      0x02 STATUS      RO  bit0 RUNNING, bit1 DONE, bit2 ERROR (any ERR_FLAGS bit),
                           bit3 SCAN_FAILED (table rejected, nothing ran), [15:8] fsm state
      0x03 NODE        RW  node id (packet-mode src)
      0x04 ENTRIES     RW  table rows in use (<= max_entries, else ERR_TABLE_INDEX)
      0x05 LOCKSTEP    RW  lockstep down-counter load value (cycles) for NOP entries
      0x06 ELEMENTS    RW  float32 elements in the gradient buffer (<= depth)
      0x07 FLOWS       RW  flows (trees) in use: head flits with flow >= FLOWS are rejected
      0x08 ERR_FLAGS   RO  sticky error bits (ErrBit)
      0x09 ERR_COUNT   RO  number of error events (all causes)
      0x0A CYCLES      RO  cycles from START to DONE (running count while RUNNING)
      0x0B TIMESTEP    RO  timestep counter
      0x0C HEAD        RO  head entry index
      0x0D PARAMS      RO  ports | lanes << 4 | log2(depth) << 8 | max_entries << 16
      0x0E WATCHDOG    RW  cycles without progress while RUNNING before ERR WATCHDOG (0 off)
      0x0F WD_INFO     RO  what the watchdog waited for: bit31 fired, [30:28] cause
                           (1 contribution, 2 gather data, 3 credit), [27:24] port,
                           [23:16] flow, [15:0] step (``watchdog.decode_info``)
      0x10+p PEER[p]   RW  node id of the peer on port p (packet-mode dest)
      0x20+8p+k        RO  per-port counters, k: 0 TX_FLITS, 1 TX_HEADS, 2 TX_WORDS
                           (payload words sent), 3 RX_FRAGS (fragments accepted),
                           4 RX_WORDS (payload words written), 5 RX_LINK_ERRS (depacketiser
                           error count, all causes), 6 RX_DROPPED (flits dropped by the
                           depacketiser), 7 RX_BAD (fragments rejected by the NIC checks)
      0xE0 SP_MODE     RW  (sparse builds, ``NicParams.sparse``) bit0 SPARSE: the links
                           belong to the sparse engine, START starts it; a change is
                           refused while either side runs or a link is not drained
                           (ERR HOST_RANGE, SP_STATUS MODE_REFUSED)
      0xE1 SP_STATUS   RO  :class:`SparseStatus` bits, [15:8] HOST_IN FIFO level,
                           [23:16] HOST_OUT FIFO level
      0xE2 SP_CYCLES   RO  the engine's cycles of its last run
      0xE3 SP_FLITS    RO  flits the engine sent since reset
      0xE4 SP_MALFORMED RO malformed sparse messages / pairs the engine dropped
      0xE5 SP_FINALS   RO  final pairs the engine holds
      0xE8+k SP_IN[k]  WO  k < 3: word k (bits 32k..32k+31) of the next HOST_IN word
      0xEB SP_PUSH     WO  its bits 96..127, and push the word into the HOST_IN FIFO
                           (SP_IN cleared); a full FIFO or a START word is refused
      0xEC SP_OUT_POP  RO  take the head of the HOST_OUT FIFO into the out latch; reads
                           bit0 VALID (there was one), bit1 FINAL, bit2 END
      0xED SP_OUT_INDEX RO the out latch's index;  0xEE SP_OUT_VALUE RO  its value
      0xF0+p LINK_CRC[p] RO sub-packets port p's link CRC checker failed (fabrics built
                           with link CRC; else 0)
    region 1  schedule table: row i, word k at i * row_stride + k (write only)
    region 2  gradient buffer: element e (write while not RUNNING, read any time: the
              host is the banked buffer's highest-priority reader)

Every read answers HOST_READ_LATENCY (7) cycles after ``re`` (the host slice, a registered
request, then the buffer's read latency; registers and the step log are delayed to match);
reads may be issued back to back.
    region 3  read: step cycle log, word s = cycles the node spent in timestep s;
              write: ORDER table, word f << ceil(log2 P) | q = the step at which port q's
              REDUCE contribution to flow f arrives (reset to "unknown" by CLEAR).  With it
              the receive order gate waits only for contributions that precede in
              (step, port) order; without it, it bounds unknown steps by what each link
              delivered so far (correct, slower).  A contribution whose step differs from
              the written one is rejected (ERR SEQUENCE).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from amaranth.lib import data
from amaranth.utils import bits_for, ceil_log2

from ..link.flit import FlitFormat, Op
from ..link.model import MESSAGE, PACKET, DEFAULT_SUB_WORDS
from .buffer import ARBITERS

ID_VALUE = 0x544E4943

#: NicParams.forward: store-and-forward at every step (per-flow arrived bits) or
#: cut-through (TX reads paced on the sources' per-fragment write-back progress)
STORE, CUT_THROUGH = "store", "cut-through"
FORWARD_MODES = (STORE, CUT_THROUGH)


class Reg(enum.IntEnum):
    ID = 0x00
    CTRL = 0x01
    STATUS = 0x02
    NODE = 0x03
    ENTRIES = 0x04
    LOCKSTEP = 0x05
    ELEMENTS = 0x06
    FLOWS = 0x07
    ERR_FLAGS = 0x08
    ERR_COUNT = 0x09
    CYCLES = 0x0A
    TIMESTEP = 0x0B
    HEAD = 0x0C
    PARAMS = 0x0D
    WATCHDOG = 0x0E
    WD_INFO = 0x0F
    PEER = 0x10
    PORT = 0x20
    SP_MODE = 0xE0
    SP_STATUS = 0xE1
    SP_CYCLES = 0xE2
    SP_FLITS = 0xE3
    SP_MALFORMED = 0xE4
    SP_FINALS = 0xE5
    SP_IN = 0xE8
    SP_PUSH = 0xEB
    SP_OUT_POP = 0xEC
    SP_OUT_INDEX = 0xED
    SP_OUT_VALUE = 0xEE
    LINK_CRC = 0xF0


#: the sparse engine's readable registers, in the order of ``HostRegs.sparse_regs``
SPARSE_READ_REGS = (Reg.SP_MODE, Reg.SP_STATUS, Reg.SP_CYCLES, Reg.SP_FLITS,
                    Reg.SP_MALFORMED, Reg.SP_FINALS, Reg.SP_OUT_POP, Reg.SP_OUT_INDEX,
                    Reg.SP_OUT_VALUE)
#: SP_IN words before SP_PUSH (the HOST_IN word is 4 x 32 bits wide)
SPARSE_IN_WORDS = 3


class SparseStatus(enum.IntFlag):
    """SP_STATUS bits (sparse builds)."""
    MODE = 1             # the links belong to the sparse engine
    RUNNING = 2          # a sparse START is queued or the engine runs it
    DONE = 4             # the last sparse run finished (cleared by START)
    BUSY = 8             # the engine's own busy
    DRAINED = 16         # every flit this NIC sent or received was taken (credits home)
    MODE_REFUSED = 32    # sticky: an SP_MODE change was refused (CLEAR resets it)
    HOST_REFUSED = 64    # sticky: an SP_PUSH, or a START, was refused (CLEAR resets it)
    OUT_VALID = 128      # the HOST_OUT FIFO holds a word


class SparseOut(enum.IntFlag):
    """SP_OUT_POP bits."""
    VALID = 1
    FINAL = 2
    END = 4


class PortCounter(enum.IntEnum):
    TX_FLITS = 0
    TX_HEADS = 1
    TX_WORDS = 2
    RX_FRAGS = 3
    RX_WORDS = 4
    RX_LINK_ERRS = 5
    RX_DROPPED = 6
    RX_BAD = 7


class ErrBit(enum.IntEnum):
    TABLE_INDEX = 0      # host wrote a table row >= max_entries, or ENTRIES > max_entries
    HOST_RANGE = 1       # host buffer access >= depth / ELEMENTS > depth / FLOWS > max
    BAD_OP = 2           # table row with op code 3
    ENTRY_RANGE = 3      # table row start+size beyond ELEMENTS, or flow >= FLOWS
    FRAG_RANGE = 4       # received fragment outside its flow's chunk
    UNEXPECTED = 5       # contribution/gather from a port the table does not expect
    SEQUENCE = 6         # fragment offset does not continue the open message
    LINK = 7             # depacketiser error (unknown flow/op, seq, length, orphan, overflow)
    BANK_CONFLICT = 8    # two write-backs met in one buffer bank (internal; never expected)
    WATCHDOG = 9         # no progress for WATCHDOG cycles while RUNNING (see WD_INFO)
    LINK_CRC = 10        # a link CRC checker failed a sub-packet (it was not accumulated)


class Ctrl(enum.IntEnum):
    START = 1
    CLEAR = 2


class Status(enum.IntEnum):
    RUNNING = 1
    DONE = 2
    ERROR = 4
    SCAN_FAILED = 8


#: The link format of the sparse engine inside a NIC: the sparse fabric's head layout (the
#: engine reads its SUB_HEAD as a 64-bit head), one VC as on the NIC's links.  Its flit
#: layout (64 data bits, type, vc) is the NIC's, so sparse flits cross the NIC's links bit
#: for bit; only engines read their heads (the links carry one owner's flits at a time).
SPARSE_ENGINE_FMT = FlitFormat(vcs=1)


@dataclass(frozen=True)
class SparseParams:
    """Build of the sparse engine inside a NIC (``NicParams.sparse``): the
    :class:`~treenic.hdl.nic.sparse_engine.SparseEngine` parameters but its ports and
    link format (the NIC's), plus the words that HOST_IN and HOST_OUT each hold between the
    host bus and the engine (``host_fifo``).  :meth:`for_program` sizes it for a compiled
    sparse program."""
    depth: int
    lanes: int
    max_flow: int
    chunks: int
    slot: int
    rows: int
    rx_depth: int
    scan_bins: int = 16
    topk_units: int = 2
    codec: bool = False
    host_fifo: int = 16
    #: any further ``SparseEngine`` parameter ``engine_sizes`` gives, as (name, value)
    #: pairs, passed through unchanged
    engine_extra: tuple = ()

    def __post_init__(self):
        if not isinstance(self.host_fifo, int) or not 2 <= self.host_fifo <= 255:
            raise ValueError(f"host_fifo must be an int in 2..255, got {self.host_fifo!r}")

    @classmethod
    def for_program(cls, program, *, lanes: int = 2, scan_bins: int = 16,
                    topk_units: int = 2, **extra) -> "SparseParams":
        """The engine build the sparse fabric uses for ``program``
        (:func:`~treenic.hdl.nic.sparse_fabric.engine_sizes`)."""
        from dataclasses import fields
        from .sparse_fabric import engine_sizes
        sizes = engine_sizes(program, lanes, scan_bins, topk_units)
        sizes.pop("ports")
        named = {f.name for f in fields(cls)}
        rest = tuple(sorted((k, v) for k, v in sizes.items() if k not in named))
        return cls(**{k: v for k, v in sizes.items() if k in named}, engine_extra=rest,
                   **extra)

    def engine_kwargs(self, ports: int) -> dict:
        """``SparseEngine`` keyword arguments for a NIC of ``ports`` ports (link format
        :data:`SPARSE_ENGINE_FMT`)."""
        from dataclasses import asdict
        kw = asdict(self)
        kw.pop("host_fifo")
        kw.update(kw.pop("engine_extra"))
        return dict(kw, ports=ports, fmt=SPARSE_ENGINE_FMT)


@dataclass(frozen=True)
class NicParams:
    """Build-time parameters of one NIC.

    ports: link ports; width: flit data bits (multiple of 32); depth: buffer elements;
    max_nodes: nodes = flows the table may name; max_entries / max_steps: table rows /
    schedule steps; mode: "message" (MultiTree sub-packets) or "packet"; sub_words:
    sub-packet length; packet_words: packet payload in packet mode; credits: receive
    buffer (flits) per port = sender credits; banks: gradient-buffer banks (power of two,
    default 2·ports·lanes rounded up, capped at depth; see :mod:`.buffer`); forward:
    :data:`STORE` -- a send issues once the data it forwards is written back (per-flow
    arrived bits) -- or :data:`CUT_THROUGH` -- it issues when due and its TX unit reads
    each beat once every source port has written that beat back (:mod:`.tx`); arbiter:
    the gradient buffer's reader priority order (:data:`.buffer.ARBITERS`): "fixed" --
    host, RX ports, TX ports, in index order -- "rotating" or "age" (a reader refused
    in the previous cycle goes before those that were not); see :mod:`.buffer`;
    shared_ports: the TX units share one buffer reader, the RX units another and one
    writer (:mod:`.share`): a crossbar of 3 readers and 2 writers instead of 2·ports + 1
    and ports + 1, for boards whose links carry far less than a flit a cycle; sparse:
    None, or the :class:`SparseParams` of a sparse engine built into the NIC (its links
    shared with the dense datapath under SP_MODE, its host streams on the register bus;
    ``docs/sparse-nic.md``).
    """
    ports: int = 4
    width: int = 64
    depth: int = 1024
    max_nodes: int = 16
    max_entries: int | None = None
    max_steps: int | None = None
    mode: str = MESSAGE
    sub_words: int = DEFAULT_SUB_WORDS
    packet_words: int = 64
    credits: int = 16
    banks: int | None = None
    forward: str = STORE
    arbiter: str = "fixed"
    shared_ports: bool = False
    sparse: SparseParams | None = None

    def __post_init__(self):
        if self.banks is None:
            # the words the ports can stream per cycle (TX reads + RX read-modify-writes);
            # at most depth.  With GATHER beats off the read ports, 16 banks for 4 ports
            # ran torus:4x4 64 KiB in 6743 cycles where 32 banks had taken 6742, and the
            # 64 KiB core with 32 banks does not route on an ECP5-85
            b = 1 << ceil_log2(2 * self.ports * self.lanes)
            while b > 2 and b > self.depth:
                b //= 2
            object.__setattr__(self, "banks", max(b, 2, self.lanes))
        if self.max_entries is None:
            object.__setattr__(self, "max_entries", 8 * self.max_nodes)
        if self.max_steps is None:
            object.__setattr__(self, "max_steps", 4 * self.max_nodes)
        if self.mode not in (MESSAGE, PACKET):
            raise ValueError(f"mode must be {MESSAGE!r} or {PACKET!r}")
        if self.forward not in FORWARD_MODES:
            raise ValueError(f"forward must be one of {FORWARD_MODES}, not {self.forward!r}")
        if self.arbiter not in ARBITERS:
            raise ValueError(f"arbiter must be one of {ARBITERS}, not {self.arbiter!r}")
        if not isinstance(self.shared_ports, bool):
            raise TypeError(f"shared_ports must be a bool, not {self.shared_ports!r}")
        if self.sparse is not None:
            if not isinstance(self.sparse, SparseParams):
                raise TypeError(f"sparse must be SparseParams or None, not "
                                f"{type(self.sparse).__name__}")
            if self.width != 64 or self.fmt.flit.size != SPARSE_ENGINE_FMT.flit.size:
                raise ValueError(f"a sparse engine needs 64-bit flits (pair flits), not "
                                 f"width={self.width}")
            if self.ports > 16:
                raise ValueError(f"a sparse build has at most 16 ports, not {self.ports}")

    @property
    def cut_through(self) -> bool:
        return self.forward == CUT_THROUGH

    @property
    def lanes(self) -> int:
        return self.width // 32

    @property
    def abits(self) -> int:          # element addresses / sizes 0..depth
        return bits_for(self.depth)

    @property
    def fmt(self) -> FlitFormat:
        return FlitFormat(width=self.width, vcs=1, ports=max(2, self.ports),
                          nodes=max(2, self.max_nodes), flows=max(2, self.max_nodes),
                          steps=self.max_steps + 2, offset_bits=self.abits,
                          length_bits=self.abits, max_packet_words=self.packet_words)

    @property
    def flow_bits(self) -> int:
        return max(1, ceil_log2(self.max_nodes))

    @property
    def step_bits(self) -> int:
        return max(1, ceil_log2(self.max_steps + 2))

    @property
    def pport_bits(self) -> int:     # parent port incl. NIL (all ones)
        return bits_for(self.ports)

    @property
    def port_nil(self) -> int:
        return (1 << self.pport_bits) - 1

    @property
    def row(self) -> data.StructLayout:
        return data.StructLayout({
            "op": Op, "flow": self.flow_bits, "step": self.step_bits,
            "pport": self.pport_bits, "cports": self.ports,
            "start": self.abits, "size": self.abits})

    @property
    def row_words(self) -> int:
        return (self.row.size + 31) // 32

    @property
    def row_stride(self) -> int:     # power of two >= row_words
        return 1 << ceil_log2(self.row_words)

    @property
    def region_bits(self) -> int:    # offset bits inside a host-bus region
        return max(ceil_log2(self.depth), ceil_log2(self.max_entries * self.row_stride),
                   ceil_log2(self.max_steps + 2), 8)

    @property
    def addr_bits(self) -> int:
        return self.region_bits + 2

    def reg_addr(self, reg: int) -> int:
        return int(reg)

    def table_addr(self, row: int, word: int = 0) -> int:
        return (1 << self.region_bits) | (row * self.row_stride + word)

    def buf_addr(self, element: int) -> int:
        return (2 << self.region_bits) | element

    def steplog_addr(self, step: int) -> int:
        return (3 << self.region_bits) | step

    def order_addr(self, flow: int, port: int) -> int:
        return (3 << self.region_bits) | (flow << max(1, ceil_log2(self.ports))) | port

    def port_counter_addr(self, port: int, k: int) -> int:
        return int(Reg.PORT) + 8 * port + int(k)

    def encode_row(self, op: int, flow: int, step: int, pport: int | None, cports,
                   start: int, size: int) -> int:
        vals = {"op": op, "flow": flow, "step": step,
                "pport": self.port_nil if pport is None else pport,
                "cports": sum(1 << p for p in cports), "start": start, "size": size}
        word = 0
        for name, f in self.row:
            v = int(vals[name])
            if not 0 <= v < (1 << f.width):
                raise ValueError(f"row field {name}={v} does not fit {f.width} bits")
            word |= v << f.offset
        return word
