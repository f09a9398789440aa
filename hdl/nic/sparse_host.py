"""The sparse engine inside a NIC (``NicParams.sparse``): link sharing and host access.

::

    host bus ─► SP_IN[0..2], SP_PUSH ─► push stage ─► HOST_IN FIFO ─► engine.host_i
         CTRL START / start (SP_MODE SPARSE) ─► a START word ─┘
    host bus ◄─ SP_OUT_POP / INDEX / VALUE ◄─ out latch ◄─ HOST_OUT FIFO ◄─ engine.host_o

    dense TxUnit[p] ─┐                       ┌─► dense RxUnit[p]
                     ├─(SP_MODE)─► tx[p]     │
    engine.tx[p] ────┘       rx[p] ─(SP_MODE)┴─► engine.rx[p]

:class:`LinkShare` gives each port to one owner at a time, chosen by the SP_MODE register
(:class:`SparseHost`): the owner's flits go out, the incoming flits go to the owner only,
and the credits follow the owner both ways.  The mode is static: the host sets it before a
START and it cannot change while the dense core runs, while a sparse run is queued or runs,
or while any flit this NIC sent has not been taken by its peer (``drained``: per port, the
flits sent minus the credits returned).  So a link never carries dense and sparse flits at
once, and no credit of one owner can reach the other: each side's credit counter starts
full after a switch, as it was left, and its peer's receive buffer is empty.  DRAINED
is local (this NIC's sent flits all acknowledged, its received flits all taken); a flit
still on the wire towards it shows in the peer's count.  So the host switches a fabric in
two phases: first every NIC reports DRAINED (then nothing is in flight anywhere, since
nothing new is sent once both sides are idle), then every NIC's SP_MODE is written.

Register map: :mod:`.params` (``SP_*``).  Every sparse run starts through a START word
pushed into the HOST_IN FIFO behind the words the host pushed before it, so a run never
starts before its gradients are in.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..link.flit import FlitFormat, LinkSignature
from .count import step_count
from .params import (SPARSE_IN_WORDS, SPARSE_READ_REGS, NicParams, Reg, SparseOut,
                     SparseStatus)
from .sparse_engine import HOST_IN, HOST_OUT, HostKind

__all__ = ["LinkShare", "SparseHost", "link_share_golden"]

REGISTERS = 0          # host-bus region of the registers (host_regs.REGISTERS)


class LinkShare(wiring.Component):
    """Each link port owned by the dense datapath or the sparse engine (``sparse``).

    Parameters
    ----------
    fmt : FlitFormat
        The NIC's link format (the dense datapath's).
    engine_fmt : FlitFormat
        The engine's (its head layout differs; the flit layout must be the same).
    ports : int
    max_outstanding : int
        Most flits a port can have in flight (the larger receive buffer of the two owners'
        peers): sizes the drain counters.

    Members
    -------
    tx : ``Out(LinkSignature(fmt)).array(ports)``;  rx : ``In(...)``
        The NIC's link ports.
    dense_tx, engine_tx : ``In(LinkSignature(fmt / engine_fmt)).array(ports)``
        The owners' transmitters.
    dense_rx, engine_rx : ``Out(LinkSignature(fmt / engine_fmt)).array(ports)``
        The owners' receivers.
    sparse : ``In(1)``
        The engine owns every port (else the dense datapath).
    drained : ``Out(1)``
        Every flit sent on every port has its credit back, and every flit received was
        taken by its owner (its credit returned).
    """

    def __init__(self, *, fmt: FlitFormat, engine_fmt: FlitFormat, ports: int,
                 max_outstanding: int):
        if not isinstance(ports, int) or ports < 1:
            raise ValueError(f"ports must be an int >= 1, got {ports!r}")
        if fmt.vcs != 1 or engine_fmt.vcs != 1:
            raise ValueError("the shared links have one VC")
        if fmt.flit.size != engine_fmt.flit.size:
            raise ValueError(f"the engine's flits are {engine_fmt.flit.size} bits, the "
                             f"NIC's {fmt.flit.size}")
        self.ports, self.max_outstanding = ports, max_outstanding
        link, elink = LinkSignature(fmt), LinkSignature(engine_fmt)
        super().__init__({"tx": Out(link).array(ports), "rx": In(link).array(ports),
                          "dense_tx": In(link).array(ports), "engine_tx": In(elink).array(ports),
                          "dense_rx": Out(link).array(ports), "engine_rx": Out(elink).array(ports),
                          "sparse": In(1), "drained": Out(1)})

    def elaborate(self, platform):
        m = Module()
        sp = self.sparse
        idle = []
        for p in range(self.ports):
            tx, rx = self.tx[p], self.rx[p]
            dtx, etx, drx, erx = self.dense_tx[p], self.engine_tx[p], self.dense_rx[p], \
                self.engine_rx[p]
            m.d.comb += [tx.valid.eq(Mux(sp, etx.valid, dtx.valid)),
                         tx.flit.eq(Mux(sp, etx.flit.as_value(), dtx.flit.as_value())),
                         etx.credit.eq(Mux(sp, tx.credit, 0)),
                         dtx.credit.eq(Mux(sp, 0, tx.credit)),
                         drx.flit.eq(rx.flit), erx.flit.eq(rx.flit.as_value()),
                         drx.valid.eq(rx.valid & ~sp), erx.valid.eq(rx.valid & sp),
                         rx.credit.eq(Mux(sp, erx.credit, drx.credit))]
            # flits sent whose credit is not back (in flight or in the peer's receive
            # buffer), and flits received the owner has not taken yet (its credit not
            # returned): both zero = nothing of this NIC's on or at the link
            sent = Signal(range(self.max_outstanding + 2), name=f"outstanding{p}")
            held = Signal(range(self.max_outstanding + 2), name=f"held{p}")
            # +- 1 from the registers, the engine's late send valid a mux select
            m.d.sync += [sent.eq(step_count(sent, tx.valid, tx.credit[0])),
                         held.eq(step_count(held, rx.valid, rx.credit[0]))]
            idle += [sent == 0, held == 0]
        m.d.comb += self.drained.eq(Cat(*idle).all())
        return m


class SparseHost(wiring.Component):
    """The sparse registers of a NIC: SP_MODE, the HOST_IN / HOST_OUT FIFOs and the run
    state (register map: :mod:`.params`).

    Parameters
    ----------
    params : NicParams
        A sparse build (``params.sparse`` set).

    Members
    -------
    addr, wdata, we, re : ``In``
        The NIC's host bus (decoded here for the ``SP_*`` registers; HostRegs answers the
        reads, from ``regs``).
    start : ``In(1)``
        CTRL START or the fabric-wide start: queues a sparse run in sparse mode.
    clear : ``In(1)``
        CTRL CLEAR (registered): drops the sticky refusals and DONE.
    dense_running : ``In(1)``
        The dense core is busy, from its START to the end of its run (a mode change is
        refused).
    drained : ``In(1)``
        From :class:`LinkShare`.
    host_i : ``Out(stream.Signature(HOST_IN))``;  host_o : ``In(stream.Signature(HOST_OUT))``
        To and from the engine.
    busy, cycles, flits, malformed, finals : ``In``
        The engine's status.
    mode : ``Out(1)``
        SP_MODE SPARSE.
    running, done : ``Out(1)``
        A sparse run is queued or runs; the last one finished.
    regs : ``Out(32).array(len(SPARSE_READ_REGS))``
        The readable registers, in :data:`~.params.SPARSE_READ_REGS` order.
    refused : ``Out(1)``
        A refused SP_MODE change, SP_PUSH or START (a pulse: ERR HOST_RANGE).
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams) or params.sparse is None:
            raise ValueError("SparseHost needs a NicParams with sparse set")
        self.params = p = params
        super().__init__({
            "addr": In(p.addr_bits), "wdata": In(32), "we": In(1), "re": In(1),
            "start": In(1), "clear": In(1), "dense_running": In(1), "drained": In(1),
            "host_i": Out(stream.Signature(HOST_IN)), "host_o": In(stream.Signature(HOST_OUT)),
            "busy": In(1), "cycles": In(32), "flits": In(32), "malformed": In(16),
            "finals": In(32), "mode": Out(1), "running": Out(1), "done": Out(1),
            "regs": Out(32).array(len(SPARSE_READ_REGS)), "refused": Out(1)})

    def elaborate(self, platform):
        m = Module()
        p = self.params
        R = p.region_bits
        off = Signal(R)
        m.d.comb += off.eq(self.addr[:R])
        is_reg = self.addr[R:R + 2] == REGISTERS
        write = {r: Signal(name=f"write_{r.name.lower()}")
                 for r in (Reg.SP_MODE, Reg.SP_PUSH)}
        for r, sig in write.items():
            m.d.comb += sig.eq(self.we & is_reg & (off == r))
        D = p.sparse.host_fifo
        # HOST_IN holds D words: D - 1 in the FIFO, one in the push stage in front of it
        m.submodules.in_fifo = in_q = fifo.SyncFIFOBuffered(width=HOST_IN.size, depth=D - 1)
        # HOST_OUT holds D words, in a FIFO a word deeper (see _out_ready)
        m.submodules.out_fifo = out_q = fifo.SyncFIFOBuffered(width=HOST_OUT.size, depth=D + 1)
        m.d.comb += [self.host_i.valid.eq(in_q.r_rdy), self.host_i.payload.eq(in_q.r_data),
                     in_q.r_en.eq(self.host_i.ready),
                     out_q.w_data.eq(self.host_o.payload)]
        self._out_ready(m, out_q, D)
        refusals = [self._mode(m, write[Reg.SP_MODE])]
        in_level = Signal(range(D + 1))
        refusals += self._host_in(m, in_q, in_level, write[Reg.SP_PUSH], off, is_reg)
        pop_flags, latch = self._host_out(m, out_q, off, is_reg)
        m.d.comb += self.refused.eq(Cat(*refusals).any())
        self._status(m, refusals, in_level, out_q, pop_flags, latch)
        return m

    def _out_ready(self, m, out_q, words):
        """``host_o.ready`` from a register: the engine's residual and final walks step
        their buffer read addresses on it, and as the FIFO's full compare it stood in front
        of the buffer's 32 block RAMs' address pins (routed, 19th wave). The register is
        next cycle's ``level < words`` (this cycle's level, less a pop, plus the engine's
        write), so HOST_OUT holds exactly ``words``. The FIFO is a word deeper: below
        ``words`` its inner memory (all but the output register) always has room."""
        ready = Signal(init=1)
        write = self.host_o.valid & ready
        after_pop = Signal.like(out_q.level)
        m.d.comb += [after_pop.eq(out_q.level - (out_q.r_en & out_q.r_rdy)),
                     self.host_o.ready.eq(ready), out_q.w_en.eq(write)]
        m.d.sync += ready.eq(Mux(write, after_pop < words - 1, after_pop < words))

    def _mode(self, m, write_mode):
        """SP_MODE: a change while either side runs (or starts, this cycle) or while links
        are not drained is refused."""
        want = self.wdata[0]
        change = write_mode & (want != self.mode)
        refuse = change & (self.dense_running | self.running | self.start | ~self.drained)
        with m.If(change & ~refuse):
            m.d.sync += self.mode.eq(want)
        return refuse

    def _host_in(self, m, in_q, in_level, write_push, off, is_reg):
        """SP_IN staging, SP_PUSH, and the run state: a START (in sparse mode) is queued as
        a START word behind what the host pushed; DONE once the engine's busy has risen
        and fallen again."""
        staged = [Signal(32, name=f"sp_in{k}") for k in range(SPARSE_IN_WORDS)]
        for k, word in enumerate(staged):
            with m.If(self.we & is_reg & (off == Reg.SP_IN + k)):
                m.d.sync += word.eq(self.wdata)
        pushed = Signal(HOST_IN.size)
        m.d.comb += pushed.eq(Cat(*staged, self.wdata))
        is_start = pushed[:3] == HostKind.START     # only the NIC's own START starts a run
        # the push stage: the bus decode ends at its registers, not at the FIFO's write
        # pointer and LUT-RAM write data across the die (-0.44 ns routed, 19th wave). It
        # loads whenever it is free next cycle (its word unused unless ``push_q``), so the
        # decode drives two flip-flops' enables, not 123
        push_q, push_data = Signal(), Signal(HOST_IN.size)
        stage_free = ~push_q | in_q.w_rdy
        push_ok = write_push & stage_free & ~is_start
        refuse_push = write_push & ~push_ok
        with m.If(stage_free):
            m.d.sync += [push_q.eq(push_ok), push_data.eq(pushed)]
        with m.If(write_push):
            m.d.sync += [w.eq(0) for w in staged]
        start_pending, armed, seen_busy = Signal(), Signal(), Signal()
        start_req = self.start & self.mode
        refuse_start = start_req & self.running
        with m.If(start_req & ~self.running):
            m.d.sync += [start_pending.eq(1), self.done.eq(0)]
        # the START word goes in once the stage is empty (behind every word pushed before
        # it) and there is room. Only its kind is muxed in: the engine reads nothing else
        # of a START word
        put_start = start_pending & ~push_q & in_q.w_rdy
        m.d.comb += [in_q.w_en.eq(push_q | start_pending),
                     in_q.w_data.eq(Cat(Mux(push_q, push_data[:3], HostKind.START),
                                        push_data[3:]))]
        m.d.sync += in_level.eq(in_q.level + push_q)     # SP_STATUS, a cycle late
        with m.If(put_start):
            m.d.sync += [start_pending.eq(0), armed.eq(1), seen_busy.eq(0)]
        with m.If(armed & self.busy):
            m.d.sync += seen_busy.eq(1)
        with m.If(armed & seen_busy & ~self.busy):
            m.d.sync += [armed.eq(0), self.done.eq(1)]
        with m.If(self.clear):
            m.d.sync += self.done.eq(0)
        m.d.comb += self.running.eq(start_pending | armed)
        return [refuse_push, refuse_start]

    def _host_out(self, m, out_q, off, is_reg):
        """SP_OUT_POP: the read that HostRegs registers a cycle after ``re`` takes the head
        of the HOST_OUT FIFO into the latch in that same cycle, so the value it reads back
        (VALID, FINAL, END of that head) and the latch agree; INDEX and VALUE read the
        latch (back-to-back reads POP, INDEX, VALUE see one word)."""
        pop_req = Signal()
        m.d.sync += pop_req.eq(self.re & is_reg & (off == Reg.SP_OUT_POP))
        head = out_q.r_data
        flags = Signal(3)
        m.d.comb += [flags.eq(Cat(out_q.r_rdy, head[64], head[65])),
                     out_q.r_en.eq(pop_req)]
        latch = Signal(64)
        with m.If(pop_req & out_q.r_rdy):
            m.d.sync += latch.eq(head[:64])
        assert SparseOut.VALID == 1 and SparseOut.FINAL == 2 and SparseOut.END == 4
        return flags, latch

    def _status(self, m, refusals, in_level, out_q, pop_flags, latch):
        mode_refused, host_refused = Signal(), Signal()
        # CLEAR first: like ErrorCollect's flags, a (registered) CLEAR drops the
        # refusals of its own cycle and of the one before
        with m.If(self.clear):
            m.d.sync += [mode_refused.eq(0), host_refused.eq(0)]
        with m.Else():
            with m.If(refusals[0]):
                m.d.sync += mode_refused.eq(1)
            with m.If(Cat(*refusals[1:]).any()):
                m.d.sync += host_refused.eq(1)
        bits = {SparseStatus.MODE: self.mode, SparseStatus.RUNNING: self.running,
                SparseStatus.DONE: self.done, SparseStatus.BUSY: self.busy,
                SparseStatus.DRAINED: self.drained, SparseStatus.MODE_REFUSED: mode_refused,
                SparseStatus.HOST_REFUSED: host_refused, SparseStatus.OUT_VALID: out_q.r_rdy}
        status = Signal(32)
        for flag, sig in bits.items():
            m.d.comb += status[flag.bit_length() - 1].eq(sig)
        m.d.comb += [status[8:16].eq(in_level), status[16:24].eq(out_q.level)]
        values = {Reg.SP_MODE: self.mode, Reg.SP_STATUS: status, Reg.SP_CYCLES: self.cycles,
                  Reg.SP_FLITS: self.flits, Reg.SP_MALFORMED: self.malformed,
                  Reg.SP_FINALS: self.finals, Reg.SP_OUT_POP: pop_flags,
                  Reg.SP_OUT_INDEX: latch[:32], Reg.SP_OUT_VALUE: latch[32:]}
        for k, r in enumerate(SPARSE_READ_REGS):
            m.d.comb += self.regs[k].eq(values[r])


