"""Depacketiser: flits -> checked fragments (header + binary32 words), credits back.

Receive path::

    rx.flit ──► per-VC input FIFO ──► round-robin ──► check register ──► fragment buffer
                (≥ credits, buffered;  VC arbiter      (per-VC context)   (one region per VC:
                 head checks on its     │                    │             commit / rollback)
                 output register)       pop: rx.credit   commit register         │
                  │                                          ▼                   ▼
              OVERFLOW if full                hdr FIFO ──► hdr     len FIFO ──► reader ──► data

* **Pop**: the arbiter pops a flit only if all it can lead to is sure to fit: a slot in
  its VC's buffer region and an entry in each descriptor FIFO.  Those are registered flags,
  worked out a cycle ahead and conservatively (the flit and commit still in the stages
  below count as if they used room), so the pop is a few gates away from registers.  A
  head flit's own checks (flow, op, length) are made on the input FIFO's output register
  and registered with the flit.
* **Check** (one cycle, never stalls): the popped flit is checked against its VC's context,
  which it updates, and written into the buffer; all of it is enabled by the register's
  valid bit, not by a decision of the same cycle.
* **Commit register**: a fragment's header and length are registered, then written into
  the hdr / len FIFOs (room was reserved at the pop).  A fragment reaches the FIFOs two
  cycles after the pop of its last flit.
* One message context per VC (IDLE / ACTIVE / DISCARD, header, words left, words in and
  offset of the open fragment) and one buffer region per VC, so the arbiter may switch VC
  on every flit: flits of different VCs interleave freely and a VC stuck mid-message (e.g.
  a lost tail) never blocks the others.
* Payload words are written speculatively into the VC's buffer region and become visible
  to the output only when the fragment (sub-packet, or packet in packet mode) ends
  correctly (**commit**: its header and length are queued, in commit order); any error
  drops them (**rollback**).  Nothing of a malformed fragment reaches ``data``.
* Both modes are accepted at once: the type's bit 2 tells normal packets from all-reduce
  sub-packets.  Semantics (error causes, what is dropped) are exactly
  :func:`treenic.hdl.link.model.depacketise`; see there.
* Errors are counted per cause (:class:`~treenic.hdl.link.flit.ErrorCause`), the last
  cause is kept in ``status.code``; ``status.clear`` zeroes them.  Status lags the check
  of the flit that caused it by one cycle (events are registered before counting), its
  pop by two.
"""

from types import SimpleNamespace

from amaranth.hdl import Module, Signal, Mux, Cat, Const
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .flit import ErrorCause, FlitFormat, FlitType, LinkSignature, N_CAUSES, Op
from .model import DEFAULT_SUB_WORDS

__all__ = ["Depacketiser", "DepacketiserStatusSignature", "DepacketiserStatusCounters",
           "FragmentReader", "FlitInput"]

IDLE, ACTIVE, DISCARD = 0, 1, 2

#: signals the receive stages share (built in ``elaborate``)
_SHARED = frozenset([
    'fmt', 'W', 'V', 'rx', 'D', 'abits', 'wp', 'rp', 'wptr', 'cptr', 'rptr', 'fragw',
    'hdr_fifo', 'len_fifo', 'f_v', 'f_vc', 'f', 'chk_layout', 'f_chk', 'cq_hv', 'cq_lv',
    'cq_hd', 'cq_len', 'in_chk'])
#: what the check stage hands the actions
_CHECKED = frozenset([
    't', 'd', 'is_head', 'is_tailtype', 'is_ht', 'is_subtail', 'ph', 'frag_len', 'exp',
    'c_st', 'c_hd', 'c_fo', 'n_st'])


class DepacketiserStatusSignature(wiring.Signature):
    """Register-style status: ``code`` (last :class:`ErrorCause`, sticky), ``counts``
    (16-bit per cause; index 0 = all errors), ``dropped`` (flits discarded), ``frags``
    (fragments delivered), ``clear`` (in: zero all of them)."""

    def __init__(self):
        super().__init__({
            "code": Out(3),
            "counts": Out(data.ArrayLayout(16, N_CAUSES)),
            "dropped": Out(32),
            "frags": Out(32),
            "clear": In(1),
        })


