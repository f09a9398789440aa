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
* **Check** (:class:`FragmentCheck`, one cycle, never stalls): the popped flit is checked
  against its VC's context, which it updates; all of it is enabled by the register's valid
  bit, not by a decision of the same cycle.
* **Commit** (:class:`FragmentCommit`): the flit is written into the buffer; a fragment's
  header and length are registered, then written into the hdr / len FIFOs (room was
  reserved at the pop).  A fragment reaches the FIFOs two cycles after the pop of its last
  flit.

Components, in flit order: :class:`FlitInput` (input FIFOs, head checks, arbiter, check
register), :class:`FragmentCheck`, :class:`FragmentCommit`, :class:`FragmentReader`
(committed fragments out), :class:`DepacketiserStatusCounters`; :class:`Depacketiser` joins
them with the fragment buffer, the descriptor FIFOs and the pop flags.  Each stage has a
golden function in :mod:`treenic.hdl.link.model` (:func:`~treenic.hdl.link.model.check_flit`,
:func:`~treenic.hdl.link.model.commit_stage`, and :func:`~treenic.hdl.link.model.depacketise`
for the whole).
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
           "FragmentReader", "FlitInput", "FragmentCheck", "FragmentCommit", "DECISION",
           "CHECK_ERRORS", "HEAD_CHECKS"]

IDLE, ACTIVE, DISCARD = 0, 1, 2

#: the check stage's decision on the flit it holds
DECISION = data.StructLayout({
    "accept": 1,      # the flit is used (else dropped)
    "write": 1,       # an accepted payload flit: it stays in the buffer
    "rollback": 1,    # the open fragment is dropped
    "commit": 1,      # the flit completes a fragment
})
#: the errors the check stage raises for the flit it holds
CHECK_ERRORS = data.StructLayout({"orphan": 1, "seq": 1, "flow": 1, "op": 1, "length": 1})


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
    events : ``In(CHECK_ERRORS)``
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
            "events": In(CHECK_ERRORS),
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


