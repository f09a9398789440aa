"""Selection side of the sparse engine: ``topk_units`` top-k units that select flows ahead
of the row sequencer (:mod:`.sparse_sequencer`), concurrently with each other and with the
sequencer's link traffic.

Why: with one unit selecting each flow when the sequencer reaches its SEND row, a node of
torus:4x4 (16 flows) spends ~6400 of its cycles selecting, one flow after another, while the
links idle. A leaf's selection needs no input at all, and every other selection needs only
the receives of its own flow; so a dispatcher walks the same program ahead of the
sequencer and starts each SEND/ROOT selection on a free unit as soon as the receives of
that flow that precede it in the program are accumulated (RECV_BM counts as a receive,
SEND_BM as a send: its slot then goes through the encoder):

::

    program ──(2nd read port)──► dispatcher: RECV row of flow c  -> seen[c] += 1
                                             SEND/ROOT row of c  -> wait done[c] == seen[c]
                                                                    and a free unit; start it
    sequencer: a RECV row of flow c drained -> done[c] += 1
    unit u: feeder (a lanes port) ─► TopKUnit ─► PairNarrower ─┐
                                                               ├─ arbiter (lowest u first,
    unit u': ...                                         ──────┘   one pair a cycle)
        pair -> flow c's final-pair slot + (index, -value) into the scatter adder (zeroes it)
        end  -> counts[c], selected[c] = 1
    slot / region row (ACC, ZERO, FIXUP, COPY) -> wait until the sequencer has run it
    sequencer: SEND row of c waits selected[c], then streams slot c (head, pairs, tail);
               ROOT row of c waits selected[c] (its slot is the final block).

Numerics are unchanged (bit for bit the golden): a selection of flow c reads part[flow c]
only after every pair the golden adds to it before its selection is in the buffer (the
sequencer's RECV rows drain before ``done`` counts them), and the zeroing adds of flow c
touch only flow c's words, which no receive touches afterwards within the run; additions
to one word keep the golden's order, additions to different words commute. The slot and
region rows (TopkA's ZERO/ACC, the global residual's COPY/FIXUP) read or write words and
slots a selection may touch, so the dispatcher stops at each until the sequencer has run
it, and the sequencer starts one only with no selection in flight and the adder empty.

Dispatch is in program order (a unit is never given a later row before an earlier one),
so the sequencer, which waits on the rows in the same order, cannot deadlock on it. The
sequencer's own use of the scatter adder or the final-pair memory (a RECV / GRECV message
body) has priority over the units' pairs, and one selection's pairs go to the adder back to
back (the adder waits for its pipeline whenever an index is not above the previous one).
"""
from __future__ import annotations

from amaranth import Cat, Mux, Signal
from amaranth.lib import data

from ..ram import lanes_address
from ..sparse.narrow import PairNarrower
from ..sparse.topk import PASSES, Mode, TopKUnit
from .sparse_sequencer import write_count
from treenic.schedule.sparse_table import SparseOp

__all__ = ["build_selection"]

SIGN = 1 << 31


class _Unit:
    """One top-k unit with its feeder, narrower and job registers."""

    def __init__(self, m, c, u):
        e = c.e
        self.topk = TopKUnit(lanes=e.lanes, max_chunk=e.chunk_beats * e.lanes,
                             scan_bins=e.scan_bins)
        self.narrow = PairNarrower(lanes=e.lanes)
        m.submodules[f"topk{u}"], m.submodules[f"narrow{u}"] = self.topk, self.narrow
        m.d.comb += [self.narrow.i.valid.eq(self.topk.o.valid),
                     self.narrow.i.payload.eq(self.topk.o.payload),
                     self.topk.o.ready.eq(self.narrow.i.ready)]
        self.busy = Signal(name=f"unit{u}_busy")
        self.cmd = Signal(name=f"unit{u}_cmd")
        self.chunk = Signal(range(e.chunks), name=f"unit{u}_chunk")
        self.lo, self.n, self.k = (Signal(24, name=f"unit{u}_{f}") for f in ("lo", "n", "k"))
        self.pairs = Signal(range(e.slot + 1), name=f"unit{u}_pairs")
        self.go = Signal(name=f"unit{u}_go")
        tk = self.topk
        m.d.comb += [tk.cmd.valid.eq(self.cmd), tk.cmd.payload.mode.eq(Mode.EXACT),
                     tk.cmd.payload.k.eq(self.k), self.go.eq(self.cmd & tk.cmd.ready)]
        with m.If(self.go):
            m.d.sync += self.cmd.eq(0)
        _feeder(m, c, tk, self.go, self.lo, self.n, u)

    def start(self, m, row):
        m.d.sync += [self.busy.eq(1), self.cmd.eq(1), self.chunk.eq(row.chunk),
                     self.lo.eq(row.lo), self.n.eq(row.n), self.k.eq(row.k), self.pairs.eq(0)]