class DepacketiserStatusCounters(wiring.Component):
    """The depacketiser's error and traffic counters.

    Events are registered before they are counted, so the counters' adders hang off a
    register rather than the flit checks (a timing path); status lags one cycle.  A clear
    in an event's own cycle still drops it, as if counted and cleared.

    Members
    -------
    events : ``In(StructLayout(orphan, seq, flow, op, length))``
        The check stage's error decisions for the flit it holds.
    check_valid : ``In(1)``
        The check stage holds a flit (the events and ``accepted``/``committed`` count only
        then).
    overflow : ``In(1)``
        A flit arrived for a full input FIFO (counted as an error and a dropped flit).
    accepted, committed : ``In(1)``
        The held flit is accepted / commits a fragment.
    status : ``Out(DepacketiserStatusSignature())``
    """

    def __init__(self):
        super().__init__({
            "events": In(data.StructLayout({"orphan": 1, "seq": 1, "flow": 1, "op": 1,
                                            "length": 1})),
            "check_valid": In(1), "overflow": In(1), "accepted": In(1), "committed": In(1),
            "status": Out(DepacketiserStatusSignature())})

    def elaborate(self, platform):
        m = Module()
        s, e, f_v, overflow = self.status, self.events, self.check_valid, self.overflow
        causes = {ErrorCause.ORPHAN: e.orphan, ErrorCause.SEQ: e.seq,
                  ErrorCause.FLOW: e.flow, ErrorCause.OP: e.op, ErrorCause.LENGTH: e.length}
        ev = {c: Signal(name=f"ev_{c.name.lower()}") for c in ErrorCause
              if c != ErrorCause.NONE}
        for c, sig in causes.items():
            m.d.comb += ev[c].eq(f_v & sig)
        m.d.comb += ev[ErrorCause.OVERFLOW].eq(overflow)
        ev_q = {c: Signal(name=f"ev_{c.name.lower()}_q") for c in ev}
        drop_q = Signal(2)
        frag_q = Signal()
        m.d.sync += [ev_q[c].eq(sig & ~s.clear) for c, sig in ev.items()]
        m.d.sync += [drop_q.eq(Mux(s.clear, 0, (f_v & ~self.accepted) + overflow)),
                     frag_q.eq(f_v & self.committed & ~s.clear)]
        n_err = Signal(range(N_CAUSES + 1))
        m.d.comb += n_err.eq(sum(ev_q.values()))
        with m.If(s.clear):
            m.d.sync += [s.code.eq(0), s.dropped.eq(0), s.frags.eq(0)]
            m.d.sync += [s.counts[i].eq(0) for i in range(N_CAUSES)]
        with m.Else():
            m.d.sync += s.counts[0].eq(s.counts[0] + n_err)
            for c, sig in ev_q.items():
                with m.If(sig):
                    m.d.sync += [s.counts[int(c)].eq(s.counts[int(c)] + 1),
                                 s.code.eq(int(c))]   # later (higher) causes win
            m.d.sync += [s.dropped.eq(s.dropped + drop_q), s.frags.eq(s.frags + frag_q)]
        return m


class FragmentReader(wiring.Component):
    """Read side of the depacketiser: committed fragments out of the fragment buffer.

    A fragment's length and VC come from the length FIFO; its words are read from the
    VC's buffer region, ``lanes`` per beat, at the region's read pointer.  The buffer read
    port is synchronous, so a beat's data appears the cycle after its read (``data.valid``
    is a register).

    Parameters
    ----------
    fmt : FlitFormat
    vcs : int
        Virtual channels (buffer regions).
    ptr_bits : int
        Width of a region's pointers (the region size's log2 + 1).
    length_bits : int
        Width of a fragment length.

    Members
    -------
    lengths : ``In(stream.Signature(length_bits + vc_bits))``
        The length FIFO's output: fragment length (low bits) and VC.
    buf_addr, buf_en : ``Out``;  buf_data : ``In(fmt.width)``
        The fragment buffer's read port (address = region pointer, VC).
    read_ptr : ``Out(ptr_bits).array(vcs)``
        Each region's read pointer (the write side's room check reads them).
    data : ``Out(stream.Signature(fmt.out_beat))``
    """

    def __init__(self, fmt: FlitFormat, *, vcs: int, ptr_bits: int, length_bits: int):
        if vcs < 1 or ptr_bits < 1 or length_bits < 1:
            raise ValueError("vcs, ptr_bits and length_bits must be positive")
        self.fmt, self.vcs = fmt, vcs
        self.ptr_bits, self.length_bits = ptr_bits, length_bits
        super().__init__({
            "lengths": In(stream.Signature(length_bits + fmt.vc_bits)),
            "buf_addr": Out(ptr_bits - 1 + fmt.vc_bits), "buf_en": Out(1),
            "buf_data": In(fmt.width),
            "read_ptr": Out(ptr_bits).array(vcs),
            "data": Out(stream.Signature(fmt.out_beat))})

    def elaborate(self, platform):
        m = Module()
        fmt, V, W = self.fmt, self.vcs, self.fmt.lanes
        abits, fragw, rptr = self.ptr_bits - 1, self.length_bits, self.read_ptr
        words_left = Signal(fragw)
        rvc = Signal(fmt.vc_bits)
        c_rptr = Signal(abits + 1)
        for v in range(V):
            with m.If(rvc == v):
                m.d.comb += c_rptr.eq(rptr[v])
        ov = Signal()
        olast = Signal()
        can_adv = Signal()
        issue = Signal()
        m.d.comb += [can_adv.eq(~ov | self.data.ready),
                     issue.eq(can_adv & (words_left != 0)),
                     self.buf_addr.eq(Cat(c_rptr[:abits], rvc)), self.buf_en.eq(issue)]
        with m.If(can_adv):
            m.d.sync += ov.eq(issue)
        with m.If(issue):
            m.d.sync += olast.eq(words_left <= W)
            for v in range(V):
                with m.If(rvc == v):
                    m.d.sync += rptr[v].eq(rptr[v] + 1)
        need = Signal()
        m.d.comb += need.eq((words_left == 0) | (issue & (words_left <= W)))
        m.d.comb += self.lengths.ready.eq(need)
        with m.If(need & self.lengths.valid):
            m.d.sync += [words_left.eq(self.lengths.payload[:fragw]),
                         rvc.eq(self.lengths.payload[fragw:])]
        with m.Elif(issue):
            m.d.sync += words_left.eq(Mux(words_left <= W, 0, words_left - W))
        m.d.comb += [self.data.valid.eq(ov), self.data.payload.data.eq(self.buf_data),
                     self.data.payload.last.eq(olast)]
        return m


