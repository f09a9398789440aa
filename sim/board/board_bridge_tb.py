"""cocotb: one BoardCore's RGMII pins bridged to a UDP socket on 127.0.0.1; the udp
driver's transport talks to it from another process (udp_client_check.py)."""
import json
import os
import socket
import subprocess
import sys

import cocotb
from cocotb.triggers import Timer

from board_net import bridge, start_boards
from harness import bench_params


@cocotb.test()
async def driver_transport_through_bridge(dut):
    p = bench_params()
    port, = await start_boards(dut)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    done = {}
    cocotb.start_soon(bridge(port, sock, lambda: "rc" in done))
    host, udp_port = sock.getsockname()
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                          "udp_client_check.py"),
                             host, str(udp_port), json.dumps(p["nic"])],
                            stdout=subprocess.PIPE, text=True)
    while proc.poll() is None:
        await Timer(20, unit="us")
    done["rc"] = proc.returncode
    out = proc.stdout.read().strip()
    dut._log.info("driver transport: %s", out)
    assert proc.returncode == 0, out
    assert json.loads(out.splitlines()[-1])["ok"]