class FragmentCheck(wiring.Component):
    """Check stage of the depacketiser: the held flit against its VC's message context.

    One context per VC: state (IDLE / ACTIVE / DISCARD), message header, words left, words
    in and offset of the open fragment, and two flags kept ahead in registers so that no
    subtract/compare sits between the context and the decision (a timing path): ``lastf``
    (the next payload flit is the message's last) and ``subtf`` (it ends a sub-packet).
    Every held flit updates its VC's context at the clock edge (the enable is the check
    register's valid bit, not a decision of the same cycle).  The decision, the errors and
    the header and length of the fragment the flit would commit are combinational from
    registers only (the held flit and the contexts); they are meaningful while
    ``held_valid``.  Semantics: the golden :func:`treenic.hdl.link.model.check_flit`.

    Parameters
    ----------
    fmt : FlitFormat
    sub_words : int
        Sub-packet length (words) the sender uses in message mode.
    length_bits : int
        Width of a fragment length (no fragment is longer than ``2**length_bits - 1``).

    Members
    -------
    held_valid : ``In(1)``
        The check register holds a flit.
    held_vc : ``In(fmt.vc_bits)``
    held : ``In(fmt.flit)``
    held_checks : ``In(HEAD_CHECKS)``
        The held flit's head checks (made by :class:`FlitInput` before the arbiter).
    decision : ``Out(DECISION)``
        accept / write (an accepted payload flit) / rollback / commit.
    errors : ``Out(CHECK_ERRORS)``
    commit_header : ``Out(fmt.header)``
        Header of the fragment the flit would commit (offset and length of the fragment,
        ``last`` if it ends the message).
    fragment_length : ``Out(length_bits)``
        Words in the open fragment once the (payload) flit is in.
    """

    def __init__(self, fmt: FlitFormat, *, sub_words: int, length_bits: int):
        if sub_words <= 0 or sub_words % fmt.lanes:
            raise ValueError("sub_words must be a positive multiple of the words per flit")
        if length_bits < 1:
            raise ValueError(f"length_bits must be positive, not {length_bits}")
        self.fmt, self.sub_words, self.length_bits = fmt, sub_words, length_bits
        super().__init__({
            "held_valid": In(1), "held_vc": In(fmt.vc_bits), "held": In(fmt.flit),
            "held_checks": In(HEAD_CHECKS),
            "decision": Out(DECISION), "errors": Out(CHECK_ERRORS),
            "commit_header": Out(fmt.header), "fragment_length": Out(length_bits)})

    def elaborate(self, platform):
        m = Module()
        V, f_v, f_vc = self.fmt.vcs, self.held_valid, self.held_vc
        # the check register holds a flit of VC v
        in_chk = [f_v if V == 1 else f_v & (f_vc == v) for v in range(V)]
        x = self._context(m, in_chk)
        self._decide(m, x)
        self._commit_header(m, x)
        return m

    def _context(self, m, in_chk):
        """The held flit's VC context, its decode and the context's next value."""
        fmt, W, V, fragw = self.fmt, self.fmt.lanes, self.fmt.vcs, self.length_bits
        f_vc, f_chk = self.held_vc, self.held_checks
        # ---------------------------------------------------------------- per-VC contexts
        st = [Signal(2, name=f"state{v}") for v in range(V)]
        pk = [Signal(name=f"pmode{v}") for v in range(V)]
        hd = [Signal(fmt.header, name=f"hdr{v}") for v in range(V)]
        # words left in the message, words in the open fragment, the fragment's offset and
        # the two flags kept ahead.  A fragment never exceeds max_frag words, so ``sub`` is
        # only as wide as a fragment length.
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

        t, is_head, is_tailtype, is_ht, is_subtail, ph, new_hd = self._decode(m)

        last_flit = c_lf
        k = Signal(range(W + 1))
        m.d.comb += k.eq(Mux(last_flit, c_rm, W))
        # words in the fragment once this flit is in (a fragment fits ``fragw`` bits)
        frag_len = self.fragment_length
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
        # Only the state depends on the checks (:meth:`_decide`).  Everything else is
        # loaded by any head and advanced by any other flit: a context that is not ACTIVE
        # is never read, and only a good head makes it ACTIVE (after reloading it), so the
        # checks stay off these registers' paths.  (A payload flit that is not the
        # message's last carries W words; a SUB_TAIL never is the last.)
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

        return SimpleNamespace(t=t, is_head=is_head, is_tailtype=is_tailtype, is_ht=is_ht,
                               is_subtail=is_subtail, ph=ph, exp=exp, c_st=c_st, c_hd=c_hd,
                               c_fo=c_fo, n_st=n_st)

    def _decode(self, m):
        """The held flit's type flags, its packet-head view and the header a head loads."""
        fmt, f, f_vc = self.fmt, self.held, self.held_vc
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
        return t, is_head, is_tailtype, is_ht, is_subtail, ph, new_hd

    def _decide(self, m, x):
        """Accept / drop, commit / rollback, the errors and the VC's next state."""
        f_chk, n_st, c_st = self.held_checks, x.n_st, x.c_st
        e, dec = self.errors, self.decision
        with m.If(x.is_head):
            with m.If(c_st == ACTIVE):
                m.d.comb += [e.seq.eq(1), dec.rollback.eq(1)]
            m.d.comb += [e.flow.eq(f_chk.e_flow), e.op.eq(f_chk.e_op),
                         e.length.eq(f_chk.e_len)]
            with m.If(f_chk.e_flow | f_chk.e_op | f_chk.e_len):
                m.d.comb += n_st.eq(Mux(x.is_ht, IDLE, DISCARD))
            with m.Else():
                m.d.comb += dec.accept.eq(1)
                with m.If(x.is_ht):
                    m.d.comb += [n_st.eq(IDLE), dec.commit.eq(1)]
                with m.Else():
                    m.d.comb += n_st.eq(ACTIVE)
        with m.Elif(c_st == IDLE):
            m.d.comb += [e.orphan.eq(1), n_st.eq(Mux(x.is_tailtype, IDLE, DISCARD))]
        with m.Elif(c_st == DISCARD):
            m.d.comb += n_st.eq(Mux(x.is_tailtype, IDLE, DISCARD))
        with m.Else():  # ACTIVE, payload flit
            with m.If(x.t == x.exp):
                m.d.comb += [dec.accept.eq(1), dec.write.eq(1)]
                with m.If(x.is_tailtype | x.is_subtail):
                    m.d.comb += dec.commit.eq(1)
                with m.If(x.is_tailtype):
                    m.d.comb += n_st.eq(IDLE)
            with m.Else():
                m.d.comb += [e.seq.eq(1), dec.rollback.eq(1),
                             n_st.eq(Mux(x.is_tailtype, IDLE, DISCARD))]

    def _commit_header(self, m, x):
        """The header of the fragment this flit would commit.  Its data depend on the type
        alone: a HEAD_TAIL's own header, else the context's with the fragment's offset and
        length."""
        commit_hd, ph = self.commit_header, x.ph
        with m.If(x.is_ht):
            # (a good HEAD_TAIL has length 0)
            m.d.comb += [commit_hd.dest.eq(ph.dest), commit_hd.src.eq(ph.src),
                         commit_hd.flow.eq(ph.flow), commit_hd.op.eq(ph.op),
                         commit_hd.step.eq(ph.step), commit_hd.offset.eq(ph.offset),
                         commit_hd.packet.eq(1), commit_hd.last.eq(1)]
        with m.Else():
            m.d.comb += [commit_hd.eq(x.c_hd), commit_hd.offset.eq(x.c_fo),
                         commit_hd.length.eq(self.fragment_length),
                         commit_hd.last.eq(x.is_tailtype)]
        m.d.comb += commit_hd.vc.eq(self.held_vc)


