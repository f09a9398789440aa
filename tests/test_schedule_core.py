"""Schedule IR, golden executor and checkers — including schedules that must be rejected."""
import json

import numpy as np
import pytest

from treenic import topology as T
from treenic.algorithms import build
from treenic.schedule import check
from treenic.schedule.execute import execute, replay, run_and_check
from treenic.schedule.ir import Op, Schedule, ScheduleError, Transfer

R, G = Op.REDUCE, Op.GATHER


def star3(transfers, rs=1, ag=1, chunks=1):
    return Schedule("hand", T.parse("switch:3"), chunks, transfers, rs, ag)


def test_reduction_order_is_local_then_port_order():
    """Node 1 (ring:3 middle) gets two contributions in one step: must compute (x1 + x0) + x2
    when port(1->0) < port(1->2) — with values where the other order rounds differently."""
    topo = T.parse("ring:3")
    s = Schedule("hand", topo, 1, [Transfer(1, 0, 1, R, (0,), 0), Transfer(1, 2, 1, R, (0,), 0),
                                   Transfer(2, 1, 0, G, (0,), 0), Transfer(2, 1, 2, G, (0,), 0)],
                 1, 1)
    assert s.rx_port(s.transfers[0]) < s.rx_port(s.transfers[1])
    x = np.array([[1.0], [2**24], [1.0]], np.float32)      # 2^24 + 1 rounds back to 2^24
    out = execute(s, x)
    f = np.float32
    expect = (f(2**24) + f(1.0)) + f(1.0)
    assert out[0, 0] == expect == f(2**24)
    assert (x[1, 0] + (x[0, 0] + x[2, 0])) != expect       # the other bracketing differs
    assert np.array_equal(replay(s, x), out)


def test_snapshot_semantics_no_same_step_forwarding():
    topo = T.parse("ring:3")
    # 0 -> 1 and 1 -> 2 in the same step: node 2 must not see node 0's value yet
    s = Schedule("hand", topo, 1, [Transfer(1, 0, 1, R, (0,), 0), Transfer(1, 1, 2, R, (0,), 0)],
                 1, 0)
    out = execute(s, np.array([[1], [10], [100]], np.float32))
    assert out[2, 0] == 110 and out[1, 0] == 11


def test_postcondition_catches_missing_and_double_counting():
    with pytest.raises(ScheduleError, match="lacks contributions"):
        check.check_postcondition(star3([Transfer(1, 0, 1, R, (0,), 0)]))
    dup = star3([Transfer(1, 0, 1, R, (0,), 0), Transfer(2, 1, 2, R, (0,), 0),
                 Transfer(3, 0, 2, R, (0,), 0)], rs=3, ag=0)
    with pytest.raises(ScheduleError, match="twice"):
        check.check_postcondition(dup)


def test_gather_of_partial_rejected():
    s = star3([Transfer(1, 0, 1, R, (0,), 0), Transfer(2, 1, 2, G, (0,), 0)])
    with pytest.raises(ScheduleError, match="gathers chunk 0 holding only 2/3"):
        check.check_postcondition(s)


def test_dependency_checker_rejects_lost_contribution():
    s = star3([Transfer(1, 1, 0, R, (0,), 0), Transfer(2, 2, 1, R, (0,), 0)], rs=2, ag=0)
    with pytest.raises(ScheduleError, match="already forwarded"):
        check.check_dependencies(s)


@pytest.mark.parametrize("bad, msg", [
    (Transfer(0, 0, 1, R, (0,), 0), "step outside"),
    (Transfer(1, 0, 0, R, (0,), 0), "bad endpoints"),
    (Transfer(1, 0, 5, R, (0,), 0), "bad endpoints"),
    (Transfer(1, 0, 1, R, (3,), 0), "chunk ids"),
    (Transfer(2, 0, 1, R, (0,), 0), "outside its phase"),
    (Transfer(1, 0, 1, R, (0,), 0, route=(0, 1)), "route is not a path"),
])
def test_ir_validation(bad, msg):
    with pytest.raises(ScheduleError, match=msg):
        star3([bad])


def test_json_round_trip_and_errors():
    s = build("multitree", "fattree:16")
    text = s.dumps()
    d = json.loads(text)
    assert d["format"] == "treenic-schedule" and d["steps"]["reduce_scatter"] == s.reduce_steps
    back = Schedule.loads(text)
    assert back.transfers == s.transfers and back.num_chunks == s.num_chunks
    with pytest.raises(ScheduleError, match="version"):
        Schedule.from_json(dict(d, version=99))
    with pytest.raises(ScheduleError, match="does not parse"):
        Schedule.loads("{nope")
    with pytest.raises(ScheduleError, match="lacks field"):
        Schedule.from_json({k: v for k, v in d.items() if k != "num_chunks"})


def test_chunk_bounds():
    s = build("multitree", "torus:4x4")
    b = s.chunk_bounds(35)
    assert b[0] == 0 and b[-1] == 35 and list(np.diff(b)) == [3, 3, 3] + [2] * 13
    assert list(s.chunk_bounds(5)[-3:]) == [5, 5, 5]          # empty chunks are fine


def test_executor_input_validation():
    s = build("multitree", "torus:4x4")
    with pytest.raises(ScheduleError, match="float32"):
        execute(s, np.zeros((16, 4)))
    with pytest.raises(ScheduleError, match="shape"):
        execute(s, np.zeros((15, 4), np.float32))


def test_special_values_bit_exact():
    s = build("multitree", "torus:4x4")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    x[0, :4] = [np.inf, -0.0, 1e-45, 3.4e38]
    x[1, :4] = [1.0, -0.0, 1e-45, 3.4e38]
    rep = run_and_check(s, x)
    assert rep.bit_exact
    assert np.isinf(rep.result[5, 3])          # overflow to inf, as float32 does
