"""Short fault campaign on the Verilated fabric (make sim): every fault class injected at
random cycles of a ring:4 MultiTree all-reduce, with per-sub-packet link CRC, watchdogs and
the driver's stuck check.  No run may finish "ok" with a result that differs from the
golden executor's; every destructive fault must be detected.  The full campaign is
``python -m treenic.bench --only faults --runs 1000 --json``."""
import os
import re

import pytest

from treenic.hdl import cosim
from treenic.faults import CLASSES, campaign

pytestmark = pytest.mark.skipif(not cosim.cosim_available(),
                                reason="verilator / C++ compiler not on PATH")

RUNS = int(os.environ.get("TREENIC_FAULT_RUNS", "24"))


def test_short_fault_campaign():
    res = campaign(RUNS, seed=int(os.environ.get("TREENIC_FAULT_SEED", "1")), keep_runs=True)
    assert res["silent_wrong"] == 0, res["silent_wrong_faults"]
    assert set(res["classes"]) == set(CLASSES)
    for cls, s in res["classes"].items():
        assert set(s) == {"injected", "detected", "recovered", "silent_wrong",
                          "detect_cycles_max"}
        assert s["injected"] == s["detected"] + s["recovered"] + s["silent_wrong"]
        if cls in ("drop", "dead_link"):
            # data lost on a link can never end in a correct "ok" (a duplicate of a link's
            # last sub-packet may arrive after DONE: the result is right, so it "recovers")
            assert s["recovered"] == 0, (cls, s)
    injected = sum(s["injected"] for s in res["classes"].values())
    assert injected >= RUNS // 2, res
    # a detected fault is noticed within the watchdog limit plus the driver's poll
    wd = res["fabric"]["watchdog"]
    for cls, s in res["classes"].items():
        assert s["detect_cycles_max"] <= 3 * wd + 1024, (cls, s, wd)
    # the driver's exception names what the watchdog waited for: port, flow and step
    dead = [r for r in res["runs_detail"]
            if r["fault"]["class"] == "dead_link" and r["outcome"] == "detected"]
    assert dead
    for r in dead:
        assert re.search(r"WATCHDOG \(watchdog: no (credit|contribution|gather data) on port "
                         r"\d+ for flow \d+ step \d+\)", r["error"]), r["error"]
    # a doubled sub-packet is caught by the link CRC (its implicit sequence number); a
    # flipped one by the CRC too, unless the flip turned the link's last end flit into a
    # body (then the depacketiser's LINK error or the watchdog catch it)
    for r in res["runs_detail"]:
        if r["fault"]["class"] == "dup" and r["outcome"] == "detected":
            assert "LINK_CRC" in r["error"], r
        if r["fault"]["class"] == "bitflip" and r["outcome"] == "detected":
            assert re.search(r"LINK|WATCHDOG", r["error"]), r
