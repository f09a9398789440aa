"""TableScan + FlowTable (hdl/nic/scan.py, flow_table.py): real schedules' table rows
(from the configuration images) scanned into the per-flow tables, compared with the
tables derived from the same images' entries; the ORDER table from ``order_writes``;
bad rows flagged (op 3, range beyond ELEMENTS, flow >= FLOWS)."""
import pytest
from amaranth.hdl import Elaboratable, Module

from treenic.algorithms import build
from treenic.firmware.image import build_images
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.flow_table import FlowTable, order_table_index
from treenic.hdl.nic.host import decode_image, order_writes
from treenic.hdl.nic.rx import order_step_nil
from treenic.hdl.nic.scan import TableScan

from nic_unit_helpers import simulate


class ScanTop(Elaboratable):
    def __init__(self, params):
        self.scan, self.flows = TableScan(params=params), FlowTable(params=params)

    def elaborate(self, platform):
        m = Module()
        m.submodules.scan, m.submodules.flows = s, f = self.scan, self.flows
        m.d.comb += [f.reset.eq(s.reset), f.write_en.eq(s.write_en),
                     f.write_row.eq(s.write_row), f.write_end.eq(s.write_end)]
        return m


def golden_tables(params, entries):
    """Per flow: (expect ports, gather port, start, size) as the image's rows state them."""
    F = params.max_nodes
    expect, gport, chunk = [0] * F, [params.port_nil] * F, [(0, 0)] * F
    for e in entries:
        if int(e.op) == 0:
            continue
        chunk[e.flow] = (e.start, e.size)
        if int(e.op) == 1:
            expect[e.flow] |= sum(1 << q for q in e.child_ports)
        elif e.parent_port is not None:
            gport[e.flow] = e.parent_port
    return expect, gport, chunk


def run_scan(params, rows, *, elements, flows, order=()):
    top = ScanTop(params)
    s, f = top.scan, top.flows
    out = {}

    async def tb(ctx):
        for a, v in order:
            ctx.set(f.order_we, 1)
            ctx.set(f.order_addr, a & ((1 << params.region_bits) - 1))
            ctx.set(f.order_data, v)
            await ctx.tick()
        ctx.set(f.order_we, 0)
        ctx.set(s.entries, len(rows))
        ctx.set(s.elements, elements)
        ctx.set(s.flows, flows)
        ctx.set(s.reset, 1)
        await ctx.tick()
        ctx.set(s.reset, 0)
        ctx.set(s.active, 1)
        addrs = [None, None]           # a row arrives two cycles after its address
        events = {"bad_op": 0, "entry_range": 0}
        for cycle in range(4 * len(rows) + 20):
            a = addrs[-2]
            ctx.set(s.row.as_value(), rows[a] if a is not None and a < len(rows) else 0)
            events["bad_op"] += ctx.get(s.ev_bad_op)
            events["entry_range"] += ctx.get(s.ev_entry_range)
            if ctx.get(s.finished):
                break
            addrs.append(ctx.get(s.row_addr))
            await ctx.tick()
        ctx.set(s.active, 0)
        out.update(finished=ctx.get(s.finished), bad=ctx.get(s.bad), events=events,
                   cycles=cycle)
        t = f.tables
        F = params.max_nodes
        out["expect"] = [ctx.get(t.expect[k]) for k in range(F)]
        out["gport"] = [ctx.get(t.gather_port[k]) for k in range(F)]
        out["chunk"] = [(ctx.get(t.start[k]), ctx.get(t.size[k])) for k in range(F)]
        out["end"] = [ctx.get(t.end[k]) for k in range(F)]
        out["order"] = [[ctx.get(t.order_step[q][k]) for k in range(F)]
                        for q in range(params.ports)]
        out["empty_reduce"] = [ctx.get(f.empty_reduce[q]) for q in range(params.ports)]

    simulate(top, tb)
    return out


@pytest.mark.parametrize("alg,spec,E", [("multitree", "mesh:2x2", 13),
                                        ("multitree", "ring:4", 3)])
def test_scan_loads_golden_flow_tables(alg, spec, E):
    sched = build(alg, spec)
    params = NicParams(ports=sched.topology.max_ports(), depth=32, max_nodes=4,
                       max_entries=16, max_steps=8)
    imgs = build_images(sched, E)
    ow = [order_writes(params, im) for im in imgs]
    for node in (0, sched.n - 1):
        entries = decode_image(imgs[node]).table.entries
        rows = [params.encode_row(int(e.op), e.flow, e.step, e.parent_port, e.child_ports,
                                  e.start, e.size) for e in entries]
        o = run_scan(params, rows, elements=E, flows=sched.n, order=ow[node])
        assert o["finished"] and not o["bad"] and o["events"] == {"bad_op": 0,
                                                                  "entry_range": 0}
        expect, gport, chunk = golden_tables(params, entries)
        assert (o["expect"], o["gport"], o["chunk"]) == (expect, gport, chunk)
        assert o["end"] == [s + n for s, n in chunk]
        nil = order_step_nil(params)
        want = [[nil] * params.max_nodes for _ in range(params.ports)]
        for a, step in ow[node]:
            idx = a & ((1 << params.region_bits) - 1)
            q, fl = next((q, fl) for q in range(params.ports) for fl in range(params.max_nodes)
                         if order_table_index(params, fl, q) == idx)
            want[q][fl] = step
        assert o["order"] == want
        assert o["empty_reduce"] == [sum(1 << fl for fl in range(params.max_nodes)
                                         if chunk[fl][1] == 0 and expect[fl] >> q & 1)
                                     for q in range(params.ports)]


@pytest.mark.parametrize("bad", ["op", "range", "flow"])
def test_scan_flags_bad_rows(bad):
    p = NicParams(ports=2, depth=32, max_nodes=4, max_entries=16, max_steps=8)
    good = p.encode_row(1, 1, 1, 0, [], 0, 4)
    row = {"op": p.encode_row(3, 0, 1, None, [], 0, 4),
           "range": p.encode_row(1, 1, 1, 0, [], 6, 4),
           "flow": p.encode_row(2, 3, 1, None, [1], 0, 4)}[bad]
    o = run_scan(p, [good, row, good], elements=8, flows=2)
    assert o["finished"] and o["bad"]
    assert o["events"] == {"bad_op": int(bad == "op"), "entry_range": int(bad != "op")}
