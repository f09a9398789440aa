"""The row sequencer of the sparse engine (see :mod:`.sparse_engine` for the contract)."""
from __future__ import annotations

from amaranth import Cat, Mux, Signal
from amaranth.lib import data

from ..link.flit import FlitType, Op
from .sparse_engine import HostKind
from .sparse_place_rows import (drain, final_label, idle_words, loads_done, residual_label,
                                restart_sweep)
from treenic.schedule.sparse_table import SparseOp

SIGN = 1 << 31


class WalkIndex:
    """The row walks' word index ``j``, with ``j + 1`` and the walks' exit tests
    (``j == limit``) held in registers beside it.

    A walk reads word ``j + 1`` ahead when its word moves (``fire``). With ``j1 = j + 1`` a
    register, that look-ahead address is a mux behind ``fire``, not an adder whose carry-in
    is ``fire``; with ``at[name]`` registered, no 24-bit compare stands in front of the
    walks' valids, ``tx_req`` and the look-ahead addresses. (The 14th wave's routed
    critical path: ``j`` → compare → state → ``fire`` → adder → the final-pair RAM's
    address, 11.2 ns, 9.8 of it routing.)

    Every write of ``j`` goes through :meth:`step` or :meth:`rewind` (one per cycle: they
    stand in exclusive FSM states). ``limits`` maps a name to the limit's value *as it will
    read next cycle*; ``at[name]`` is then ``j == limit`` exactly. A limit given by its
    present value (it changes only in cycles after which no walk tests it before it is
    tested again) is exact from the cycle after its last change.
    """

    def __init__(self, m, limits):
        self.j, self.j1 = Signal(24, name="j"), Signal(24, name="j1", init=1)
        self._step, self._rewind = Signal(name="j_step"), Signal(name="j_rewind")
        j, j1 = self.j, self.j1
        with m.If(self._rewind):
            m.d.sync += [j.eq(0), j1.eq(1)]
        with m.Elif(self._step):
            m.d.sync += [j.eq(j1), j1.eq(j1 + 1)]
        self.at = {}
        for name, limit in limits.items():
            # the compares from registers, the step / rewind mux last
            self.at[name] = at = Signal(name=f"j_at_{name}", init=1)
            m.d.sync += at.eq(Mux(self._rewind, limit == 0,
                                  Mux(self._step, j1 == limit, j == limit)))

    def step(self, m):
        """``j += 1`` at the clock edge."""
        m.d.comb += self._step.eq(1)

    def rewind(self, m):
        """``j = 0`` at the clock edge."""
        m.d.comb += self._rewind.eq(1)

    def ahead(self, fire):
        """The word to read now for next cycle: ``j + 1`` when ``fire`` moves word ``j``."""
        return Mux(fire, self.j1, self.j)


class ReadPointer:
    """The buffer word the sequencer's walks read (the lanes port it lends unit 0's
    feeder), from registers: ``a``, and ``a1 = a + 1`` for the look-ahead read when the
    word moves. ``addr`` is then a mux behind :meth:`step` in front of the port, where it
    was an adder (``lo + j``) and the walks' mux: that port's address fans out to every
    block RAM of the buffer (32 at 64 KiB), and its pins were the routed critical path
    (-1.16 ns, 16th wave; ``row.lo`` -> carry chain -> ``bank0`` ADB10).

    A walk loads its first word's address a cycle before it reads it (:meth:`load`), then
    steps with ``j`` (:meth:`step`); one address with no walk behind it is :meth:`hold`.
    Load and step stand in exclusive FSM states."""

    def __init__(self, m, width):
        self.a, self.a1 = Signal(width, name="rd_a"), Signal(width, name="rd_a1", init=1)
        self._step = Signal(name="rd_step")
        with m.If(self._step):
            m.d.sync += [self.a.eq(self.a1), self.a1.eq(self.a1 + 1)]
        self.addr = Mux(self._step, self.a1, self.a)

    def load(self, m, base):
        """Read ``base``, ``base + 1``, ... from the next cycle on."""
        m.d.sync += [self.a.eq(base), self.a1.eq(base + 1)]

    def hold(self, m, base):
        """Read ``base`` from the next cycle on, no step after it."""
        m.d.sync += self.a.eq(base)

    def step(self, m):
        """The walk's word moves: read the next one now."""
        m.d.comb += self._step.eq(1)


