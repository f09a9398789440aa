"""Amaranth-simulator unit tests of the NIC core: registers, table loader/scan, issue logic
(timestep, lockstep NOP, dependencies), receive checks and error flags, and a small fabric
all-reduce compared bit for bit with the golden executor."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from treenic.algorithms import build
from treenic.firmware.image import compile_images
from treenic.hdl.link.flit import FlitType
from treenic.hdl.link.model import packetise
from treenic.hdl.nic import ErrBit, Nic, NicParams, Reg, Status, ID_VALUE
from treenic.hdl.nic.core import HOST_READ_LATENCY
from treenic.hdl.nic.fabric import Fabric, wiring_plan
from treenic.hdl.nic.host import (NicImageError, buffer_writes, host_writes, image_writes,
                                  order_writes, params_for_images, sim_run_fabric)
from treenic.hdl.nic.model import expected_port_counters, ideal_cycles, port_messages
from treenic.schedule.execute import execute
from treenic.topology import parse

P2 = NicParams(ports=2, depth=32, max_nodes=4, max_entries=16, max_steps=8, sub_words=8,
               credits=8)


def run_nic(params, body, cycles=4000):
    nic = Nic(params)
    sim = Simulator(nic)
    sim.add_clock(1e-8)
    out = {}

    async def tb(ctx):
        async def wr(addr, val):
            ctx.set(nic.host.addr, addr)
            ctx.set(nic.host.wdata, val)
            ctx.set(nic.host.we, 1)
            await ctx.tick()
            ctx.set(nic.host.we, 0)

        async def rd(addr):
            ctx.set(nic.host.addr, addr)
            ctx.set(nic.host.re, 1)
            await ctx.tick()
            ctx.set(nic.host.re, 0)
            await ctx.tick().repeat(HOST_READ_LATENCY - 1)
            return ctx.get(nic.host.rdata)

        await body(ctx, nic, wr, rd, out)

    sim.add_testbench(tb)
    sim.run()
    return out


def row(params, op, flow, step, pport, cports, start, size):
    return params.encode_row(op, flow, step, pport, cports, start, size)


async def load_rows(params, wr, rows):
    for i, r in enumerate(rows):
        for k in range(params.row_words):
            await wr(params.table_addr(i, k), (r >> (32 * k)) & 0xFFFFFFFF)
    await wr(Reg.ENTRIES, len(rows))


def test_registers_and_host_errors():
    async def body(ctx, nic, wr, rd, out):
        out["id"] = await rd(Reg.ID)
        await wr(Reg.LOCKSTEP, 1234)
        out["lk"] = await rd(Reg.LOCKSTEP)
        await wr(P2.buf_addr(5), 0x3F800000)
        out["b5"] = await rd(P2.buf_addr(5))
        out["err0"] = await rd(Reg.ERR_FLAGS)
        await wr(P2.table_addr(P2.max_entries, 0), 1)      # row out of range
        await wr(Reg.ELEMENTS, P2.depth + 1)               # too many elements
        out["err1"] = await rd(Reg.ERR_FLAGS)
        out["cnt"] = await rd(Reg.ERR_COUNT)
        out["el"] = await rd(Reg.ELEMENTS)
        await wr(Reg.CTRL, 2)
        out["err2"] = await rd(Reg.ERR_FLAGS)
    o = run_nic(P2, body)
    assert o["id"] == ID_VALUE and o["lk"] == 1234 and o["b5"] == 0x3F800000
    assert o["err0"] == 0
    assert o["err1"] == (1 << ErrBit.TABLE_INDEX) | (1 << ErrBit.HOST_RANGE)
    assert o["cnt"] == 2 and o["el"] == 0          # rejected write changed nothing
    assert o["err2"] == 0


@pytest.mark.parametrize("bad", ["op", "range", "flow"])
def test_scan_rejects_bad_table(bad):
    rows = [row(P2, 1, 0, 1, 0, [], 0, 4), row(P2, 2, 0, 2, 0, [], 0, 4)]
    if bad == "op":
        rows.append(row(P2, 3, 0, 3, None, [], 0, 0))
    elif bad == "range":
        rows.append(row(P2, 2, 1, 3, None, [1], 6, 4))      # 6+4 > 8 elements
    else:
        rows.append(row(P2, 2, 3, 3, None, [1], 0, 4))      # flow 3 >= FLOWS 2

    async def body(ctx, nic, wr, rd, out):
        await wr(Reg.ELEMENTS, 8)
        await wr(Reg.FLOWS, 2)
        await load_rows(P2, wr, rows)
        await wr(Reg.CTRL, 1)
        sent = 0
        for _ in range(60):
            await ctx.tick()
            sent += ctx.get(nic.tx[0].valid) + ctx.get(nic.tx[1].valid)
        out["status"] = await rd(Reg.STATUS)
        out["err"] = await rd(Reg.ERR_FLAGS)
        out["sent"] = sent
    o = run_nic(P2, body)
    assert o["status"] & Status.SCAN_FAILED and not o["status"] & Status.RUNNING
    assert o["sent"] == 0
    want = ErrBit.BAD_OP if bad == "op" else ErrBit.ENTRY_RANGE
    assert o["err"] == 1 << want


def test_issue_lockstep_and_reduce_send():
    """NOP at step 1 holds the node for LOCKSTEP cycles; the step-2 REDUCE (a leaf) then
    sends its chunk to the parent port with exactly the golden packetiser's flits."""
    L = 40
    rows = [row(P2, 0, 0, 1, None, [], 0, 0), row(P2, 1, 1, 2, 1, [], 3, 5)]
    vals = np.arange(8, dtype=np.float32) + 0.5

    async def body(ctx, nic, wr, rd, out):
        await wr(Reg.ELEMENTS, 8)
        await wr(Reg.FLOWS, 2)
        await wr(Reg.LOCKSTEP, L)
        await wr(Reg.NODE, 3)
        for a, v in buffer_writes(P2, vals):
            await wr(a, v)
        await load_rows(P2, wr, rows)
        ctx.set(nic.tx[1].credit, 0)
        await wr(Reg.CTRL, 1)
        flits, first = [], None
        for c in range(200):
            await ctx.tick()
            if ctx.get(nic.tx[1].valid):
                first = c if first is None else first
                flits.append(ctx.get(nic.tx[1].flit.as_value()))
            assert not ctx.get(nic.tx[0].valid)
        out.update(flits=flits, first=first, status=await rd(Reg.STATUS),
                   ts=await rd(Reg.TIMESTEP), s1=await rd(P2.steplog_addr(1)))
    o = run_nic(P2, body)
    words = vals[3:8].view(np.uint32).tolist()
    gold = packetise({"vc": 0, "next": 1, "eject": 1, "flow": 1, "op": 1, "step": 2,
                      "offset": 3}, words, "message", P2.fmt, sub_words=P2.sub_words)
    assert o["flits"] == gold
    assert o["first"] >= L                       # lockstep held the send
    assert o["status"] & Status.DONE and o["ts"] == 2 and o["s1"] >= L


