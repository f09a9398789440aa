import json
import subprocess
import sys

import pytest

from treenic import cli
from treenic.algorithms import build
from treenic.schedule import check, cost

BIG = 16 << 20      # 64 MiB of float32 per node


def test_multitree_beats_ring_and_ring2d_on_torus8x8_under_contention():
    t = {a: cost.contention(build(a, "torus:8x8"), BIG) for a in ("multitree", "ring2d", "ring")}
    assert t["multitree"] < t["ring2d"] < t["ring"] or t["multitree"] < min(t["ring2d"], t["ring"])


def test_dbtree_suffers_contention_on_torus():
    s = build("dbtree", "torus:8x8")
    mt = build("multitree", "torus:8x8")
    assert check.link_conflicts(s) > 0 and check.link_conflicts(mt) == 0
    assert cost.contention(s, BIG) > 1.05 * cost.ideal(s, BIG)
    assert cost.contention(mt, BIG) == pytest.approx(cost.ideal(mt, BIG))
    assert cost.contention(s, BIG) > 5 * cost.contention(mt, BIG)


def test_alpha_beta_ring_closed_form():
    s = build("ring", "ring:8")
    m = 8 * 1024 * 4
    alpha, bw = 1e-6, 1e9
    expect = 2 * 7 * alpha + 2 * 7 / 8 * m / bw
    assert cost.alpha_beta(s, m // 4, alpha=alpha, bandwidth=bw) == pytest.approx(expect)


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "treenic.cli", *argv], capture_output=True,
                          text=True, timeout=120)


def test_cli_schedule_json():
    r = run_cli("schedule", "torus:4x4", "--algorithm", "multitree", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["nodes"] == 16 and d["link_conflicts"] == 0
    assert set(d["steps"]) == {"reduce_scatter", "all_gather"} and d["build_seconds"] >= 0


def test_cli_allreduce_json():
    r = run_cli("allreduce", "mesh:2x2", "--algorithm", "multitree", "--elements", "1000",
                "--json")
    d = json.loads(r.stdout)
    assert d["bit_exact"] is True and d["nodes"] == 4 and d["elements"] == 1000
    assert d["alpha_beta_seconds"] > 0 and d["contention_seconds"] > 0


@pytest.mark.parametrize("topo, bound, paper", [("torus:4x4", 5, 6), ("switch:6", 5, 6)])
def test_cli_variant_flag(topo, bound, paper):
    """--variant picks MultiTree's construction; the default is ``bound``, ``paper`` is
    Algorithm 1 as printed (issue 20's table)."""
    runs = {v: run_cli("schedule", topo, "--json", *(["--variant", v] if v else []))
            for v in (None, "bound", "paper")}
    got = {v: json.loads(r.stdout) for v, r in runs.items()}
    assert got[None] == {**got["bound"], "build_seconds": got[None]["build_seconds"]}
    assert got["bound"]["variant"] == "bound" and got["paper"]["variant"] == "paper"
    assert got["bound"]["steps"]["all_gather"] == bound
    assert got["paper"]["steps"]["all_gather"] == paper
    assert got["paper"]["construction"].endswith("/ports")         # Algorithm 1's order
    assert all(d["link_conflicts"] == 0 for d in got.values())
    r = run_cli("allreduce", topo, "--variant", "paper", "--elements", "300", "--json")
    d = json.loads(r.stdout)
    assert d["variant"] == "paper" and d["steps"] == 2 * paper and d["bit_exact"] is True


def test_cli_export_and_table(tmp_path):
    out = tmp_path / "s.json"
    assert cli.main(["schedule", "mesh:2x2", "--export", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == "treenic-schedule"
    assert cli.main(["schedule", "mesh:2x2", "--table", "0"]) == 0


@pytest.mark.parametrize("argv, msg", [
    (["schedule", "torus:4x4", "--algorithm", "nope"], "unknown algorithm"),
    (["schedule", "torus:4x"], "malformed"),
    (["schedule", "ring:1"], "at least 2"),
    (["allreduce", "ring:4", "--elements", "0"], "elements"),
    (["schedule", "ring2d", "--algorithm", "multitree"], "unknown topology"),
])
def test_cli_errors_are_one_line(argv, msg):
    r = run_cli(*argv)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and msg in r.stderr and r.stderr.startswith("treenic: error:")
