"""cocotb: host-protocol requests as Ethernet frames into a BoardCore's RGMII pins."""
import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles
from cocotb.utils import get_sim_time

from board_net import HostPort
from harness import SIM_DIR, bench_params
from treenic.hdl.host import model as wire
from treenic.hdl.host.model import Op, encode_request
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.params import ID_VALUE, Reg


async def start(dut):
    dut.rgmii__rx_ctl.value = 0
    dut.rgmii__rx_data.value = 0
    dut.rst.value = 1
    dut.eth_rst.value = 1
    cocotb.start_soon(Clock(dut.clk, 8, unit="ns").start())
    cocotb.start_soon(Clock(dut.eth_clk, 13332, unit="ps").start())
    port = HostPort(dut)
    await ClockCycles(dut.clk, 20)
    dut.rst.value = 0
    dut.eth_rst.value = 0
    await ClockCycles(dut.clk, 200)
    return port


@cocotb.test()
async def host_protocol_over_rgmii(dut):
    p = NicParams(**bench_params()["nic"])
    rng = random.Random(1)
    port = await start(dut)
    seq = 100

    async def req(op, addr=0, count=None, payload=()):
        nonlocal seq
        seq += 1
        raw = await port.request(encode_request(op, seq, addr, count, payload))
        assert raw is not None, f"no reply to {op.name} seq {seq}"
        r = wire.decode_reply(raw)
        assert (r.op, r.seq) == (op, seq)
        return r

    r = await req(Op.READ, int(Reg.ID), 1)
    assert r.payload == (ID_VALUE,), r
    assert port.arp_replies >= 1           # the board resolved the host before replying
    words = [rng.getrandbits(32) for _ in range(200)]
    await req(Op.WRITE, p.buf_addr(0), payload=words)
    r = await req(Op.READ, p.buf_addr(0), 200)
    assert list(r.payload) == words
    # a malformed datagram is dropped (no reply) and counted
    bad = bytearray(encode_request(Op.WRITE, 999, p.buf_addr(0), payload=[1, 2]))
    bad[17] ^= 0x40
    assert await port.request(bytes(bad), timeout_ns=100_000) is None
    # a retried WRITE (same seq) is acknowledged as DUP, not executed again: the "retry"
    # here carries different data, which must not reach the buffer
    seq += 1
    first = wire.decode_reply(await port.request(
        encode_request(Op.WRITE, seq, p.buf_addr(0), payload=[7])))
    again = wire.decode_reply(await port.request(
        encode_request(Op.WRITE, seq, p.buf_addr(0), payload=[9])))
    assert first.flags == 0 and again.flags == wire.Flag.DUP, (first, again)
    assert (await req(Op.READ, p.buf_addr(0), 1)).payload == (7,)
    # host link throughput: 16 back-to-back 1 KiB WRITEs (pipelined, as the udp backend
    # sends them), from the first frame queued to the last reply received
    n, data = 16, [rng.getrandbits(32) for _ in range(256)]
    t0 = get_sim_time("ns")
    for k in range(n):
        seq += 1
        await port.send(encode_request(Op.WRITE, seq, p.buf_addr(256 * (k % 4)),
                                       payload=data))
    for _ in range(n):
        raw, _, _ = await port.replies.get()
        assert wire.decode_reply(raw).op == Op.WRITE
    dt = get_sim_time("ns") - t0
    mbps = n * 1024 * 8 / dt * 1000
    res = {"datagrams": n, "payload_bytes": n * 1024, "sim_ns": dt, "payload_mbps": mbps,
           "line_rate_fraction": mbps / 1000, "simulator": f"{cocotb.SIM_NAME} (cocotb, "
           "cocotbext-eth RGMII at 125 MHz DDR)"}
    out = SIM_DIR.parent / "build" / "sim" / "board_core" / "throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    dut._log.info(f"host link: {mbps:.1f} Mb/s of WRITE payload over simulated RGMII "
                  f"({mbps / 10:.1f} % of 1 Gb/s)")
    st = await req(Op.STATUS)
    accepted, dropped, dups = st.payload[-3:]
    assert (dropped, dups) == (1, 1), st.payload
    dut._log.info("board core: ID, 200-word write/read, malformed drop, DUP: ok "
                  f"(accepted {accepted})")