#: the checks of a head flit, made on the input FIFO's head register
HEAD_CHECKS = data.StructLayout({
    "e_flow": 1, "e_op": 1, "e_len": 1,     # the error, if any (one at most)
    "short": 1,                             # length <= W (one payload flit)
})


class FlitInput(wiring.Component):
    """Input side of the depacketiser: per-VC input FIFOs, the head flits' checks, the
    round-robin VC arbiter and the check register it loads.

    The arbiter pops a flit of VC v only if ``room_*[v]`` (registered by the depacketiser
    a cycle ahead) says all it can lead to fits; a credit goes back on every pop.

    Parameters
    ----------
    fmt : FlitFormat
    credits : int
        Input FIFO depth per VC (the sender's credits).

    Members
    -------
    rx : ``In(LinkSignature(fmt))``
    flow_enable : ``In(fmt.flows)``
        Flows a head flit may name.
    room_idle, room_same, room_other : ``In(vcs)``
        Per VC: a pop fits when the check register holds nothing / a flit of this VC / a
        flit of another VC.
    overflow : ``Out(1)``
        A flit for a full FIFO or an unknown VC (it is lost).
    held_valid, held_vc, held, held_checks : ``Out``
        The check register: a popped flit, its VC and its head checks (``HEAD_CHECKS``).
    """

    def __init__(self, fmt: FlitFormat, *, credits: int):
        if credits < 1:
            raise ValueError(f"credits must be positive, not {credits}")
        self.fmt, self.credits = fmt, credits
        V = fmt.vcs
        super().__init__({
            "rx": In(LinkSignature(fmt)), "flow_enable": In(fmt.flows),
            "room_idle": In(V), "room_same": In(V), "room_other": In(V),
            "overflow": Out(1), "held_valid": Out(1), "held_vc": Out(fmt.vc_bits),
            "held": Out(fmt.flit), "held_checks": Out(HEAD_CHECKS)})

    def elaborate(self, platform):
        m = Module()
        fmt, V, rx = self.fmt, self.fmt.vcs, self.rx
        overflow = self.overflow
        # ---------------------------------------------------------------- input FIFOs
        fifos = []
        for v in range(V):
            # buffered: the head flit comes from a register, not through the distributed
            # RAM's read mux, into the arbiter and the check register.  One more entry than
            # credits: its w_rdy only counts the RAM part (depth - 1), which must hold every
            # flit in flight while the output register is being refilled.  A credit goes
            # back when the flit is popped (the check stage below never stalls)
            q = fifo.SyncFIFOBuffered(width=fmt.flit.size, depth=self.credits + 1)
            m.submodules[f"vc{v}_fifo"] = q
            fifos.append(q)
            m.d.comb += [q.w_data.eq(rx.flit.as_value()),
                         q.w_en.eq(rx.valid & (rx.flit.vc == v))]
            with m.If(rx.valid & (rx.flit.vc == v) & ~q.w_rdy):
                m.d.comb += overflow.eq(1)
        if V < (1 << fmt.vc_bits):
            with m.If(rx.valid & (rx.flit.vc >= V)):
                m.d.comb += overflow.eq(1)

        self._arbiter(m, fifos, self._head_checks(m, fifos))
        return m

    def _head_checks(self, m, fifos):
        """Checks of each input FIFO's head flit (flow, op, length)."""
        fmt, chk_layout = self.fmt, HEAD_CHECKS
        W, V = fmt.lanes, fmt.vcs
        # ---------------------------------------------------------------- head checks
        # A head's checks (flow known, op, length) need only the flit itself: they are
        # made on each input FIFO's head register, before the arbiter's mux, and registered
        # with the flit, so the check stage's accept/commit decision starts from flags
        flow_en = Cat(self.flow_enable, Const(0, (1 << fmt.flow_bits)))
        head_chk = []
        for v in range(V):
            hf = data.View(fmt.flit, fifos[v].r_data)
            ht = hf.type
            sh = data.View(fmt.sub_head, hf.data[:fmt.sub_head.size])
            ph = data.View(fmt.pkt_head, hf.data[:fmt.pkt_head.size])
            is_sub = ht == FlitType.SUB_HEAD
            # (each check on both layouts, then one select by the type)
            flow_ok = Mux(is_sub, flow_en.bit_select(sh.flow, 1),
                          flow_en.bit_select(ph.flow, 1))
            op = Mux(is_sub, sh.op, ph.op)
            op_ok = (op == Op.REDUCE) | (op == Op.GATHER)
            len_bad = Signal(name=f"len_bad{v}")
            with m.Switch(ht):
                with m.Case(FlitType.SUB_HEAD):
                    m.d.comb += len_bad.eq(sh.length == 0)
                with m.Case(FlitType.HEAD):
                    m.d.comb += len_bad.eq((ph.length == 0) |
                                           (ph.length > fmt.max_packet_words))
                with m.Case(FlitType.HEAD_TAIL):
                    m.d.comb += len_bad.eq(ph.length != 0)
            c = Signal(chk_layout, name=f"head_chk{v}")
            m.d.comb += [c.e_flow.eq(~flow_ok), c.e_op.eq(flow_ok & ~op_ok),
                         c.e_len.eq(flow_ok & op_ok & len_bad),
                         c.short.eq(Mux(is_sub, sh.length <= W, ph.length <= W))]
            head_chk.append(c)

        return head_chk

    def _arbiter(self, m, fifos, head_chk):
        """Round robin over the VCs; the pop loads the check register."""
        fmt, V, rx, chk_layout = self.fmt, self.fmt.vcs, self.rx, HEAD_CHECKS
        f_v, f_vc, f, f_chk = self.held_valid, self.held_vc, self.held, self.held_checks
        ok_idle, ok_same, ok_other = self.room_idle, self.room_same, self.room_other
        # ---------------------------------------------------------------- arbiter
        # round robin over the VCs that have a flit and room; may switch VC on every flit
        # (a VC stuck in a message never blocks the others)
        elig = Signal(V)
        for v in range(V):
            ok = Mux(f_v, ok_same[v] if V == 1 else Mux(f_vc == v, ok_same[v], ok_other[v]),
                     ok_idle[v])
            m.d.comb += elig[v].eq(fifos[v].r_rdy & ok)
        last_vc = Signal(fmt.vc_bits)
        sel = Signal(fmt.vc_bits)
        for v in range(V):
            with m.If(last_vc == v):
                for off in reversed(range(1, V + 1)):
                    cand = (v + off) % V
                    with m.If(elig[cand]):
                        m.d.comb += sel.eq(cand)
        pop = Signal()
        cur = Signal(fmt.flit)
        cur_chk = Signal(chk_layout)
        for v in range(V):
            with m.If(sel == v):
                m.d.comb += [pop.eq(elig[v]), cur.eq(fifos[v].r_data),
                             cur_chk.eq(head_chk[v])]
        with m.If(pop):
            m.d.sync += last_vc.eq(sel)
        credit = Signal(V)
        for v in range(V):
            m.d.comb += fifos[v].r_en.eq(pop & (sel == v))
            m.d.comb += credit[v].eq(pop & (sel == v))
        m.d.sync += rx.credit.eq(credit)
        # (the flit register loads every cycle: only its valid bit depends on the pop)
        m.d.sync += [f_v.eq(pop), f_vc.eq(sel), f.eq(cur), f_chk.eq(cur_chk)]


