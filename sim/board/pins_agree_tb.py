"""cocotb: the reference half of the simulator agreement check -- the requests of
treenic.boards.pinsim.agreement_requests into a PinBoard's RGMII pins through
cocotbext-eth's RGMII models; replies and the bulk WRITE rate go to params["out"]."""
import json

import cocotb
from cocotb.utils import get_sim_time

from board_net import start_boards
from harness import bench_params


@cocotb.test()
async def same_requests_through_cocotbext(dut):
    p = bench_params()
    for i in range(p["ports"]):
        getattr(dut, f"lanes_rx__{i}").value = 0
    port, = await start_boards(dut)
    replies = []
    for r in p["requests"]:
        raw = await port.request(bytes.fromhex(r), timeout_ns=p["timeout_ns"])
        replies.append(raw.hex() if raw is not None else None)
    t0 = get_sim_time("ns")
    for r in p["bulk"]:
        await port.send(bytes.fromhex(r))
    for _ in p["bulk"]:
        await port.replies.get()
    dt = get_sim_time("ns") - t0
    res = {"replies": replies, "bulk_replies": len(p["bulk"]), "sim_ns": dt,
           "bulk_payload_mbps": len(p["bulk"]) * 1024 * 8 / dt * 1000}
    with open(p["out"], "w") as f:
        json.dump(res, f)
