"""Issue logic of a NIC: the run state machine, the timestep and lockstep counters and the
head entry's issue decision.

States: IDLE -(START)-> INIT (a cycle to reset the scan and the flow tables) -> SCAN
(:class:`~.scan.TableScan`) -> FINISH (rejected: SCAN_FAILED, back to IDLE; else the
arrived bits of empty chunks are set and the run starts) -> RUN -> IDLE (DONE).

* The head entry issues when ``step <= timestep`` and its dependencies hold: REDUCE --
  every child port's contribution for the flow is written back; GATHER -- the parent's
  data is written back (root: every expected contribution is); NOP -- loads the lockstep
  counter.  REDUCE sends the chunk to the parent port, GATHER to every child port at once.
  Entries that send nothing (the root's REDUCE, a leaf's receive-only GATHER) retire as
  soon as they are due: waiting for their data would block the sends behind them.
* The timestep advances when the lockstep counter is zero, every TX unit is idle and the
  head entry is for a later step.  DONE when every entry is retired, TX is idle and every
  expected receive is written back.
* Cut-through builds (``NicParams.forward``): a due send issues without waiting for its
  data; its descriptor names the source ports and the TX unit reads each beat once they
  have written it back (:mod:`.tx`).  The arrived bits stay the completion condition.
* The head entry's issue terms are registered from the row every cycle and used a cycle
  later.  What they read only becomes more permissive while the head waits (arrival bits
  are set, never cleared, while RUNNING; units go idle on their own but are started only
  here, and a start retires the head), so a registered "yes" is still true; the timestep
  moving on forces a recompute.
* The issue decision and the TX units meet through registers (timing): ``tx_go`` is
  registered before it loads a unit, and the issue logic sees the units' idle flags a
  cycle late, masked for the two cycles after a start, so a unit is never seen idle
  between its start and its load.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..link.flit import Op
from .params import NicParams
from .rx import FlowTableSignature
from .tx import TxDescriptor

__all__ = ["Issue"]

NOP, REDUCE, GATHER = Op.NOP, Op.REDUCE, Op.GATHER     # the one op code (link.flit.Op)


class Issue(wiring.Component):
    """Run state machine, timestep/lockstep counters and the head entry's issue.

    Parameters
    ----------
    params : NicParams

    Members
    -------
    start, clear : ``In(1)``
        START (registered here) and CLEAR (clears DONE and SCAN_FAILED).
    entries, lockstep : ``In``
        The ENTRIES and LOCKSTEP registers.
    row_data : ``In(row_words * 32)``
        The table RAM's read data (registered here into ``row``).
    row_addr : ``Out``
        The table RAM's read address (the scan's row, else the head entry).
    row : ``Out(params.row)``
        The row register (for the scan).
    scan_reset, scan_active, scan_finished, scan_bad : the scan's control
    run_init : ``Out(1)``
        The cycle the run starts (receive state reset, empty chunks arrived).
    tables : ``In(FlowTableSignature(params))``
    reduce_done, gather_done : ``In(max_nodes).array(ports)``
        The receive units' arrived bits.
    tx_idle : ``In(ports)``;  tx_go : ``Out(ports)``;  tx_desc : ``Out(TxDescriptor)``
        The TX units: idle flags, registered start pulses, the message.
    running, done, scan_failed : ``Out(1)``
    cycles : ``Out(32)``;  timestep, head : ``Out``
        CYCLES, TIMESTEP, HEAD registers.
    ev_table_index : ``Out(1)``
        START with ENTRIES beyond the table (pulse).
    lockstep_busy : ``Out(1)``
        The lockstep counter is running (progress, for the watchdog).
    head_owed : ``Out(ports)``
        The ports whose data the head entry still waits for: a REDUCE's child ports that
        have not contributed, a GATHER's parent port (the root's: the expected
        contributions) -- what the watchdog names.
    steplog_en, steplog_addr, steplog_data : ``Out``
        Step cycle log write: cycles spent in a finished timestep.
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        self.params = params
        P, F, E = params.ports, params.max_nodes, range(params.max_entries + 1)
        super().__init__({
            "start": In(1), "clear": In(1), "entries": In(E), "lockstep": In(32),
            "row_data": In(params.row_words * 32), "row_addr": Out(E),
            "row": Out(params.row),
            "scan_reset": Out(1), "scan_active": Out(1), "scan_row_addr": In(E),
            "scan_finished": In(1), "scan_bad": In(1), "run_init": Out(1),
            "tables": In(FlowTableSignature(params)),
            "reduce_done": In(F).array(P), "gather_done": In(F).array(P),
            "tx_idle": In(P), "tx_go": Out(P), "tx_desc": Out(TxDescriptor(params)),
            "running": Out(1), "done": Out(1), "scan_failed": Out(1),
            "cycles": Out(32), "timestep": Out(params.step_bits), "head": Out(E),
            "ev_table_index": Out(1), "lockstep_busy": Out(1), "head_owed": Out(P),
            "steplog_en": Out(1), "steplog_addr": Out(params.step_bits),
            "steplog_data": Out(32)})

    def _reduce_done_of(self, flow):
        return Cat(*[rd.bit_select(flow, 1) for rd in self.reduce_done])

    def _gather_done_of(self, flow):
        return Cat(*[gd.bit_select(flow, 1) for gd in self.gather_done]).any()

    def _expect_of(self, flow):
        """The child ports that owe ``flow`` a REDUCE contribution."""
        t = self.tables
        return Cat(*[Cat(*[x[q] for x in t.expect]).bit_select(flow, 1)
                     for q in range(self.params.ports)])

    def _head_terms(self, m, tx_idle_q) -> dict:
        """The head entry's issue terms, registered from the row every cycle."""
        p, e, t = self.params, self.row, self.tables
        P = p.ports
        hd = {"due": Signal(name="head_due"),      # the entry's step has come
              "none": Signal(name="head_sends_nothing"),
              "deps": Signal(name="head_deps_met"),
              "ports": Signal(P, name="head_ports"),   # the TX units it starts
              "idle": Signal(name="head_ports_idle")}
        send_ports = Signal(P)
        with m.Switch(e.op):
            with m.Case(REDUCE):
                for i in range(P):
                    m.d.comb += send_ports[i].eq(e.pport == i)
            with m.Case(GATHER):
                m.d.comb += send_ports.eq(e.cports)
        expect_f = self._expect_of(e.flow)
        root_ok = (expect_f & ~self._reduce_done_of(e.flow)) == 0
        self._head_owed(m, e, expect_f)
        m.d.sync += [hd["due"].eq(e.step <= self.timestep), hd["ports"].eq(send_ports),
                     hd["none"].eq((send_ports == 0) | (e.size == 0)),
                     hd["deps"].eq(Mux(e.op == REDUCE,
                                       (e.cports & ~self._reduce_done_of(e.flow)) == 0,
                                       Mux(e.pport == p.port_nil, root_ok,
                                           self._gather_done_of(e.flow)))),
                     hd["idle"].eq((send_ports & ~tx_idle_q) == 0)]
        # store: a send waits for its data; cut-through: its TX unit waits beat by beat
        hd["ready"] = 1 if p.cut_through else hd["deps"]
        return hd

    def _pace_sources(self, m, hd):
        """Cut-through: the descriptor names the ports the head's data comes from -- a
        REDUCE's children, a GATHER's parent, a root GATHER's expected children -- and
        whether the TX unit must pace on them (the data was not all in when the terms
        were registered, which is only ever conservative)."""
        p, e, d = self.params, self.row, self.tx_desc
        expect_f = self._expect_of(e.flow)
        parent = Cat(*[e.pport == q for q in range(p.ports)])
        root = e.pport == p.port_nil
        m.d.sync += [d.src.eq(Mux(e.op == REDUCE, e.cports, Mux(root, expect_f, parent))),
                     d.src_red.eq((e.op == REDUCE) | root), d.paced.eq(~hd["deps"])]

    def _head_owed(self, m, e, expect_f):
        """``head_owed``: the same dependencies as the issue decision, per port."""
        p = self.params
        gather_owed = Cat(*[(e.pport == q) & ~self._gather_done_of(e.flow)
                            for q in range(p.ports)])
        with m.Switch(e.op):
            with m.Case(REDUCE):
                m.d.comb += self.head_owed.eq(e.cports & ~self._reduce_done_of(e.flow))
            with m.Case(GATHER):
                m.d.comb += self.head_owed.eq(Mux(e.pport == p.port_nil,
                                                  expect_f & ~self._reduce_done_of(e.flow),
                                                  gather_owed))

    def elaborate(self, platform):
        m = Module()
        p, t = self.params, self.tables
        P, F = p.ports, p.max_nodes
        start_q = Signal()                # registered START (fabric pin or CTRL write)
        m.d.sync += start_q.eq(self.start)
        # the row is registered out of the RAM (slow clock-to-out) before the scan checks
        # and the issue logic look at it: a row is seen two cycles after its address
        m.d.sync += self.row.eq(self.row_data[:p.row.size])
        e = self.row
        tx_go = Signal(P)                 # start pulse from the issue logic
        tx_idle_q = Signal(P)
        m.d.sync += [self.tx_go.eq(tx_go), tx_idle_q.eq(self.tx_idle & ~tx_go & ~self.tx_go)]
        m.d.sync += [self.tx_desc.flow.eq(e.flow), self.tx_desc.op.eq(e.op),
                     self.tx_desc.step.eq(e.step), self.tx_desc.start.eq(e.start),
                     self.tx_desc.size.eq(e.size)]
        hd = self._head_terms(m, tx_idle_q)
        if p.cut_through:
            self._pace_sources(m, hd)
        # every expected receive (REDUCE contributions, GATHER from the parent) written back
        # (registered: it only grows while RUNNING, so one cycle late is only conservative)
        rx_all_done = Signal()
        m.d.sync += rx_all_done.eq(Cat(*[
            ((t.expect[f] & ~Cat(*[rd[f] for rd in self.reduce_done])) == 0) &
            ((t.gather_port[f] == p.port_nil) | Cat(*[gd[f] for gd in self.gather_done]).any())
            for f in range(F)]).all())
        m.d.comb += self.row_addr.eq(self.head)
        self._fsm(m, start_q, tx_go, tx_idle_q.all(), rx_all_done, hd)
        with m.If(self.clear):
            m.d.sync += [self.done.eq(0), self.scan_failed.eq(0)]
        return m

    def _log_step(self, m, step_start):
        m.d.comb += [self.steplog_addr.eq(self.timestep),
                     self.steplog_data.eq(self.cycles - step_start), self.steplog_en.eq(1)]

    def _fsm(self, m, start_q, tx_go, tx_all_idle, rx_all_done, hd):
        p, e = self.params, self.row
        ts, hp, cycles = self.timestep, self.head, self.cycles
        lk = Signal(32, name="lockstep_left")
        head_w = Signal()                 # head row read, in the register next cycle
        head_ok = Signal()
        head_ok2 = Signal()               # ... and its issue terms registered
        step_start = Signal(32)
        with m.FSM(name="sched"):
            with m.State("IDLE"):
                with m.If(start_q):
                    with m.If(self.entries > p.max_entries):
                        m.d.comb += self.ev_table_index.eq(1)
                        m.d.sync += self.scan_failed.eq(1)
                    with m.Else():
                        m.d.sync += [self.done.eq(0), self.scan_failed.eq(0)]
                        m.next = "INIT"
            with m.State("INIT"):
                # a cycle of its own to reset the scan and every flow's tables: their
                # enables then come from the state register, not from the START decode
                m.d.comb += self.scan_reset.eq(1)
                m.d.sync += cycles.eq(0)
                m.next = "SCAN"
            with m.State("SCAN"):
                m.d.comb += [self.scan_active.eq(1), self.row_addr.eq(self.scan_row_addr)]
                with m.If(self.scan_finished):
                    m.next = "FINISH"
            with m.State("FINISH"):
                with m.If(self.scan_bad):
                    m.d.sync += self.scan_failed.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.run_init.eq(1)
                    m.d.sync += [hp.eq(0), head_w.eq(0), head_ok.eq(0), head_ok2.eq(0),
                                 ts.eq(1), lk.eq(0), self.running.eq(1), step_start.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.sync += [cycles.eq(cycles + 1), head_w.eq(1), head_ok.eq(head_w),
                             head_ok2.eq(head_ok)]
                with m.If(lk != 0):
                    m.d.sync += lk.eq(lk - 1)
                    m.d.comb += self.lockstep_busy.eq(1)
                advance = Signal()
                with m.If(hp >= self.entries):
                    with m.If(tx_all_idle & rx_all_done):
                        self._log_step(m, step_start)
                        m.d.sync += [self.running.eq(0), self.done.eq(1)]
                        m.next = "IDLE"
                with m.Elif(head_ok2):
                    with m.If(hd["due"]):
                        with m.Switch(e.op):
                            with m.Case(NOP):
                                m.d.sync += lk.eq(self.lockstep)
                                m.d.comb += advance.eq(1)
                            with m.Case(REDUCE, GATHER):
                                # an entry that sends nothing (root, empty chunk,
                                # receive-only GATHER) retires at once: it must not block
                                # the sends behind it (head-of-line); its completion is
                                # what later entries and DONE wait for
                                with m.If(hd["none"]):
                                    m.d.comb += advance.eq(1)
                                with m.Elif(hd["ready"] & hd["idle"]):
                                    m.d.comb += [tx_go.eq(hd["ports"]), advance.eq(1)]
                    with m.Elif((lk == 0) & tx_all_idle):
                        self._log_step(m, step_start)
                        # the head's terms were computed with the old timestep: redo them
                        m.d.sync += [ts.eq(ts + 1), step_start.eq(cycles), head_ok2.eq(0)]
                with m.If(advance):
                    m.d.sync += [hp.eq(hp + 1), head_w.eq(0), head_ok.eq(0), head_ok2.eq(0)]
