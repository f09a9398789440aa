"""Issue 19, defect 11: every bad input to the ``treenic`` CLI is rejected before any work
starts with exactly one line on stderr and exit status 2 (no traceback, no training run, no
allocation beyond the available memory); nonsense is not accepted."""
import contextlib
import io
import shlex

import pytest

from treenic import cli

BAD_INPUTS = [
    # topologies: malformed, degenerate, oversized, unreadable files
    "schedule fattree:4:0", "schedule fattree:0", "schedule ''", "schedule ring:x",
    "schedule torus:4x4x4", "schedule ring:0", "schedule mesh:1x1", "schedule switch:1",
    "schedule bigraph:0x4", "schedule dgx2:3", "schedule torus:2000x2000",
    "schedule ring:100000000", "allreduce torus:300x300 --elements 1",
    "schedule {tmp}/garbage.graphml", "schedule {tmp}/garbage.json",
    "schedule {tmp}/bad.edgelist", "schedule file:{tmp}/missing.json",
    # outputs
    "schedule ring:4 --export {tmp}/missing/x.json", "schedule ring:4 --export {tmp}",
    "schedule ring:4 --table 99", "schedule ring:4 --table -1",
    "schedule ring:4 --table 0 --elements -3",
    # sizes: zero, negative, beyond memory
    "allreduce ring:4 --elements 0", "allreduce ring:4 --elements -5",
    "allreduce ring:4 --elements 1000000000000", "compare ring:4 --elements 0",
    "compare ring:4 --elements -1", "compare ring:4 --elements 1000000000000",
    "allreduce ring:4 --elements 4 --seed -1", "compare ring:4 --seed -1",
    # nonsense that used to be accepted
    "compare torus:0x4", "compare ring:1",
    # algorithms
    "allreduce ring:4 -a bogus --elements 4", "schedule ring:4 -a bogus",
    # construction variants: unknown, or for an algorithm without variants
    "schedule ring:4 --variant bogus", "schedule ring:4 -a ring --variant paper",
    "allreduce ring:4 --variant bogus --elements 4", "train --variant bogus",
    "train --algorithm ring --variant bound",
    # training: checked before any process is spawned
    "train --workers 1", "train --workers 0", "train --workers 100000", "train --epochs 0",
    "train --density 2", "train --density 0.01 --scheme bogus", "train --algorithm bogus",
    "train --topology ring:3", "train --topology torus:0x4", "train --warmup-iters -1",
    "train --out /dev/null/x",
    "train --backend udp --boards 10.0.0.1,10.0.0.2 --workers 2 --host-addresses 10.0.0.9",
    "train --backend udp --simulated-boards --host-addresses 10.0.0.8,10.0.0.9 --workers 2", "demo --elements 0", "demo --elements -1",
    "demo --workers 1",
    # sparse golden models
    "sparse -a bogus -P 4 -N 100 -d 0.1", "sparse -a topka -P 1 -N 100 -d 0.1",
    "sparse -a topka -P 4 -N 0 -d 0.1", "sparse -a topka -P 4 -N 100 -d 2",
    "sparse -a topka -P 4 -N 1000000000000 -d 0.1", "sparse -a topka -P 4 -N 100 -d 0.1 -T 0",
    "sparse -a topka -P 4 -N 100 -d 0.1 --opt x",
    # usage errors
    "schedule ring:4 --table x", "nonsense", "", "schedule",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "garbage.graphml").write_text("garbage <graphml> not xml")
    (tmp / "garbage.json").write_text("{not json")
    (tmp / "bad.edgelist").write_text("0 1\n1 x y z w\n")
    return tmp


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """A bad training input must never reach the training run (it spawns processes)."""
    import treenic.train
    def refuse(*a, **k):
        raise AssertionError("training started on bad input")
    monkeypatch.setattr(treenic.train, "run", refuse)
    monkeypatch.setattr(treenic.train, "run_many", refuse)


def run_cli(line):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(shlex.split(line))
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("line", BAD_INPUTS)
def test_bad_input_one_line_exit_2(line, files):
    rc, out, err = run_cli(line.format(tmp=files))
    lines = err.strip().splitlines()
    assert rc == 2, (rc, out[-300:], err[-600:])
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    assert out == ""


def test_catch_all_prints_one_line(monkeypatch):
    def boom(args):
        raise RuntimeError("disk on fire\nsecond line")
    monkeypatch.setattr(cli, "cmd_compare", boom)
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["compare"].set_defaults(func=boom)
    rc, _, err = run_cli("compare ring:4")
    assert rc == 1
    assert err.strip() == ("treenic: internal error: RuntimeError: disk on fire second line "
                           "(set TREENIC_DEBUG=1 for the traceback)")


def test_good_inputs_still_work(tmp_path):
    assert run_cli("compare ring:4 --elements 64 --json")[0] == 0
    assert run_cli(f"schedule ring:4 --export {tmp_path}/s.json")[0] == 0
    assert (tmp_path / "s.json").exists()
    assert run_cli("allreduce torus:2x2 --elements 10")[0] == 0
