"""Per-flow tables of a NIC: what each flow (tree) expects this node to receive.

Loaded once per run by the table scan (:class:`~.scan.TableScan`) from the schedule rows,
and, for the ORDER table, by the host before START.  Read by the receive units (checks,
order gate) and the issue logic (dependencies, completion); static while RUNNING.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..link.flit import Op
from .params import NicParams
from .rx import FlowTableSignature, order_step_nil

__all__ = ["FlowTable", "order_table_index"]

REDUCE, GATHER = Op.REDUCE, Op.GATHER


def order_table_index(params: NicParams, flow: int, port: int) -> int:
    """Word offset of the ORDER-table entry (flow, port) inside host region 3."""
    return params.order_addr(flow, port) & ((1 << params.region_bits) - 1)


class FlowTable(wiring.Component):
    """The per-flow tables (see :class:`~.rx.FlowTableSignature` for ``tables``).

    Parameters
    ----------
    params : NicParams

    Members
    -------
    tables : ``Out(FlowTableSignature(params))``
        expect (child ports owing a REDUCE contribution), gather_port (the parent port a
        GATHER comes from; ``port_nil`` at the root), start/size/end (the chunk), and the
        ORDER table ``order_step[port][flow]``.
    reset : ``In(1)``
        Empty every flow (the scan's first cycle).
    write_en : ``In(max_nodes)``
        One-hot: the flow the scan row ``write_row`` (op, pport, cports, start, size;
        ``write_end`` = start + size) describes.  A REDUCE row adds its child ports, a
        GATHER row with a parent sets the gather port; both set the chunk.
    order_we, order_addr, order_data : ``In``
        Host write of ORDER-table word ``order_addr`` (see :func:`order_table_index`).
    clear : ``In(1)``
        CLEAR: every ORDER entry back to "unknown".
    empty_reduce, empty_gather : ``Out(max_nodes).array(ports)``
        Per port: the flows whose expected REDUCE / GATHER from that port carry an empty
        chunk (nothing is sent: they count as arrived from the start).
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        self.params = params
        P, F = params.ports, params.max_nodes
        super().__init__({
            "tables": Out(FlowTableSignature(params)),
            "reset": In(1), "write_en": In(F), "write_row": In(params.row),
            "write_end": In(params.abits + 1),
            "order_we": In(1), "order_addr": In(params.region_bits), "order_data": In(32),
            "clear": In(1),
            "empty_reduce": Out(F).array(P), "empty_gather": Out(F).array(P)})

    def elaborate(self, platform):
        m = Module()
        p, t = self.params, self.tables
        P, F = p.ports, p.max_nodes
        row = self.write_row
        with m.If(self.reset):
            for f in range(F):
                m.d.sync += [t.expect[f].eq(0), t.gather_port[f].eq(p.port_nil),
                             t.start[f].eq(0), t.size[f].eq(0), t.end[f].eq(0)]
        # each flow's registers load from a registered one-hot enable (the decode would
        # otherwise fan out to all of them)
        for f in range(F):
            with m.If(self.write_en[f]):
                m.d.sync += [t.start[f].eq(row.start), t.size[f].eq(row.size),
                             t.end[f].eq(self.write_end)]
                with m.If(row.op == REDUCE):
                    m.d.sync += t.expect[f].eq(t.expect[f] | row.cports)
                with m.If((row.op == GATHER) & (row.pport != p.port_nil)):
                    m.d.sync += t.gather_port[f].eq(row.pport)
        with m.If(self.order_we):
            for q in range(P):
                for f in range(F):
                    with m.If(self.order_addr == order_table_index(p, f, q)):
                        m.d.sync += t.order_step[q][f].eq(self.order_data)
        with m.If(self.clear):
            m.d.sync += [t.order_step[q][f].eq(order_step_nil(p))
                         for q in range(P) for f in range(F)]
        for q in range(P):
            m.d.comb += [
                self.empty_reduce[q].eq(Cat(*[(t.size[f] == 0) & t.expect[f][q]
                                              for f in range(F)])),
                self.empty_gather[q].eq(Cat(*[(t.size[f] == 0) & (t.gather_port[f] == q)
                                              for f in range(F)]))]
        return m
