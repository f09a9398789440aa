"""Depacketiser: flits -> checked fragments (header + binary32 words), credits back.

Receive path::

    rx.flit ──► per-VC input FIFO ──► round-robin ──► checker ──────► fragment buffer
                (≥ credits, buffered) VC arbiter      (per-VC         (one region per VC:
                  │ pop returns a credit (rx.credit)   context)        commit / rollback)
                  ▼                                                        │
              OVERFLOW if full               hdr FIFO ──► hdr     len FIFO ──► reader ──► data

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
  cause is kept in ``status.code``; ``status.clear`` zeroes them.  Status lags the flit
  that caused it by one cycle (events are registered before counting).
"""

from amaranth.hdl import Module, Signal, Mux, Cat, Const
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .flit import ErrorCause, FlitFormat, FlitType, LinkSignature, N_CAUSES, Op
from .model import DEFAULT_SUB_WORDS

__all__ = ["Depacketiser", "DepacketiserStatusSignature"]

IDLE, ACTIVE, DISCARD = 0, 1, 2


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
    """

    def __init__(self, fmt: FlitFormat | None = None, *, sub_words: int = DEFAULT_SUB_WORDS,
                 credits: int = 8, buf_flits: int | None = None, desc_depth: int = 4):
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

        # ---------------------------------------------------------------- input FIFOs
        fifos = []
        overflow = Signal()
        for v in range(V):
            # buffered: the head flit comes from a register, not through the distributed
            # RAM's read mux, into the decode/check logic below (a timing path).  One more
            # entry than credits: its w_rdy only counts the RAM part (depth - 1), which must
            # hold every flit in flight while the output register is being refilled
            f = fifo.SyncFIFOBuffered(width=fmt.flit.size, depth=self.credits + 1)
            m.submodules[f"vc{v}_fifo"] = f
            fifos.append(f)
            m.d.comb += [f.w_data.eq(rx.flit.as_value()),
                         f.w_en.eq(rx.valid & (rx.flit.vc == v))]
            with m.If(rx.valid & (rx.flit.vc == v) & ~f.w_rdy):
                m.d.comb += overflow.eq(1)
        if V < (1 << fmt.vc_bits):
            with m.If(rx.valid & (rx.flit.vc >= V)):
                m.d.comb += overflow.eq(1)

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
        space = Signal(V)
        for v in range(V):
            m.d.comb += space[v].eq((wptr[v] - rptr[v])[:abits + 1] < D)

        fragw = ceil_log2(self.max_frag + 1)
        m.submodules.hdr_fifo = hdr_fifo = fifo.SyncFIFOBuffered(
            width=fmt.header.size, depth=self.desc_depth)
        m.submodules.len_fifo = len_fifo = fifo.SyncFIFOBuffered(
            width=fragw + fmt.vc_bits, depth=self.desc_depth)
        m.d.comb += [self.hdr.valid.eq(hdr_fifo.r_rdy),
                     self.hdr.payload.eq(hdr_fifo.r_data),
                     hdr_fifo.r_en.eq(self.hdr.ready)]

        # ---------------------------------------------------------------- arbiter
        # round robin over the VCs that have a flit and buffer space; may switch VC on
        # every flit (a VC stuck in a message never blocks the others)
        elig = Signal(V)
        for v in range(V):
            m.d.comb += elig[v].eq(fifos[v].r_rdy & space[v])
        last_vc = Signal(fmt.vc_bits)
        sel = Signal(fmt.vc_bits)
        for v in range(V):
            with m.If(last_vc == v):
                for off in reversed(range(1, V + 1)):
                    cand = (v + off) % V
                    with m.If(elig[cand]):
                        m.d.comb += sel.eq(cand)
        cur_valid = Signal()
        cur = Signal(fmt.flit)
        for v in range(V):
            with m.If(sel == v):
                m.d.comb += [cur_valid.eq(elig[v]), cur.eq(fifos[v].r_data)]

        go = Signal()
        m.d.comb += go.eq(cur_valid & hdr_fifo.w_rdy & len_fifo.w_rdy)
        with m.If(go):
            m.d.sync += last_vc.eq(sel)
        credit = Signal(V)
        for v in range(V):
            m.d.comb += fifos[v].r_en.eq(go & (sel == v))
            m.d.comb += credit[v].eq(go & (sel == v))
        m.d.sync += rx.credit.eq(credit)

        # ---------------------------------------------------------------- per-VC contexts
        st = [Signal(2, name=f"state{v}") for v in range(V)]
        pk = [Signal(name=f"pmode{v}") for v in range(V)]
        hd = [Signal(fmt.header, name=f"hdr{v}") for v in range(V)]
        # words left in the message, words in the open fragment, the fragment's offset, and
        # two flags kept ahead in registers so that no subtract/compare sits between the
        # context and the accept/commit decision (a timing path): ``lastf`` = the next
        # payload flit is the message's last (left <= W), ``subtf`` = it ends a sub-packet
        # (in the fragment >= sub_words - W)
        rm = [Signal(fmt.length_bits, name=f"left{v}") for v in range(V)]
        sb = [Signal(fmt.length_bits, name=f"sub{v}") for v in range(V)]
        OW = len(hd[0].offset)
        fo = [Signal(OW, name=f"foff{v}") for v in range(V)]
        lf = [Signal(name=f"lastf{v}") for v in range(V)]
        sf = [Signal(name=f"subtf{v}") for v in range(V)]
        # (per-VC registers, the selected VC's context ``c_*``, its next value ``n_*``)
        shapes = [("state", 2), ("pmode", 1), ("hdr", fmt.header), ("left", fmt.length_bits),
                  ("sub", fmt.length_bits), ("foff", OW), ("lastf", 1), ("subtf", 1)]
        regs_all = [st, pk, hd, rm, sb, fo, lf, sf]
        cur_ctx = [Signal(shape, name=f"c_{n}") for n, shape in shapes]
        nxt = [Signal(shape, name=f"n_{n}") for n, shape in shapes]
        ctx = list(zip(regs_all, cur_ctx))
        c_st, c_pk, c_hd, c_rm, c_sb, c_fo, c_lf, c_sf = cur_ctx
        n_st, n_pk, n_hd, n_rm, n_sb, n_fo, n_lf, n_sf = nxt
        for v in range(V):
            with m.If(sel == v):
                m.d.comb += [c.eq(regs[v]) for regs, c in ctx]
        m.d.comb += [n.eq(c) for (_, c), n in zip(ctx, nxt)]
        with m.If(go):
            for v in range(V):
                with m.If(sel == v):
                    m.d.sync += [regs[v].eq(n) for (regs, _), n in zip(ctx, nxt)]

        # ---------------------------------------------------------------- decode
        t = cur.type
        d = cur.data
        is_head = Signal()
        is_tailtype = Signal()
        m.d.comb += [
            is_head.eq((t == FlitType.SUB_HEAD) | (t == FlitType.HEAD) |
                       (t == FlitType.HEAD_TAIL)),
            is_tailtype.eq((t == FlitType.MSG_TAIL) | (t == FlitType.TAIL)),
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
        m.d.comb += new_hd.vc.eq(sel)
        flow_en = Cat(self.flow_enable, Const(0, (1 << fmt.flow_bits)))
        flow_ok = Signal()
        m.d.comb += flow_ok.eq(flow_en.bit_select(new_hd.flow, 1))
        op_ok = Signal()
        m.d.comb += op_ok.eq((new_hd.op == Op.REDUCE) | (new_hd.op == Op.GATHER))
        len_bad = Signal()
        with m.Switch(t):
            with m.Case(FlitType.SUB_HEAD):
                m.d.comb += len_bad.eq(new_hd.length == 0)
            with m.Case(FlitType.HEAD):
                m.d.comb += len_bad.eq((new_hd.length == 0) |
                                       (new_hd.length > fmt.max_packet_words))
            with m.Case(FlitType.HEAD_TAIL):
                m.d.comb += len_bad.eq(new_hd.length != 0)

        last_flit = c_lf
        k = Signal(range(W + 1))
        m.d.comb += k.eq(Mux(last_flit, c_rm, W))
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

        # ---------------------------------------------------------------- actions
        e_orphan, e_seq, e_flow, e_op, e_len = (Signal(name=n) for n in
                                                ("e_orphan", "e_seq", "e_flow", "e_op",
                                                 "e_len"))
        accept = Signal()
        wr = Signal()
        rollback = Signal()
        commit = Signal()
        commit_hd = Signal(fmt.header)
        frag_len = Signal(fragw)

        with m.If(is_head):
            with m.If(c_st == ACTIVE):
                m.d.comb += [e_seq.eq(1), rollback.eq(1)]
            with m.If(~flow_ok):
                m.d.comb += e_flow.eq(1)
            with m.Elif(~op_ok):
                m.d.comb += e_op.eq(1)
            with m.Elif(len_bad):
                m.d.comb += e_len.eq(1)
            with m.If(~flow_ok | ~op_ok | len_bad):
                m.d.comb += n_st.eq(Mux(t == FlitType.HEAD_TAIL, IDLE, DISCARD))
            with m.Else():
                m.d.comb += [accept.eq(1), n_hd.eq(new_hd), n_rm.eq(new_hd.length),
                             n_sb.eq(0), n_fo.eq(new_hd.offset),
                             n_lf.eq(new_hd.length <= W), n_sf.eq(sub_tail_at_0),
                             n_pk.eq(t != FlitType.SUB_HEAD)]
                with m.If(t == FlitType.HEAD_TAIL):
                    m.d.comb += [n_st.eq(IDLE), commit.eq(1), commit_hd.eq(new_hd),
                                 commit_hd.last.eq(1), frag_len.eq(0)]
                with m.Else():
                    m.d.comb += n_st.eq(ACTIVE)
        with m.Elif(c_st == IDLE):
            m.d.comb += [e_orphan.eq(1), n_st.eq(Mux(is_tailtype, IDLE, DISCARD))]
        with m.Elif(c_st == DISCARD):
            m.d.comb += n_st.eq(Mux(is_tailtype, IDLE, DISCARD))
        with m.Else():  # ACTIVE, payload flit
            with m.If(t == exp):
                # (a payload flit that is not the message's last carries W words)
                m.d.comb += [accept.eq(1), wr.eq(1), n_rm.eq(c_rm - k), n_sb.eq(c_sb + k),
                             n_lf.eq(c_rm <= 2 * W), n_sf.eq(sub_tail_after)]
                with m.If(is_tailtype | (t == FlitType.SUB_TAIL)):
                    m.d.comb += [commit.eq(1), commit_hd.eq(c_hd),
                                 commit_hd.offset.eq(c_fo),
                                 commit_hd.length.eq(c_sb + k),
                                 commit_hd.last.eq(is_tailtype),
                                 frag_len.eq(c_sb + k), n_sb.eq(0),
                                 n_fo.eq(c_fo + c_sb + k), n_sf.eq(sub_tail_at_0)]
                with m.If(is_tailtype):
                    m.d.comb += n_st.eq(IDLE)
            with m.Else():
                m.d.comb += [e_seq.eq(1), rollback.eq(1),
                             n_st.eq(Mux(is_tailtype, IDLE, DISCARD))]

        # buffer pointers and descriptors
        c_wptr = Signal(abits + 1)
        for v in range(V):
            with m.If(sel == v):
                m.d.comb += c_wptr.eq(wptr[v])
                with m.If(go & rollback):
                    m.d.sync += wptr[v].eq(cptr[v])
                with m.Elif(go & wr):
                    m.d.sync += wptr[v].eq(wptr[v] + 1)
                    with m.If(commit):
                        m.d.sync += cptr[v].eq(wptr[v] + 1)
        m.d.comb += [wp.addr.eq(Cat(c_wptr[:abits], sel)), wp.data.eq(d),
                     wp.en.eq(go & wr)]
        m.d.comb += [hdr_fifo.w_data.eq(commit_hd), hdr_fifo.w_en.eq(go & commit),
                     len_fifo.w_data.eq(Cat(frag_len, sel)),
                     # a payload commit has words (a message of length 0 is HEAD_TAIL)
                     len_fifo.w_en.eq(go & commit & wr)]

        # ---------------------------------------------------------------- read side
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
                     rp.addr.eq(Cat(c_rptr[:abits], rvc)), rp.en.eq(issue)]
        with m.If(can_adv):
            m.d.sync += ov.eq(issue)
        with m.If(issue):
            m.d.sync += olast.eq(words_left <= W)
            for v in range(V):
                with m.If(rvc == v):
                    m.d.sync += rptr[v].eq(rptr[v] + 1)
        need = Signal()
        m.d.comb += need.eq((words_left == 0) | (issue & (words_left <= W)))
        m.d.comb += len_fifo.r_en.eq(need)
        with m.If(need & len_fifo.r_rdy):
            m.d.sync += [words_left.eq(len_fifo.r_data[:fragw]),
                         rvc.eq(len_fifo.r_data[fragw:])]
        with m.Elif(issue):
            m.d.sync += words_left.eq(Mux(words_left <= W, 0, words_left - W))
        m.d.comb += [self.data.valid.eq(ov), self.data.payload.data.eq(rp.data),
                     self.data.payload.last.eq(olast)]

        # ---------------------------------------------------------------- status
        s = self.status
        causes = {ErrorCause.ORPHAN: e_orphan, ErrorCause.SEQ: e_seq,
                  ErrorCause.FLOW: e_flow, ErrorCause.OP: e_op, ErrorCause.LENGTH: e_len}
        ev = {c: Signal(name=f"ev_{c.name.lower()}") for c in ErrorCause
              if c != ErrorCause.NONE}
        for c, sig in causes.items():
            m.d.comb += ev[c].eq(go & sig)
        m.d.comb += ev[ErrorCause.OVERFLOW].eq(overflow)
        # Events are registered before they are counted, so the counters' adders hang off
        # a register rather than the flit checks (a timing path); status lags one cycle.
        # A clear in an event's own cycle still drops it, as if counted and cleared.
        ev_q = {c: Signal(name=f"ev_{c.name.lower()}_q") for c in ev}
        drop_q = Signal(2)
        frag_q = Signal()
        m.d.sync += [ev_q[c].eq(sig & ~s.clear) for c, sig in ev.items()]
        m.d.sync += [drop_q.eq(Mux(s.clear, 0, (go & ~accept) + overflow)),
                     frag_q.eq(go & commit & ~s.clear)]
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
