"""The NIC's sparse engine: MultiTree-Sparse (``treenic.sparse.multitree_sparse``, local and
global residual) and TopkA (``treenic.sparse.topk_family.TopkA``) in RTL.

An engine beside the dense TX/RX datapath with ``topk_units`` top-k units. The row
sequencer runs the node's sparse program (:mod:`treenic.schedule.sparse_table`) row by row;
a dispatcher (:mod:`.sparse_select`) walks the same program ahead of it and starts every
SEND/ROOT selection on a free unit as soon as that flow's receives are in:

::

    host_i ──GRAD──► skid ─► ScatterAccumulate (part: the partial / residual buffer, FP32Adder)
                      ▲  ▲  ▲                   │ a lanes port per unit (W banks)
          RECV pairs ─┘  │  └── selections: (index, -value) zeroes what was selected
                         │                      ▼
    rx[p] ─► flit FIFO ─► skid      feeder ─► TopKUnit(W) ─► PairNarrower ─┐ (x topk_units)
                                                    arbiter ◄──────────────┘
    final-pair memory (chunk slots) ◄── selections, GRECV ;  SEND, GSEND ──► tx[p]
    final slot ──ACC / ZERO / FIXUP──► ScatterAccumulate ;  COPY: part region ──► part region

Every source of the scatter unit goes through one skid buffer (a register slice that cuts
ready too), and each RX queue's head flit through another: pipeline registers that keep the
sources' mux and the queues' block RAM outputs apart from the unit's address and hazard logic
(docs/sparse-nic.md, "Eleventh wave").

The slot and region rows (ACC, ZERO, FIXUP, COPY; ``treenic.schedule.sparse_table``) use the
scatter unit's set mode (write instead of add) for ZERO, FIXUP and COPY: TopkA sums the P
gathered selections into ``part[N:2N]`` in rank order, the global residual snapshots and
restores the accumulator through ``part[N:2N]``. They are barriers for the selection side:
the dispatcher does not pass one before the sequencer has run it, and the sequencer starts
one only when no unit holds a selection and the adder is empty.

Numeric contract (bit for bit the golden): the residual lives in ``part`` between runs; the
host's gradient g is added to it (``part + g``, IEEE addition is commutative); every
addition goes through the one scatter adder (buffer value first, then the contribution,
messages in the program's order = the IR's (step, rx_port) order); a sent or final pair is
removed by adding its negation (``x + (-x) = +0`` exactly, what the golden's ``= 0`` gives).

Link format (per message, one 64-bit flit each, paper Table II types): ``SUB_HEAD`` (the
dense sub-packet head layout with ``op = Op.SPARSE``, flow, step, length = budget), one
``SUB_BODY`` flit per pair (index u32 low, value f32 high), ``MSG_TAIL`` carrying the pair
count. A head naming the wrong flow/step/op, a pair outside the flow, over the budget or not
ascending, a count mismatch or an unexpected flit type is counted in ``malformed``, and the
message is dropped whole: its pairs are added as they arrive (cut-through), each logging
the word it replaces (the scatter unit's ``old`` output) in an undo log of ``slot``
entries, and once the row's adds have drained a malformed message's old words are written
back (set mode) before the next row -- ``part`` as if the message had never been sent; a
malformed GRECV leaves its final slot empty. A good message pays no cycle for it
(:func:`.sparse_sequencer._drained` has the cycle diagram); golden:
``treenic.sparse.base.receive_message``. With ``codec``, the
``*_BM`` rows send codec messages instead (:mod:`.sparse_codec_rows`: pairs or bitmap +
values, two 32-bit words a flit).

Flow control: credits (one per flit, VC 0); each receive FIFO holds ``rx_depth`` flits, which
the compiler sizes to every flit a port receives in a run, so a send never waits on a
receiver that is itself sending (no deadlock by construction).
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..link.flit import FlitFormat, FlitType, LinkSignature, Op
from ..sparse.narrow import PairNarrower
from ..sparse.scatter import ScatterAccumulate
from ..sparse.topk import PASSES, Mode, TopKUnit

__all__ = ["SparseEngine", "HostKind", "HOST_IN", "HOST_OUT"]

ROW = data.StructLayout({"op": 3, "step": 8, "chunk": 8, "port": 4, "lo": 24, "n": 24,
                         "k": 24, "op_hi": 1})


class HostKind:
    GRAD = 0     # addr = index, data[0:32] = gradient bits: part[index] += g (idle only)
    PROG = 1     # addr = row, data = row (sparse_table layout)
    START = 2    # run the program
    DUMP = 3     # data = elements: stream part[0:elements], every final pair, an end word
    CLEAR = 4    # data = elements: part[0:elements] = +0 (adds each word's negation: exact)
    HASH = 5     # hash-flow engines: addr = the accumulator base, data[0:32] = hash seed; the
    #              GRAD words that follow are an element-order sweep the placer places


HOST_IN = data.StructLayout({"kind": 3, "addr": 24, "data": 96})
HOST_OUT = data.StructLayout({"index": 32, "value": 32, "final": 1, "end": 1})


class SparseEngine(wiring.Component):
    """One node's sparse engine.

    Parameters
    ----------
    ports : int
        Link ports.
    depth : int
        Buffer words (power of two) -- the node's elements fit.
    lanes : int
        W, top-k lanes (a power of two in 2..32); the buffer is in W banks, which a
        feeder reads through one lanes port (:class:`~treenic.hdl.ram.LaneBankedRam`).
    scan_bins : int
        Top-k histogram bins scanned a cycle (:class:`~treenic.hdl.sparse.topk.TopKUnit`).
    topk_units : int
        Top-k units (1..8) selecting independent flows concurrently, ahead of the row
        sequencer (:mod:`.sparse_select`); each has its own feeder and lanes port.
    max_flow : int
        Largest flow (top-k chunk), elements.
    chunks : int
        Flows (final-pair slots).
    slot : int
        Final-pair slot size (>= the largest budget), power of two.
    rows : int
        Program rows.
    rx_depth : int
        Receive FIFO flits per port (>= what a port receives in one run).
    fmt : FlitFormat
        Link format (64-bit data).
    codec : bool
        Build the message codec (``treenic.hdl.sparse.codec`` encoder and decoder) for the
        ``*_BM`` rows: messages as a header word and pairs or the flow's bitmap + values,
        whichever is smaller, two 32-bit words a flit. Without it those rows are counted
        in ``malformed`` and skipped.
    hash_elements : int
        0: no hash placer (contiguous flows; the netlist of an engine without it). Else the
        elements of a hash-flow program (Zen's h0): the engine holds a
        :class:`~.sparse_place.HashPlacer` over ``chunks`` flows, so after a ``HASH`` host
        word the host sends the gradients in element order and the DUMP labels every word
        with its element index (see :mod:`.sparse_place` and the host words below).

    Members
    -------
    host_i : In(stream.Signature(HOST_IN))
    host_o : Out(stream.Signature(HOST_OUT))
    tx, rx : link ports (``Out``/``In`` ``LinkSignature(fmt)`` arrays)
    start : In(1)
        Same as a host START (a fabric-wide start).
    flits : Out(32)
        Flits sent on all links since reset (64 data bits each).
    busy : Out(1)
        The program runs.
    finals : Out(range(chunks * slot + 1))
        Final pairs held (what a DUMP streams after the residual), two cycles behind the
        per-chunk counts.
    cycles : Out(32)
        Cycles of the last run (START to END).
    malformed : Out(16)
        Malformed sparse messages / pairs counted (sticky over runs; each such message is
        dropped whole: it contributes nothing to ``part`` or a final slot); with the hash placer
        also GRAD words it drops (out of sweep order, past the end, or their flow full).

    Host words (``host_i``, :class:`HostKind`): ``PROG`` rows (a hash-flow engine also
    takes each flow's buffer range from its SEND / ROOT row, and a PROG word turns the
    placer off), ``GRAD`` (``part[addr] += g``; after ``HASH``: ``addr`` = accumulator base +
    element index, in ascending order from 0 after every ``HASH`` or START), ``START``,
    ``DUMP``, ``CLEAR``, ``HASH``. DUMP words (``host_o``): ``index`` is the buffer word
    (residual region) or pair index (final pairs), with the placer on the element index
    ``inv[position]`` instead, in buffer order.
    """

    def __init__(self, *, ports: int, depth: int, lanes: int, max_flow: int, chunks: int,
                 slot: int, rows: int, rx_depth: int, scan_bins: int = 16,
                 topk_units: int = 2, fmt: FlitFormat | None = None, codec: bool = False,
                 hash_elements: int = 0):
        for name, v, lo in (("ports", ports, 1), ("depth", depth, 2), ("max_flow", max_flow, 1),
                            ("chunks", chunks, 1), ("slot", slot, 1), ("rows", rows, 1),
                            ("rx_depth", rx_depth, 2), ("topk_units", topk_units, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if not isinstance(lanes, int) or not 2 <= lanes <= 32 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two in 2..32 (the top-k unit's W), "
                             f"got {lanes!r}")
        if topk_units > 8:
            raise ValueError(f"topk_units must be at most 8, got {topk_units}")
        if not isinstance(hash_elements, int) or not 0 <= hash_elements <= depth:
            raise ValueError(f"hash_elements must be an int in 0..depth ({depth}), "
                             f"got {hash_elements!r}")
        if depth & (depth - 1) or slot & (slot - 1):
            raise ValueError("depth and slot must be powers of two")
        self.fmt = fmt = fmt or FlitFormat()
        if fmt.width != 64:
            raise ValueError("a pair flit needs 64-bit flit data")
        self.ports, self.depth, self.lanes = ports, depth, lanes
        self.chunk_beats = -(-max_flow // lanes)
        self.max_flow, self.chunks, self.slot = max_flow, chunks, slot
        self.rows, self.rx_depth, self.scan_bins = rows, rx_depth, scan_bins
        self.topk_units = topk_units
        self.codec = bool(codec)
        self.hash_elements = hash_elements
        super().__init__({
            "host_i": In(stream.Signature(HOST_IN)), "host_o": Out(stream.Signature(HOST_OUT)),
            "tx": Out(LinkSignature(fmt)).array(ports), "rx": In(LinkSignature(fmt)).array(ports),
            "start": In(1), "busy": Out(1), "flits": Out(32), "cycles": Out(32), "malformed": Out(16),
            "finals": Out(range(chunks * slot + 1))})

    def elaborate(self, platform):
        from .sparse_datapath import build_engine
        return build_engine(self)