def write_count(m, c, value, chunk=None):
    """``counts[chunk] = value`` (by default the row's flow), and ``row_count`` with it
    when ``chunk`` is the row's.

    ``row_count`` is ``counts[row.chunk]`` in a register, the walks' ``count`` limit: the
    16-way count mux behind ``row.chunk`` stood in front of the exit test ``j_at_count``
    (-1.00 ns routed, 16th wave). It is loaded from the mux where the row's flow changes
    (DISPATCH, DUMP_CHUNK; no walk tests it in the cycle after either) and written through
    by every write of ``counts``, which comes after the load in the same cycle."""
    if chunk is None:
        m.d.sync += [c.counts[c.row.chunk].eq(value), c.row_count.eq(value)]
    else:
        m.d.sync += c.counts[chunk].eq(value)
        with m.If(chunk == c.row.chunk):
            m.d.sync += c.row_count.eq(value)


def sequencer(m, c, head):
    e = c.e
    row, n_pairs = c.row, Signal(range(e.slot + 2))
    seen, bad = Signal(24), Signal()
    pc = Signal(range(e.rows + 1))
    hd, hd_set = head
    m.d.comb += hd_set
    slot_base = row.chunk * e.slot
    m.d.comb += c.prog_r.addr.eq(pc)
    c.seq_pc = pc                   # the dispatcher's barrier at slot and region rows
    h = e.host_i
    chunk = Signal(range(e.chunks + 1))
    dump_n = Signal(24)
    # each limit by its present value (see WalkIndex); the row's count from a register
    c.row_count = Signal.like(c.counts[0], name="row_count")
    j = WalkIndex(m, {"count": c.row_count, "n": row.n, "log": c.log_n, "dump": dump_n})
    # the slot's words: a walk over them (``fin_walk``) reads word j + 1 when word j moves
    # (``fin_fire``) and holds word j when it stays, through the read enable; any other
    # state reads word j. ``fin_fire`` then drives the block RAM's enable and not its
    # address mux, whose select is the state alone: a walk state sets ``fin_walk`` in its
    # exit cycle too (no fire there, so the word is held, unused), and the exit test
    # stays off the 64-bit RAM's address pins (-0.26 ns routed, 19th wave)
    fin_fire, c.fin_walk = Signal(), Signal()
    slot_bits = (e.slot - 1).bit_length()
    c.rd = ReadPointer(m, len(c.dump_addr))
    m.d.comb += [c.fin_r.addr.eq(Cat(Mux(c.fin_walk, j.j1, j.j)[:slot_bits], row.chunk)),
                 c.fin_r.en.eq(~c.fin_walk | fin_fire), c.dump_addr.eq(c.rd.addr)]
    with m.If(e.busy):
        m.d.sync += e.cycles.eq(e.cycles + 1)
    # registered, in two stages (the halves' sums, then theirs): the host reads it after
    # DONE, long after the last count was written (END comes three cycles or more after
    # it), and the adder tree stays off the host register mux (9.65 ns estimated) and
    # short itself (one stage of 16 counts: 7.85 ns estimated, 16th wave)
    half = (e.chunks + 1) // 2
    halves = [Signal.like(e.finals, name=f"finals_half{h}") for h in range(2)]
    m.d.sync += [halves[0].eq(sum(c.counts[i] for i in range(half))),
                 halves[1].eq(sum(c.counts[i] for i in range(half, e.chunks))),
                 e.finals.eq(halves[0] + halves[1])]
    rx = c.rx_flit
    rx_pair_idx, rx_pair_val = rx.data[:32], rx.data[32:]
    c.prev_index = Signal(32)       # the message's last pair taken: indices must ascend
    in_range, ascends = _index_checks(m, c)
    fits = in_range & pair_fits(c, n_pairs, ascends)
    with m.FSM():
        with m.State("IDLE"):
            _idle(m, c, h, pc, j, chunk, dump_n)
        with m.State("WAIT"):
            with m.If(loads_done(c)):
                m.d.sync += e.busy.eq(1)
                m.d.comb += c.sel_start.eq(1)
                restart_sweep(m, c)
                m.next = "FETCH"
            drain(m, c)
        with m.State("FETCH"):
            m.next = "LOAD"
        with m.State("LOAD"):
            j.rewind(m)
            m.d.sync += [row.eq(c.prog_r.data), n_pairs.eq(0), seen.eq(0), bad.eq(0),
                         c.drop.eq(0), c.log_n.eq(0),
                         c.port_hot.eq(Cat(c.prog_r.data.port == p for p in range(e.ports)))]
            m.next = "DISPATCH"
        with m.State("DISPATCH"):
            _dispatch(m, c)
        with m.State("SEL_WAIT"):        # the selection side fills the flow's slot
            with m.If(c.selected.bit_select(row.chunk, 1)):
                with m.If((c.op == SparseOp.SEND) | (c.op == SparseOp.SEND_BM)):
                    m.next = "HEAD"
                with m.Else():
                    m.next = "NEXT"
        with m.State("HEAD"):
            m.d.comb += [c.tx_req.eq(1), c.tx_type.eq(FlitType.SUB_HEAD),
                         c.tx_data.eq(hd.as_value())]
            with m.If(c.tx_fire):
                m.next = "HEAD_DONE"
        with m.State("HEAD_DONE"):
            m.next = "GS_PAIRS"
            if e.codec:                 # SEND_BM streams its slot through the encoder too
                with m.If((c.op == SparseOp.GSEND_BM) | (c.op == SparseOp.SEND_BM)):
                    m.next = "GS_ENC"
        with m.State("GS_PAIRS"):
            m.d.comb += c.fin_walk.eq(1)
            with m.If(j.at["count"]):
                m.next = "GS_TAIL"
            with m.Else():
                m.d.comb += [c.tx_req.eq(1), c.tx_type.eq(FlitType.SUB_BODY),
                             c.tx_data.eq(c.fin_r.data), fin_fire.eq(c.tx_fire)]
                with m.If(c.tx_fire):
                    j.step(m)
        with m.State("GS_TAIL"):
            m.d.comb += [c.tx_req.eq(1), c.tx_type.eq(FlitType.MSG_TAIL), c.tx_data.eq(j.j)]
            with m.If(c.tx_fire):
                m.next = "NEXT"
        with m.State("RX_HEAD"):
            m.d.comb += c.rx_pop.eq(1)
            with m.If(c.rx_valid):
                ok = _head_ok(c, rx, row)
                with m.If(~ok):
                    m.d.sync += bad.eq(1)
                    malformed(m, c)
                m.next = "RX_BODY"
                if e.codec:
                    with m.If((c.op == SparseOp.RECV_BM) | (c.op == SparseOp.GRECV_BM)):
                        m.next = "RX_DEC_INIT"
        with m.State("RX_BODY"):
            m.d.comb += c.main_uses.eq(1)   # the whole message: its pairs stay back to back
            _rx_body(m, c, rx, rx_pair_idx, rx_pair_val, fits, n_pairs, seen, bad, slot_base)
        with m.State("DRAIN"):
            m.d.comb += c.main_uses.eq(1)   # hold the units' pairs back: the adder empties
            with m.If(c.adds_idle):
                _drained(m, c, j)
        _undo_states(m, c, j)
        with m.State("NEXT"):
            m.d.sync += pc.eq(pc + 1)
            m.next = "FETCH"
        with m.State("CLEAR_WAIT"):
            with m.If(loads_done(c)):
                m.next = "CLEAR_ADDR"
            drain(m, c)
        with m.State("CLEAR_ADDR"):
            m.next = "CLEAR"
        with m.State("CLEAR"):
            _clear(m, c, j, dump_n)
        with m.State("DUMP_WAIT"):
            with m.If(loads_done(c)):
                m.next = "DUMP_ADDR"
            drain(m, c)
        with m.State("DUMP_ADDR"):
            m.next = "DUMP_RES"
        with m.State("DUMP_RES"):
            _dump_residual(m, c, j, chunk, dump_n)
        with m.State("DUMP_CHUNK"):
            with m.If(chunk == e.chunks):
                m.next = "DUMP_END"
            with m.Else():
                j.rewind(m)
                m.d.sync += [row.chunk.eq(chunk), c.row_count.eq(c.counts[chunk])]
                m.next = "DUMP_SLOT_ADDR"
        with m.State("DUMP_END"):
            m.d.comb += [c.host_o.valid.eq(1), c.host_o.payload.end.eq(1)]
            with m.If(c.host_o.ready):
                m.next = "IDLE"
        _region_states(m, c, j, fin_fire, slot_base)
        if e.codec:
            from .sparse_codec_rows import codec_states
            codec_states(m, c, j, fin_fire, n_pairs, seen, bad, slot_base)
        _dump_finals(m, c, j, chunk, fin_fire)


