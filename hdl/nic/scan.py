"""Table scan: START reads the schedule table once, one row per cycle, validates every row
(op, flow, range) and loads the per-flow tables (:class:`~.flow_table.FlowTable`).

A row is seen two cycles after its address (RAM read, then the issue logic's row
register); then three stages: the row registered with its checks (a carry chain), the
flow's one-hot write enable registered, the flow-table write.  A table with a bad row is
rejected: the issue logic reports SCAN_FAILED and nothing is sent or written.
"""
from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..link.flit import Op
from .params import NicParams

__all__ = ["TableScan"]

NOP = Op.NOP
BAD_OP = Op.SPARSE  # code 3: heads sparse link messages, never valid in a dense table row


class TableScan(wiring.Component):
    """The scan pipeline.

    Parameters
    ----------
    params : NicParams

    Members
    -------
    reset : ``In(1)``
        Restart the scan (the cycle before it runs).
    active : ``In(1)``
        Scan (one row address per cycle until ``entries``).
    row : ``In(params.row)``
        The row read two cycles after its address.
    entries, elements, flows : ``In``
        The ENTRIES, ELEMENTS and FLOWS registers.
    row_addr : ``Out``
        The table row to read.
    finished : ``Out(1)``
        Every row was read and checked and every flow-table write done.
    bad : ``Out(1)``
        A row failed a check (sticky until ``reset``).
    ev_bad_op, ev_entry_range : ``Out(1)``
        A row with op code 3 / a range beyond ELEMENTS or a flow >= FLOWS (pulses).
    write_en, write_row, write_end : ``Out``
        Flow-table write: one-hot flow, the row, its start + size.
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        self.params = params
        E = range(params.max_entries + 1)
        super().__init__({
            "reset": In(1), "active": In(1), "row": In(params.row),
            "entries": In(E), "elements": In(params.abits),
            "flows": In(range(params.max_nodes + 1)),
            "row_addr": Out(E), "finished": Out(1), "bad": Out(1),
            "ev_bad_op": Out(1), "ev_entry_range": Out(1),
            "write_en": Out(params.max_nodes), "write_row": Out(params.row),
            "write_end": Out(params.abits + 1)})

    def elaborate(self, platform):
        m = Module()
        p, e = self.params, self.row
        AB, F = p.abits, p.max_nodes
        scan_i = self.row_addr
        reading = Signal()                # a row read is in flight
        in_row_reg = Signal()             # ... and in ``row`` now
        checked_v = Signal()              # stage 2: the row and its checks
        checked = Signal(p.row)
        checked_end = Signal(AB + 1)
        bad_op = Signal()
        bad_range = Signal()
        with m.If(self.reset):
            m.d.sync += [scan_i.eq(0), reading.eq(0), in_row_reg.eq(0), checked_v.eq(0),
                         self.write_en.eq(0), self.bad.eq(0)]
        with m.Elif(self.active):
            with m.If(scan_i < self.entries):
                m.d.sync += scan_i.eq(scan_i + 1)
            m.d.sync += [reading.eq(scan_i < self.entries), in_row_reg.eq(reading),
                         checked_v.eq(in_row_reg), checked.eq(e),
                         checked_end.eq(e.start + e.size),
                         bad_op.eq(e.op == BAD_OP),
                         bad_range.eq((e.op != NOP) & (((e.start + e.size) > self.elements) |
                                                       (e.flow >= self.flows)))]
            with m.If(checked_v):
                with m.If(bad_op):
                    m.d.comb += self.ev_bad_op.eq(1)
                    m.d.sync += self.bad.eq(1)
                with m.Elif(bad_range):
                    m.d.comb += self.ev_entry_range.eq(1)
                    m.d.sync += self.bad.eq(1)
            row_ok = checked_v & ~bad_op & ~bad_range & (checked.op != NOP)
            m.d.sync += [self.write_row.eq(checked), self.write_end.eq(checked_end),
                         self.write_en.eq(Mux(row_ok, Const(1, F) << checked.flow, 0))]
        m.d.comb += self.finished.eq((self.write_en == 0) & ~checked_v & ~in_row_reg &
                                     ~reading & (scan_i == self.entries))
        return m