def _feeder(m, c, tk, go, lo, n, u):
    """Streams part[lo : lo+n] to one top-k unit W words a beat, once per pass (zero pad),
    through a lanes port of the banked buffer whose ``en`` holds the data while the unit
    stalls, and a register slice in front of the unit::

        cycle : t            t+1                       t+2
                address ──►  banks' data, lane mux ──► beat register ──► top-k input

    The slice keeps the block RAMs' slow clock-to-output off the unit's key compares and
    flag counts (the 15th wave's estimated worst path, 10.1 ns: bank data → ``over_hits``);
    it costs one cycle per selection, not one per beat."""
    e = c.e
    W = e.lanes
    active, beat, pas = Signal(), Signal(range(e.chunk_beats + 1)), Signal(range(8))
    size = Signal(24)
    rv, last, mask = Signal(), Signal(), Signal(W)
    beats = Signal(range(e.chunk_beats + 1))
    qv, q_last = Signal(name=f"unit{u}_beat_valid"), Signal(name=f"unit{u}_beat_last")
    q_value = [Signal(32, name=f"unit{u}_beat_value{l}") for l in range(W)]
    take = ~qv | tk.i.ready             # the beat register is free next cycle
    advance = ~rv | take
    m.d.comb += beats.eq((size + W - 1) >> (W.bit_length() - 1))
    first = beat * W
    next_beat, wrap = Signal(name=f"unit{u}_next_beat"), Signal(name=f"unit{u}_wrap")
    words = _lanes_words(m, c, u, go, lo, next_beat, wrap, advance, feeding=active | rv)
    with m.If(take):
        m.d.sync += [qv.eq(rv), q_last.eq(last),
                     *(q.eq(Mux(mask[l], word, 0)) for l, (q, word) in
                       enumerate(zip(q_value, words)))]
    m.d.comb += [tk.i.valid.eq(qv), tk.i.payload.last.eq(q_last),
                 *(tk.i.payload.value[l].eq(q) for l, q in enumerate(q_value))]
    with m.If(advance):
        m.d.sync += [rv.eq(active), last.eq(beat == beats - 1),
                     mask.eq(Cat(*[first + l < size for l in range(W)]))]
        with m.If(active):
            with m.If(beat == beats - 1):
                m.d.comb += wrap.eq(1)
                m.d.sync += [beat.eq(0), pas.eq(pas + 1)]
                with m.If(pas == PASSES[Mode.EXACT] - 1):
                    m.d.sync += active.eq(0)
            with m.Else():
                m.d.comb += next_beat.eq(1)
                m.d.sync += beat.eq(beat + 1)
    with m.If(go):
        m.d.sync += [active.eq(1), beat.eq(0), pas.eq(0), size.eq(n)]


