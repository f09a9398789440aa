"""``treenic sparse`` pieces: add_arguments / run over every registered algorithm."""
import argparse
import json

import numpy as np
import pytest

from treenic.sparse import cli
from treenic.sparse.base import REGISTRY, SparseError


def parse(*argv):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(list(argv))


REQUIRED = {"algorithm", "workers", "elements", "density", "steps", "bytes_sent_per_worker",
            "bytes_received_per_worker", "invariants", "iteration_seconds"}


@pytest.mark.parametrize("algo", sorted(REGISTRY))
def test_every_registered_algorithm_runs(algo):
    out = cli.run(parse("--algorithm", algo, "--workers", "6", "--elements", "960",
                        "--density", "0.05", "--iterations", "2", "--seed", "3"))
    assert REQUIRED <= set(out)
    assert out["algorithm"] == algo and out["workers"] == 6 and out["elements"] == 960
    assert out["steps"] >= 1 and len(out["iteration_seconds"]) == 2
    for key in ("bytes_sent_per_worker", "bytes_received_per_worker"):
        assert 0 < out[key]["mean"] <= out[key]["max"]
    assert out["invariants"] and all(isinstance(v, bool) for v in out["invariants"].values())
    json.dumps(out)                                   # the --json output is serialisable


def test_report_matches_a_direct_run():
    from treenic.sparse import synthetic
    from treenic.sparse.base import make
    out = cli.run(parse("-a", "spardl", "-P", "5", "-N", "500", "-d", "0.1", "--seed", "7"))
    a = make("spardl", workers=5, elements=500, density=0.1, seed=7)
    g = synthetic.gaussian_shared_grads(5, 500, shared=0.5, layers=4, seed=7)
    r = a.step(g)
    assert out["bytes_sent_per_worker"]["max"] == r.bytes_sent_per_worker().max()
    assert out["bytes_received_per_worker"]["mean"] == pytest.approx(r.bytes_received_per_worker().mean())
    assert out["steps"] == r.steps and out["k"] == 50
    assert out["invariants"] == {k: bool(v) for k, v in r.info["invariants"].items()}


def test_algorithm_specific_options_reach_their_algorithm():
    out = cli.run(parse("-a", "spardl", "-P", "8", "-N", "800", "-d", "0.05",
                        "--teams", "2", "--spardl-sag", "b"))
    assert out["options"] == {"sag": "b", "teams": 2}
    assert out["info"]["sag"] == "b" and out["info"]["teams"] == 2
    out = cli.run(parse("-a", "multitree-sparse", "-P", "8", "-N", "800", "-d", "0.05",
                        "--topology", "ring:8", "--flow-assignment", "hash"))
    assert out["info"]["topology"] == "ring:8" and out["info"]["flow_assignment"] == "hash"
    out = cli.run(parse("-a", "oktopk", "-P", "4", "-N", "400", "-d", "0.05",
                        "--opt", "threshold_period=2", "--opt", "repartition-period=3"))
    assert out["options"] == {"threshold_period": 2, "repartition_period": 3}


def test_zipf_workload():
    out = cli.run(parse("-a", "zen", "-P", "4", "-N", "1600", "-d", "0.05", "--workload", "zipf"))
    assert out["workload"] == "zipf"
    with pytest.raises(SparseError, match="divisible"):
        cli.run(parse("-a", "zen", "-P", "4", "-N", "1601", "-d", "0.05", "--workload", "zipf"))


@pytest.mark.parametrize("argv,msg", [
    (["-a", "nope", "-P", "4", "-N", "100", "-d", "0.1"], "unknown sparse algorithm"),
    (["-a", "topka", "-P", "4", "-N", "100", "-d", "0.1", "--teams", "2"], "applies to spardl"),
    (["-a", "spardl", "-P", "4", "-N", "100", "-d", "0.1", "--topology", "ring:4"],
     "applies to multitree-sparse"),
    (["-a", "spardl", "-P", "4", "-N", "100", "-d", "1.5"], "density"),
    (["-a", "spardl", "-P", "4", "-N", "100", "-d", "0"], "density"),
    (["-a", "spardl", "-P", "1", "-N", "100", "-d", "0.1"], "at least 2 workers"),
    (["-a", "spardl", "-P", "4", "-N", "100", "-d", "0.001"], "k = 0"),
    (["-a", "spardl", "-P", "4", "-N", "100", "-d", "0.1", "-T", "0"], "iterations"),
    (["-a", "spardl", "-P", "4", "-N", "100", "-d", "0.1", "--opt", "teams"], "KEY=VALUE"),
])
def test_bad_arguments(argv, msg):
    with pytest.raises(SparseError, match=msg):
        cli.run(parse(*argv))


def test_standalone_main(capsys):
    rc = cli.main(["-a", "topka", "-P", "3", "-N", "300", "-d", "0.1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["algorithm"] == "topka"
    with pytest.raises(SystemExit) as e:
        cli.main(["-a", "topka", "-P", "3", "-N", "300", "-d", "2"])
    assert e.value.code == 2


def test_main_cli_wiring(capsys):
    """The project CLI mounts these pieces as ``treenic sparse``."""
    main = pytest.importorskip("treenic.cli")
    rc = main.main(["sparse", "-a", "multitree-sparse", "-P", "4", "-N", "400", "-d", "0.05", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["algorithm"] == "multitree-sparse"


def test_sparse_bench_quick(tmp_path):
    """``make bench`` section: plots, markdown and numbers measured from the models."""
    from treenic.sparse import bench
    res = bench.run(tmp_path, quick=True)
    for f in ("volumes.png", "skew.png", "timing.png", "section.md"):
        assert (tmp_path / f).stat().st_size > 0
    assert set(res["timings"]) == set(REGISTRY)
    sp = {r["P"]: r for r in res["volumes"]["spardl"]}
    ta = {r["P"]: r for r in res["volumes"]["topka"]}
    # measured, not copied: TopkA's all-gather volume is exactly 2(P-1)k words per worker
    assert all(ta[p]["recv_words_per_k_max"] == 2 * (p - 1) for p in ta)
    assert all(r["invariants_ok"] for rows in res["volumes"].values() for r in rows)
    assert all(sp[p]["recv_words_per_k_max"] <= sp[p]["table_i_words_per_k"][1] + 1e-9 for p in sp)
    assert "Volume vs P" in (tmp_path / "section.md").read_text()


@pytest.mark.parametrize("name", ["topka", "topkdsa", "gtopk", "oktopk", "spardl", "multitree-sparse"])
def test_results_and_state_are_read_only(name):
    from treenic.sparse.base import make
    algo = make(name, workers=4, elements=64, density=0.1)
    res = algo.step(np.ones((4, 64), np.float32))
    with pytest.raises(ValueError):
        res.result[0, 0] = 1.0
    with pytest.raises(ValueError):
        res.residuals[0, 0] = 1.0
    algo.step(np.ones((4, 64), np.float32))          # the next step still works
    quiet = make(name, workers=4, elements=64, density=0.1, check_invariants=False)
    assert "mass_conservation" not in quiet.step(np.ones((4, 64), np.float32)).info["invariants"]
    with pytest.raises(SparseError, match="check_invariants"):
        make(name, workers=4, elements=64, density=0.1, check_invariants="yes")