class FragmentCommit(wiring.Component):
    """Commit stage of the depacketiser: the fragment buffer's write side and the commit
    register.

    One circular region of ``2**region_bits`` flits per VC with a speculative write pointer
    and a committed end.  The pop made sure the slot at the write pointer is free, so every
    held flit is written there (the write enable is the check register's valid bit); only
    an accepted payload flit moves the write pointer past it, a commit moves the committed
    end with it, and a rollback moves the write pointer back to the committed end.  A
    commit's header and length (with the VC) are registered, then written into the
    descriptor FIFOs (room was reserved at the pop); a fragment without words queues no
    length.  Semantics: the golden :func:`treenic.hdl.link.model.commit_stage`.

    Parameters
    ----------
    fmt : FlitFormat
    region_bits : int
        log2 of a VC's buffer region (flits); the pointers carry one bit more.
    length_bits : int
        Width of a fragment length.

    Members
    -------
    held_valid : ``In(1)``
    held_vc : ``In(fmt.vc_bits)``
    held_data : ``In(fmt.width)``
        The held flit's data field.
    decision : ``In(DECISION)``
    commit_header : ``In(fmt.header)``
    fragment_length : ``In(length_bits)``
        From :class:`FragmentCheck`.
    buf_addr, buf_data, buf_en : ``Out``
        The fragment buffer's write port (address = VC, region pointer).
    write_ptr : ``Out(region_bits + 1).array(fmt.vcs)``
        Each region's write pointer (the pop's room check reads them).
    header_valid, header : ``Out``
        The commit register: write the header FIFO.
    length_valid, length : ``Out``
        The commit register: write the length FIFO (fragment length, then VC).
    """

    def __init__(self, fmt: FlitFormat, *, region_bits: int, length_bits: int):
        if region_bits < 0 or length_bits < 1:
            raise ValueError("region_bits must be >= 0 and length_bits positive")
        self.fmt, self.region_bits, self.length_bits = fmt, region_bits, length_bits
        super().__init__({
            "held_valid": In(1), "held_vc": In(fmt.vc_bits), "held_data": In(fmt.width),
            "decision": In(DECISION), "commit_header": In(fmt.header),
            "fragment_length": In(length_bits),
            "buf_addr": Out(region_bits + fmt.vc_bits), "buf_data": Out(fmt.width),
            "buf_en": Out(1),
            "write_ptr": Out(region_bits + 1).array(fmt.vcs),
            "header_valid": Out(1), "header": Out(fmt.header),
            "length_valid": Out(1), "length": Out(length_bits + fmt.vc_bits)})

    def elaborate(self, platform):
        m = Module()
        V, abits = self.fmt.vcs, self.region_bits
        f_v, f_vc, dec = self.held_valid, self.held_vc, self.decision
        wptr = self.write_ptr
        cptr = [Signal(abits + 1, name=f"cptr{v}") for v in range(V)]
        in_chk = [f_v if V == 1 else f_v & (f_vc == v) for v in range(V)]
        c_wptr = Signal(abits + 1)
        for v in range(V):
            with m.If(f_vc == v):
                m.d.comb += c_wptr.eq(wptr[v])
            with m.If(in_chk[v]):
                with m.If(dec.rollback):
                    m.d.sync += wptr[v].eq(cptr[v])
                with m.Elif(dec.write):
                    m.d.sync += wptr[v].eq(wptr[v] + 1)
                    with m.If(dec.commit):
                        m.d.sync += cptr[v].eq(wptr[v] + 1)
        m.d.comb += [self.buf_addr.eq(Cat(c_wptr[:abits], f_vc)),
                     self.buf_data.eq(self.held_data), self.buf_en.eq(f_v)]
        # the commit register: the FIFOs are written from registers
        m.d.sync += [self.header.eq(self.commit_header),
                     self.length.eq(Cat(self.fragment_length, f_vc)),
                     self.header_valid.eq(f_v & dec.commit),
                     # a payload commit has words (a message of length 0 is HEAD_TAIL)
                     self.length_valid.eq(f_v & dec.commit & dec.write)]
        return m