def _lanes_words(m, c, u, go, lo, next_beat, wrap, en, feeding):
    """The W words of the feeder's beat from ``lo`` through a lanes port of the banked
    buffer (one read port per bank), a cycle after ``en``. A selection's words start at
    ``lo``, so each bank's row is its first row (registered at ``go``) plus the beat: a
    register per bank that counts the beats (``next_beat``) and returns to the first row
    at a pass's end (``wrap``). No address adder or compare stands in front of the banks,
    whose address pins are spread over the die (the first row plus the beat was an adder
    there, -1.0 ns routed at 64 KiB, 16th wave).

    Unit 0's port is the sequencer's (``dump_r``; its word is lane 0 of the rows of
    ``dump_addr``), lent to the feeder while it feeds (``feeding``: beats to read or to
    hand over). The sequencer reads the buffer (FIX, COPY, CLEAR, the residual DUMP) only
    while no selection is in flight: REGION_WAIT waits for ``~sel_busy``, and CLEAR and
    DUMP start from IDLE, after every selection of the run was sent. So the two never want
    the port in one cycle, and each bank keeps one read port, one block-RAM copy, fewer."""
    buf, W = c.scatter.buffer, c.e.lanes
    port = c.dump_r if u == 0 else buf.lanes_port()
    row0 = [Signal.like(row, name=f"unit{u}_row0_{b}") for b, row in enumerate(port.rows)]
    bank0 = Signal.like(port.first, name=f"unit{u}_bank0")
    rows = [Signal.like(row, name=f"unit{u}_row{b}") for b, row in enumerate(port.rows)]
    with m.If(go):
        m.d.sync += [*lanes_address(lo, W, row0, bank0), *lanes_address(lo, W, rows, bank0)]
    with m.Elif(wrap):
        m.d.sync += [r.eq(r0) for r, r0 in zip(rows, row0)]
    with m.Elif(next_beat):
        m.d.sync += [r.eq(r + 1) for r in rows]
    if u == 0:
        sb = W.bit_length() - 1
        dump_row, dump_bank = c.dump_addr >> sb, c.dump_addr[:sb]
        m.d.comb += [*(p.eq(Mux(feeding, r, dump_row)) for p, r in zip(port.rows, rows)),
                     port.first.eq(Mux(feeding, bank0, dump_bank)),
                     port.en.eq(~feeding | en)]
    else:
        m.d.comb += [*(p.eq(r) for p, r in zip(port.rows, rows)), port.first.eq(bank0),
                     port.en.eq(en)]
    return port.data


def build_selection(m, c):
    """The units, the dispatcher and the pair arbiter. Uses from ``c``: ``e``, ``scatter``,
    ``prog_r2`` (the dispatcher's program read port), ``counts``, ``fin_w``, ``sc_*``,
    ``sel_start`` (the run begins), ``recv_done`` (the sequencer drained a RECV row of
    ``row.chunk``), ``seq_pc`` (the sequencer's row), ``main_uses`` (the sequencer is in a message body and may drive the
    adder / final memory), ``selected`` (set here: flow c's selection is in its slot), ``sel_busy`` (set here: a unit
    holds a selection)."""
    e = c.e
    units = [_Unit(m, c, u) for u in range(e.topk_units)]
    _dispatcher(m, c, units)
    _arbiter(m, c, units)


def _dispatcher(m, c, units):
    e = c.e
    pc = Signal(range(e.rows + 1))
    rd = c.prog_r2
    # the row registered (ROW) before it is decoded (LOOK): decoded straight from the block
    # RAM output, with the flow's seen/done mux and compare behind it, it was 11 LUT levels
    # into the enable of pc (an estimated 14.1 ns); a cycle more a row, ahead of the sequencer
    row = Signal.like(rd.data)
    op = Signal(4)                      # the row's op code (op_hi is its bit 3)
    m.d.comb += [rd.addr.eq(pc), op.eq(Cat(row.op, row.op_hi))]
    dispatched = Signal()               # LOOK passes a RECV row of ``row.chunk``
    settled = _settled_flows(m, c, row.chunk, dispatched)
    free = Signal(len(units))
    m.d.comb += [free.eq(Cat(*[~u.busy for u in units])), c.sel_busy.eq(~free.all())]
    with m.FSM(name="dispatch"):
        with m.State("OFF"):
            with m.If(c.sel_start):             # a run starts from row 0
                m.next = "FETCH"
        with m.State("FETCH"):
            m.next = "ROW"
        with m.State("ROW"):
            m.d.sync += row.eq(rd.data)
            m.next = "LOOK"
        with m.State("LOOK"):
            with m.Switch(op):
                with m.Case(SparseOp.RECV, SparseOp.RECV_BM):
                    m.d.comb += dispatched.eq(1)
                    m.d.sync += pc.eq(pc + 1)
                    m.next = "FETCH"
                with m.Case(SparseOp.SEND, SparseOp.SEND_BM, SparseOp.ROOT):
                    with m.If(settled.bit_select(row.chunk, 1) & free.any()):
                        for i, u in enumerate(units):   # the lowest free unit takes it
                            with m.If(free[i] & ((free & ((1 << i) - 1)) == 0)):
                                u.start(m, row)
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "FETCH"
                with m.Case(SparseOp.ACC, SparseOp.ZERO, SparseOp.FIXUP, SparseOp.COPY):
                    with m.If(c.seq_pc > pc):   # a barrier: the sequencer has run it
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "FETCH"
                with m.Case(SparseOp.END):
                    m.next = "OFF"
                with m.Default():
                    m.d.sync += pc.eq(pc + 1)
                    m.next = "FETCH"
    with m.If(c.sel_start):
        m.d.sync += [pc.eq(0), c.selected.eq(0)]