def _dump_finals(m, c, j, chunk, fin_fire):
    """Every final pair of the current slot (``row.chunk``), then the next slot; with the
    hash placer a lookup cycle before each word (its element index from the inverse map)."""
    e, row = c.e, c.row
    fin_word = "DUMP_FIN_INV" if c.placer is not None else "DUMP_FIN"
    with m.State("DUMP_SLOT_ADDR"):
        m.next = fin_word
    if c.placer is not None:
        with m.State("DUMP_FIN_INV"):
            final_label(m, c)
            m.next = "DUMP_FIN"
    with m.State("DUMP_FIN"):
        m.d.comb += c.fin_walk.eq(1)
        with m.If(j.at["count"]):
            m.d.sync += chunk.eq(chunk + 1)
            m.next = "DUMP_CHUNK"
        with m.Else():
            m.d.comb += [c.host_o.valid.eq(1), c.host_o.payload.index.eq(final_label(m, c)),
                         c.host_o.payload.value.eq(c.fin_r.data[32:]),
                         c.host_o.payload.final.eq(1), fin_fire.eq(c.host_o.ready)]
            with m.If(c.host_o.ready):
                j.step(m)
                if c.placer is not None:
                    m.next = "DUMP_FIN_INV"


def pair_fits(c, n_pairs, ascends):
    """A received pair may be taken: below the row's budget (and so within the undo log,
    ``slot`` entries) and above the message's previous pair (``ascends``: its index above
    ``prev_index``, as every sender emits them: the undo log then holds each word once)."""
    return (n_pairs < c.row.k) & (n_pairs < c.e.slot) & ((n_pairs == 0) | ascends)