class Depacketiser(wiring.Component):
    """Flit stream -> fragments.

    Ports:
        rx: ``In(LinkSignature(fmt))`` -- flits in, credits out (one per popped flit).
        hdr: ``Out(stream.Signature(fmt.header))`` -- one per fragment: ``vc``,
            ``packet`` (came as normal packets), ``last`` (ends the message), route fields,
            ``flow, op, step``, ``offset`` of the fragment's first word, ``length`` (words).
        data: ``Out(stream.Signature(fmt.out_beat))`` -- ``ceil(length/lanes)`` beats per
            fragment (``last`` on the final one; none for a zero-length fragment).
        flow_enable: ``In(fmt.flows)`` -- bit f set: flow f is known.
        status: ``Out(DepacketiserStatusSignature())``.

    Args:
        sub_words: sub-packet length (words) the sender uses (message mode).
        credits: input buffer depth per VC (the sender's initial credits).
        buf_flits: fragment buffer region per VC (flits, power of 2, >= the largest
            fragment); default twice the largest fragment.
        desc_depth: hdr / len FIFO depth (>= 2).  The pop reserves room for the commits
            still in flight, so one fragment per cycle needs 7 (a distributed RAM holds
            16 entries at the same cost).
    """

    def __init__(self, fmt: FlitFormat | None = None, *, sub_words: int = DEFAULT_SUB_WORDS,
                 credits: int = 8, buf_flits: int | None = None, desc_depth: int = 8):
        self.fmt = fmt = fmt or FlitFormat()
        if sub_words <= 0 or sub_words % fmt.lanes:
            raise ValueError("sub_words must be a positive multiple of the words per flit")
        self.sub_words = sub_words
        self.credits = credits
        self.max_frag = max(sub_words, fmt.max_packet_words)
        need = self.max_frag // fmt.lanes
        if buf_flits is None:
            buf_flits = 1 << ceil_log2(2 * need)
        if buf_flits < need or buf_flits & (buf_flits - 1):
            raise ValueError(f"buf_flits must be a power of 2 >= {need}")
        if desc_depth < 2:
            raise ValueError("desc_depth must be >= 2")
        self.buf_flits = buf_flits
        self.desc_depth = desc_depth
        super().__init__({
            "rx": In(LinkSignature(fmt)),
            "hdr": Out(stream.Signature(fmt.header)),
            "data": Out(stream.Signature(fmt.out_beat)),
            "flow_enable": In(fmt.flows),
            "status": Out(DepacketiserStatusSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        W = fmt.lanes
        V = fmt.vcs
        rx = self.rx

        # ---------------------------------------------------------------- input side
        m.submodules.input = inp = FlitInput(fmt, credits=self.credits)
        wiring.connect(m, wiring.flipped(rx), inp.rx)
        m.d.comb += inp.flow_enable.eq(self.flow_enable)
        overflow = inp.overflow

        # ---------------------------------------------------------------- fragment buffer
        # one circular region of D flits per VC: speculative write pointer, committed end,
        # read pointer
        D = self.buf_flits
        abits = ceil_log2(D)
        m.submodules.buf = buf = memory.Memory(shape=fmt.width, depth=D * V, init=[])
        wp = buf.write_port()
        rp = buf.read_port()
        wptr = [Signal(abits + 1, name=f"wptr{v}") for v in range(V)]
        cptr = [Signal(abits + 1, name=f"cptr{v}") for v in range(V)]
        rptr = [Signal(abits + 1, name=f"rptr{v}") for v in range(V)]

        fragw = ceil_log2(self.max_frag + 1)
        m.submodules.hdr_fifo = hdr_fifo = fifo.SyncFIFOBuffered(
            width=fmt.header.size, depth=self.desc_depth)
        m.submodules.len_fifo = len_fifo = fifo.SyncFIFOBuffered(
            width=fragw + fmt.vc_bits, depth=self.desc_depth)
        m.d.comb += [self.hdr.valid.eq(hdr_fifo.r_rdy),
                     self.hdr.payload.eq(hdr_fifo.r_data),
                     hdr_fifo.r_en.eq(self.hdr.ready)]

        # ---------------------------------------------------------------- stage registers
        # check stage: the popped flit, its VC (``f_v``: valid) and its head checks,
        # registered in the input side
        f_v, f_vc, f, f_chk = inp.held_valid, inp.held_vc, inp.held, inp.held_checks
        chk_layout = HEAD_CHECKS
        # commit register: a fragment's header and length, written into the FIFOs next
        cq_hv = Signal()              # write the hdr FIFO
        cq_lv = Signal()              # write the len FIFO (a commit with words)
        cq_hd = Signal(fmt.header)
        cq_len = Signal(fragw + fmt.vc_bits)
        # the check stage holds a flit of VC v
        in_chk = [f_v if V == 1 else f_v & (f_vc == v) for v in range(V)]

        here = locals()
        s = SimpleNamespace(**{n: here[n] for n in _SHARED})
        ok_idle, ok_same, ok_other = self._pop_flags(m, s)
        m.d.comb += [inp.room_idle.eq(ok_idle), inp.room_same.eq(ok_same),
                     inp.room_other.eq(ok_other)]
        x = self._check_stage(m, s)
        e_orphan, e_seq, e_flow, e_op, e_len, accept, commit = self._actions(m, s, x)
        self._read_side(m, s)
        self._status(m, s, overflow, (e_orphan, e_seq, e_flow, e_op, e_len), accept, commit)
        return m

    def _pop_flags(self, m, s):
        """Per VC: may the arbiter pop a flit (registered a cycle ahead)."""
        (V, D, abits, wptr, rptr, hdr_fifo, len_fifo, cq_hv, cq_lv, f_v, in_chk) = (
         s.V, s.D, s.abits, s.wptr, s.rptr, s.hdr_fifo, s.len_fifo, s.cq_hv,
         s.cq_lv, s.f_v, s.in_chk)
        # ---------------------------------------------------------------- pop flags
        # Registered a cycle ahead, so that no subtract/compare of pointers or FIFO levels
        # sits between them and the pop (a timing path).  A flit popped next cycle writes
        # its buffer slot the cycle after, and its commit reaches the FIFOs one later.
        # Bounds on what it will find, from this cycle's registers:
        # * its VC's region holds <= wptr - rptr + the flit checked now (if of that VC) +
        #   the flit popped now (if of that VC; it is checked next cycle);
        # * a FIFO holds <= level + the commit register + the flit checked now + the flit
        #   popped now (each may commit once).
        # The flit popped now is not known yet: one flag per case, picked next cycle by
        # what the check register then holds (``ok_idle``: nothing, ``ok_same``: a flit of
        # this VC, ``ok_other``: one of another VC).  Reads only free room and rollbacks
        # only move wptr back, so the flags err on the safe side by at most the flits and
        # commits in flight, and are exact once the stages are empty.
        # (x + n < limit for the few n in flight: compares with constants, selected by the
        # in-flight bits, rather than an adder in front of a compare)
        def below(x, n, limit):
            return x < limit - n if limit > n else Const(0)

        def fits(x, extra, limit):          # x + sum(extra) < limit
            return Cat(*(below(x, i, limit) for i in range(len(extra) + 1))).bit_select(
                sum(extra), 1)

        nd = self.desc_depth - 1      # entries the FIFOs' w_rdy counts (RAM part)
        room0 = Signal()              # room for the commits in flight
        room1 = Signal()              # ... and for one more
        m.d.comb += [
            room0.eq(fits(hdr_fifo.level, [cq_hv, f_v], nd) &
                     fits(len_fifo.level, [cq_lv, f_v], nd)),
            room1.eq(fits(hdr_fifo.level, [cq_hv, f_v, 1], nd) &
                     fits(len_fifo.level, [cq_lv, f_v, 1], nd)),
        ]
        ok_idle = Signal(V)
        ok_same = Signal(V)
        ok_other = Signal(V)
        for v in range(V):
            occ = (wptr[v] - rptr[v])[:abits + 1]
            m.d.sync += [ok_idle[v].eq(fits(occ, [in_chk[v]], D) & room0),
                         ok_same[v].eq(fits(occ, [in_chk[v], 1], D) & room1)]
            if V > 1:
                m.d.sync += ok_other[v].eq(fits(occ, [in_chk[v]], D) & room1)

        return ok_idle, ok_same, ok_other

    def _check_stage(self, m, s):
        """The checked flit's VC context, its decode and the context's next value."""
        fmt, W, V, fragw, f, f_vc, f_chk, in_chk = \
            s.fmt, s.W, s.V, s.fragw, s.f, s.f_vc, s.f_chk, s.in_chk
        # ---------------------------------------------------------------- per-VC contexts
        st = [Signal(2, name=f"state{v}") for v in range(V)]
        pk = [Signal(name=f"pmode{v}") for v in range(V)]
        hd = [Signal(fmt.header, name=f"hdr{v}") for v in range(V)]
        # words left in the message, words in the open fragment, the fragment's offset, and
        # two flags kept ahead in registers so that no subtract/compare sits between the
        # context and the accept/commit decision (a timing path): ``lastf`` = the next
        # payload flit is the message's last (left <= W), ``subtf`` = it ends a sub-packet
        # (in the fragment >= sub_words - W).  A fragment never exceeds max_frag words,
        # so ``sub`` is only as wide as a fragment length.
        rm = [Signal(fmt.length_bits, name=f"left{v}") for v in range(V)]
        sb = [Signal(fragw, name=f"sub{v}") for v in range(V)]
        OW = len(hd[0].offset)
        fo = [Signal(OW, name=f"foff{v}") for v in range(V)]
        lf = [Signal(name=f"lastf{v}") for v in range(V)]
        sf = [Signal(name=f"subtf{v}") for v in range(V)]
        # (per-VC registers, the checked VC's context ``c_*``, its next value ``n_*``)
        shapes = [("state", 2), ("pmode", 1), ("hdr", fmt.header), ("left", fmt.length_bits),
                  ("sub", fragw), ("foff", OW), ("lastf", 1), ("subtf", 1)]
        regs_all = [st, pk, hd, rm, sb, fo, lf, sf]
        cur_ctx = [Signal(shape, name=f"c_{n}") for n, shape in shapes]
        nxt = [Signal(shape, name=f"n_{n}") for n, shape in shapes]
        ctx = list(zip(regs_all, cur_ctx))
        c_st, c_pk, c_hd, c_rm, c_sb, c_fo, c_lf, c_sf = cur_ctx
        n_st, n_pk, n_hd, n_rm, n_sb, n_fo, n_lf, n_sf = nxt
        for v in range(V):
            with m.If(f_vc == v):
                m.d.comb += [c.eq(regs[v]) for regs, c in ctx]
        m.d.comb += [n.eq(c) for (_, c), n in zip(ctx, nxt)]
        # every checked flit updates its VC's context: the enable is a register
        for v in range(V):
            with m.If(in_chk[v]):
                m.d.sync += [regs[v].eq(n) for (regs, _), n in zip(ctx, nxt)]

        # ---------------------------------------------------------------- decode
        t = f.type
        d = f.data
        is_head = Signal()
        is_tailtype = Signal()
        is_ht = Signal()
        is_subtail = Signal()
        m.d.comb += [
            is_head.eq((t == FlitType.SUB_HEAD) | (t == FlitType.HEAD) |
                       (t == FlitType.HEAD_TAIL)),
            is_tailtype.eq((t == FlitType.MSG_TAIL) | (t == FlitType.TAIL)),
            is_ht.eq(t == FlitType.HEAD_TAIL),
            is_subtail.eq(t == FlitType.SUB_TAIL),
        ]
        sh = data.View(fmt.sub_head, d[:fmt.sub_head.size])
        ph = data.View(fmt.pkt_head, d[:fmt.pkt_head.size])
        new_hd = Signal(fmt.header)
        with m.If(t == FlitType.SUB_HEAD):
            m.d.comb += [new_hd.next.eq(sh.next), new_hd.eject.eq(sh.eject),
                         new_hd.flow.eq(sh.flow), new_hd.op.eq(sh.op),
                         new_hd.step.eq(sh.step), new_hd.offset.eq(sh.offset),
                         new_hd.length.eq(sh.length)]
        with m.Else():
            m.d.comb += [new_hd.dest.eq(ph.dest), new_hd.src.eq(ph.src),
                         new_hd.flow.eq(ph.flow), new_hd.op.eq(ph.op),
                         new_hd.step.eq(ph.step), new_hd.offset.eq(ph.offset),
                         new_hd.length.eq(ph.length), new_hd.packet.eq(1)]
        m.d.comb += new_hd.vc.eq(f_vc)

        last_flit = c_lf
        k = Signal(range(W + 1))
        m.d.comb += k.eq(Mux(last_flit, c_rm, W))
        # words in the fragment once this flit is in (a fragment fits ``fragw`` bits)
        frag_len = Signal(fragw)
        m.d.comb += frag_len.eq(c_sb + k)
        # ``subtf`` after a fragment starts, and after a W-word payload flit
        sub_tail_at_0 = Const(self.sub_words - W <= 0)
        sub_tail_after = (Const(1) if self.sub_words - 2 * W <= 0
                          else c_sb >= self.sub_words - 2 * W)
        exp = Signal(FlitType)
        with m.If(c_pk):
            m.d.comb += exp.eq(Mux(last_flit, FlitType.TAIL, FlitType.BODY))
        with m.Elif(last_flit):
            m.d.comb += exp.eq(FlitType.MSG_TAIL)
        with m.Elif(c_sf):
            m.d.comb += exp.eq(FlitType.SUB_TAIL)
        with m.Else():
            m.d.comb += exp.eq(FlitType.SUB_BODY)

        # ---------------------------------------------------------------- next context
        # Only the state depends on the checks.  Everything else is loaded by any head and
        # advanced by any other flit: a context that is not ACTIVE is never read, and only
        # a good head makes it ACTIVE (after reloading it), so the checks stay off these
        # registers' paths.  (A payload flit that is not the message's last carries W
        # words; a SUB_TAIL never is the last.)
        with m.If(is_head):
            m.d.comb += [n_hd.eq(new_hd), n_rm.eq(new_hd.length), n_sb.eq(0),
                         n_fo.eq(new_hd.offset), n_lf.eq(f_chk.short),
                         n_sf.eq(sub_tail_at_0), n_pk.eq(t != FlitType.SUB_HEAD)]
        with m.Else():
            m.d.comb += [n_rm.eq(c_rm - k), n_lf.eq(c_rm <= 2 * W)]
            with m.If(is_tailtype | is_subtail):
                m.d.comb += [n_sb.eq(0), n_sf.eq(sub_tail_at_0)]
            with m.Else():
                m.d.comb += [n_sb.eq(frag_len), n_sf.eq(sub_tail_after)]
            with m.If(is_subtail):
                m.d.comb += n_fo.eq(c_fo + c_sb + W)

        here = locals()
        return SimpleNamespace(**{n: here[n] for n in _CHECKED})

    def _actions(self, m, s, x):
        """Accept / drop, commit / rollback, the buffer pointers and the commit register."""
        (fmt, V, abits, wptr, cptr, wp, hdr_fifo, len_fifo, f_v, f_vc, in_chk,
         cq_hv, cq_lv, cq_hd, cq_len) = (
         s.fmt, s.V, s.abits, s.wptr, s.cptr, s.wp, s.hdr_fifo, s.len_fifo, s.f_v,
         s.f_vc, s.in_chk, s.cq_hv, s.cq_lv, s.cq_hd, s.cq_len)
        (t, d, is_head, is_tailtype, is_ht, is_subtail, ph, frag_len, exp, c_st, c_hd, c_fo,
         n_st) = (x.t, x.d, x.is_head, x.is_tailtype, x.is_ht, x.is_subtail, x.ph,
                  x.frag_len, x.exp, x.c_st, x.c_hd, x.c_fo, x.n_st)
        f_chk = s.f_chk
        # ---------------------------------------------------------------- actions
        e_orphan, e_seq, e_flow, e_op, e_len = (Signal(name=n) for n in
                                                ("e_orphan", "e_seq", "e_flow", "e_op",
                                                 "e_len"))
        accept = Signal()
        wr = Signal()
        rollback = Signal()
        commit = Signal()

        with m.If(is_head):
            with m.If(c_st == ACTIVE):
                m.d.comb += [e_seq.eq(1), rollback.eq(1)]
            m.d.comb += [e_flow.eq(f_chk.e_flow), e_op.eq(f_chk.e_op),
                         e_len.eq(f_chk.e_len)]
            with m.If(f_chk.e_flow | f_chk.e_op | f_chk.e_len):
                m.d.comb += n_st.eq(Mux(is_ht, IDLE, DISCARD))
            with m.Else():
                m.d.comb += accept.eq(1)
                with m.If(is_ht):
                    m.d.comb += [n_st.eq(IDLE), commit.eq(1)]
                with m.Else():
                    m.d.comb += n_st.eq(ACTIVE)
        with m.Elif(c_st == IDLE):
            m.d.comb += [e_orphan.eq(1), n_st.eq(Mux(is_tailtype, IDLE, DISCARD))]
        with m.Elif(c_st == DISCARD):
            m.d.comb += n_st.eq(Mux(is_tailtype, IDLE, DISCARD))
        with m.Else():  # ACTIVE, payload flit
            with m.If(t == exp):
                m.d.comb += [accept.eq(1), wr.eq(1)]
                with m.If(is_tailtype | is_subtail):
                    m.d.comb += commit.eq(1)
                with m.If(is_tailtype):
                    m.d.comb += n_st.eq(IDLE)
            with m.Else():
                m.d.comb += [e_seq.eq(1), rollback.eq(1),
                             n_st.eq(Mux(is_tailtype, IDLE, DISCARD))]

        # buffer pointers.  The pop made sure that the slot at wptr is free, so every
        # checked flit is written there (the write enable is a register); only an accepted
        # payload flit moves wptr past it.
        c_wptr = Signal(abits + 1)
        for v in range(V):
            with m.If(f_vc == v):
                m.d.comb += c_wptr.eq(wptr[v])
            with m.If(in_chk[v]):
                with m.If(rollback):
                    m.d.sync += wptr[v].eq(cptr[v])
                with m.Elif(wr):
                    m.d.sync += wptr[v].eq(wptr[v] + 1)
                    with m.If(commit):
                        m.d.sync += cptr[v].eq(wptr[v] + 1)
        m.d.comb += [wp.addr.eq(Cat(c_wptr[:abits], f_vc)), wp.data.eq(d), wp.en.eq(f_v)]

        # commit register: the header / length of the fragment this flit would commit
        # (its data depend on the type alone: a HEAD_TAIL's own header, else the context's
        # with the fragment's offset and length); the FIFOs are written from registers
        commit_hd = Signal(fmt.header)
        with m.If(is_ht):
            # (a good HEAD_TAIL has length 0)
            m.d.comb += [commit_hd.dest.eq(ph.dest), commit_hd.src.eq(ph.src),
                         commit_hd.flow.eq(ph.flow), commit_hd.op.eq(ph.op),
                         commit_hd.step.eq(ph.step), commit_hd.offset.eq(ph.offset),
                         commit_hd.packet.eq(1), commit_hd.last.eq(1)]
        with m.Else():
            m.d.comb += [commit_hd.eq(c_hd), commit_hd.offset.eq(c_fo),
                         commit_hd.length.eq(frag_len), commit_hd.last.eq(is_tailtype)]
        m.d.comb += commit_hd.vc.eq(f_vc)
        m.d.sync += [cq_hd.eq(commit_hd), cq_len.eq(Cat(frag_len, f_vc)),
                     cq_hv.eq(f_v & commit),
                     # a payload commit has words (a message of length 0 is HEAD_TAIL)
                     cq_lv.eq(f_v & commit & wr)]
        m.d.comb += [hdr_fifo.w_data.eq(cq_hd), hdr_fifo.w_en.eq(cq_hv),
                     len_fifo.w_data.eq(cq_len), len_fifo.w_en.eq(cq_lv)]

        return e_orphan, e_seq, e_flow, e_op, e_len, accept, commit

    def _read_side(self, m, s):
        """Committed fragments out of the buffer (:class:`FragmentReader`)."""
        fmt, V, abits, fragw = s.fmt, s.V, s.abits, s.fragw
        m.submodules.reader = rd = FragmentReader(fmt, vcs=V, ptr_bits=abits + 1,
                                                  length_bits=fragw)
        wiring.connect(m, rd.data, wiring.flipped(self.data))
        m.d.comb += [rd.lengths.payload.eq(s.len_fifo.r_data),
                     rd.lengths.valid.eq(s.len_fifo.r_rdy),
                     s.len_fifo.r_en.eq(rd.lengths.ready),
                     s.rp.addr.eq(rd.buf_addr), s.rp.en.eq(rd.buf_en),
                     rd.buf_data.eq(s.rp.data)]
        m.d.comb += [rptr.eq(rd.read_ptr[v]) for v, rptr in enumerate(s.rptr)]

    def _status(self, m, s, overflow, errors, accept, commit):
        """The status counters (a component of their own) fed from the check stage."""
        m.submodules.status = counters = DepacketiserStatusCounters()
        wiring.connect(m, counters.status, wiring.flipped(self.status))
        ev = counters.events
        e_orphan, e_seq, e_flow, e_op, e_len = errors
        m.d.comb += [ev.orphan.eq(e_orphan), ev.seq.eq(e_seq), ev.flow.eq(e_flow),
                     ev.op.eq(e_op), ev.length.eq(e_len), counters.check_valid.eq(s.f_v),
                     counters.overflow.eq(overflow), counters.accepted.eq(accept),
                     counters.committed.eq(commit)]