def link_share_golden(steps, ports: int) -> list[dict]:
    """Golden model of :class:`LinkShare`, cycle by cycle.  ``steps``: per cycle a dict of
    the inputs -- ``sparse`` and per port ``p`` the tuples ``dense_tx[p]``,
    ``engine_tx[p]`` and ``rx[p]`` = (valid, flit bits), and the credit bits
    ``tx_credit[p]``, ``dense_rx_credit[p]``, ``engine_rx_credit[p]``.  Returns per cycle
    the outputs: ``tx[p]`` = (valid, flit), ``dense_tx_credit[p]``, ``engine_tx_credit[p]``,
    ``dense_rx_valid[p]``, ``engine_rx_valid[p]``, ``rx_credit[p]``, ``drained``."""
    sent, held = [0] * ports, [0] * ports
    out = []
    for s in steps:
        sp = s["sparse"]
        o = {"drained": all(x == 0 for x in sent + held)}
        for p in range(ports):
            tx = s["engine_tx"][p] if sp else s["dense_tx"][p]
            cr, rx_cr = s["tx_credit"][p], (s["engine_rx_credit"] if sp else
                                             s["dense_rx_credit"])[p]
            o.setdefault("tx", []).append(tx)
            o.setdefault("engine_tx_credit", []).append(cr if sp else 0)
            o.setdefault("dense_tx_credit", []).append(0 if sp else cr)
            o.setdefault("engine_rx_valid", []).append(s["rx"][p][0] if sp else 0)
            o.setdefault("dense_rx_valid", []).append(0 if sp else s["rx"][p][0])
            o.setdefault("rx_credit", []).append(rx_cr)
            sent[p] += tx[0] - cr
            held[p] += s["rx"][p][0] - rx_cr
        out.append(o)
    return out
