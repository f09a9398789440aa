"""``treenic allreduce ... --density D --engine rtl``: bad input is one line and exit 2
(before any Verilator build); the real run (slow, Verilated) is bit-exact vs the golden."""
import json
import shutil

import pytest

from test_cli_bad_input import run_cli

BAD = ["allreduce ring:4 --algorithm topka --density 0.01 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 0.01 --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 0 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 1.5 --engine rtl --elements 256",
       "allreduce ring:4 --algorithm multitree-sparse --density 0.1 --engine rtl --elements 2",
       "allreduce ring:4 --algorithm multitree-sparse --density 0.1 --engine rtl "
       "--elements 256 --iterations 0",
       "allreduce ring:4 --algorithm multitree --engine rtl --elements 256"]


@pytest.mark.parametrize("line", BAD)
def test_bad_sparse_allreduce(line):
    rc, out, err = run_cli(line)
    assert rc == 2 and out == "", (rc, err)
    assert len(err.strip().splitlines()) == 1 and "error:" in err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("verilator") is None, reason="needs verilator")
def test_sparse_allreduce_rtl_small():
    rc, out, err = run_cli("allreduce ring:4 --algorithm multitree-sparse --density 0.05 "
                           "--engine rtl --elements 256 --iterations 2 --json")
    r = json.loads(out)
    assert rc == 0 and r["bit_exact"] is True and r["engine"].startswith("Verilated sparse")
    assert r["bit_exact_per_iteration"] == [True, True] and r["malformed"] == 0
    assert r["dense_bit_exact"] is True and r["link_bytes"] < r["dense_link_bytes"]
