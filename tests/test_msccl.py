"""MSCCL XML export: round trip through the golden executor, bit for bit."""
import numpy as np
import pytest

from treenic.algorithms import build
from treenic.schedule.execute import execute
from treenic.schedule.msccl import MscclError, from_xml, to_xml


@pytest.mark.parametrize("alg,spec", [("multitree", "torus:4x4"), ("ring", "ring:8"),
                                      ("ring2d", "mesh:3x3"), ("dbtree", "mesh:3x3"),
                                      ("halving-doubling", "ring:6"),
                                      ("multitree", "fattree:8")])
def test_round_trip_bit_exact(alg, spec):
    s = build(alg, spec)
    text = to_xml(s)
    back = from_xml(text, s.topology)
    assert back.num_chunks == s.num_chunks
    assert sum(len(t.chunks) for t in back.transfers) == sum(len(t.chunks) for t in s.transfers)
    rng = np.random.default_rng(5)
    bufs = rng.standard_normal((s.n, 1001)).astype(np.float32) * \
        rng.uniform(0.1, 1e4, (s.n, 1)).astype(np.float32)
    want = execute(s, bufs)
    got = execute(back, bufs)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def test_xml_structure():
    import xml.etree.ElementTree as ET
    s = build("multitree", "mesh:2x2")
    algo = ET.fromstring(to_xml(s))
    assert algo.get("coll") == "allreduce" and algo.get("ngpus") == "4"
    for gpu in algo.iter("gpu"):
        for tb in gpu.iter("tb"):
            assert (tb.get("send") == "-1") != (tb.get("recv") == "-1")
            for i, st in enumerate(tb.iter("step")):
                assert int(st.get("s")) == i
                assert st.get("type") in ("s", "r", "rrc", "nop")


def test_bad_xml():
    s = build("ring", "ring:4")
    with pytest.raises(MscclError, match="does not parse"):
        from_xml("<algo", s.topology)
    with pytest.raises(MscclError, match="GPUs"):
        from_xml(to_xml(build("ring", "ring:5")), s.topology)
    with pytest.raises(MscclError, match="step types"):
        from_xml(to_xml(s).replace('type="rrc"', 'type="rrcs"'), s.topology)


def test_cli_writes_msccl_xml(tmp_path, capsys):
    from treenic.cli import main
    from treenic.topology import parse
    out = tmp_path / "mt.xml"
    assert main(["schedule", "mesh:2x2", "--algorithm", "multitree", "--msccl-xml", str(out)]) == 0
    assert "MSCCL" in capsys.readouterr().out
    s = build("multitree", "mesh:2x2")
    back = from_xml(out.read_text(), parse("mesh:2x2"))
    bufs = np.arange(4 * 9, dtype=np.float32).reshape(4, 9) / 7
    assert np.array_equal(execute(s, bufs), execute(back, bufs))


@pytest.mark.parametrize("alg,spec", [("multitree", "torus:4x4"), ("ring", "ring:5"),
                                      ("dbtree", "mesh:3x3"), ("halving-doubling", "ring:6"),
                                      ("multitree", "bigraph:4x4")])
def test_xml_runs_like_msccl_in_any_order(alg, spec):
    """The exported program, run with thread blocks interleaved at random (only the XML's
    dependencies and connection FIFOs order them), equals the golden executor bit for bit:
    the dependencies carry the IR's step semantics and the contract's reduction order."""
    from treenic.schedule.msccl import execute_xml
    s = build(alg, spec)
    text = to_xml(s)
    rng = np.random.default_rng(9)
    bufs = (rng.standard_normal((s.n, 97)) * rng.uniform(1e-3, 1e4, (s.n, 1))).astype(np.float32)
    want = execute(s, bufs)
    for seed in range(3):
        got = execute_xml(text, bufs, seed=seed)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), seed


def test_missing_reduction_order_dependency_is_caught():
    """Drop the dependencies of the REDUCE receives: some interleaving then adds
    contributions in another order and the result differs from the golden executor."""
    import re
    from treenic.schedule.msccl import execute_xml
    s = build("multitree", "torus:4x4")
    text = re.sub(r'(type="rrc"[^>]*?)depid="\d+" deps="\d+"', r'\1depid="-1" deps="-1"',
                  to_xml(s))
    rng = np.random.default_rng(9)
    bufs = (rng.standard_normal((s.n, 97)) * rng.uniform(1e-3, 1e4, (s.n, 1))).astype(np.float32)
    want = execute(s, bufs)
    assert any(not np.array_equal(want.view(np.uint32),
                                  execute_xml(text, bufs, seed=k).view(np.uint32))
               for k in range(8))
