"""Elaboration of :class:`~treenic.hdl.nic.sparse_engine.SparseEngine` (split from the
component so that every function stays short): memories, the link ports, the row sequencer
and the selection side (:mod:`.sparse_select`: top-k units, their feeders, the dispatcher)."""
from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, memory

from ..link.flit import FlitType, Op
from ..sparse.scatter import ScatterAccumulate
from .sparse_engine import ROW, HostKind
from .sparse_place_rows import build_placer, count_drops
from .sparse_select import build_selection
from treenic.schedule.sparse_table import SparseOp

SIGN = 1 << 31


class _Ctx:
    """Signals shared by the builders below."""


def build_engine(e) -> Module:
    m = Module()
    c = _Ctx()
    c.e = e
    # the hash placer's sweep writes distinct positions out of order (see sparse_place_rows)
    m.submodules.scatter = c.scatter = ScatterAccumulate(depth=e.depth,
                                                         distinct_port=bool(e.hash_elements),
                                                         old_port=True)
    m.submodules.program = prog = memory.Memory(shape=ROW, depth=e.rows, init=[])
    c.prog_w, c.prog_r, c.prog_r2 = prog.write_port(), prog.read_port(), prog.read_port()
    m.submodules.finals = fin = memory.Memory(shape=64, depth=e.chunks * e.slot, init=[])
    c.fin_w, c.fin_r = fin.write_port(), fin.read_port()
    c.counts = Array(Signal(range(e.slot + 1), name=f"count{i}") for i in range(e.chunks))
    c.dump_r = c.scatter.buffer.read_port()
    c.row = Signal(ROW)
    c.pending = Signal(16)
    c.sc_valid, c.sc_index, c.sc_value = Signal(), Signal(32), Signal(32)
    c.sc_set = Signal()           # write the value instead of adding it (ZERO/FIXUP/COPY)
    c.sc_log = Signal()           # a received pair: log the word it replaces (undo log)
    c.op = Signal(4)              # the row's op code (op_hi is its bit 3)
    m.d.comb += c.op.eq(Cat(c.row.op, c.row.op_hi))
    sc = c.scatter
    in_range = (c.sc_index >> (e.depth.bit_length() - 1)) == 0
    m.d.comb += [sc.i.valid.eq(c.sc_valid), sc.i.payload.index.eq(c.sc_index),
                 sc.i.payload.value.eq(c.sc_value), sc.set.eq(c.sc_set),
                 sc.log.eq(c.sc_log), sc.o.ready.eq(1)]
    m.d.sync += c.pending.eq(c.pending + (c.sc_valid & sc.i.ready & in_range) - sc.o.valid)
    c.sel_start, c.recv_done, c.main_uses = Signal(), Signal(), Signal()
    c.selected = Signal(e.chunks)
    c.sel_busy = Signal()         # a top-k unit holds a selection (driven by the selection side)
    if e.codec:
        _codec(m, c)
    c.placer = None
    if e.hash_elements:
        build_placer(m, c)
    _links(m, c)
    _undo_log(m, c)
    _sequencer(m, c)
    build_selection(m, c)       # drives the adder only in cycles the sequencer does not
    count_drops(m, c)
    return m


def _codec(m, c):
    """The message codec of the ``*_BM`` rows: one encoder (SEND_BM, GSEND_BM) and one
    decoder (RECV_BM, GRECV_BM), both over the row's flow (chunk C = ``n``); the decoder is
    reset at every message start, so a malformed message cannot leave it mid-message."""
    from amaranth.hdl import ResetInserter
    from ..sparse.codec import SparseDecoder, SparseEncoder
    C = max(32, c.e.max_flow)
    c.dec_reset = Signal()
    m.submodules.encoder = c.enc = SparseEncoder(max_chunk=C)
    c.dec = SparseDecoder(max_chunk=C)
    m.submodules.decoder = ResetInserter(c.dec_reset)(c.dec)
    m.d.comb += [c.enc.chunk.eq(c.row.n), c.dec.chunk.eq(c.row.n)]


def _undo_log(m, c):
    """The undo log of the message being received (RECV, RECV_BM): (index, old word) of
    every pair it added, written as the adder reads each operand (``scatter.old``). A
    message takes at most ``slot`` pairs (its budget; the sequencer drops pairs beyond it),
    so ``slot`` entries always suffice. The sequencer clears ``log_n`` at every row and,
    when the message turns out malformed, writes the old words back (UNDO)."""
    e, old = c.e, c.scatter.old
    entry = data.StructLayout({"index": e.depth.bit_length() - 1, "value": 32})
    m.submodules.undo_log = log = memory.Memory(shape=entry, depth=e.slot, init=[])
    c.undo_w, c.undo_r = log.write_port(), log.read_port()
    c.log_n = Signal(range(e.slot + 1))
    c.drop = Signal()             # the message is malformed: it must contribute nothing
    m.d.comb += [c.undo_w.addr.eq(c.log_n), c.undo_w.data.index.eq(old.payload.index),
                 c.undo_w.data.value.eq(old.payload.value), c.undo_w.en.eq(old.valid)]
    with m.If(old.valid):
        m.d.sync += c.log_n.eq(c.log_n + 1)


def _links(m, c):
    """Per port: credits for sending (one per flit) and the receive FIFO that returns one."""
    e = c.e
    fmt = e.fmt
    c.tx_req, c.tx_type, c.tx_data = Signal(), Signal(FlitType), Signal(64)
    c.rx_pop = Signal()
    c.rx_flit = Signal(fmt.flit)
    c.rx_valid = Signal()
    port = c.row.port
    credits = [Signal(range(e.rx_depth + 1), init=e.rx_depth, name=f"credit{p}")
               for p in range(e.ports)]
    c.tx_ok = Signal()
    m.d.comb += c.tx_ok.eq(Array(cr != 0 for cr in credits)[port])
    c.tx_fire = c.tx_req & c.tx_ok
    m.d.sync += e.flits.eq(e.flits + c.tx_fire)
    for p in range(e.ports):
        tx, rx = e.tx[p], e.rx[p]
        sending = c.tx_fire & (port == p)
        m.d.comb += [tx.valid.eq(sending), tx.flit.data.eq(c.tx_data),
                     tx.flit.type.eq(c.tx_type), tx.flit.vc.eq(0)]
        m.d.sync += credits[p].eq(credits[p] - sending + tx.credit[0])
        m.submodules[f"rxq{p}"] = q = fifo.SyncFIFOBuffered(width=fmt.flit.size,
                                                          depth=e.rx_depth)
        pop = c.rx_pop & (port == p) & q.r_rdy
        m.d.comb += [q.w_data.eq(rx.flit.as_value()), q.w_en.eq(rx.valid), q.r_en.eq(pop),
                     rx.credit.eq(pop)]
        with m.If(rx.valid & ~q.w_rdy):
            m.d.sync += e.malformed.eq(e.malformed + 1)
        with m.If(port == p):
            m.d.comb += [c.rx_flit.eq(q.r_data), c.rx_valid.eq(q.r_rdy)]


def _head(c):
    fmt = c.e.fmt
    h = Signal(fmt.sub_head)
    return h, [h.flow.eq(c.row.chunk), h.op.eq(Op.SPARSE), h.step.eq(c.row.step),
               h.offset.eq(c.row.lo), h.length.eq(c.row.k)]


def _sequencer(m, c):
    from .sparse_sequencer import sequencer
    sequencer(m, c, _head(c))