def _index_checks(m, c):
    """``lo <= index < lo + n`` and ``index > prev_index`` for the received pair, each
    computed on every port's head register and then picked by the one-hot ``row.port``:
    the 32-bit port mux stays off the compares' carry chains, and one bit each crosses it
    (the checks drive the scatter input's enables: -1.7 ns routed, 14th wave).

    The compares are as wide as a buffer address (AB bits), not 32: an index with a bit
    at or above AB is outside every row (rows lie in the buffer), the bound registers
    are cut to AB bits a cycle after LOAD (RX_BODY comes 3 cycles after it), and
    ``prev_index`` is a pair taken in range. Each carry chain is then half as long: they
    ended in the scatter input's ``taken`` and the final-pair RAM's write enable (-0.78 ns
    routed, 16th wave). ``lo + n`` is registered, not a subtraction chained behind the
    received index (the 13th wave's routed critical path ran through both chains)."""
    fmt, row, AB = c.e.fmt, c.row, c.e.depth.bit_length() - 1
    lo, lo_past, end = Signal(AB, name="row_lo"), Signal(name="row_lo_past"), Signal(AB + 1)
    row_end = row.lo + row.n        # past AB + 1 bits: every AB-bit index is below it
    m.d.sync += [lo.eq(row.lo), lo_past.eq(row.lo[AB:] != 0),
                 end.eq(Mux(row_end[AB + 1:] != 0, 1 << AB, row_end))]
    in_range, ascends = Signal(), Signal()
    ranges, orders = [], []
    for hot, head in zip(c.port_hot, c.rx_heads):
        index = data.View(fmt.flit, head.payload).data[:32]
        low, inside = index[:AB], index[AB:] == 0
        ranges.append(hot & inside & ~lo_past & (low >= lo) & (low < end))
        orders.append(hot & (low > c.prev_index[:AB]))
    m.d.comb += [in_range.eq(Cat(*ranges).any()), ascends.eq(Cat(*orders).any())]
    return in_range, ascends