def _rx_flits(params, **hdr):
    words = hdr.pop("words")
    h = {"vc": 0, "next": 0, "eject": 0, **hdr}
    return packetise(h, words, "message", params.fmt, sub_words=params.sub_words)


@pytest.mark.parametrize("case", ["gather_ok", "gather_before_start", "unknown_flow",
                                  "outside_chunk", "unexpected_port", "reduce_children"])
def test_receive_checks(case):
    """Port 0 = parent of flow 1 (GATHER), port 1 = child of flow 0 (REDUCE root).
    ``gather_before_start``: the message arrives before START, so its header waits in the
    RX stage while the scan fills the per-flow tables; its checks must see the filled ones."""
    rows = [row(P2, 1, 0, 2, None, [1], 0, 4),       # root of flow 0, child on port 1
            row(P2, 2, 1, 3, 0, [], 4, 4)]            # leaf of flow 1, parent on port 0
    base = np.full(8, 2.0, dtype=np.float32)
    data = np.array([1.5, -2.25, 1e-40, 7.0], dtype=np.float32)
    bits = data.view(np.uint32).tolist()
    port, flits = 0, []
    if case in ("gather_ok", "gather_before_start"):
        flits = _rx_flits(P2, flow=1, op=2, step=3, offset=4, words=bits)
    elif case == "unknown_flow":
        flits = _rx_flits(P2, flow=3, op=2, step=3, offset=4, words=bits)
    elif case == "outside_chunk":
        flits = _rx_flits(P2, flow=1, op=2, step=3, offset=2, words=bits)
    elif case == "unexpected_port":
        flits = _rx_flits(P2, flow=0, op=1, step=1, offset=0, words=bits)   # on port 0
    else:
        port = 1
        flits = _rx_flits(P2, flow=0, op=1, step=1, offset=0, words=bits)

    async def body(ctx, nic, wr, rd, out):
        await wr(Reg.ELEMENTS, 8)
        await wr(Reg.FLOWS, 2)
        for a, v in buffer_writes(P2, base):
            await wr(a, v)
        await load_rows(P2, wr, rows)
        early = case == "gather_before_start"
        if not early:
            await wr(Reg.CTRL, 1)
        rx = nic.rx[port]
        for f in flits:
            ctx.set(rx.valid, 1)
            ctx.set(rx.flit.as_value(), f)
            await ctx.tick()
        ctx.set(rx.valid, 0)
        if early:
            await ctx.tick().repeat(20)
            await wr(Reg.CTRL, 1)
        await ctx.tick().repeat(60)
        out["buf"] = [await rd(P2.buf_addr(e)) for e in range(8)]
        out["err"] = await rd(Reg.ERR_FLAGS)
        out["status"] = await rd(Reg.STATUS)
    o = run_nic(P2, body)
    got = np.array(o["buf"], dtype=np.uint32)
    b = base.view(np.uint32)
    if case in ("gather_ok", "gather_before_start"):
        assert o["err"] == 0
        assert got.tolist() == b[:4].tolist() + bits
        assert not o["status"] & Status.DONE     # flow 0 still waits for its child
    elif case == "reduce_children":
        assert o["err"] == 0
        exp = (base[:4] + data).view(np.uint32).tolist()
        assert got.tolist() == exp + b[4:].tolist()
    else:
        want = {"unknown_flow": ErrBit.LINK, "outside_chunk": ErrBit.FRAG_RANGE,
                "unexpected_port": ErrBit.UNEXPECTED}[case]
        assert o["err"] == 1 << want
        assert got.tolist() == b.tolist()        # nothing written