class Depacketiser(wiring.Component):
    """Flit stream -> checked fragments (see the module docstring for the stages).

    Parameters
    ----------
    fmt : FlitFormat
        Default ``FlitFormat()``.
    sub_words : int
        Sub-packet length (words) the sender uses (message mode).
    credits : int
        Input buffer depth per VC (the sender's initial credits).
    buf_flits : int or None
        Fragment buffer region per VC (flits, power of 2, >= the largest fragment);
        default twice the largest fragment.
    desc_depth : int
        hdr / len FIFO depth (>= 2).  The pop reserves room for the commits still in
        flight, so one fragment per cycle needs 7 (a distributed RAM holds 16 entries at
        the same cost).

    Members
    -------
    rx : ``In(LinkSignature(fmt))``
        Flits in, credits out (one per popped flit).
    hdr : ``Out(stream.Signature(fmt.header))``
        One per fragment: ``vc``, ``packet`` (came as normal packets), ``last`` (ends the
        message), route fields, ``flow, op, step``, ``offset`` of the fragment's first
        word, ``length`` (words).
    data : ``Out(stream.Signature(fmt.out_beat))``
        ``ceil(length/lanes)`` beats per fragment (``last`` on the final one; none for a
        zero-length fragment).
    flow_enable : ``In(fmt.flows)``
        Bit f set: flow f is known.
    status : ``Out(DepacketiserStatusSignature())``
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
        fmt, V = self.fmt, self.fmt.vcs

        # ---------------------------------------------------------------- input side
        m.submodules.input = inp = FlitInput(fmt, credits=self.credits)
        wiring.connect(m, wiring.flipped(self.rx), inp.rx)
        m.d.comb += inp.flow_enable.eq(self.flow_enable)

        # ---------------------------------------------------------------- fragment buffer
        # one circular region of D flits per VC: speculative write pointer, committed end
        # (FragmentCommit), read pointer (FragmentReader)
        D = self.buf_flits
        abits = ceil_log2(D)
        m.submodules.buf = buf = memory.Memory(shape=fmt.width, depth=D * V, init=[])
        wp = buf.write_port()
        rp = buf.read_port()
        fragw = ceil_log2(self.max_frag + 1)
        m.submodules.hdr_fifo = hdr_fifo = fifo.SyncFIFOBuffered(
            width=fmt.header.size, depth=self.desc_depth)
        m.submodules.len_fifo = len_fifo = fifo.SyncFIFOBuffered(
            width=fragw + fmt.vc_bits, depth=self.desc_depth)
        m.d.comb += [self.hdr.valid.eq(hdr_fifo.r_rdy),
                     self.hdr.payload.eq(hdr_fifo.r_data),
                     hdr_fifo.r_en.eq(self.hdr.ready)]

        # ---------------------------------------------------------------- check, commit
        # the check register (the popped flit, its VC and head checks) is in the input
        # side; the check stage decides, the commit stage writes the buffer and registers
        # the commit (header, length) for the descriptor FIFOs
        m.submodules.check = chk = FragmentCheck(fmt, sub_words=self.sub_words,
                                                 length_bits=fragw)
        m.submodules.commit = cmt = FragmentCommit(fmt, region_bits=abits, length_bits=fragw)
        m.d.comb += [chk.held_valid.eq(inp.held_valid), chk.held_vc.eq(inp.held_vc),
                     chk.held.eq(inp.held), chk.held_checks.eq(inp.held_checks),
                     cmt.held_valid.eq(inp.held_valid), cmt.held_vc.eq(inp.held_vc),
                     cmt.held_data.eq(inp.held.data), cmt.decision.eq(chk.decision),
                     cmt.commit_header.eq(chk.commit_header),
                     cmt.fragment_length.eq(chk.fragment_length),
                     wp.addr.eq(cmt.buf_addr), wp.data.eq(cmt.buf_data), wp.en.eq(cmt.buf_en),
                     hdr_fifo.w_data.eq(cmt.header), hdr_fifo.w_en.eq(cmt.header_valid),
                     len_fifo.w_data.eq(cmt.length), len_fifo.w_en.eq(cmt.length_valid)]

        # ---------------------------------------------------------------- read side
        m.submodules.reader = rd = FragmentReader(fmt, vcs=V, ptr_bits=abits + 1,
                                                  length_bits=fragw)
        wiring.connect(m, rd.data, wiring.flipped(self.data))
        m.d.comb += [rd.lengths.payload.eq(len_fifo.r_data),
                     rd.lengths.valid.eq(len_fifo.r_rdy),
                     len_fifo.r_en.eq(rd.lengths.ready),
                     rp.addr.eq(rd.buf_addr), rp.en.eq(rd.buf_en),
                     rd.buf_data.eq(rp.data)]

        # ---------------------------------------------------------------- pop flags
        f_v, f_vc = inp.held_valid, inp.held_vc
        in_chk = [f_v if V == 1 else f_v & (f_vc == v) for v in range(V)]
        ok_idle, ok_same, ok_other = self._pop_flags(
            m, SimpleNamespace(D=D, abits=abits, wptr=cmt.write_ptr, rptr=rd.read_ptr,
                               hdr_fifo=hdr_fifo, len_fifo=len_fifo, cq_hv=cmt.header_valid,
                               cq_lv=cmt.length_valid, f_v=f_v, in_chk=in_chk))
        m.d.comb += [inp.room_idle.eq(ok_idle), inp.room_same.eq(ok_same),
                     inp.room_other.eq(ok_other)]

        # ---------------------------------------------------------------- status
        m.submodules.status = counters = DepacketiserStatusCounters()
        wiring.connect(m, counters.status, wiring.flipped(self.status))
        m.d.comb += [counters.events.eq(chk.errors), counters.check_valid.eq(f_v),
                     counters.overflow.eq(inp.overflow),
                     counters.accepted.eq(chk.decision.accept),
                     counters.committed.eq(chk.decision.commit)]
        return m

    def _pop_flags(self, m, s):
        """Per VC: may the arbiter pop a flit (registered a cycle ahead)."""
        V = self.fmt.vcs
        (D, abits, wptr, rptr, hdr_fifo, len_fifo, cq_hv, cq_lv, f_v, in_chk) = (
         s.D, s.abits, s.wptr, s.rptr, s.hdr_fifo, s.len_fifo, s.cq_hv,
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