def _settled_flows(m, c, chunk, dispatched):
    """Per flow, whether every RECV row the dispatcher passed (``dispatched`` with its
    ``chunk``) has drained in the sequencer (``recv_done`` with ``row.chunk``): a flow's
    SEND selects its partial only then. Kept as a register beside each flow's count of
    receives owed (modulo its width, as the two counts were: the sequencer may drain a
    RECV row before the dispatcher passes it) and updated with it, so LOOK tests one bit
    where it compared two counts behind a mux over the flows (the unit loads' enables,
    -2.6 ns routed, 13th wave). Returns the flags."""
    e = c.e
    settled = Signal(e.chunks, init=(1 << e.chunks) - 1)
    for f in range(e.chunks):
        owed = Signal(range(e.rows + 1), name=f"owed{f}")
        up = dispatched & (chunk == f)
        down = c.recv_done & (c.row.chunk == f)
        with m.If(c.sel_start):
            m.d.sync += [owed.eq(0), settled[f].eq(1)]
        with m.Elif(up & ~down):
            m.d.sync += [owed.eq(owed + 1), settled[f].eq((owed + 1)[:len(owed)] == 0)]
        with m.Elif(down & ~up):
            m.d.sync += [owed.eq(owed - 1), settled[f].eq((owed - 1)[:len(owed)] == 0)]
    return settled


def _arbiter(m, c, units):
    """One narrowed beat a cycle: a pair goes to its flow's slot and (negated) into the
    scatter adder, a terminator closes the selection. The unit whose pair goes first keeps
    the adder until its terminator (``owner``): the adder waits for its pipeline to empty
    whenever an index is not above the previous one, so interleaving two selections'
    ascending streams would cost that wait on nearly every pair."""
    e = c.e
    T = len(units)
    owner, locked = Signal(range(T)), Signal()
    for i, u in enumerate(units):
        o = u.narrow.o
        first = o.valid & ~locked
        for v in units[:i]:
            first = first & ~v.narrow.o.valid
        with m.If(Mux(locked, owner == i, first)):
            index = (u.lo + o.payload.index)[:32]
            with m.If(o.valid & o.payload.end):
                m.d.comb += o.ready.eq(1)
                write_count(m, c, u.pairs, u.chunk)
                m.d.sync += [u.busy.eq(0), locked.eq(0),
                             c.selected.bit_select(u.chunk, 1).eq(1)]
            with m.Elif(o.valid & ~c.main_uses):
                go = c.sc_ready
                m.d.comb += [o.ready.eq(go), c.sc_valid.eq(1), c.sc_index.eq(index),
                             c.sc_value.eq(o.payload.value ^ SIGN),
                             c.fin_w.addr.eq(u.chunk * e.slot + u.pairs),
                             c.fin_w.data.eq(Cat(index, o.payload.value)), c.fin_w.en.eq(go)]
                with m.If(go):
                    m.d.sync += [u.pairs.eq(u.pairs + 1), owner.eq(i), locked.eq(1)]