def _fabric_run(spec, alg, E, mode="message", order=True, stall=0):
    sched = build(alg, spec)
    images = compile_images(None, sched, E)
    params = params_for_images(images, depth=32, max_nodes=4, max_entries=16, max_steps=8,
                               sub_words=4, packet_words=4, credits=6, mode=mode)
    fab = Fabric(spec, params, latency=2, stall=stall, seed=3)
    rng = np.random.default_rng(5)
    bufs = rng.standard_normal((sched.n, E)).astype(np.float32)
    writes = host_writes(params, images, bufs, order=order)
    out = sim_run_fabric(fab, params, writes, sched.n, E)
    return out, execute(sched, bufs)


@pytest.mark.parametrize("mode,order,stall", [("message", True, 0), ("message", False, 80),
                                              ("packet", True, 40)])
def test_fabric_mesh2x2_bit_exact(mode, order, stall):
    out, gold = _fabric_run("mesh:2x2", "multitree", 13, mode, order, stall)
    assert out["done"] == 1 and out["error"] == 0
    assert np.array_equal(out["res"], gold.view(np.uint32))


def test_wiring_plan_pairs_ports():
    t = parse("torus:4x4")
    plan = wiring_plan(t)
    assert len(plan) == 64
    for u, i, v, j in plan:
        assert t.ports(u)[i].peer == v and t.ports(v)[j].peer == u


def test_model_and_host_helpers():
    sched = build("ring", "ring:8")
    p = NicParams(ports=2, depth=64, max_nodes=8, sub_words=8)
    imgs = compile_images(None, sched, 64)
    msgs = port_messages(imgs[0])
    assert sum(len(v) for v in msgs.values()) == 2 * (8 - 1)
    cnt = expected_port_counters(imgs, p)
    # each message: 8 words -> 1 head + 4 flits
    assert all(c["tx_flits"] == 5 * len(msgs[q]) for q, c in cnt[0].items())
    assert ideal_cycles(imgs, p) == 14 * 5
    assert all(len(order_writes(p, im)) == 7 for im in imgs)   # n-1 contributions per node
    with pytest.raises(NicImageError):
        image_writes(NicParams(ports=2, depth=32, max_nodes=8), imgs[0])


def test_tx_streams_one_flit_per_cycle():
    """With credits to spare the DMA + packetiser send a message back to back."""
    p = NicParams(ports=2, depth=256, max_nodes=4, max_entries=16, max_steps=8,
                  sub_words=16, credits=64)
    rows = [row(p, 1, 1, 1, 0, [], 0, 200)]

    async def body(ctx, nic, wr, rd, out):
        await wr(Reg.ELEMENTS, 200)
        await wr(Reg.FLOWS, 2)
        await load_rows(p, wr, rows)
        await wr(Reg.CTRL, 1)
        cyc = []
        for c in range(400):
            await ctx.tick()
            if ctx.get(nic.tx[0].valid):
                cyc.append(c)
            ctx.set(nic.tx[0].credit, ctx.get(nic.tx[0].valid))
        out["cyc"] = cyc
    o = run_nic(p, body)
    assert len(o["cyc"]) == 101                      # 1 head + 100 payload flits
    assert o["cyc"][-1] - o["cyc"][0] <= 101         # at most one bubble per message


@pytest.mark.parametrize("args", [["--elements", "0"], ["--topology", "foo:1"],
                                  ["--banks", "12"], ["--banks", "1"]])
def test_nic_bench_rejects_bad_arguments(args, tmp_path):
    from treenic.hdl.nic import bench
    with pytest.raises(SystemExit):
        bench.main(args + ["--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()              # rejected before any build


def test_nic_bench_run_rejects_nonpositive_elements(tmp_path):
    from treenic.hdl.nic import bench
    with pytest.raises(ValueError, match="elements must be positive"):
        bench.run(tmp_path / "o", elements=0)
    with pytest.raises(ValueError, match="banks must be a power of two"):
        bench.run(tmp_path / "o", banks=6)
    assert not (tmp_path / "o").exists()