def malformed(m, c):
    """Count a malformed message or pair (``malformed``, sticky) and mark the message being
    received for dropping: it contributes nothing (see :func:`_drained`)."""
    m.d.comb += c.malformed_event.eq(1)
    m.d.sync += c.drop.eq(1)


def _drained(m, c, j):
    """The row's adds are written (DRAIN, ``adds_idle``). A malformed message is dropped
    whole: RECV / RECV_BM restore the words its pairs changed from the undo log (UNDO,
    then DRAIN again with an empty log); GRECV / GRECV_BM leave the final slot empty. A
    good message (``drop`` low) goes on to the next row in this very cycle, as before the
    undo log: not one cycle more::

        cycle   : t      t+1        t+2 .. t+L+2            then                 next
        good    : DRAIN  NEXT
        dropped : DRAIN  UNDO_ADDR  UNDO (L words, 1 exit)  DRAIN (L writes land) NEXT
    """
    reduce = (c.op == SparseOp.RECV) | (c.op == SparseOp.RECV_BM)
    with m.If(c.drop & reduce & (c.log_n != 0)):
        j.rewind(m)
        m.next = "UNDO_ADDR"
    with m.Else():
        with m.If(c.drop & ~reduce):
            write_count(m, c, 0)
        m.d.comb += c.recv_done.eq(reduce)
        m.next = "NEXT"


def _undo_states(m, c, j):
    """UNDO_ADDR / UNDO: ``part[index] = old`` for every entry of the undo log, through the
    scatter unit's set mode (``+0 + old``, which is ``old`` bit for bit: a buffer word is
    never -0 -- +0 after reset, CLEAR and set-mode writes, and an IEEE sum is -0 only when
    both operands are -- and a NaN in it is already the adder's canonical NaN). Entries
    hold distinct ascending indices (:func:`pair_fits`), so the writes pass the unit at
    one a cycle and their order does not matter."""
    log = c.undo_r
    fire = c.sc_ready               # valid is 1 in the walk; see :func:`_region_states`
    with m.State("UNDO_ADDR"):
        m.d.comb += [c.main_uses.eq(1), log.addr.eq(0)]
        m.next = "UNDO"
    with m.State("UNDO"):
        m.d.comb += [c.main_uses.eq(1), log.addr.eq(j.ahead(fire))]
        with m.If(j.at["log"]):
            m.d.sync += c.log_n.eq(0)
            m.next = "DRAIN"
        with m.Else():
            m.d.comb += [c.sc_valid.eq(1), c.sc_index.eq(log.data.index),
                         c.sc_value.eq(log.data.value), c.sc_set.eq(1)]
            with m.If(fire):
                j.step(m)


def _head_ok(c, rx, row):
    fmt = c.e.fmt
    from amaranth.lib import data
    hv = data.View(fmt.sub_head, rx.data)
    return ((rx.type == FlitType.SUB_HEAD) & (hv.flow == row.chunk) & (hv.op == Op.SPARSE) &
            (hv.step == row.step))


