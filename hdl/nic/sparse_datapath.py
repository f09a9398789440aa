"""Elaboration of :class:`~treenic.hdl.nic.sparse_engine.SparseEngine` (split from the
component so that every function stays short): memories, the link ports, the row sequencer
and the selection side (:mod:`.sparse_select`: top-k units, their feeders, the dispatcher)."""
from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring

from ..link.flit import FlitType, Op
from ..ram import BlockRam, BlockRamFIFO, registered_write
from ..skid import SkidBuffer
from ..sparse.scatter import ScatterAccumulate
from .count import step_count
from .sparse_engine import HOST_OUT, ROW, HostKind
from .sparse_place_rows import build_placer, count_drops
from .sparse_select import build_selection
from treenic.schedule.sparse_table import SparseOp

SIGN = 1 << 31
#: what the sources hand the scatter unit (``set``, ``log``, ``distinct``: its side inputs)
SCATTER_IN = data.StructLayout({"index": 32, "value": 32, "set": 1, "log": 1, "distinct": 1})


class _Ctx:
    """Signals shared by the builders below."""


def build_engine(e) -> Module:
    m = Module()
    c = _Ctx()
    c.e = e
    # the hash placer's sweep writes distinct positions out of order (see sparse_place_rows)
    # the buffer in W banks: a feeder reads its W words through one read port per bank,
    # not W copies of the buffer (sparse_select._lanes_words)
    m.submodules.scatter = c.scatter = ScatterAccumulate(depth=e.depth,
                                                         distinct_port=bool(e.hash_elements),
                                                         old_port=True, banks=e.lanes)
    m.submodules.program = prog = BlockRam(shape=ROW, depth=e.rows, init=[])
    c.prog_w, c.prog_r, c.prog_r2 = prog.write_port(), prog.read_port(), prog.read_port()
    m.submodules.finals = fin = BlockRam(shape=64, depth=e.chunks * e.slot, init=[])
    # the write request is registered: its enable sat behind the received-pair checks
    # (-0.92 ns routed, seventeenth wave). No reader reads a slot in the cycle after its
    # last write (a tail, DRAIN and DISPATCH come between a slot's writes and its walk)
    c.fin_w, c.fin_r = registered_write(m, fin.write_port(), name="fin_w"), fin.read_port()
    c.counts = Array(Signal(range(e.slot + 1), name=f"count{i}") for i in range(e.chunks))
    # the sequencer's buffer read port (FIX, COPY, CLEAR, the residual DUMP): its address
    # is ``dump_addr``, its word lane 0; unit 0's feeder borrows it (sparse_select._lanes_words)
    c.dump_r = c.scatter.buffer.lanes_port()
    c.dump_addr = Signal(range(e.depth))
    c.dump_data = c.dump_r.data[0]
    c.row = Signal(ROW)
    c.sc_valid, c.sc_index, c.sc_value = Signal(), Signal(32), Signal(32)
    c.sc_set = Signal()           # write the value instead of adding it (ZERO/FIXUP/COPY)
    c.sc_log = Signal()           # a received pair: log the word it replaces (undo log)
    c.op = Signal(4)              # the row's op code (op_hi is its bit 3)
    m.d.comb += c.op.eq(Cat(c.row.op, c.row.op_hi))
    c.sc_distinct = Signal()      # the hash placer's sweep (see sparse_place_rows.drain)
    _malformed_count(m, c)
    c.sc_ready = _scatter_input(m, c)
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


def _scatter_input(m, c):
    """The scatter unit's input through a skid buffer, and ``adds_idle`` (every pair
    taken is written). The sources' mux (received pairs, the undo log, slot and region
    walks, host words, the selections' zeroing adds) and their ready then
    stand apart from the unit's read address and its boundary compare: the two in one path
    were the engine's deepest logic (an estimated 17.6 ns, tools/netlist_depth.py on nic_core_sparse). Pairs
    keep their order; each takes a cycle more to its write. Returns the input's ready."""
    e, sc = c.e, c.scatter
    m.submodules.scatter_in = skid = SkidBuffer(SCATTER_IN)
    i, o = skid.i.payload, skid.o.payload
    m.d.comb += [skid.i.valid.eq(c.sc_valid), i.index.eq(c.sc_index), i.value.eq(c.sc_value),
                 i.set.eq(c.sc_set), i.log.eq(c.sc_log), i.distinct.eq(c.sc_distinct),
                 sc.i.valid.eq(skid.o.valid), sc.i.payload.index.eq(o.index),
                 sc.i.payload.value.eq(o.value), sc.set.eq(o.set), sc.log.eq(o.log),
                 skid.o.ready.eq(sc.i.ready), sc.o.ready.eq(1)]
    if e.hash_elements:
        m.d.comb += sc.distinct.eq(o.distinct)
    # every add done: no pair in the skid and none in the unit (its own count). A pair
    # into the skid shows as the skid's registered valid a cycle later, so the sources'
    # valid (behind the received-pair checks) reaches no counter: as a 16-bit count of
    # pairs taken it was a routed endpoint at -0.77 ns (16th wave)
    c.adds_idle = Signal()
    m.d.comb += c.adds_idle.eq(~skid.o.valid & sc.idle)
    return skid.i.ready


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
    m.submodules.undo_log = log = BlockRam(shape=entry, depth=e.slot, init=[])
    c.undo_w, c.undo_r = log.write_port(), log.read_port()
    c.log_n = Signal(range(e.slot + 1))
    c.drop = Signal()             # the message is malformed: it must contribute nothing
    m.d.comb += [c.undo_w.addr.eq(c.log_n), c.undo_w.data.index.eq(old.payload.index),
                 c.undo_w.data.value.eq(old.payload.value), c.undo_w.en.eq(old.valid)]
    with m.If(old.valid):
        m.d.sync += c.log_n.eq(c.log_n + 1)


