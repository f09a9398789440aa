"""The VPI-free Verilator co-simulation harness (treenic.hdl.cosim) on small designs."""
import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from treenic.hdl import cosim
from treenic.hdl.cosim import Port, _vl_name, pack_words, parse_ports, unpack_words

needs_verilator = pytest.mark.skipif(not cosim.cosim_available(),
                                     reason="verilator / C++ compiler not on PATH")


class WideAcc(wiring.Component):
    """o = running 80-bit sum of i (stream in, stream out), plus a plain counter."""
    i: In(stream.Signature(80))
    o: Out(stream.Signature(80))
    count: Out(16)
    bias: In(80)

    def elaborate(self, platform):
        m = Module()
        acc = Signal(80)
        m.d.sync += self.count.eq(self.count + 1)
        with m.If(self.o.ready | ~self.o.valid):
            m.d.sync += self.o.valid.eq(0)
            with m.If(self.i.valid):
                m.d.sync += [acc.eq(acc + self.i.payload),
                             self.o.payload.eq(acc + self.i.payload + self.bias),
                             self.o.valid.eq(1)]
        m.d.comb += self.i.ready.eq(self.o.ready | ~self.o.valid)
        return m


def test_vl_name_mangling():
    assert _vl_name("i__payload") == "i___05Fpayload"
    assert _vl_name("clk") == "clk"
    assert _vl_name("a___b") == "a___05F_b"


def test_parse_ports_and_words():
    v = "module top(a, b, clk);\n  input [79:0] a;\n  output b;\n  input clk;\nendmodule\n"
    assert parse_ports(v, "top") == [Port(0, "a", "input", 80), Port(1, "b", "output", 1),
                                     Port(2, "clk", "input", 1)]
    vals = [0, (1 << 80) - 1, 0x1234_5678_9ABC_DEF0_1122]
    assert unpack_words(pack_words(vals, 80)) == vals


@needs_verilator
def test_cosim_ports_step_and_streams():
    lib = cosim.build_cosim(WideAcc(), name="test_wideacc")
    sim = lib.new()
    sim.reset()
    c0 = sim["count"]
    sim.step(10)
    assert sim["count"] == c0 + 10 and sim.cycle >= 10
    with pytest.raises(ValueError):
        sim["bias"] = 1 << 80
    with pytest.raises(KeyError):
        sim["nope"]
    big = (1 << 79) + 12345
    sim["bias"] = 0
    sim["o__ready"] = 1
    sim["i__payload"] = big
    sim["i__valid"] = 1
    sim.step()
    sim["i__valid"] = 0
    assert sim["o__valid"] == 1 and sim["o__payload"] == big
    sim.step()
    assert sim["o__valid"] == 0

    # bulk pump with stalls: running sums of 80-bit values, carried on from `big`
    rng = np.random.default_rng(5)
    vals = [int(x) << 40 | int(y) for x, y in zip(rng.integers(0, 1 << 40, 5000),
                                                  rng.integers(0, 1 << 40, 5000))]
    res = sim.run_streams(inputs={"i": vals}, outputs={"o": len(vals)}, valid_prob=0.5,
                          ready_prob=0.5, seed=3)
    got = unpack_words(res.outputs["o"])
    exp, acc = [], big
    for x in vals:
        acc = (acc + x) % (1 << 80)
        exp.append(acc)
    assert got == exp
    assert res.cycles > len(vals) * 2      # stalls happened
    # a second instance is independent
    other = lib.new()
    other.reset()
    assert other["o__valid"] == 0
    # an impossible request times out instead of hanging
    with pytest.raises(TimeoutError):
        sim.run_streams(outputs={"o": 1}, max_cycles=100)


@needs_verilator
def test_cosim_trace(tmp_path):
    lib = cosim.build_cosim(WideAcc(), name="test_wideacc_trace", trace=True)
    sim = lib.new()
    sim.trace(tmp_path / "w.vcd")
    sim.reset()
    sim.step(5)
    sim.trace(None)
    text = (tmp_path / "w.vcd").read_text()
    assert "$var" in text and "count" in text and "#45" in text
    # a library without tracing refuses politely
    plain = cosim.build_cosim(WideAcc(), name="test_wideacc").new()
    with pytest.raises(RuntimeError, match="trace=True"):
        plain.trace(tmp_path / "x.vcd")


@needs_verilator
def test_cosim_step_until_and_pump_edges():
    sim = cosim.build_cosim(WideAcc(), name="test_wideacc").new()
    sim.reset()
    sim["o__ready"] = 0
    c0 = sim["count"]
    assert sim.step_until(50, "o__valid") == 50          # never rises: all n cycles
    assert sim["count"] == (c0 + 50) & 0xFFFF
    sim["i__payload"] = 7
    sim["i__valid"] = 1
    assert sim.step_until(50, "o__valid") == 1           # stops on the cycle it rises
    sim["i__valid"] = 0
    assert sim["o__valid"] == 1 and sim["o__payload"] == 7
    assert sim.step_until(50, "o__valid") == 0           # already high: no cycle
    with pytest.raises(ValueError, match="1-bit output"):
        sim.step_until(5, "count")
    # the pump clocks exactly res.cycles edges and leaves the model settled with clk low
    c1, e1 = sim["count"], sim.cycle
    res = sim.run_streams(inputs={"i": [1, 2, 3]}, outputs={"o": 4}, ready_prob=0.5, seed=2)
    assert unpack_words(res.outputs["o"]) == [7, 8, 10, 13]
    assert sim.cycle - e1 == res.cycles
    assert sim["count"] == (c1 + res.cycles) & 0xFFFF
    sim.step(3)
    assert sim["count"] == (c1 + res.cycles + 3) & 0xFFFF
