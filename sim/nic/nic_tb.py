"""cocotb bench of one NIC against golden neighbours.

The bench plays every neighbour of one node of a schedule: it sends that node's incoming
messages (payloads from the golden executor's state at the end of the previous step) as
flits from the golden packetiser, honouring the NIC's credits and causality (a step-t
message only after the NIC sent all its messages of earlier steps) but with random gaps
and no other pacing -- messages of adjacent steps on different ports overlap and reorder
-- and it drains the NIC's TX ports with randomly delayed credit returns
(backpressure).  It checks every flit the NIC sends against the golden packetiser of the
golden payload, and the final buffer bit for bit against execute()."""
import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge, ReadOnly

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.algorithms import build
from treenic.firmware.image import ImageSet
from treenic.hdl.link.model import packetise
from treenic.hdl.nic.host import host_writes
from treenic.hdl.nic.model import expected_buffers
from treenic.hdl.nic.core import HOST_READ_LATENCY
from treenic.hdl.nic.params import NicParams, Reg
from treenic.schedule.execute import execute
from treenic.schedule.ir import Op, Schedule


def state_before(schedule, buffers, step):
    """Golden buffers at the end of step-1 (executor on the schedule's prefix)."""
    sub = Schedule(schedule.algorithm, schedule.topology, schedule.num_chunks,
                   [t for t in schedule.transfers if t.step < step], schedule.reduce_steps,
                   schedule.gather_steps)
    return execute(sub, buffers)


def messages(schedule, buffers, node, params, direction):
    """{port: [flit ints]} of the messages node receives ("in") or sends ("out")."""
    E = buffers.shape[1]
    b = schedule.chunk_bounds(E)
    topo = schedule.topology
    out = {}
    for t in schedule.transfers:
        if (t.dst if direction == "in" else t.src) != node:
            continue
        st = state_before(schedule, buffers, t.step)
        (c,) = t.chunks
        words = st[t.src, b[c]:b[c + 1]].view(np.uint32).tolist()
        if not words:
            continue
        port_tx = topo.port_to(t.src, t.dst)
        port_rx = topo.port_to(t.dst, t.src)
        hdr = {"vc": 0, "next": port_tx, "eject": port_tx, "flow": t.flow, "op": int(t.op),
               "step": t.step, "offset": int(b[c]), "dest": t.dst, "src": t.src}
        fl = packetise(hdr, words, params.mode, params.fmt, sub_words=params.sub_words,
                       packet_words=params.packet_words)
        key = port_rx if direction == "in" else port_tx
        out.setdefault(key, []).append((t.step, fl))
    return {p: [(s, f) for s, fl in sorted(v, key=lambda x: x[0]) for f in fl]
            for p, v in out.items()}


async def host_write(dut, addr, val):
    dut.host__addr.value = addr
    dut.host__wdata.value = val
    dut.host__we.value = 1
    await RisingEdge(dut.clk)
    dut.host__we.value = 0


async def host_read(dut, addr):
    dut.host__addr.value = addr
    dut.host__re.value = 1
    await RisingEdge(dut.clk)
    dut.host__re.value = 0
    for _ in range(HOST_READ_LATENCY - 1):
        await RisingEdge(dut.clk)
    await ReadOnly()
    v = int(dut.host__rdata.value)
    await RisingEdge(dut.clk)
    return v


@cocotb.test()
async def nic_vs_golden_neighbours(dut):
    prm = bench_params()
    rnd = random.Random(bench_seed())
    params = NicParams(**prm["nic"])
    sched = build(prm["algorithm"], prm["topology"])
    node, E = prm["node"], prm["elements"]
    rng = np.random.default_rng(bench_seed())
    bufs = rng.standard_normal((sched.n, E)).astype(np.float32)
    imgs = ImageSet.from_bytes(bytes.fromhex(prm["images"]))   # the compiler's, as built
    gold = expected_buffers(imgs, bufs)
    rx_msgs = messages(sched, bufs, node, params, "in")
    tx_msgs = messages(sched, bufs, node, params, "out")
    P = params.ports
    # causality: a neighbour's step-t message depends on everything this node sent
    # before step t; release it once the NIC has sent all its flits of steps < t
    tx_before = {}
    all_tx = sorted(s for v in tx_msgs.values() for s, _ in v)
    for s in range(1, sched.steps + 2):
        tx_before[s] = sum(1 for x in all_tx if x < s)
    tx_msgs = {i: [f for _, f in v] for i, v in tx_msgs.items()}
    for i in range(P):
        getattr(dut, f"rx__{i}__valid").value = 0
        getattr(dut, f"tx__{i}__credit").value = 0
    dut.host__we.value = 0
    dut.host__re.value = 0
    dut.start.value = 0
    await start_clock_and_reset(dut)
    for a, v in host_writes(params, imgs, bufs, order=prm.get("order", True))[node]:
        await host_write(dut, a, v)
    await host_write(dut, Reg.CTRL, 1)

    send_p, stall_p, credit_delay = prm["send_prob"], prm["stall"], prm["credit_delay"]
    rx_pos = {i: 0 for i in range(P)}
    rx_cred = {i: params.credits for i in range(P)}
    got = {i: [] for i in range(P)}
    pending_credit = {i: [] for i in range(P)}     # cycles at which to return one credit
    cycle = 0
    for cycle in range(prm["max_cycles"]):
        await ReadOnly()
        done = int(dut.done.value)
        err = int(dut.error.value)
        for i in range(P):
            if int(getattr(dut, f"tx__{i}__valid").value):
                got[i].append(int(getattr(dut, f"tx__{i}__flit").value))
                pending_credit[i].append(cycle + rnd.randint(1, credit_delay))
            rx_cred[i] += int(getattr(dut, f"rx__{i}__credit").value)
        if done or err:
            break
        await RisingEdge(dut.clk)
        for i in range(P):
            flits = rx_msgs.get(i, [])
            sent = sum(len(v) for v in got.values())
            go = (rx_pos[i] < len(flits) and rx_cred[i] > 0 and rnd.random() < send_p
                  and sent >= tx_before[flits[rx_pos[i]][0]])
            getattr(dut, f"rx__{i}__valid").value = int(go)
            if go:
                getattr(dut, f"rx__{i}__flit").value = flits[rx_pos[i]][1]
                rx_pos[i] += 1
                rx_cred[i] -= 1
            ret = [c for c in pending_credit[i] if c <= cycle and rnd.random() > stall_p]
            if ret:
                pending_credit[i].remove(ret[0])
            getattr(dut, f"tx__{i}__credit").value = int(bool(ret))
    await RisingEdge(dut.clk)
    for i in range(P):
        getattr(dut, f"rx__{i}__valid").value = 0
    assert not err, f"NIC flagged errors {await host_read(dut, Reg.ERR_FLAGS):#x}"
    assert done, f"NIC not done after {cycle} cycles"
    for i in range(P):
        exp = tx_msgs.get(i, [])
        assert got[i] == exp, (f"port {i}: {len(got[i])} flits sent, golden {len(exp)}; first "
                               f"difference at {next((k for k, (a, b) in enumerate(zip(got[i], exp)) if a != b), None)}")
    res = [await host_read(dut, params.buf_addr(e)) for e in range(E)]
    g = gold[node].view(np.uint32).tolist()
    assert res == g, f"buffer differs at {[e for e in range(E) if res[e] != g[e]][:8]}"
    dut._log.info("node %d done in %d cycles, %s flits sent", node, cycle,
                  {i: len(v) for i, v in got.items()})
