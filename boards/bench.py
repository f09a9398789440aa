"""``python -m treenic.bench --only boards``: host link and board bitstream figures.

* ``engine_*``: the host protocol engine alone (Amaranth simulator): cycles per 1 KiB
  WRITE datagram back to back, and the payload rate that gives at the NIC's 125 MHz;
* ``frame_bound_fraction``: the best a 1 KiB WRITE can do on 1 Gb/s Ethernet from frame
  arithmetic (preamble, Ethernet/IPv4/UDP headers, the protocol header, FCS, gap);
* ``host_link_*``: measured over simulated RGMII by the board bench
  (``sim/board/test_board_core.py`` writes ``build/sim/board_core/throughput.json``);
  ``None`` with a note when that bench has not run;
* ``pmod_link_*``: the serial (PMOD) link's flit payload rate per direction, measured by
  ``sim/link_serial/test_link_serial.py`` (saturated link, writes
  ``build/sim/link_serial/throughput.json``), and its line rate;
* ``bitstreams``: each ``build/bitstream/<board>/report.json`` found (Fmax and slack per
  clock, utilisation, build seconds); boards not built are listed as such.

Goal (issue): host link >= 90 % of 1 Gb/s for bulk buffer writes.
"""
from __future__ import annotations

import json
from pathlib import Path

from treenic.hdl.host.model import HEADER_WORDS, Op, encode_request

__all__ = ["run"]

ROOT = Path(__file__).resolve().parents[1]
#: bytes a UDP datagram costs on the wire beyond its payload: preamble+SFD 8, Ethernet
#: header 14, IPv4 20, UDP 8, FCS 4, inter-frame gap 12
WIRE_OVERHEAD = 8 + 14 + 20 + 8 + 4 + 12
GOAL = 0.90


def _engine_cycles(n: int = 8, words: int = 256) -> float:
    """Cycles per WRITE datagram of *words* through the engine, back to back, no stalls:
    from the first word in to the n-th reply's last word out, divided by n."""
    import numpy as np
    from amaranth.sim import Simulator
    from treenic.hdl.host.engine import HostEngine
    from treenic.hdl.nic import HOST_READ_LATENCY

    eng = HostEngine(addr_bits=16, read_latency=HOST_READ_LATENCY, max_words=words)
    count = {"ticks": 0, "replies": 0}

    async def tick(ctx):
        if ctx.get(eng.tx.valid) and ctx.get(eng.tx.payload.last):
            count["replies"] += 1
        await ctx.tick()
        count["ticks"] += 1

    async def tb(ctx):
        ctx.set(eng.tx.ready, 1)
        for k in range(n):
            ws = np.frombuffer(encode_request(Op.WRITE, k + 1, 0, payload=range(words)), "<u4")
            for i, w in enumerate(ws):
                ctx.set(eng.rx.valid, 1)
                ctx.set(eng.rx.payload, {"data": int(w), "last": i == len(ws) - 1,
                                         "length": 4 * len(ws), "peer": 0})
                while True:
                    ready = ctx.get(eng.rx.ready)
                    await tick(ctx)
                    if ready:
                        break
            ctx.set(eng.rx.valid, 0)
        while count["replies"] < n:
            await tick(ctx)

    sim = Simulator(eng)
    sim.add_clock(8e-9)
    sim.add_testbench(tb)
    sim.run()
    return count["ticks"] / n


def _bitstreams() -> dict:
    out = {}
    for rep in sorted((ROOT / "build" / "bitstream").glob("*/report.json")):
        r = json.loads(rep.read_text())
        out[rep.parent.name] = {k: r.get(k) for k in (
            "board", "fmax_mhz_per_clock", "target_mhz_per_clock", "slack_ns_per_clock",
            "worst_slack_ns", "slack_ok", "utilisation", "seconds", "links")}
    return out


def _pmod_link() -> dict:
    meas = ROOT / "build" / "sim" / "link_serial" / "throughput.json"
    if not meas.exists():
        return {"pmod_link_payload_mbps": None,
                "pmod_link_source": "not measured: run pytest sim/link_serial"}
    t = json.loads(meas.read_text())
    return {"pmod_link_payload_mbps": round(t["payload_mbps"], 1),
            "pmod_link_line_rate_mbps": t["line_rate_mbps"],
            "pmod_link_cycles_per_flit": t["cycles_per_flit"],
            "pmod_link_up_cycles": t["link_up_cycles"],
            "pmod_link_source": f"{meas.relative_to(ROOT)} ({t['simulator']}, "
                                f"{t['lanes']} lanes at {t['clock_mhz']:g} MHz DDR)"}


def run(out_dir: Path, quick: bool = False) -> dict:
    out_dir = Path(out_dir) / "boards"
    out_dir.mkdir(parents=True, exist_ok=True)
    words = 256
    payload = 4 * words
    frame_bound = payload / (payload + 4 * HEADER_WORDS + WIRE_OVERHEAD)
    cyc = _engine_cycles(4 if quick else 8, words)
    res = {"engine_cycles_per_1KiB_write": round(cyc, 1),
           "engine_payload_mbps_at_125MHz": round(payload * 8 * 125 / cyc, 1),
           "frame_bound_fraction": round(frame_bound, 4), "goal_fraction": GOAL}
    meas = ROOT / "build" / "sim" / "board_core" / "throughput.json"
    if meas.exists():
        t = json.loads(meas.read_text())
        res.update({"host_link_payload_mbps": round(t["payload_mbps"], 1),
                    "host_link_fraction": round(t["line_rate_fraction"], 4),
                    "host_link_goal_met": t["line_rate_fraction"] >= GOAL,
                    "host_link_source": f"{meas.relative_to(ROOT)} ({t['simulator']})"})
    else:
        res.update({"host_link_payload_mbps": None, "host_link_fraction": None,
                    "host_link_goal_met": None,
                    "host_link_source": "not measured: run pytest sim/board/test_board_core.py"})
    res.update(_pmod_link())
    res["bitstreams"] = _bitstreams() or "none built (make bitstream BOARD=ecpix5)"
    lines = ["# Boards", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.items() if k != "bitstreams"]
    lines += ["", "Bitstreams: `" + json.dumps(res["bitstreams"]) + "`", ""]
    (out_dir / "section.md").write_text("\n".join(lines))
    return res