def _idle(m, c, h, pc, j, chunk, dump_n):
    e = c.e
    with m.If(e.start):
        m.d.sync += [pc.eq(0), e.cycles.eq(0)]
        m.next = "WAIT"
    with m.Switch(h.payload.kind):
        with m.Case(HostKind.GRAD):
            m.d.comb += [c.sc_valid.eq(h.valid), c.sc_index.eq(h.payload.addr),
                         c.sc_value.eq(h.payload.data[:32]), h.ready.eq(c.sc_ready)]
        with m.Case(HostKind.PROG):
            m.d.comb += [h.ready.eq(1), c.prog_w.addr.eq(h.payload.addr),
                         c.prog_w.data.eq(h.payload.data), c.prog_w.en.eq(h.valid)]
        with m.Case(HostKind.START):
            m.d.comb += h.ready.eq(1)
            with m.If(h.valid):
                m.d.sync += [pc.eq(0), e.cycles.eq(0)]
                m.next = "WAIT"
        with m.Case(HostKind.DUMP):
            m.d.comb += h.ready.eq(1)
            with m.If(h.valid):
                j.rewind(m)
                c.rd.load(m, 0)
                m.d.sync += [chunk.eq(0), dump_n.eq(h.payload.data[:24])]
                m.next = "DUMP_WAIT"
        with m.Case(HostKind.CLEAR):
            m.d.comb += h.ready.eq(1)
            with m.If(h.valid):
                j.rewind(m)
                c.rd.load(m, 0)
                m.d.sync += dump_n.eq(h.payload.data[:24])
                m.next = "CLEAR_WAIT"
    idle_words(m, c, h)


def _if(cond, *ops):
    return ops if cond else ()


def _dispatch(m, c):
    e, row = c.e, c.row
    m.d.sync += c.row_count.eq(c.counts[row.chunk])     # the row's flow, from LOAD
    with m.Switch(c.op):
        with m.Case(SparseOp.END):
            m.d.sync += e.busy.eq(0)
            m.next = "IDLE"
        with m.Case(SparseOp.SEND, SparseOp.ROOT, *_if(e.codec, SparseOp.SEND_BM)):
            m.next = "SEL_WAIT"
        with m.Case(SparseOp.RECV, SparseOp.GRECV,
                    *_if(e.codec, SparseOp.RECV_BM, SparseOp.GRECV_BM)):
            m.next = "RX_HEAD"
        with m.Case(SparseOp.GSEND, *_if(e.codec, SparseOp.GSEND_BM)):
            m.next = "HEAD"
        with m.Case(SparseOp.ACC, SparseOp.ZERO, SparseOp.FIXUP, SparseOp.COPY):
            m.next = "REGION_WAIT"
        with m.Default():
            m.d.comb += c.malformed_event.eq(1)
            m.next = "NEXT"


def _rx_body(m, c, rx, idx, val, fits, n_pairs, seen, bad, slot_base):
    """Body flits: pairs of the expected flow go to the scatter adder (RECV) or the final
    slot (GRECV); the tail's count closes the message."""
    row = c.row
    reduce = c.op == SparseOp.RECV
    with m.If(c.rx_valid & (rx.type == FlitType.SUB_BODY)):
        take = fits & ~bad
        # a pair leaves the queue when the scatter unit could take it, taken or not: a
        # pair it drops (malformed) may wait a cycle, but the pair checks stay off the
        # queues' pop and their head registers' enables (-3.1 ns routed, 13th wave)
        ready = c.sc_ready | ~reduce
        m.d.comb += [c.rx_pop.eq(ready), c.sc_valid.eq(take & reduce), c.sc_index.eq(idx),
                     c.sc_value.eq(val), c.sc_log.eq(1), c.fin_w.addr.eq(slot_base + n_pairs),
                     c.fin_w.data.eq(rx.data), c.fin_w.en.eq(take & ~reduce)]
        with m.If(ready):
            m.d.sync += seen.eq(seen + 1)
            with m.If(take):
                m.d.sync += [n_pairs.eq(n_pairs + 1), c.prev_index.eq(idx)]
            with m.Else():
                malformed(m, c)
    with m.Elif(c.rx_valid & (rx.type == FlitType.MSG_TAIL)):
        m.d.comb += c.rx_pop.eq(1)
        with m.If(rx.data[:32] != seen):
            malformed(m, c)
        with m.If(~reduce):
            write_count(m, c, n_pairs)
        m.next = "DRAIN"
    with m.Elif(c.rx_valid):
        m.d.comb += c.rx_pop.eq(1)        # a flit type a sparse message never has
        malformed(m, c)


