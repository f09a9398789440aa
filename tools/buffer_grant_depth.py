"""Logic depth of the gradient buffer's grant path under each bank arbiter (issue 20).

    python tools/buffer_grant_depth.py [--arbiter fixed,rotating,age] [--depth 1024]

Synthesises :class:`treenic.hdl.nic.buffer.BankedBuffer` in the NIC's reader shape (16
banks, 2 lanes, 1 host + 4 write-back RX + 4 TX readers, 5 writers) with Yosys
``synth_ecp5`` (the ``synth`` extra's YoWASP Yosys, as ``make synth`` installs it:
``tools/setup_env.sh sim,torch,test,synth``). For each arbiter it prints the longest path in cells between
registers and block RAMs (``ltp`` with TRELLIS_FF and DP16KD cut out; it runs from a
reader's ``addr`` input through its grant to the registered rows) and the cell counts.
Yosys' LUT counts move by thousands between netlists that differ in a few gates, so
compare the depth, not the area. This is no timing figure: only place and route gives
one. Files go to ``build/grant_depth/<arbiter>/``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from amaranth.back import rtlil

from treenic.boards import synth
from treenic.hdl.nic.buffer import ARBITERS, BankedBuffer

def grant_depth(arbiter: str, depth: int, out: Path) -> dict:
    """Synthesise one buffer; returns its longest register-to-register path and cells."""
    out.mkdir(parents=True, exist_ok=True)
    dut = BankedBuffer(depth=depth, banks=16, lanes=2, readers=9, writers=5,
                       write_back=range(1, 5), arbiter=arbiter)
    (out / "top.il").write_text(rtlil.convert(dut, name="top"))
    # yowasp tools see the working directory only: relative paths
    rel = os.path.relpath(out)
    script = (f"read_rtlil {rel}/top.il; synth_ecp5 -top top; tee -o {rel}/stat.txt stat; "
              f"tee -o {rel}/ltp.txt ltp * t:TRELLIS_FF %d t:DP16KD %d")
    env = synth._tool_env()                 # the YoWASP Yosys, as the synthesis flow runs it
    run = subprocess.run([env["YOSYS"], "-q", "-p", script], env=env, capture_output=True,
                         text=True)
    if run.returncode:
        raise SystemExit(f"buffer_grant_depth: yosys failed for {arbiter}: "
                         f"{run.stderr.strip().splitlines()[-1:]}")
    ltp = re.search(r"Longest topological path in \S+ \(length=(\d+)\)",
                    (out / "ltp.txt").read_text())
    cells = synth.parse_yosys_stat((out / "stat.txt").read_text())
    cells.pop("cells", None)
    return {"longest_path_cells": int(ltp.group(1)) if ltp else None, "cells": cells}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arbiter", default=",".join(ARBITERS),
                    help=f"comma list of {', '.join(ARBITERS)}")
    ap.add_argument("--depth", type=int, default=1024, help="buffer elements (16..65536)")
    a = ap.parse_args(argv)
    arbs = a.arbiter.split(",")
    bad = [x for x in arbs if x not in ARBITERS]
    if bad:
        ap.error(f"unknown arbiter(s) {bad}; known: {list(ARBITERS)}")
    if not 16 <= a.depth <= 65536:
        ap.error(f"--depth {a.depth} outside 16..65536")
    res = {arb: grant_depth(arb, a.depth, Path("build/grant_depth") / arb) for arb in arbs}
    print(json.dumps({"what": "gradient buffer, NIC reader shape, yosys synth_ecp5; "
                      "longest path in cells between registers/block RAMs",
                      "depth": a.depth, "arbiters": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
