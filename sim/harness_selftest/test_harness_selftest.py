"""Self-test of sim/harness.py: a passing bench passes, a failing bench raises.

The design is a tiny registered incrementer (``o = i + 1`` one cycle later)."""
import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from harness import BenchFailure, run_bench


class Inc(wiring.Component):
    i: In(8)
    o: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.o.eq(self.i + 1)
        return m


def test_harness_pass():
    run_bench(Inc(), name="harness_selftest", test_module="harness_selftest_tb",
              testcase="inc_ok", params={"n": 50})


def test_harness_detects_failure():
    with pytest.raises(BenchFailure, match="inc_wrong"):
        run_bench(Inc(), name="harness_selftest", test_module="harness_selftest_tb",
                  testcase="inc_wrong")