def _dump_residual(m, c, j, chunk, dump_n):
    e = c.e
    fire = c.host_o.ready           # valid is 1 in the walk; see :func:`_region_states`
    with m.If(j.at["dump"]):
        j.rewind(m)
        m.d.sync += chunk.eq(0)
        m.next = "DUMP_CHUNK"
    with m.Else():
        label = residual_label(m, c, j.ahead(fire), j.j)
        m.d.comb += [c.host_o.valid.eq(1), c.host_o.payload.index.eq(label),
                     c.host_o.payload.value.eq(c.dump_data)]
        with m.If(fire):
            j.step(m)
            c.rd.step(m)


def _clear(m, c, j, dump_n):
    """part[j] += -part[j] for j < dump_n: +0 exactly, through the one adder path."""
    fire = c.sc_ready               # valid is 1 in the walk; see :func:`_region_states`
    with m.If(j.at["dump"]):
        m.next = "IDLE"
    with m.Else():
        m.d.comb += [c.sc_valid.eq(1), c.sc_index.eq(j.j), c.sc_value.eq(c.dump_data ^ SIGN)]
        with m.If(fire):
            j.step(m)
            c.rd.step(m)


def _region_states(m, c, j, fin_fire, slot_base):
    """The rows that walk a final slot or a buffer region through the scatter unit, one
    write a cycle (FIXUP: one each two cycles), then drain:

    * SLOT (ACC / ZERO): for each pair (i, v) of the slot, ``part[lo + i] += v`` (ACC) or
      ``= +0`` (ZERO, the scatter unit's set mode), from a register (see
      :func:`_slot_states`);
    * FIX_ADDR, then FIX_READ / FIX_WRITE (FIXUP): ``part[k + i] = part[lo + i]`` for each
      pair of the slot (see :func:`_fixup_states`);
    * COPY_ADDR / COPY: ``part[k + j] = part[lo + j]`` for j < n.

    Slots hold ascending indices, so the scatter unit never waits on a hazard inside a row.

    The other walks offer a word (valid 1) until their exit test, so a word moves when the
    scatter unit is ready: ``fire`` is ``sc_ready`` alone. The look-ahead read of word
    ``j + 1`` then needs no valid term either (in the exit cycle its data goes unused), and
    the received-pair checks that also drive the shared ``sc_valid`` stay off the block
    RAMs' address pins -- they were the routed critical path (77.1 MHz, 13th wave).
    """
    row = c.row
    fire = c.sc_ready
    with m.State("REGION_WAIT"):    # no selection in flight, its zeroing adds done
        c.rd.load(m, row.lo)        # COPY's first word (j is 0 from LOAD)
        with m.If(~c.sel_busy & c.adds_idle):
            with m.Switch(c.op):
                with m.Case(SparseOp.ACC, SparseOp.ZERO):
                    m.next = "SLOT"
                with m.Case(SparseOp.FIXUP):
                    m.next = "FIX_ADDR"
                with m.Default():
                    m.next = "COPY_ADDR"
    fin_index, fin_value = c.fin_r.data[:32], c.fin_r.data[32:]
    _slot_states(m, c, j, fin_fire, fin_index, fin_value)
    _fixup_states(m, c, j, fin_fire, fin_index)
    with m.State("COPY_ADDR"):     # reads part[lo] (see ReadPointer)
        m.d.comb += c.main_uses.eq(1)
        m.next = "COPY"
    with m.State("COPY"):
        m.d.comb += c.main_uses.eq(1)
        with m.If(j.at["n"]):
            m.next = "DRAIN"
        with m.Else():
            m.d.comb += [c.sc_valid.eq(1), c.sc_index.eq(row.k + j.j),
                         c.sc_value.eq(c.dump_data), c.sc_set.eq(1)]
            with m.If(fire):
                j.step(m)
                c.rd.step(m)


