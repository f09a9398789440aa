"""Receive unit of one NIC port: depacketiser, header decision (checks + order gate), the
fragment stream into the gradient buffer and the accumulate/write-back stage.

::

    link ─► Depacketiser ─► hdr ─► h0 ─► h ─S1─► lookups ─S2─► checks ─S3─► decision
                       │                  OrderGate (other ports) ──┘      │ take
                       └─► data ─► SkidBuffer ─► fragment stream (cur) ◄── nxt
                                                    │ buffer read grant (bank arbitration)
                                                    ▼
                                   Accumulate: read data + beat ─► FP32Adder × lanes
                                     ─► write-back register ─► buffer write
                                     ─► progress: done_to, message done, arrived bits

Each port's receive unit decides on a fragment header in three registered stages and then
streams the fragment from a descriptor register, so neither the decision's logic (flow
tables, the order gate over the other ports' state) nor the bank grant sits in front of
the ~100 registers an accept loads.  ``settle`` counts cycles since ``h`` or this port's
own state last changed; the decision register is trusted when it reached 3, i.e. when it
was computed from the header in ``h`` and a snapshot of the port's own state that is
still current.  The other ports' state may have moved on since the snapshot: every
order-gate term only ever becomes more permissive while a header waits (a port's steps
only grow, ``done_to`` only grows within a message and restarts together with the message
fields it belongs to, a finished contribution drops out of ``need``), so a stale "yes" is
still a yes and a stale "no" only delays.

Receive order (the order gate): a REDUCE fragment covering elements [o, o+l) of flow f
arriving on port p with step s may be accumulated only once every other port q that still
owes a contribution to f is known to come later in (step, port) order, or, if q's
contribution comes earlier, q has written back through o+l.  A port's future steps are
bounded below by its current head/message step (links deliver in step order).
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..fp32 import FP32Adder
from ..link.depacketiser import Depacketiser
from ..link.flit import LinkSignature, Op
from ..skid import SkidBuffer
from .buffer import READ_LATENCY, BufferReadSignature, BufferWriteSignature
from .params import NicParams
from .tx import buffer_abits

__all__ = ["RxUnit", "OrderGate", "Accumulate", "RxPortStateSignature", "FlowTableSignature",
           "order_step_nil"]


def order_step_nil(params: NicParams) -> int:
    """ORDER-table value meaning "step unknown" (all ones)."""
    return (1 << params.step_bits) - 1


class RxPortStateSignature(wiring.Signature):
    """The state a receive unit shows the other ports' order gates and the issue logic.

    Members (all ``Out``)
    ---------------------
    msg_open, msg_reduce : 1
        A message is open on the port, and it is a REDUCE.
    msg_flow, msg_step :
        Flow and step of the open (or last) message.
    done_to : abits + 1
        Written back through this element: grows within a message, restarts at a new
        message's accept, in the same cycle as ``msg_flow``/``msg_step`` change.
    last_step :
        The step of the last accepted fragment (a lower bound of the port's future steps).
    hdr_valid, hdr_step :
        A header waits for its decision, and its step.
    reduce_done, gather_done : max_nodes
        Per flow: this port's REDUCE contribution / GATHER data is written back.
    """

    def __init__(self, params: NicParams):
        F = params.max_nodes
        super().__init__({
            "msg_open": Out(1), "msg_reduce": Out(1), "msg_flow": Out(params.flow_bits),
            "msg_step": Out(params.step_bits), "done_to": Out(params.abits + 1),
            "last_step": Out(params.step_bits), "hdr_valid": Out(1),
            "hdr_step": Out(params.step_bits), "reduce_done": Out(F), "gather_done": Out(F)})


class FlowTableSignature(wiring.Signature):
    """The per-flow tables as a reader sees them (:class:`~.flow_table.FlowTable` drives
    them; see there for their meaning).

    Members (all ``Out``)
    ---------------------
    expect : ports, per flow
        The child ports whose REDUCE contributions the flow expects.
    gather_port : pport_bits, per flow
        The port the flow's GATHER data comes from (``port_nil``: none, the root).
    start, size : abits, per flow;  end : abits + 1, per flow
        The flow's chunk.
    order_step : step_bits, per port and flow
        ORDER table: the step of port q's contribution to flow f (all ones: unknown).
    """

    def __init__(self, params: NicParams):
        P, F, AB = params.ports, params.max_nodes, params.abits
        nil = order_step_nil(params)
        super().__init__({
            "expect": Out(P).array(F),
            "gather_port": Out(params.pport_bits, init=params.port_nil).array(F),
            "start": Out(AB).array(F), "size": Out(AB).array(F), "end": Out(AB + 1).array(F),
            "order_step": Out(params.step_bits, init=nil).array(P, F)})


def expect_bits(tables, port: int) -> Signal:
    """Per flow: does ``port`` owe the flow a REDUCE contribution (a flow-indexed vector)."""
    return Cat(*[e[port] for e in tables.expect])


def _check_params(params):
    if not isinstance(params, NicParams):
        raise TypeError(f"params must be NicParams, not {type(params).__name__}")


class OrderGate(wiring.Component):
    """The receive-order gate of one port over every other port (REDUCE headers only).

    Per other port q: stage 1 looks up whether q owes the header's flow a contribution
    and, from the ORDER table, whether it comes earlier in (step, port) order; stage 2
    snapshots q's live state; ``ok`` combines them.  ``ok`` is valid two cycles after the
    header (``flow``, ``step``, ``end``) was presented and held.

    Parameters
    ----------
    params : NicParams
    port : int
        The receiving port (ties in step go to the lower port).

    Members
    -------
    flow, step, end : In
        The waiting header's flow, step and fragment end (offset + length).
    tables : ``In(FlowTableSignature(params))``
    peers : ``In(RxPortStateSignature(params)).array(ports)``
        Every port's receive state (this port's entry is ignored).
    ok : ``Out(1)``
        No other port's earlier contribution to the flow is still missing for this
        fragment's elements.
    """

    def __init__(self, *, params: NicParams, port: int):
        _check_params(params)
        if not 0 <= port < params.ports:
            raise ValueError(f"port {port} is not among the NIC's {params.ports} ports")
        self.params, self.port = params, port
        super().__init__({
            "flow": In(params.flow_bits), "step": In(params.step_bits),
            "end": In(params.abits + 1),
            "tables": In(FlowTableSignature(params)),
            "peers": In(RxPortStateSignature(params)).array(params.ports),
            "ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        p, i = self.params, self.port
        fn, step, hend = self.flow, self.step, self.end
        nil = order_step_nil(p)
        gate = []
        for qq, peer in enumerate(self.peers):
            if qq == i:
                continue
            exp_q = Signal(name=f"expects{qq}")
            order_q = Signal(p.step_bits, name=f"order_step{qq}")   # ORDER table entry
            m.d.sync += [exp_q.eq(expect_bits(self.tables, qq).bit_select(fn, 1)),
                         order_q.eq(Array(self.tables.order_step[qq])[fn])]

            def before(s, qq=qq):         # q's step precedes this header's
                return (s <= step) if qq < i else (s < step)

            need = Signal(name=f"need{qq}")                 # q still owes flow f
            order_known = Signal(name=f"order_known{qq}")
            order_before = Signal(name=f"order_before{qq}")  # ORDER says q comes first
            on_f = Signal(name=f"on_flow{qq}")               # q's open message is on f
            q_before = Signal(name=f"next_before{qq}")       # q's next step precedes
            reach = Signal(name=f"reach{qq}")                # q wrote f through hend
            m.d.sync += [
                need.eq(exp_q & ~peer.reduce_done.bit_select(fn, 1)),
                order_known.eq(order_q != nil),
                order_before.eq((order_q < step) | ((order_q == step) & (qq < i))),
                on_f.eq(peer.msg_open & peer.msg_reduce & (peer.msg_flow == fn)),
                # q's future steps are bounded below by its open message's step, else its
                # waiting header's, else the last step it received
                q_before.eq(Mux(peer.msg_open, before(peer.msg_step),
                                Mux(peer.hdr_valid, before(peer.hdr_step),
                                    before(peer.last_step)))),
                reach.eq(peer.done_to >= hend)]
            ok = Mux(order_known, ~order_before | (on_f & reach),
                     ~q_before | (on_f & reach))
            gate.append(~need | ok)
        m.d.comb += self.ok.eq(Cat(*gate).all() if gate else Const(1))
        return m


def BeatLayout(params: NicParams) -> data.StructLayout:
    """One beat of an accepted fragment on its way to the adders."""
    return data.StructLayout({"v": 1, "data": params.lanes * 32, "addr": params.abits + 1,
                              "mask": params.lanes, "red": 1, "flast": 1, "mlast": 1,
                              "flow": params.flow_bits})


class Accumulate(wiring.Component):
    """Accumulate/write-back stage of a receive unit.

    A beat presented in cycle t (its buffer read granted in the same cycle) meets the read
    data :data:`READ_LATENCY` cycles later at ``lanes`` :class:`FP32Adder` s (REDUCE: old
    + received; GATHER: the received word passes); the sums go through a write-back
    register to the buffer write port.  Lane k is element ``addr + k``; ``mask`` marks the
    lanes inside the fragment.

    Parameters
    ----------
    params : NicParams

    Members
    -------
    beat : ``In(BeatLayout(params))``
        The beat (``v``: present this cycle).
    read_data : ``In(32 * lanes)``
        The buffer read port's data.
    write : ``Out(BufferWriteSignature)``
    clear : ``In(1)``
        Zero ``words``.
    words : ``Out(32)``
        Payload words received (counted at stage 0).
    last_valid, last_addr_end, last_mlast, last_red, last_flow : ``Out``
        Write-back of a fragment's last beat this cycle: the element after it, whether it
        ends the message, its op (REDUCE) and flow.
    """

    def __init__(self, *, params: NicParams):
        _check_params(params)
        self.params = params
        AB = params.abits
        super().__init__({
            "beat": In(BeatLayout(params)), "read_data": In(32 * params.lanes),
            "write": Out(BufferWriteSignature(buffer_abits(params), params.lanes)),
            "clear": In(1), "words": Out(32),
            "last_valid": Out(1), "last_addr_end": Out(AB + 1), "last_mlast": Out(1),
            "last_red": Out(1), "last_flow": Out(params.flow_bits)})

    def elaborate(self, platform):
        m = Module()
        p, W, AB = self.params, self.params.lanes, self.params.abits
        tag_bits = AB + 1 + 1 + 1 + 32 + 1 + 1 + p.flow_bits + 1
        # stage 0 of the beat pipeline (loads every cycle, ``v`` says whether it holds a
        # beat); the read data meets the beat READ_LATENCY cycles later at the adders
        adders = [FP32Adder(tag_width=tag_bits) for _ in range(W)]
        for k, ad in enumerate(adders):
            m.submodules[f"add{k}"] = ad
            m.d.comb += ad.o.ready.eq(1)
        st = [Signal(BeatLayout(p), name=f"stage{k}") for k in range(READ_LATENCY)]
        m.d.sync += st[0].eq(self.beat)
        # words received, counted from the registered beat (the grant stays off this
        # 32-bit adder's enable)
        with m.If(st[0].v):
            m.d.sync += self.words.eq(self.words + sum(st[0].mask[k] for k in range(W)))
        with m.If(self.clear):
            m.d.sync += self.words.eq(0)
        m.d.sync += [st[k].eq(st[k - 1]) for k in range(1, READ_LATENCY)]
        s1 = st[-1]
        # -> adders (the tag carries everything needed at write-back)
        tag_lay = data.StructLayout({"addr": AB + 1, "en": 1, "red": 1, "b": 32,
                                     "flast": 1, "mlast": 1, "flow": p.flow_bits, "pad": 1})
        wb = []
        for k, ad in enumerate(adders):
            t = Signal(tag_lay, name=f"tag{k}")
            b_k = s1.data[32 * k:32 * k + 32]
            m.d.comb += [t.addr.eq(s1.addr + k), t.en.eq(s1.mask[k]), t.red.eq(s1.red),
                         t.b.eq(b_k), t.flast.eq(s1.flast), t.mlast.eq(s1.mlast),
                         t.flow.eq(s1.flow),
                         ad.i.valid.eq(s1.v),
                         ad.i.payload.a.eq(self.read_data[32 * k:32 * k + 32]),
                         ad.i.payload.b.eq(b_k), ad.i.payload.tag.eq(t)]
            ot = data.View(tag_lay, ad.o.payload.tag)
            # write-back register: the sum leaves the adder for this register only, so the
            # adder's last stage stays compact; the long trip to the bank write muxes
            # starts here (a timing path).  Progress and completion follow this register,
            # so nothing can read ahead of the write it waits for.
            wv = Signal(name=f"wb_valid{k}")
            wt = Signal(tag_lay, name=f"wb_tag{k}")
            wd = Signal(32, name=f"wb_data{k}")
            m.d.sync += [wv.eq(ad.o.valid), wt.eq(ot),
                         wd.eq(Mux(ot.red, ad.o.payload.sum, ot.b))]
            wb.append((wv, wt, wd))
        # write-back: every lane's adder has the same latency, lane k is element addr + k
        m.d.comb += [self.write.addr.eq(wb[0][1].addr),
                     self.write.en.eq(Cat(*[v & t.en for v, t, _ in wb])),
                     self.write.data.eq(Cat(*[d for _, _, d in wb]))]
        v0, t0, _ = wb[0]
        m.d.comb += [self.last_valid.eq(v0 & t0.flast),
                     self.last_addr_end.eq(t0.addr + sum(t.en for _, t, _ in wb)),
                     self.last_mlast.eq(t0.mlast), self.last_red.eq(t0.red),
                     self.last_flow.eq(t0.flow)]
        return m


class RxUnit(wiring.Component):
    """Receive unit of one port (see the module docstring for the pipeline).

    Parameters
    ----------
    params : NicParams
    port : int
        This unit's port index.

    Members
    -------
    link : ``In(LinkSignature(params.fmt))``
        Flits in, credits out.
    read : ``Out(BufferReadSignature)``;  write : ``Out(BufferWriteSignature)``
        The unit's reader (a write-back reader) and writer of the gradient buffer.
    running, clear, run_init : ``In(1)``
        An all-reduce runs; CLEAR; the cycle the run starts (message state reset, the
        arrived bits loaded from ``init_reduce_done``/``init_gather_done``).
    flow_enable : ``In(max_nodes)``
        Flows in use (the depacketiser rejects head flits of others).
    init_reduce_done, init_gather_done : ``In(max_nodes)``
        Arrived bits at the start of a run (empty chunks count as arrived).
    tables : ``In(FlowTableSignature(params))``
    peers : ``In(RxPortStateSignature(params)).array(ports)``
        Every port's state, for the order gate.
    state : ``Out(RxPortStateSignature(params))``
        This port's state.
    ev_range, ev_unexpected, ev_sequence : ``Out(1)``
        A fragment rejected for its range, an unexpected role, its sequence (pulses).
    frags, words, bad : ``Out(32)``
        Fragments accepted, payload words written, fragments rejected.
    link_errors : ``Out(16)``;  link_dropped : ``Out(32)``
        The depacketiser's error count (all causes) and dropped flits.
    """

    def __init__(self, *, params: NicParams, port: int):
        _check_params(params)
        if not 0 <= port < params.ports:
            raise ValueError(f"port {port} is not among the NIC's {params.ports} ports")
        self.params, self.port = params, port
        F, BA, W = params.max_nodes, buffer_abits(params), params.lanes
        super().__init__({
            "link": In(LinkSignature(params.fmt)),
            "read": Out(BufferReadSignature(BA, W)), "write": Out(BufferWriteSignature(BA, W)),
            "running": In(1), "clear": In(1), "run_init": In(1), "flow_enable": In(F),
            "init_reduce_done": In(F), "init_gather_done": In(F),
            "tables": In(FlowTableSignature(params)),
            "peers": In(RxPortStateSignature(params)).array(params.ports),
            "state": Out(RxPortStateSignature(params)),
            "ev_range": Out(1), "ev_unexpected": Out(1), "ev_sequence": Out(1),
            "frags": Out(32), "words": Out(32), "bad": Out(32),
            "link_errors": Out(16), "link_dropped": Out(32)})

    def elaborate(self, platform):
        m = Module()
        p = self.params
        dp = Depacketiser(p.fmt, sub_words=p.sub_words, credits=p.credits)
        m.submodules.depacketiser = dp
        wiring.connect(m, wiring.flipped(self.link), dp.rx)
        m.d.comb += [dp.flow_enable.eq(self.flow_enable), dp.status.clear.eq(self.clear),
                     self.link_errors.eq(dp.status.counts[0]),
                     self.link_dropped.eq(dp.status.dropped)]
        # payload skid buffer: the bank grant -- decided across all ports -- pops this
        # local register, not the depacketiser's read logic (a timing path)
        m.submodules.skid = skid = SkidBuffer(dp.data.payload.shape())
        wiring.connect(m, dp.data, skid.i)
        hdr = self._header(m, dp)
        dec = self._decide(m, hdr)
        cur, beat = self._stream(m, hdr, dec, skid.o)
        m.submodules.accumulate = acc = Accumulate(params=p)
        wiring.connect(m, acc.write, wiring.flipped(self.write))
        W = p.lanes
        m.d.comb += [acc.beat.v.eq(beat & ~cur.drop), acc.beat.data.eq(skid.o.payload.data),
                     acc.beat.addr.eq(cur.addr), acc.beat.red.eq(cur.red),
                     acc.beat.flast.eq(cur.last), acc.beat.mlast.eq(cur.mlast & cur.last),
                     acc.beat.flow.eq(cur.flow),
                     acc.beat.mask.eq(Cat(*[cur.left > k for k in range(W)])),
                     acc.read_data.eq(self.read.data), acc.clear.eq(self.clear),
                     self.words.eq(acc.words)]
        self._progress(m, acc, hdr["own_evt"])
        return m

    def _header(self, m, dp) -> dict:
        """``h0`` takes the depacketiser's FIFO head, ``h`` holds the header being decided;
        the fragment end is added up on the way in.  ``settle`` (module docstring)."""
        fmt = self.params.fmt
        h0 = Signal(fmt.header, name="h0")
        h0v = Signal(name="h0_valid")
        h = Signal(fmt.header, name="h")
        hv = Signal(name="h_valid")
        hend = Signal(self.params.abits + 1, name="h_end")
        take = Signal()
        load = Signal()                        # h0 -> h
        m.d.comb += [load.eq(~hv & h0v), dp.hdr.ready.eq(~h0v | load)]
        with m.If(dp.hdr.valid & dp.hdr.ready):
            m.d.sync += [h0.eq(dp.hdr.payload), h0v.eq(1)]
        with m.Elif(load):
            m.d.sync += h0v.eq(0)
        with m.If(load):
            m.d.sync += [h.eq(h0), hv.eq(1), hend.eq(h0.offset + h0.length)]
        with m.Elif(take):
            m.d.sync += hv.eq(0)
        m.d.comb += [self.state.hdr_valid.eq(hv), self.state.hdr_step.eq(h.step)]
        own_evt = Signal()                     # this port finished a message
        settle = Signal(range(4))
        with m.If(load | ~self.running):
            m.d.sync += settle.eq(0)
        with m.Elif(own_evt):
            m.d.sync += settle.eq(1)           # the lookups stay valid; S2, S3 redo
        with m.Elif(settle != 3):
            m.d.sync += settle.eq(settle + 1)
        return {"h": h, "hv": hv, "hend": hend, "take": take, "own_evt": own_evt,
                "settle": settle, "is_red": h.op == Op.REDUCE}

    def _decide(self, m, hdr) -> dict:
        """S1 table lookups, S2 checks and snapshot of the port's own state, S3 decision
        (good / bad and the cause); the order gate runs beside S1 and S2."""
        p, i, tab, own = self.params, self.port, self.tables, self.state
        AB = p.abits
        h, hend, is_red = hdr["h"], hdr["hend"], hdr["is_red"]
        fn = h.flow
        nil = order_step_nil(p)
        # --- S1: lookups of the header's flow in the tables (static while RUNNING)
        flow_start = Signal(AB, name="flow_start")
        flow_end = Signal(AB + 1, name="flow_end")
        role_exp = Signal()                    # port i has a role in this flow
        step_ok = Signal()
        own_order_step = Array(tab.order_step[i])[fn]
        m.d.sync += [flow_start.eq(Array(tab.start)[fn]), flow_end.eq(Array(tab.end)[fn]),
                     role_exp.eq(Mux(is_red, expect_bits(tab, i).bit_select(fn, 1),
                                     Array(tab.gather_port)[fn] == i)),
                     step_ok.eq(~is_red | (own_order_step == nil) |
                                (own_order_step == h.step))]
        # --- S2: checks of the header, snapshot of the port's own state
        range_ok, at_start, mlast, role_ok = Signal(), Signal(), Signal(), Signal()
        same_msg = Signal()                    # continues the open message
        msg_open_s, off_ok, step_ok_s = Signal(), Signal(), Signal()
        next_off = Signal(AB + 1)
        arrived = Mux(is_red, own.reduce_done, own.gather_done).bit_select(fn, 1)
        m.d.sync += [range_ok.eq((h.offset >= flow_start) & (hend <= flow_end)),
                     at_start.eq(h.offset == flow_start), mlast.eq(hend == flow_end),
                     role_ok.eq(role_exp & ~arrived),
                     same_msg.eq(own.msg_open & (own.msg_flow == fn) &
                                 (own.msg_reduce == is_red) & (own.msg_step == h.step)),
                     msg_open_s.eq(own.msg_open), off_ok.eq(h.offset == next_off),
                     step_ok_s.eq(step_ok)]
        m.submodules.order_gate = gate = OrderGate(params=p, port=i)
        wiring.connect(m, wiring.flipped(tab), gate.tables)
        for q in range(p.ports):
            wiring.connect(m, wiring.flipped(self.peers[q]), gate.peers[q])
        m.d.comb += [gate.flow.eq(fn), gate.step.eq(h.step), gate.end.eq(hend)]
        # --- S3: the decision
        dec = {k: Signal(name=f"dec_{k}") for k in
               ("good", "bad", "range", "unexpected", "sequence", "same_msg", "mlast")}
        seq_ok = Mux(same_msg, off_ok, at_start) & step_ok_s
        good = range_ok & role_ok & seq_ok
        may_start = same_msg | ~msg_open_s     # a new message waits for the last one
        m.d.sync += [dec["good"].eq(good & may_start & (~is_red | gate.ok)),
                     dec["bad"].eq(~good & may_start),
                     dec["range"].eq(~range_ok), dec["unexpected"].eq(range_ok & ~role_ok),
                     dec["sequence"].eq(range_ok & role_ok & ~seq_ok),
                     dec["same_msg"].eq(same_msg), dec["mlast"].eq(mlast)]
        dec["next_off"] = next_off
        return dec

    def _stream(self, m, hdr, dec, rxd):
        """take: the decided header becomes the next fragment descriptor (``nxt``), then
        the current one (``cur``), streamed beat by beat once the buffer grants its read
        (bank arbitration) or, for a dropped fragment, as it comes."""
        p, own = self.params, self.state
        W, AB = p.lanes, p.abits
        h, hend, is_red, take = hdr["h"], hdr["hend"], hdr["is_red"], hdr["take"]
        desc_lay = data.StructLayout({"addr": AB + 1, "left": AB + 1, "last": 1, "red": 1,
                                      "flow": p.flow_bits, "mlast": 1, "drop": 1})
        nxt, nv = Signal(desc_lay, name="next_frag"), Signal(name="next_frag_valid")
        cur, cur_v = Signal(desc_lay, name="cur_frag"), Signal(name="cur_frag_valid")
        decided, take_good, take_bad = Signal(), Signal(), Signal()
        m.d.comb += [decided.eq(hdr["hv"] & self.running & (hdr["settle"] == 3) & ~nv),
                     take_good.eq(decided & dec["good"]), take_bad.eq(decided & dec["bad"]),
                     take.eq(take_good | take_bad)]
        with m.If(take):
            m.d.sync += [nxt.addr.eq(h.offset), nxt.left.eq(h.length),
                         nxt.last.eq(h.length <= W), nxt.red.eq(is_red),
                         nxt.flow.eq(h.flow), nxt.mlast.eq(dec["mlast"]),
                         nxt.drop.eq(take_bad), nv.eq(h.length != 0)]
        with m.If(take_good):
            m.d.sync += [own.msg_open.eq(1), own.msg_reduce.eq(is_red),
                         own.msg_flow.eq(h.flow), own.msg_step.eq(h.step),
                         own.last_step.eq(h.step), dec["next_off"].eq(hend),
                         self.frags.eq(self.frags + 1)]
            with m.If(~dec["same_msg"]):
                m.d.sync += own.done_to.eq(h.offset)
        with m.If(take_bad):
            m.d.comb += [self.ev_range.eq(dec["range"]),
                         self.ev_unexpected.eq(dec["unexpected"]),
                         self.ev_sequence.eq(dec["sequence"])]
            m.d.sync += self.bad.eq(self.bad + 1)
        brd = self.read
        beat = Signal()
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
        return cur, beat

    def _progress(self, m, acc, own_evt):
        """Write-back of a fragment's last beat: progress, message completion, the
        arrived bits; then CLEAR and the start of a run."""
        own = self.state
        m.d.comb += own_evt.eq(acc.last_valid & acc.last_mlast)
        with m.If(acc.last_valid):
            m.d.sync += own.done_to.eq(acc.last_addr_end)
            with m.If(acc.last_mlast):
                m.d.sync += own.msg_open.eq(0)
                with m.If(acc.last_red):
                    m.d.sync += own.reduce_done.bit_select(acc.last_flow, 1).eq(1)
                with m.Else():
                    m.d.sync += own.gather_done.bit_select(acc.last_flow, 1).eq(1)
        with m.If(self.clear):
            m.d.sync += [self.frags.eq(0), self.bad.eq(0), own.msg_open.eq(0),
                         own.last_step.eq(0), own.reduce_done.eq(0), own.gather_done.eq(0)]
        with m.If(self.run_init):
            m.d.sync += [own.msg_open.eq(0), own.last_step.eq(0),
                         own.reduce_done.eq(self.init_reduce_done),
                         own.gather_done.eq(self.init_gather_done)]
