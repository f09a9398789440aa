"""The treenic NIC core: schedule management (MultiTree paper §IV-A, Fig. 6), DMA, link
ports and in-NIC reduction.

::

           host bus (regs / table rows / buffer / step log)
                │
     ┌──────────┴────────────────────────────────────────────────────────────┐
     │  schedule table (lib.memory) ─► scan (per-flow: expected child ports,  │
     │      │                            gather parent port, chunk range)     │
     │      ▼                                                                 │
     │  head entry ─► issue logic ◄── timestep ctr, lockstep down-counter     │
     │      │   (REDUCE: children arrived; GATHER: parent arrived / root)     │
     │      ▼ start/size                                                      │
     │  TX unit p: DMA (lanes reads/cycle) ─► FIFO ─► Packetiser ─► tx[p]     │
     │                                                                        │
     │  rx[p] ─► Depacketiser ─► Skid ─► RX unit p: checks (flow role, range, │
     │        sequence) + order gate (§5: ascending (step, port) per element) │
     │        ─► buffer read ─► FP32Adder × lanes ─► buffer write             │
     │        ─► per-flow arrived bits (children / parent) ─► issue logic     │
     │                                                                        │
     │  gradient buffer (buffer.py): `banks` block RAMs, element e in bank    │
     │  e mod banks; a registered crossbar arbitrates reads and RX write      │
     │  slots (RX first; a GATHER beat takes a write slot only)               │
     └────────────────────────────────────────────────────────────────────────┘

Semantics implemented (what the golden model :mod:`treenic.hdl.nic.model` states):

* START scans the table once (one row per cycle): it validates every row (op, flow, range)
  and extracts per-flow facts used by the receive side -- the REDUCE entries' child ports
  (expected contributions), the GATHER entries' parent port and each flow's chunk range.
  A table with a bad row is rejected (SCAN_FAILED), nothing is sent or written.
* The head entry issues when ``step <= timestep`` and its dependencies hold: REDUCE --
  every child port's contribution for the flow is written back; GATHER -- the parent's
  data is written back (root: every expected contribution is); NOP -- loads the lockstep
  counter.  REDUCE sends the chunk to the parent port, GATHER to every child port at once
  (each TX unit runs its own DMA over the same chunk).  Entries that send nothing (the
  root's REDUCE, a leaf's receive-only GATHER) retire as soon as they are due: waiting for
  their data would block the sends behind them (head-of-line); later entries and DONE
  check the same arrival bits.
* The timestep advances when the lockstep counter is zero, every TX unit is idle and the
  head entry is for a later step.  DONE when every entry is retired, TX is idle and every
  expected receive is written back.
* Receive order (ARCHITECTURE §5): a REDUCE fragment covering elements [o, o+l) of flow f
  arriving on port p with step s may be accumulated only once every other port q that
  still owes a contribution to f is known to come later in (step, port) order, or, if q's
  contribution comes earlier, q has written back through o+l.  A port's future steps are
  bounded below by its current head/message step (links deliver in step order).  So
  concurrent contributions to one flow pipeline fragment by fragment, and skew or stalls
  never change the result.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..fp32 import FP32Adder
from ..skid import SkidBuffer
from ..link.flit import LinkSignature, Op
from ..link.packetiser import Packetiser
from ..link.depacketiser import Depacketiser
from .buffer import BankedBuffer, READ_LATENCY
from .params import (ErrBit, ID_VALUE, NicParams, PortCounter, Reg)
from .watchdog import Watchdog

__all__ = ["Nic", "HostSignature", "HOST_READ_LATENCY"]

#: cycles from a host read (``re``) to its ``rdata`` (every region; the buffer's read path)
HOST_READ_LATENCY = READ_LATENCY
#: TX unit FIFO (beats): covers the buffer's read latency plus the FIFO's own at full rate
TXQ_DEPTH = 1 << ceil_log2(READ_LATENCY + 4)

NOP, REDUCE, GATHER = 0, 1, 2


class HostSignature(wiring.Signature):
    """Host register/memory bus seen from the NIC (``In``): ``addr``, ``wdata``, ``we``,
    ``re``; ``rdata`` is valid :data:`HOST_READ_LATENCY` cycles after ``re`` (reads may be
    issued back to back)."""

    def __init__(self, addr_bits: int):
        super().__init__({"addr": In(addr_bits), "wdata": In(32), "we": In(1), "re": In(1),
                          "rdata": Out(32)})


class Nic(wiring.Component):
    """One NIC.  Ports: ``tx0..``/``rx0..`` links, ``host`` bus, ``start`` (same as CTRL
    START, for a fabric-wide start), ``done``/``running``/``error`` status wires; with
    ``link_crc=True`` also ``link_crc`` (In, one bit per port: the port's link CRC checker
    failed a sub-packet this cycle, see :mod:`treenic.hdl.link.crc`)."""

    def __init__(self, params: NicParams | None = None, *, link_crc: bool = False):
        self.p = p = params or NicParams()
        self.has_link_crc = bool(link_crc)
        self.fmt = p.fmt
        members = {"host": Out(HostSignature(p.addr_bits)), "start": In(1),
                   "done": Out(1), "running": Out(1), "error": Out(1)}
        for i in range(p.ports):
            members[f"tx{i}"] = Out(LinkSignature(self.fmt))
            members[f"rx{i}"] = In(LinkSignature(self.fmt))
        if self.has_link_crc:
            members["link_crc"] = In(p.ports)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p = self.p
        fmt = self.fmt
        P, W, F = p.ports, p.lanes, p.max_nodes
        AB = p.abits
        host = self.host

        R = p.region_bits
        region = host.addr[R:R + 2]
        off = host.addr[:R]
        start_req = Signal()
        m.d.comb += start_req.eq(self.start | (host.we & (region == 0) & (off == Reg.CTRL) &
                                               host.wdata[0]))
        start_q = Signal()                # registered START (fabric pin or CTRL write)
        m.d.sync += start_q.eq(start_req)
        run_init = Signal()
        # ------------------------------------------------------------ configuration regs
        node_id = Signal(16)
        n_entries = Signal(range(p.max_entries + 1))
        lockstep = Signal(32)
        elements = Signal(AB)
        nflows = Signal(range(F + 1))
        peer = [Signal(16, name=f"peer{i}") for i in range(P)]
        err_flags = Signal(len(ErrBit))
        err_count = Signal(32)
        err_n = Signal(range(4 * P + 10))  # number of events last cycle (registered)
        cycles = Signal(32)
        ts = Signal(p.step_bits)
        hp = Signal(range(p.max_entries + 1))
        lk = Signal(32)
        scan_failed = Signal()
        done = Signal()
        running = Signal()
        clear_req = Signal()
        clear = Signal()                  # registered: it resets counters across the core
        m.d.sync += clear.eq(clear_req)

        # ------------------------------------------------------------ memories
        RW = p.row_words
        m.submodules.table = table = memory.Memory(shape=RW * 32, depth=p.max_entries, init=[])
        t_wr = table.write_port(granularity=32)
        t_rd = table.read_port()
        # readers (in priority order): 0 host, 1..P RX (a stalled RX stalls its link),
        # P+1..2P TX; writers: 0..P-1 RX write-back, P host (only while not RUNNING).
        # Every RX beat writes back a fixed time after its grant, so the RX readers
        # reserve write slots; a GATHER beat reads nothing (write_only) and leaves the
        # banks' read ports to the TX streams
        m.submodules.buf = buf = BankedBuffer(depth=p.depth, banks=p.banks, lanes=W,
                                              readers=2 * P + 1, writers=P + 1,
                                              write_back=range(1, P + 1))
        m.submodules.steplog = steplog = memory.Memory(shape=32, depth=p.max_steps + 2, init=[])
        s_wr = steplog.write_port()
        s_rd = steplog.read_port()

        # ------------------------------------------------------------ per-flow state
        expect_red = [Signal(P, name=f"expect_red{f}") for f in range(F)]
        gport = [Signal(p.pport_bits, name=f"gport{f}", init=p.port_nil) for f in range(F)]
        fstart = [Signal(AB, name=f"fstart{f}") for f in range(F)]
        fsize = [Signal(AB, name=f"fsize{f}") for f in range(F)]
        fendt = [Signal(AB + 1, name=f"fend{f}") for f in range(F)]   # start + size, at scan
        A_gport = Array(gport)
        # ORDER region: step at which port q's contribution to flow f arrives (XNIL: unknown,
        # then the order gate falls back to the links' step lower bounds)
        XNIL = (1 << p.step_bits) - 1
        xstep = [[Signal(p.step_bits, name=f"xstep_p{q}_f{f}", init=XNIL) for f in range(F)]
                 for q in range(P)]
        A_xstep = [Array(xstep[q]) for q in range(P)]
        expect_bits = [Cat(*[expect_red[f][q] for f in range(F)]) for q in range(P)]
        A_fstart, A_fend = Array(fstart), Array(fendt)
        # arrived bits, owned per receiving port (no write conflicts)
        red_done = [Signal(F, name=f"red_done_p{q}") for q in range(P)]
        gat_done = [Signal(F, name=f"gat_done_p{q}") for q in range(P)]

        def red_done_of(flow):
            return Cat(*[red_done[q].bit_select(flow, 1) for q in range(P)])

        def gat_done_of(flow):
            return Cat(*[gat_done[q].bit_select(flow, 1) for q in range(P)]).any()

        # ------------------------------------------------------------ TX units
        # The issue decision and the TX units meet through registers (timing): ``tx_go``
        # is registered before it loads a unit (with the row's fields, ``tx_*``), and the
        # issue logic sees the units' idle flags a cycle late, masked for the two cycles
        # after a start, so a unit is never seen idle between its start and its load.
        tx_idle = Signal(P)
        tx_idle_q = Signal(P)
        tx_go = Signal(P)                 # start pulse from the issue logic
        tx_go_q = Signal(P)
        m.d.sync += [tx_go_q.eq(tx_go), tx_idle_q.eq(tx_idle & ~tx_go & ~tx_go_q)]
        tx_flow = Signal(p.flow_bits)
        tx_op = Signal(2)
        tx_step = Signal(p.step_bits)
        tx_start = Signal(AB)
        tx_size = Signal(AB)
        tx_counters = []
        tx_hdrs = []                      # (the watchdog names a stuck unit's flow / step)
        for i in range(P):
            pk = Packetiser(fmt, mode=p.mode, sub_words=p.sub_words,
                            packet_words=p.packet_words, credits=p.credits)
            m.submodules[f"pk{i}"] = pk
            wiring.connect(m, pk.tx, wiring.flipped(getattr(self, f"tx{i}")))
            q = fifo.SyncFIFOBuffered(width=W * 32, depth=TXQ_DEPTH)
            m.submodules[f"txq{i}"] = q
            brd = buf.rd[1 + P + i]
            addr = Signal(AB, name=f"tx{i}_addr")
            left = Signal(AB, name=f"tx{i}_left")
            inflight = Signal(READ_LATENCY, name=f"tx{i}_inflight")   # reads in flight
            hdr_pend = Signal(name=f"tx{i}_hdr_pend")
            hdr = Signal(fmt.header, name=f"tx{i}_hdr")
            words = Signal(32, name=f"tx{i}_words")
            issue = Signal(name=f"tx{i}_issue")
            # FIFO slots not yet claimed by a read (in flight or written): all but one, more
            # than the read latency + the buffered FIFO's two cycles from write to output,
            # so a granted stream runs at one beat per cycle.  The request is an AND of
            # two registers (``room`` and ``left_nz``): it feeds the cross-port bank grant.
            room = Signal(range(TXQ_DEPTH), init=TXQ_DEPTH - 1, name=f"tx{i}_room")
            left_nz = Signal(name=f"tx{i}_left_nz")
            pop = q.r_en & q.r_rdy
            m.d.comb += [brd.req.eq(left_nz & (room != 0)),
                         brd.addr.eq(addr), issue.eq(brd.grant)]
            m.d.sync += [inflight.eq(Cat(issue, inflight[:-1])), room.eq(room - issue + pop)]
            with m.If(issue):
                m.d.sync += [addr.eq(addr + W), left.eq(Mux(left > W, left - W, 0)),
                             left_nz.eq(left > W)]
            m.d.comb += [q.w_data.eq(brd.data), q.w_en.eq(brd.valid),
                         pk.data.payload.eq(q.r_data), pk.data.valid.eq(q.r_rdy),
                         q.r_en.eq(pk.data.ready),
                         pk.hdr.payload.eq(hdr),
                         # the head flit waits for the first data beat: no bubble on the
                         # link behind it while the buffer read is in flight
                         # (``~left_nz``, not ``left == 0``: no wide compare in front of
                         # the packetiser's header load)
                         pk.hdr.valid.eq(hdr_pend & (q.r_rdy | (~left_nz & (inflight == 0))))]
            with m.If(pk.hdr.valid & pk.hdr.ready):
                m.d.sync += hdr_pend.eq(0)
            m.d.comb += tx_idle[i].eq(~hdr_pend & ~left_nz & (inflight == 0) & ~q.r_rdy &
                                      pk.hdr.ready)
            with m.If(tx_go_q[i]):
                m.d.sync += [addr.eq(tx_start), left.eq(tx_size), left_nz.eq(tx_size != 0),
                             hdr_pend.eq(1),
                             hdr.vc.eq(0), hdr.next.eq(i), hdr.eject.eq(i),
                             hdr.dest.eq(peer[i]), hdr.src.eq(node_id),
                             hdr.flow.eq(tx_flow), hdr.op.eq(tx_op), hdr.step.eq(tx_step),
                             hdr.offset.eq(tx_start), hdr.length.eq(tx_size),
                             words.eq(words + tx_size)]
            with m.If(clear):
                m.d.sync += words.eq(0)
            tx_counters.append((pk.status.flits, pk.status.heads, words))
            tx_hdrs.append(hdr)

        # ------------------------------------------------------------ RX units
        # Each port's receive unit decides on a fragment header in three registered
        # stages and then streams the fragment from a descriptor register, so neither the
        # decision's logic (flow tables, the order gate over the other ports' state) nor
        # the bank grant sits in front of the ~100 registers an accept loads:
        #
        #   h0 -> h --S1--> table lookups --S2--> checks + snapshot of own and other
        #   ports' state --S3--> decision (good / bad + cause) --take--> nxt --> cur --> beats
        #
        # ``settle`` counts cycles since ``h`` or this port's own state last changed; the
        # decision register is trusted when it reached 3, i.e. when it was computed from
        # the header in ``h`` and a snapshot of the port's own state that is still current.
        # The other ports' state may have moved on since the snapshot: every order-gate
        # term only ever becomes more permissive while a header waits (a port's steps only
        # grow, ``done_to`` only grows within a message and restarts together with the
        # message fields it belongs to, a finished contribution drops out of ``need``), so
        # a stale "yes" is still a yes and a stale "no" only delays.
        #
        # exported per-port state for the other ports' order gates
        q_mact = [Signal(name=f"rx{i}_mact") for i in range(P)]       # message open
        q_mred = [Signal(name=f"rx{i}_mred") for i in range(P)]       # ... and REDUCE
        q_mflow = [Signal(p.flow_bits, name=f"rx{i}_mflow") for i in range(P)]
        q_mstep = [Signal(p.step_bits, name=f"rx{i}_mstep") for i in range(P)]
        # written back through: grows within a message, restarts at a new message's
        # accept -- in the same cycle as q_mflow/q_mstep change
        q_done_to = [Signal(AB + 1, name=f"rx{i}_done_to") for i in range(P)]
        q_lb = [Signal(p.step_bits, name=f"rx{i}_lb") for i in range(P)]
        q_hv = [Signal(name=f"rx{i}_hv") for i in range(P)]
        q_hstep = [Signal(p.step_bits, name=f"rx{i}_hstep") for i in range(P)]
        rx_counters = []
        rx_err = []
        flow_enable = Signal(F)
        for f in range(F):
            m.d.comb += flow_enable[f].eq(f < nflows)

        dps = []
        TAGW = AB + 1 + 1 + 1 + 32 + 1 + 1 + p.flow_bits + 1
        for i in range(P):
            dp = Depacketiser(fmt, sub_words=p.sub_words, credits=p.credits)
            dps.append(dp)
            m.submodules[f"dp{i}"] = dp
            wiring.connect(m, wiring.flipped(getattr(self, f"rx{i}")), dp.rx)
            m.d.comb += [dp.flow_enable.eq(flow_enable), dp.status.clear.eq(clear)]
            # payload skid buffer: the bank grant -- decided across all ports -- pops this
            # local register, not the depacketiser's read logic (a timing path)
            rxq = SkidBuffer(dp.data.payload.shape())
            m.submodules[f"rxq{i}"] = rxq
            wiring.connect(m, dp.data, rxq.i)
            rxd = rxq.o

            # --- header registers: ``h0`` takes the depacketiser's FIFO head, ``h`` holds
            # the header being decided; the fragment end is added up on the way in
            h0 = Signal(fmt.header, name=f"rx{i}_h0")
            h0v = Signal(name=f"rx{i}_h0v")
            h = Signal(fmt.header, name=f"rx{i}_h")
            hv = Signal(name=f"rx{i}_hv")
            hend = Signal(AB + 1, name=f"rx{i}_hend")
            take = Signal(name=f"rx{i}_take")
            load = Signal(name=f"rx{i}_load")        # h0 -> h
            m.d.comb += [load.eq(~hv & h0v), dp.hdr.ready.eq(~h0v | load)]
            with m.If(dp.hdr.valid & dp.hdr.ready):
                m.d.sync += [h0.eq(dp.hdr.payload), h0v.eq(1)]
            with m.Elif(load):
                m.d.sync += h0v.eq(0)
            with m.If(load):
                m.d.sync += [h.eq(h0), hv.eq(1), hend.eq(h0.offset + h0.length)]
            with m.Elif(take):
                m.d.sync += hv.eq(0)
            m.d.comb += [q_hv[i].eq(hv), q_hstep[i].eq(h.step)]

            own_evt = Signal(name=f"rx{i}_own_evt")   # this port finished a message
            settle = Signal(range(4), name=f"rx{i}_settle")
            with m.If(load | ~running):
                m.d.sync += settle.eq(0)
            with m.Elif(own_evt):
                m.d.sync += settle.eq(1)          # the lookups stay valid; S2, S3 redo
            with m.Elif(settle != 3):
                m.d.sync += settle.eq(settle + 1)

            fn = h.flow
            is_red = h.op == Op.REDUCE
            # --- S1: lookups of the header's flow in the tables (static while RUNNING)
            fs_k = Signal(AB, name=f"rx{i}_fstart")
            fend = Signal(AB + 1, name=f"rx{i}_fend")
            role_exp = Signal(name=f"rx{i}_role_exp")     # port i has a role in this flow
            step_ok = Signal(name=f"rx{i}_step_ok")
            xs_own = A_xstep[i][fn]
            m.d.sync += [fs_k.eq(A_fstart[fn]), fend.eq(A_fend[fn]),
                         role_exp.eq(Mux(is_red, expect_bits[i].bit_select(fn, 1),
                                         A_gport[fn] == i)),
                         step_ok.eq(~is_red | (xs_own == XNIL) | (xs_own == h.step))]
            # --- S2: checks of the header, snapshot of the port's own state
            range_ok = Signal(name=f"rx{i}_range_ok")
            at_start = Signal(name=f"rx{i}_at_start")
            mlast = Signal(name=f"rx{i}_mlast")           # ends the flow's chunk
            role_ok = Signal(name=f"rx{i}_role_ok")
            same_msg = Signal(name=f"rx{i}_same_msg")     # continues the open message
            mact_s = Signal(name=f"rx{i}_mact_s")
            off_ok = Signal(name=f"rx{i}_off_ok")
            step_ok2 = Signal(name=f"rx{i}_step_ok2")
            next_off = Signal(AB + 1, name=f"rx{i}_next_off")
            arrived = Mux(is_red, red_done[i], gat_done[i]).bit_select(fn, 1)
            m.d.sync += [range_ok.eq((h.offset >= fs_k) & (hend <= fend)),
                         at_start.eq(h.offset == fs_k), mlast.eq(hend == fend),
                         role_ok.eq(role_exp & ~arrived),
                         same_msg.eq(q_mact[i] & (q_mflow[i] == fn) & (q_mred[i] == is_red) &
                                     (q_mstep[i] == h.step)),
                         mact_s.eq(q_mact[i]), off_ok.eq(h.offset == next_off),
                         step_ok2.eq(step_ok)]
            # order gate (REDUCE only), per other port q: S1 looks up whether q owes this
            # flow a contribution and, from the ORDER table, whether it comes earlier in
            # (step, port) order; S2 snapshots q's live state; S3 combines
            gate = []
            for qq in range(P):
                if qq == i:
                    continue
                exp_q = Signal(name=f"rx{i}_exp{qq}")
                xs_q = Signal(p.step_bits, name=f"rx{i}_xstep{qq}")   # ORDER table entry
                m.d.sync += [exp_q.eq(expect_bits[qq].bit_select(fn, 1)),
                             xs_q.eq(A_xstep[qq][fn])]

                def before(step):                 # q's step precedes this header's
                    return (step <= h.step) if qq < i else (step < h.step)

                need = Signal(name=f"rx{i}_need{qq}")       # q still owes flow f
                known2 = Signal(name=f"rx{i}_known2_{qq}")
                xb2 = Signal(name=f"rx{i}_xbefore2_{qq}")
                on_f = Signal(name=f"rx{i}_on_f{qq}")       # q's open message is on f
                q_before = Signal(name=f"rx{i}_qbefore{qq}")  # q's next step precedes
                reach = Signal(name=f"rx{i}_reach{qq}")     # q wrote f through hend
                m.d.sync += [
                    need.eq(exp_q & ~red_done[qq].bit_select(fn, 1)),
                    known2.eq(xs_q != XNIL),
                    xb2.eq((xs_q < h.step) | ((xs_q == h.step) & (qq < i))),
                    on_f.eq(q_mact[qq] & q_mred[qq] & (q_mflow[qq] == fn)),
                    # q's future steps are bounded below by its open message's step, else
                    # its waiting header's, else the last step it received
                    q_before.eq(Mux(q_mact[qq], before(q_mstep[qq]),
                                    Mux(q_hv[qq], before(q_hstep[qq]), before(q_lb[qq])))),
                    reach.eq(q_done_to[qq] >= hend)]
                ok = Mux(known2, ~xb2 | (on_f & reach), ~q_before | (on_f & reach))
                gate.append(~need | ok)
            order_ok = Cat(*gate).all() if gate else Const(1)
            # --- S3: the decision
            dec_good = Signal(name=f"rx{i}_dec_good")
            dec_bad = Signal(name=f"rx{i}_dec_bad")
            c_range = Signal(name=f"rx{i}_c_range")
            c_unexp = Signal(name=f"rx{i}_c_unexp")
            c_seq = Signal(name=f"rx{i}_c_seq")
            same3 = Signal(name=f"rx{i}_same3")
            mlast3 = Signal(name=f"rx{i}_mlast3")
            seq_ok = Mux(same_msg, off_ok, at_start) & step_ok2
            good = range_ok & role_ok & seq_ok
            may_start = same_msg | ~mact_s      # a new message waits for the last one
            m.d.sync += [dec_good.eq(good & may_start & (~is_red | order_ok)),
                         dec_bad.eq(~good & may_start),
                         c_range.eq(~range_ok), c_unexp.eq(range_ok & ~role_ok),
                         c_seq.eq(range_ok & role_ok & ~seq_ok),
                         same3.eq(same_msg), mlast3.eq(mlast)]

            # --- take: the decided header becomes the next fragment descriptor
            frags = Signal(32, name=f"rx{i}_frags")
            rwords = Signal(32, name=f"rx{i}_words")
            bad = Signal(32, name=f"rx{i}_bad")
            ev_range = Signal(name=f"rx{i}_ev_range")
            ev_unexp = Signal(name=f"rx{i}_ev_unexp")
            ev_seq = Signal(name=f"rx{i}_ev_seq")
            rx_err.append((ev_range, ev_unexp, ev_seq))
            desc_lay = data.StructLayout({"addr": AB + 1, "left": AB + 1, "last": 1, "red": 1,
                                          "flow": p.flow_bits, "mlast": 1, "drop": 1})
            nxt = Signal(desc_lay, name=f"rx{i}_nxt")
            nv = Signal(name=f"rx{i}_nv")
            cur = Signal(desc_lay, name=f"rx{i}_cur")
            cur_v = Signal(name=f"rx{i}_cur_v")
            decided = Signal(name=f"rx{i}_decided")
            take_good = Signal(name=f"rx{i}_take_good")
            take_bad = Signal(name=f"rx{i}_take_bad")
            m.d.comb += [decided.eq(hv & running & (settle == 3) & ~nv),
                         take_good.eq(decided & dec_good), take_bad.eq(decided & dec_bad),
                         take.eq(take_good | take_bad)]
            with m.If(take):
                m.d.sync += [nxt.addr.eq(h.offset), nxt.left.eq(h.length),
                             nxt.last.eq(h.length <= W), nxt.red.eq(is_red),
                             nxt.flow.eq(fn), nxt.mlast.eq(mlast3), nxt.drop.eq(take_bad),
                             nv.eq(h.length != 0)]
            with m.If(take_good):
                m.d.sync += [q_mact[i].eq(1), q_mred[i].eq(is_red),
                             q_mflow[i].eq(fn), q_mstep[i].eq(h.step),
                             q_lb[i].eq(h.step), next_off.eq(hend), frags.eq(frags + 1)]
                with m.If(~same3):
                    m.d.sync += q_done_to[i].eq(h.offset)
            with m.If(take_bad):
                m.d.comb += [ev_range.eq(c_range), ev_unexp.eq(c_unexp), ev_seq.eq(c_seq)]
                m.d.sync += bad.eq(bad + 1)

            # --- stream the current fragment: each beat once the buffer grants its read
            # (bank arbitration) or, for a dropped fragment, as it comes
            brd, bwr = buf.rd[1 + i], buf.wr[i]
            beat = Signal(name=f"rx{i}_beat")
            m.d.comb += [brd.req.eq(cur_v & ~cur.drop & rxd.valid), brd.addr.eq(cur.addr),
                         brd.write_only.eq(~cur.red),
                         rxd.ready.eq(Mux(cur.drop, cur_v, brd.grant)),
                         beat.eq(Mux(cur.drop, cur_v & rxd.valid, brd.grant))]
            with m.If(beat & ~cur.last):
                m.d.sync += [cur.addr.eq(cur.addr + W), cur.left.eq(cur.left - W),
                             cur.last.eq(cur.left <= 2 * W)]
            with m.If((beat & cur.last) | ~cur_v):
                m.d.sync += [cur.eq(nxt), cur_v.eq(nv)]
                with m.If(nv):
                    m.d.sync += nv.eq(0)

            # stage 0 of the beat pipeline (loads every cycle, ``v`` says whether it holds
            # a beat); the read data meets the beat READ_LATENCY cycles later at the adders
            adders = [FP32Adder(tag_width=TAGW) for _ in range(W)]
            for k, ad in enumerate(adders):
                m.submodules[f"rx{i}_add{k}"] = ad
                m.d.comb += ad.o.ready.eq(1)
            beat_lay = data.StructLayout({"v": 1, "data": W * 32, "addr": AB + 1, "mask": W,
                                          "red": 1, "flast": 1, "mlast": 1,
                                          "flow": p.flow_bits})
            st = [Signal(beat_lay, name=f"rx{i}_st{k}") for k in range(READ_LATENCY)]
            m.d.sync += [st[0].v.eq(beat & ~cur.drop),
                         st[0].data.eq(rxd.payload.data), st[0].addr.eq(cur.addr),
                         st[0].red.eq(cur.red), st[0].flast.eq(cur.last),
                         st[0].mlast.eq(cur.mlast & cur.last), st[0].flow.eq(cur.flow),
                         st[0].mask.eq(Cat(*[cur.left > k for k in range(W)]))]
            # words received, counted from the registered beat (the grant stays off this
            # 32-bit adder's enable)
            with m.If(st[0].v):
                m.d.sync += rwords.eq(rwords + sum(st[0].mask[k] for k in range(W)))
            m.d.sync += [st[k].eq(st[k - 1]) for k in range(1, READ_LATENCY)]
            s1 = st[-1]
            # -> adders (tag carries everything needed at write-back)
            tag_lay = data.StructLayout({"addr": AB + 1, "en": 1, "red": 1, "b": 32,
                                         "flast": 1, "mlast": 1, "flow": p.flow_bits,
                                         "pad": 1})
            wb = []
            for k, ad in enumerate(adders):
                t = Signal(tag_lay, name=f"rx{i}_tag{k}")
                b_k = s1.data[32 * k:32 * k + 32]
                m.d.comb += [t.addr.eq(s1.addr + k), t.en.eq(s1.mask[k]), t.red.eq(s1.red),
                             t.b.eq(b_k), t.flast.eq(s1.flast),
                             t.mlast.eq(s1.mlast), t.flow.eq(s1.flow),
                             ad.i.valid.eq(s1.v), ad.i.payload.a.eq(brd.data[32 * k:32 * k + 32]),
                             ad.i.payload.b.eq(b_k), ad.i.payload.tag.eq(t)]
                ot = data.View(tag_lay, ad.o.payload.tag)
                # write-back register: the sum leaves the adder for this register only, so
                # the adder's last stage stays compact; the long trip to the bank write
                # muxes starts here (a timing path).  Progress and completion below follow
                # this register, so nothing can read ahead of the write it waits for.
                wv = Signal(name=f"rx{i}_wbv{k}")
                wt = Signal(tag_lay, name=f"rx{i}_wbt{k}")
                wd = Signal(32, name=f"rx{i}_wbd{k}")
                m.d.sync += [wv.eq(ad.o.valid), wt.eq(ot),
                             wd.eq(Mux(ot.red, ad.o.payload.sum, ot.b))]
                wb.append((wv, wt, wd))
            # write-back: every lane's adder has the same latency, lane k is element addr + k
            m.d.comb += [bwr.addr.eq(wb[0][1].addr),
                         bwr.en.eq(Cat(*[v & t.en for v, t, _ in wb])),
                         bwr.data.eq(Cat(*[d for _, _, d in wb]))]
            # write-back of a fragment's last beat: progress, message completion
            v0, t0, _ = wb[0]
            nen = sum(t.en for _, t, _ in wb)
            m.d.comb += own_evt.eq(v0 & t0.flast & t0.mlast)
            with m.If(v0 & t0.flast):
                m.d.sync += q_done_to[i].eq(t0.addr + nen)
                with m.If(t0.mlast):
                    m.d.sync += q_mact[i].eq(0)
                    with m.If(t0.red):
                        m.d.sync += red_done[i].bit_select(t0.flow, 1).eq(1)
                    with m.Else():
                        m.d.sync += gat_done[i].bit_select(t0.flow, 1).eq(1)
            with m.If(clear):
                m.d.sync += [frags.eq(0), rwords.eq(0), bad.eq(0), q_mact[i].eq(0),
                             q_lb[i].eq(0), red_done[i].eq(0), gat_done[i].eq(0)]
            with m.If(run_init):
                m.d.sync += [q_mact[i].eq(0), q_lb[i].eq(0)]
            rx_counters.append((frags, rwords, dp.status.counts[0], dp.status.dropped, bad))

        # ------------------------------------------------------------ scan + issue logic
        # the table row is registered out of the RAM (slow clock-to-out) before the scan
        # checks and the issue logic look at it: a row is seen two cycles after its address
        e_q = Signal(p.row.size)
        m.d.sync += e_q.eq(t_rd.data[:p.row.size])
        e = data.View(p.row, e_q)
        head_ok = Signal()
        head_ok2 = Signal()               # ... and its issue terms (hd_*) registered
        head_w = Signal()                 # head row read, in the register next cycle
        scan_i = Signal(range(p.max_entries + 1))
        scan_p = Signal()                 # a row read is in flight
        scan_v = Signal()                 # ... and in ``e`` now
        scan_bad = Signal()
        sc_v = Signal()                   # scan stage 2: the row and its checks
        sc = Signal(p.row)
        sc_end = Signal(AB + 1)
        sc_bad_op = Signal()
        sc_bad_rng = Signal()
        sc3 = Signal(p.row)               # scan stage 3: the row and its flow's write enable
        sc3_end = Signal(AB + 1)
        sc3_we = Signal(F)
        tx_all_idle = tx_idle_q.all()
        # every expected receive (REDUCE contributions, GATHER from the parent) written back
        # (registered: it only grows while RUNNING, so one cycle late is only conservative)
        rx_all_done = Signal()
        m.d.sync += rx_all_done.eq(Cat(*[
            ((expect_red[f] & ~Cat(*[red_done[q][f] for q in range(P)])) == 0) &
            ((gport[f] == p.port_nil) | Cat(*[gat_done[q][f] for q in range(P)]).any())
            for f in range(F)]).all())
        issue_evt = Signal()
        step_start = Signal(32)
        ev_badop = Signal()
        ev_erange = Signal()
        ev_tindex = Signal()
        ev_hrange = Signal()

        m.d.sync += [tx_flow.eq(e.flow), tx_op.eq(e.op), tx_step.eq(e.step),
                     tx_start.eq(e.start), tx_size.eq(e.size)]
        # The head entry's issue terms are registered from the row (``e``) every cycle and
        # used a cycle later (``head_ok2``).  What they read only becomes more permissive
        # while the head waits (arrival bits are set, never cleared, while RUNNING; units go
        # idle on their own but are started only here, and a start retires the head), so
        # a registered "yes" is still true; the timestep moving on forces a recompute.
        hd_due = Signal()                 # the entry's step has come
        hd_none = Signal()                # it sends nothing (root REDUCE, receive-only, empty)
        hd_deps = Signal()                # its data dependencies are written back
        hd_ports = Signal(P)              # the TX units it starts
        hd_idle = Signal()                # ... and they are idle
        send_ports = Signal(P)
        with m.Switch(e.op):
            with m.Case(REDUCE):
                for i in range(P):
                    m.d.comb += send_ports[i].eq(e.pport == i)
            with m.Case(GATHER):
                m.d.comb += send_ports.eq(e.cports)
        exp_f = Cat(*[expect_bits[q].bit_select(e.flow, 1) for q in range(P)])
        root_ok = (exp_f & ~red_done_of(e.flow)) == 0
        m.d.sync += [hd_due.eq(e.step <= ts), hd_ports.eq(send_ports),
                     hd_none.eq((send_ports == 0) | (e.size == 0)),
                     hd_deps.eq(Mux(e.op == REDUCE, (e.cports & ~red_done_of(e.flow)) == 0,
                                    Mux(e.pport == p.port_nil, root_ok, gat_done_of(e.flow)))),
                     hd_idle.eq((send_ports & ~tx_idle_q) == 0)]
        # defaults for the table read port: head entry
        m.d.comb += t_rd.addr.eq(hp)
        with m.FSM(name="sched"):
            with m.State("IDLE"):
                with m.If(start_q):
                    with m.If(n_entries > p.max_entries):
                        m.d.comb += ev_tindex.eq(1)
                        m.d.sync += scan_failed.eq(1)
                    with m.Else():
                        m.d.sync += [done.eq(0), scan_failed.eq(0)]
                        m.next = "INIT"
            with m.State("INIT"):
                # a cycle of its own to reset the scan and every flow's tables: their
                # enables then come from the state register, not from the START decode
                m.d.sync += [scan_i.eq(0), scan_p.eq(0), scan_v.eq(0), sc_v.eq(0),
                             sc3_we.eq(0), scan_bad.eq(0), cycles.eq(0)]
                for f in range(F):
                    m.d.sync += [expect_red[f].eq(0), gport[f].eq(p.port_nil),
                                 fstart[f].eq(0), fsize[f].eq(0), fendt[f].eq(0)]
                m.next = "SCAN"
            with m.State("SCAN"):
                # three stages per row: read, checks (a carry chain) registered with the
                # row, per-flow table writes
                m.d.comb += t_rd.addr.eq(scan_i)
                with m.If(scan_i < n_entries):
                    m.d.sync += scan_i.eq(scan_i + 1)
                m.d.sync += [scan_p.eq(scan_i < n_entries), scan_v.eq(scan_p),
                             sc_v.eq(scan_v), sc.eq(e), sc_end.eq(e.start + e.size),
                             sc_bad_op.eq(e.op == 3),
                             sc_bad_rng.eq((e.op != NOP) & (((e.start + e.size) > elements) |
                                                            (e.flow >= nflows)))]
                with m.If(sc_v):
                    with m.If(sc_bad_op):
                        m.d.comb += ev_badop.eq(1)
                        m.d.sync += scan_bad.eq(1)
                    with m.Elif(sc_bad_rng):
                        m.d.comb += ev_erange.eq(1)
                        m.d.sync += scan_bad.eq(1)
                # stage 3: each flow's table registers load from a registered one-hot
                # enable (the decode would otherwise fan out to all of them)
                row_ok = sc_v & ~sc_bad_op & ~sc_bad_rng & (sc.op != NOP)
                m.d.sync += [sc3.eq(sc), sc3_end.eq(sc_end),
                             sc3_we.eq(Mux(row_ok, Const(1, F) << sc.flow, 0))]
                for f in range(F):
                    with m.If(sc3_we[f]):
                        m.d.sync += [fstart[f].eq(sc3.start), fsize[f].eq(sc3.size),
                                     fendt[f].eq(sc3_end)]
                        with m.If(sc3.op == REDUCE):
                            m.d.sync += expect_red[f].eq(expect_red[f] | sc3.cports)
                        with m.If((sc3.op == GATHER) & (sc3.pport != p.port_nil)):
                            m.d.sync += gport[f].eq(sc3.pport)
                with m.If((sc3_we == 0) & ~sc_v & ~scan_v & ~scan_p & (scan_i == n_entries)):
                    m.next = "FINISH"
            with m.State("FINISH"):
                with m.If(scan_bad):
                    m.d.sync += scan_failed.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    # empty chunks: nothing is sent, count them as arrived
                    for q in range(P):
                        m.d.sync += [red_done[q].eq(Cat(*[(fsize[f] == 0) & expect_red[f][q]
                                                          for f in range(F)])),
                                     gat_done[q].eq(Cat(*[(fsize[f] == 0) & (gport[f] == q)
                                                          for f in range(F)]))]
                    m.d.comb += run_init.eq(1)
                    m.d.sync += [hp.eq(0), head_w.eq(0), head_ok.eq(0), head_ok2.eq(0),
                                 ts.eq(1), lk.eq(0),
                                 running.eq(1), step_start.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.sync += [cycles.eq(cycles + 1), head_w.eq(1), head_ok.eq(head_w),
                             head_ok2.eq(head_ok)]
                with m.If(lk != 0):
                    m.d.sync += lk.eq(lk - 1)
                advance = Signal()
                with m.If(hp >= n_entries):
                    with m.If(tx_all_idle & rx_all_done):
                        m.d.comb += [s_wr.addr.eq(ts), s_wr.data.eq(cycles - step_start),
                                     s_wr.en.eq(1)]
                        m.d.sync += [running.eq(0), done.eq(1)]
                        m.next = "IDLE"
                with m.Elif(head_ok2):
                    with m.If(hd_due):
                        with m.Switch(e.op):
                            with m.Case(NOP):
                                m.d.sync += lk.eq(lockstep)
                                m.d.comb += advance.eq(1)
                            with m.Case(REDUCE):
                                # an entry that sends nothing (root, empty chunk) retires at
                                # once: it must not block the sends behind it (head-of-line);
                                # its completion is what later entries and DONE wait for
                                with m.If(hd_none):
                                    m.d.comb += advance.eq(1)
                                with m.Elif(hd_deps & hd_idle):
                                    m.d.comb += [tx_go.eq(hd_ports), advance.eq(1)]
                            with m.Case(GATHER):
                                with m.If(hd_none):
                                    m.d.comb += advance.eq(1)      # receive-only: see above
                                with m.Elif(hd_deps & hd_idle):
                                    m.d.comb += [tx_go.eq(hd_ports), advance.eq(1)]
                    with m.Elif((lk == 0) & tx_all_idle):
                        m.d.comb += [s_wr.addr.eq(ts), s_wr.data.eq(cycles - step_start),
                                     s_wr.en.eq(1)]
                        # the head's terms were computed with the old timestep: redo them
                        m.d.sync += [ts.eq(ts + 1), step_start.eq(cycles), head_ok2.eq(0)]
                with m.If(advance):
                    m.d.sync += [hp.eq(hp + 1), head_w.eq(0), head_ok.eq(0), head_ok2.eq(0)]
        m.d.comb += [self.done.eq(done), self.running.eq(running)]

        # ------------------------------------------------------------ fault detection
        # (issue 19 items 12-13: the watchdog and the link-CRC counters; see watchdog.py)
        wd_limit, wdog, crc_errs, ev_crc = self._fault_detection(
            m, running=running, clear=clear, lk=lk, hp=hp, ts=ts, e=e, n_entries=n_entries,
            tx_idle=tx_idle, tx_hdrs=tx_hdrs, expect_red=expect_red, red_done=red_done,
            gat_done=gat_done, gport=gport, red_done_of=red_done_of,
            gat_done_of=gat_done_of, exp_f=exp_f)

        # ------------------------------------------------------------ host bus
        rsel = Signal(2)
        m.d.sync += rsel.eq(region)
        # writes
        with m.If(host.we):
            with m.Switch(region):
                with m.Case(0):
                    with m.Switch(off):
                        with m.Case(Reg.CTRL):
                            with m.If(host.wdata[1]):
                                m.d.comb += clear_req.eq(1)
                        with m.Case(Reg.NODE):
                            m.d.sync += node_id.eq(host.wdata)
                        with m.Case(Reg.ENTRIES):
                            m.d.sync += n_entries.eq(Mux(host.wdata > p.max_entries,
                                                         p.max_entries + 1, host.wdata))
                            with m.If(host.wdata > p.max_entries):
                                m.d.comb += ev_tindex.eq(1)
                        with m.Case(Reg.WATCHDOG):
                            m.d.sync += wd_limit.eq(host.wdata)
                        with m.Case(Reg.LOCKSTEP):
                            m.d.sync += lockstep.eq(host.wdata)
                        with m.Case(Reg.ELEMENTS):
                            with m.If(host.wdata > p.depth):
                                m.d.comb += ev_hrange.eq(1)
                            with m.Else():
                                m.d.sync += elements.eq(host.wdata)
                        with m.Case(Reg.FLOWS):
                            with m.If(host.wdata > F):
                                m.d.comb += ev_hrange.eq(1)
                            with m.Else():
                                m.d.sync += nflows.eq(host.wdata)
                        for i in range(P):
                            with m.Case(Reg.PEER + i):
                                m.d.sync += peer[i].eq(host.wdata)
                with m.Case(1):
                    SB = ceil_log2(p.row_stride)
                    row = off >> SB
                    word = off[:SB] if SB else Const(0, 1)
                    with m.If((row < p.max_entries) & (word < RW) & ~running):
                        m.d.comb += [t_wr.addr.eq(row), t_wr.data.eq(host.wdata.replicate(RW)),
                                     t_wr.en.eq((Const(1, RW) << word)[:RW])]
                    with m.Else():
                        m.d.comb += ev_tindex.eq(1)
                with m.Case(3):
                    PS = max(1, ceil_log2(P))
                    with m.If(~running):
                        for q in range(P):
                            for f in range(F):
                                with m.If(off == (f << PS) + q):
                                    m.d.sync += xstep[q][f].eq(host.wdata)
                with m.Case(2):
                    with m.If((off < p.depth) & ~running):
                        m.d.comb += buf.wr[P].en.eq(1)
                    with m.Else():
                        m.d.comb += ev_hrange.eq(1)
        # reads
        # the host is the buffer's first reader (never refused, so reads also work while
        # RUNNING) and its last writer (writes only while not RUNNING, so never contended)
        m.d.comb += [buf.rd[0].req.eq(host.re & (region == 2)), buf.rd[0].addr.eq(off),
                     buf.wr[P].addr.eq(off), buf.wr[P].data.eq(host.wdata),
                     s_rd.addr.eq(off)]
        # Register reads: the offset is registered a cycle after ``re``; then each group of
        # registers (the core's own, each port's counters) is multiplexed into a register
        # of its own, and the groups into ``rreg`` -- two short levels instead of one
        # 40-way mux across the die.  Registers answer three cycles after ``re``, the step
        # log one: both are brought to the same point and delayed to HOST_READ_LATENCY.
        rre = Signal()
        roff = Signal.like(off)
        m.d.sync += [rre.eq(host.re & (region == 0)), roff.eq(off)]
        status = Cat(running, done, err_flags.any(), scan_failed)
        groups = [{Reg.ID: ID_VALUE, Reg.STATUS: status, Reg.NODE: node_id,
                   Reg.ENTRIES: n_entries, Reg.LOCKSTEP: lockstep, Reg.ELEMENTS: elements,
                   Reg.FLOWS: nflows, Reg.ERR_FLAGS: err_flags, Reg.ERR_COUNT: err_count,
                   Reg.CYCLES: cycles, Reg.TIMESTEP: ts, Reg.HEAD: hp,
                   Reg.PARAMS: P | (W << 4) | (ceil_log2(p.depth) << 8) | (p.max_entries << 16),
                   **{Reg.PEER + i: peer[i] for i in range(P)},
                   Reg.WATCHDOG: wd_limit, Reg.WD_INFO: wdog.info,
                   **{Reg.LINK_CRC + i: crc_errs[i] for i in range(P)}}]
        for i in range(P):
            fl, hd, wd = tx_counters[i]
            fr, rw, le, dr, bd = rx_counters[i]
            groups.append({Reg.PORT + 8 * i + k: sig
                           for k, sig in enumerate([fl, hd, wd, fr, rw, le, dr, bd])})
        gsel = Signal(range(len(groups) + 1))     # group of the read (len: none)
        gval = [Signal(32, name=f"rgroup{g}") for g in range(len(groups))]
        m.d.sync += gsel.eq(len(groups))
        for g, regs in enumerate(groups):
            with m.Switch(roff):
                for a, v in regs.items():
                    with m.Case(int(a)):
                        m.d.sync += gval[g].eq(v)
                        with m.If(rre):
                            m.d.sync += gsel.eq(g)
        rreg = Signal(32)
        m.d.sync += rreg.eq(Array(gval + [Const(0, 32)])[gsel])
        rsel2 = Signal(2)
        s_rd_q = [Signal(32, name=f"steplog_q{k}") for k in range(2)]
        rsel1 = Signal(2)
        m.d.sync += [rsel1.eq(rsel), rsel2.eq(rsel1), s_rd_q[0].eq(s_rd.data),
                     s_rd_q[1].eq(s_rd_q[0])]
        early = Signal(32)
        with m.Switch(rsel2):
            with m.Case(0):
                m.d.comb += early.eq(rreg)
            with m.Case(3):
                m.d.comb += early.eq(s_rd_q[1])
        rsel_q, early_q = rsel2, early
        for k in range(3, HOST_READ_LATENCY):
            rsel_n, early_n = Signal(2, name=f"rsel_q{k}"), Signal(32, name=f"early_q{k}")
            m.d.sync += [rsel_n.eq(rsel_q), early_n.eq(early_q)]
            rsel_q, early_q = rsel_n, early_n
        m.d.comb += host.rdata.eq(Mux(rsel_q == 2, buf.rd[0].data[:32], early_q))


        # ------------------------------------------------------------ errors
        link_err = Signal()
        m.d.comb += link_err.eq(Cat(*[d.status.counts[0] != 0 for d in dps]).any())
        evs = {ErrBit.TABLE_INDEX: [ev_tindex], ErrBit.HOST_RANGE: [ev_hrange],
               ErrBit.BAD_OP: [ev_badop], ErrBit.ENTRY_RANGE: [ev_erange],
               ErrBit.FRAG_RANGE: [r[0] for r in rx_err],
               ErrBit.UNEXPECTED: [r[1] for r in rx_err],
               ErrBit.SEQUENCE: [r[2] for r in rx_err],
               ErrBit.BANK_CONFLICT: [buf.conflict],
               ErrBit.WATCHDOG: [wdog.fire], ErrBit.LINK_CRC: ev_crc}
        # Every event is registered once before it is flagged, and the event count once
        # more before the 32-bit add (the events come out of deep logic: header checks,
        # the crossbar, host-bus decode).  A host read is decoded a cycle after ``re``
        # (below), so a read right after a rejected host write still sees its flag.  A
        # clear drops the events of its own cycle and of the cycle before.
        ev_flat = []
        flag_bits = []
        for bit in ErrBit:
            lst = evs.get(bit, [])
            lst_q = [Signal(name=f"ev_{bit.name.lower()}_q{k}") for k in range(len(lst))]
            m.d.sync += [d.eq(v & ~clear) for d, v in zip(lst_q, lst)]
            ev_flat += lst_q
            flag_bits.append(Cat(Const(0, 1), *lst_q).any() |
                             (link_err if bit == ErrBit.LINK else 0))
        m.d.sync += err_n.eq(Mux(clear, 0, sum(ev_flat)))
        with m.If(clear):
            m.d.sync += [err_flags.eq(0), err_count.eq(0), done.eq(0), scan_failed.eq(0)]
            m.d.sync += [xstep[q][f].eq(XNIL) for q in range(P) for f in range(F)]
        with m.Else():
            m.d.sync += [err_count.eq(err_count + err_n), err_flags.eq(err_flags | Cat(*flag_bits))]
        m.d.comb += self.error.eq(err_flags.any())
        return m

    def _fault_detection(self, m, *, running, clear, lk, hp, ts, e, n_entries, tx_idle,
                         tx_hdrs, expect_red, red_done, gat_done, gport, red_done_of,
                         gat_done_of, exp_f):
        """The watchdog (host limit, progress, what the NIC waits for) and the per-port
        link-CRC failure counters.  Returns (limit register, watchdog, counters, events)."""
        p = self.p
        P, F = p.ports, p.max_nodes
        m.submodules.watchdog = wd = Watchdog(p)
        wd_limit = Signal(32)
        # progress: a flit on any link (either way), the head retiring, the timestep
        # moving, the lockstep counter running
        hp_q, ts_q = Signal.like(hp), Signal.like(ts)
        m.d.sync += [hp_q.eq(hp), ts_q.eq(ts)]
        links = [getattr(self, f"tx{i}").valid for i in range(P)] + \
                [getattr(self, f"rx{i}").valid for i in range(P)]
        m.d.comb += [wd.running.eq(running), wd.clear.eq(clear), wd.limit.eq(wd_limit),
                     wd.progress.eq(Cat(*links).any() | (hp != hp_q) | (ts != ts_q) |
                                    (lk != 0)),
                     wd.tx_busy.eq(~tx_idle), wd.timestep.eq(ts),
                     wd.head_valid.eq(hp < n_entries), wd.head_gather.eq(e.op == GATHER),
                     wd.head_flow.eq(e.flow), wd.head_step.eq(e.step)]
        for i, h in enumerate(tx_hdrs):
            m.d.comb += [wd.tx_flow[i].eq(h.flow), wd.tx_step[i].eq(h.step)]
        gather_owed = Signal(P)
        for q in range(P):
            m.d.comb += gather_owed[q].eq((e.pport == q) & ~gat_done_of(e.flow))
        with m.Switch(e.op):
            with m.Case(REDUCE):
                m.d.comb += wd.head_owed.eq(e.cports & ~red_done_of(e.flow))
            with m.Case(GATHER):
                m.d.comb += wd.head_owed.eq(Mux(e.pport == p.port_nil,
                                                exp_f & ~red_done_of(e.flow), gather_owed))
        for f in range(F):
            for q in range(P):
                m.d.comb += [wd.owed_red[f][q].eq(expect_red[f][q] & ~red_done[q][f]),
                             wd.owed_gat[f][q].eq((gport[f] == q) & ~gat_done[q][f])]
        crc_errs = [Signal(32, name=f"crc_errs{i}") for i in range(P)]
        ev_crc = []
        if self.has_link_crc:
            for i in range(P):
                with m.If(clear):
                    m.d.sync += crc_errs[i].eq(0)
                with m.Elif(self.link_crc[i]):
                    m.d.sync += crc_errs[i].eq(crc_errs[i] + 1)
            ev_crc = [self.link_crc[i] for i in range(P)]
        return wd_limit, wd, crc_errs, ev_crc