def _slot_states(m, c, j, fin_fire, fin_index, fin_value):
    """ACC / ZERO's walk, one pair a cycle: ``part[lo + i] += v`` (ACC) or ``= +0`` (ZERO)
    for each pair ``(i, v)`` of the slot. The pair reaches the scatter unit from a register
    (``slot_q``) loaded from the final-pair RAM's output with ``lo + i`` added, so that RAM's
    clock-to-output and the adder stand before a register, not in front of the sources'
    mux and the scatter input (the 16th wave's estimated worst path, 9.3 ns)::

        cycle : t                      t+1                    t+2
                fin word j out ──►     slot_q (lo + i, v) ──► scatter input

    ``move``: word j goes into the register (it is free next cycle, and j is below the
    count); the RAM then reads word j + 1. The walk ends when no word is left and the
    register empties: one cycle more a row than with the sum behind the RAM (the fill)."""
    row = c.row
    qv = Signal(name="slot_q_valid")
    q_index, q_value = Signal(32, name="slot_q_index"), Signal(32, name="slot_q_value")
    zero = c.op == SparseOp.ZERO
    take = ~qv | c.sc_ready         # slot_q is free next cycle
    move = take & ~j.at["count"]
    with m.State("SLOT"):
        m.d.comb += [c.main_uses.eq(1), c.sc_valid.eq(qv), c.sc_index.eq(q_index),
                     c.sc_value.eq(q_value), c.sc_set.eq(zero), fin_fire.eq(move),
                     c.fin_walk.eq(1)]
        with m.If(take):
            m.d.sync += [qv.eq(move), q_index.eq(row.lo + fin_index),
                         q_value.eq(Mux(zero, 0, fin_value))]
        with m.If(move):
            j.step(m)
        with m.If(j.at["count"] & take):
            m.next = "DRAIN"


def _fixup_states(m, c, j, fin_fire, fin_index):
    """FIXUP's walk, two cycles a pair: ``part[k + i] = part[lo + i]`` for each pair
    ``(i, v)`` of the slot. Both addresses are registered (``fix_src``, the read pointer's
    word, and ``fix_dst``) from the final-pair RAM's output, so no adder stands between
    that block RAM and the buffer's address pins (the 15th wave's estimated second-worst
    path, 9.4 ns: the pair's index → ``lo + i`` → a bank's row → its address). The slot's
    word j + 1 is read while pair j is copied, and loaded into the registers when pair j's
    write goes::

        FIX_ADDR   fin word 0 out      -> fix_src, fix_dst
        FIX_READ   read part[fix_src]  (fin address j + 1)
        FIX_WRITE  part[fix_dst] = it; on fire: fin word j + 1 -> fix_src, fix_dst; j += 1

    One cycle per row more than computing the addresses behind the RAM (FIX_ADDR)."""
    row = c.row
    fire = c.sc_ready               # valid is 1 in the walk; see :func:`_region_states`
    fix_dst = Signal(32, name="fix_dst")

    def load():                     # fix_src is the read pointer's word
        c.rd.hold(m, row.lo + fin_index)
        m.d.sync += fix_dst.eq(row.k + fin_index)

    with m.State("FIX_ADDR"):
        m.d.comb += c.main_uses.eq(1)
        load()
        m.next = "FIX_READ"
    with m.State("FIX_READ"):
        m.d.comb += [c.main_uses.eq(1), fin_fire.eq(1), c.fin_walk.eq(1)]
        with m.If(j.at["count"]):
            m.next = "DRAIN"
        with m.Else():
            m.next = "FIX_WRITE"
    with m.State("FIX_WRITE"):
        m.d.comb += [c.main_uses.eq(1), c.sc_valid.eq(1),
                     c.sc_index.eq(fix_dst), c.sc_value.eq(c.dump_data), c.sc_set.eq(1),
                     fin_fire.eq(1), c.fin_walk.eq(1)]
        with m.If(fire):
            load()
            j.step(m)
            m.next = "FIX_READ"
