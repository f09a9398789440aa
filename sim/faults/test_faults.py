"""Short fault campaign on the Verilated fabric (make sim): every fault class injected at
random cycles of a ring:4 MultiTree all-reduce, with per-sub-packet link CRC, watchdogs and
the driver's stuck check.  No run may finish "ok" with a result that differs from the
golden executor's; every destructive fault must be detected.  The full campaign is
``python -m treenic.bench --only faults --runs 1000 --json``."""
import os

import pytest

from treenic.hdl import cosim
from treenic.faults import CLASSES, campaign

pytestmark = pytest.mark.skipif(not cosim.cosim_available(),
                                reason="verilator / C++ compiler not on PATH")

RUNS = int(os.environ.get("TREENIC_FAULT_RUNS", "24"))


def test_short_fault_campaign():
    res = campaign(RUNS, seed=int(os.environ.get("TREENIC_FAULT_SEED", "1")))
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
