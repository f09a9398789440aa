"""cocotb: N simulated boards (BoardCluster), each one's RGMII pins bridged to a real UDP
socket on 127.0.0.1, so that host drivers outside the simulator talk to them.

Bench params: ``boards`` (N), ``addr_file`` (where the sockets' addresses are written as
JSON once the boards are out of reset), ``stop_file`` (the bridge ends when it exists),
``idle_s`` (the bridge also ends after this many wall seconds without a datagram).
"""
import json
import os
import socket
import time

import cocotb
from cocotb.triggers import Timer

from board_net import bridge, start_boards
from harness import bench_params


@cocotb.test()
async def serve_cluster(dut):
    p = bench_params()
    n = p["boards"]
    ports = await start_boards(dut, [f"b{u}_rgmii__" for u in range(n)])
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    last = {"t": time.monotonic()}

    def stop():
        return os.path.exists(p["stop_file"]) or \
            time.monotonic() - last["t"] > p.get("idle_s", 600)
    for port, s in zip(ports, socks):
        cocotb.start_soon(bridge(port, s, stop, activity=last))
    tmp = p["addr_file"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"boards": [list(s.getsockname()) for s in socks],
                   "started": time.time()}, f)
    os.replace(tmp, p["addr_file"])
    while not stop():
        await Timer(20, unit="us")
    for s in socks:
        s.close()
    dut._log.info("cluster bridge stopped (%s)", "stop file" if os.path.exists(
        p["stop_file"]) else "idle")