def _malformed_count(m, c):
    """``malformed`` counts the cycles in which any source raises ``c.malformed_event`` (a
    malformed message, pair or row, a receive FIFO overflow, a word the placer drops), a
    cycle later: the receive checks behind the event stay off the counter's carry chain
    (-2.5 ns routed, 14th wave). The host reads it after the run."""
    c.malformed_event = Signal()
    bumped = Signal()
    m.d.sync += bumped.eq(c.malformed_event)
    with m.If(bumped):
        m.d.sync += c.e.malformed.eq(c.e.malformed + 1)


def _links(m, c):
    """Per port: credits for sending (one per flit) and the receive FIFO that returns one."""
    e = c.e
    fmt = e.fmt
    c.tx_req, c.tx_type, c.tx_data = Signal(), Signal(FlitType), Signal(64)
    c.rx_pop = Signal()
    c.rx_flit = Signal(fmt.flit)
    c.rx_valid = Signal()
    c.rx_heads = []               # each port's head flit (registered), for the pair checks
    # row.port one-hot (loaded with the row, see the sequencer's LOAD) and a register per
    # port that says it has a credit: the send decision is then an AND, not a mux over
    # the ports' 11-bit counts behind ``row``, and the ports' valids, credits, the link
    # share and the watchdog stand two LUT levels nearer it (-2.1 ns routed, 13th wave)
    c.port_hot = port_hot = Signal(e.ports)
    credits = [Signal(range(e.rx_depth + 1), init=e.rx_depth, name=f"credit{p}")
               for p in range(e.ports)]
    has_credit = Signal(e.ports, init=(1 << e.ports) - 1)   # rx_depth >= 2
    c.tx_ok = Signal()
    m.d.comb += c.tx_ok.eq((has_credit & port_hot).any())
    c.tx_fire = c.tx_req & c.tx_ok
    # flits sent, counted a cycle later: the send decision stays off its 32-bit carry chain
    fired = Signal()
    m.d.sync += [fired.eq(c.tx_fire), e.flits.eq(e.flits + fired)]
    for p in range(e.ports):
        tx, rx = e.tx[p], e.rx[p]
        sending, returned = c.tx_fire & port_hot[p], tx.credit[0]
        m.d.comb += [tx.valid.eq(sending), tx.flit.data.eq(c.tx_data),
                     tx.flit.type.eq(c.tx_type), tx.flit.vc.eq(0)]
        # count +- 1 from the register, then the mux: the send is a select, not a carry-in
        m.d.sync += [credits[p].eq(step_count(credits[p], returned, sending)),
                     has_credit[p].eq(Mux(sending & ~returned, credits[p] != 1,
                                          returned | (credits[p] != 0)))]
        m.submodules[f"rxq{p}"] = q = BlockRamFIFO(width=fmt.flit.size, depth=e.rx_depth)
        # the head flit from a register, not the FIFO's block RAM output (4.3 ns before
        # the port mux and the pair checks): the queue's skid buffer. A flit leaving the
        # FIFO frees its slot, so the credit returns then; the skid's two flits are extra
        m.submodules[f"rx_head{p}"] = head = SkidBuffer(fmt.flit.size)
        c.rx_heads.append(head.o)
        m.d.comb += [q.w_data.eq(rx.flit.as_value()), q.w_en.eq(rx.valid),
                     head.i.payload.eq(q.r_data), head.i.valid.eq(q.r_rdy),
                     q.r_en.eq(head.i.ready), rx.credit.eq(q.r_rdy & head.i.ready),
                     head.o.ready.eq(c.rx_pop & port_hot[p])]
        with m.If(rx.valid & ~q.w_rdy):
            m.d.comb += c.malformed_event.eq(1)
        with m.If(port_hot[p]):
            m.d.comb += [c.rx_flit.eq(head.o.payload), c.rx_valid.eq(head.o.valid)]


def _head(c):
    fmt = c.e.fmt
    h = Signal(fmt.sub_head)
    return h, [h.flow.eq(c.row.chunk), h.op.eq(Op.SPARSE), h.step.eq(c.row.step),
               h.offset.eq(c.row.lo), h.length.eq(c.row.k)]


def _sequencer(m, c):
    from .sparse_sequencer import sequencer
    # the DUMP words leave through a register slice: the walk's word comes straight from
    # a block RAM (the buffer's lane mux, or the final-pair RAM and its label), and the host
    # FIFO's bypass and ready logic stood behind it (an estimated 9.1 ns, 15th wave);
    # outside ``cycles`` (a DUMP runs after the run)
    m.submodules.host_out = out = SkidBuffer(HOST_OUT)
    c.host_o = out.i
    wiring.connect(m, out.o, wiring.flipped(c.e.host_o))
    sequencer(m, c, _head(c))
