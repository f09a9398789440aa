"""The synthesis flow's log parsers and registry (no synthesis run: that is `make synth`)."""
import pytest

from treenic.boards import synth

YOSYS_NEW = """
3. Printing statistics.

=== fp32_add ===

        +----------Local Count, excluding submodules.
        |
      933 wires
     1104 cells
       90   CCU2C
       41   L6MUX21
      652   LUT4
      109   PFUMX
      212   TRELLIS_FF
        2   DP16KD
"""

YOSYS_OLD = """
=== top ===

   Number of wires:                933
   Number of cells:               1104
     CCU2C                          17
     LUT4                          345
     TRELLIS_FF                    120
     TRELLIS_DPR16X4                 8
"""

NEXTPNR = """Info: Device utilisation:
Info: \t          TRELLIS_IO:       4/    365     1%
Info: \t              DP16KD:       1/    208     0%
Info: \t          TRELLIS_FF:     331/  83640     0%
Info: \t        TRELLIS_COMB:     953/  83640     1%
Info: Max frequency for clock '$glbnet$cd_sync.clk': 100.60 MHz (PASS at 100.00 MHz)
Info: Routing..
Info: Max frequency for clock '$glbnet$cd_sync.clk': 107.87 MHz (PASS at 100.00 MHz)
"""


def test_parse_yosys_stat_both_layouts():
    a = synth.parse_yosys_stat(YOSYS_NEW)
    assert (a["luts"], a["carry"], a["ffs"], a["brams"], a["lutram"]) == (652, 90, 212, 2, 0)
    b = synth.parse_yosys_stat(YOSYS_OLD)
    assert (b["luts"], b["carry"], b["ffs"], b["brams"], b["lutram"]) == (345, 17, 120, 0, 8)
    with pytest.raises(ValueError):
        synth.parse_yosys_stat("no statistics here")


def test_parse_nextpnr_takes_post_route_fmax():
    r = synth.parse_nextpnr_log(NEXTPNR)
    assert r["fmax_mhz"] == pytest.approx(107.87)
    assert r["utilisation"]["TRELLIS_COMB"] == (953, 83640)
    assert r["utilisation"]["DP16KD"] == (1, 208)
    with pytest.raises(ValueError):
        synth.parse_nextpnr_log("Info: nothing")


def test_registry_and_markdown():
    assert set(synth.DEFAULT_TOPS) <= set(synth.TOPS)
    synth.register_top("dummy_top", lambda: None, headline=True)
    try:
        assert synth.DEFAULT_TOPS[0] == "dummy_top"
    finally:
        synth.TOPS.pop("dummy_top")
        synth.DEFAULT_TOPS.remove("dummy_top")
    blk = {"top": "x", "fmax_mhz": 123.4, "luts": 1, "carry_cells": 2, "ffs": 3, "brams": 4,
           "lutram": 0, "dsps": 0,
           "pnr_utilisation_with_wrapper": {"TRELLIS_COMB": [5, 10], "TRELLIS_FF": [6, 10]}}
    md = synth._markdown({"device": synth.DEVICE, "blocks": [blk], "out": "o", "tops": ["x"]})
    assert "| x | 123.4 | 1 | 2 | 3 | 4 | 0 | 0 | 5 / 6 of 10 |" in md


def test_unknown_top_is_an_error(tmp_path):
    with pytest.raises(SystemExit):
        synth.main(["--out", str(tmp_path), "--top", "no_such_top"])


def test_pnr_platform_constrains_the_clock_to_the_target():
    plat = synth._platform(125.0)
    clk = plat.lookup("clk100", 0)
    assert clk.clock.frequency == pytest.approx(125e6)
    assert synth._platform(90.0).lookup("clk100", 0).clock.frequency == pytest.approx(90e6)


def test_nonpositive_clock_is_an_error(tmp_path):
    with pytest.raises(SystemExit):
        synth.main(["--out", str(tmp_path / "x"), "--clock-mhz", "0"])
    assert not (tmp_path / "x").exists()            # nothing written


# --------------------------------------------------------------- whole-design timing
from treenic.boards import timing   # noqa: E402

# a -> lut1 -> lut2 -> b.DI (late), a -> b.CE (early), c (another register) -> lut2,
# and an asynchronous reset path that must not count
REPORT = {
    "fmax": {"clk": {"achieved": 100.0, "constraint": 125}},
    "critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
        {"type": "clk-to-q", "delay": 0.3, "from": {"cell": "a_TRELLIS_FF_Q", "port": "Q"},
         "to": {"cell": "a_TRELLIS_FF_Q", "port": "Q"}},
        {"type": "setup", "delay": 0.2, "from": {"cell": "b_TRELLIS_FF_Q_3", "port": "DI"},
         "to": {"cell": "b_TRELLIS_FF_Q_3", "port": "DI"}}]}],
    "detailed_net_timings": [
        {"net": "b_TRELLIS_FF_Q_3_DI", "driver": "b_LUT4_Z", "port": "F", "event": "posedge clk",
         "endpoints": [{"cell": "b_TRELLIS_FF_Q_3", "port": "DI", "delay": [1.0, 9.8],
                        "event": "posedge clk"}]},
        {"net": "a", "driver": "a_TRELLIS_FF_Q", "port": "Q", "event": "posedge clk",
         "endpoints": [{"cell": "b_TRELLIS_FF_Q_3", "port": "CE", "delay": [0.9, 0.9],
                        "event": "posedge clk"},
                       {"cell": "b_TRELLIS_FF_Q", "port": "DI", "delay": [0.7, 7.5],
                        "event": "posedge clk"}]},
        {"net": "rst", "driver": "rst_TRELLIS_FF_Q", "port": "Q", "event": "<async>",
         "endpoints": [{"cell": "b_TRELLIS_FF_Q", "port": "LSR", "delay": [20.0, 20.0],
                        "event": "<async>"}]},
    ]}


def _cell(t, ins, outs):
    return {"type": t, "port_directions": {**{p: "input" for p in ins},
                                            **{p: "output" for p in outs}},
            "connections": {**ins, **outs}}


ROUTED = {"modules": {"top": {
    "cells": {"a_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"DI": [9]}, {"Q": [1]}),
              "c_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"DI": [9]}, {"Q": [2]}),
              "lut1": _cell("TRELLIS_COMB", {"A": [1]}, {"F": [3]}),
              "b_LUT4_Z": _cell("TRELLIS_COMB", {"A": [3], "B": [2]}, {"F": [4]}),
              "b_TRELLIS_FF_Q_3": _cell("TRELLIS_FF", {"DI": [4], "CE": [1]}, {"Q": [5]})},
    "netnames": {"a": {"bits": [1]}, "c": {"bits": [2]},
                 "x_LUT4_Z": {"bits": [3], "hide_name": 1}, "b_TRELLIS_FF_Q_3_DI": {"bits": [4]},
                 "b[3]": {"bits": [5]}}}}}


def test_timing_every_endpoint_slack_and_grouping():
    eps = timing.analyse(REPORT, 8.0)
    assert [(e.cell, e.port) for e in eps] == [("b_TRELLIS_FF_Q_3", "DI"),
                                               ("b_TRELLIS_FF_Q", "DI"),
                                               ("b_TRELLIS_FF_Q_3", "CE")]   # no async LSR
    worst = eps[0]
    assert worst.register == "b"
    # setup of DI taken from the critical path's segment: 8 - 0.2 - 9.8
    assert worst.slack == pytest.approx(-2.0)
    assert eps[1].slack == pytest.approx(0.3)
    g = timing.summarise(eps)
    assert len(g) == 1 and g[0]["failing"] == 1 and g[0]["endpoints"] == 3
    with pytest.raises(ValueError, match="detailed"):
        timing.analyse({"critical_paths": []}, 8.0)


def test_timing_traces_the_deepest_path_to_its_start_register():
    eps = timing.analyse(REPORT, 8.0)
    timing.trace_paths(ROUTED, eps)
    assert [n for n, _ in eps[0].path] == ["a", "x_LUT4_Z", "b_TRELLIS_FF_Q_3_DI"]
    assert [lv for _, lv in eps[0].path] == [0, 1, 2]
    md = timing.format_report(eps, 8.0)
    assert "1 of 3 endpoints fail" in md and "a @0 → x @1 → b @2" in md
    assert timing.rtl_name("rx0_h_TRELLIS_FF_Q_DI_LUT4_Z[2]") == "rx0_h"


def test_timing_block_ram_inputs_are_endpoints_without_their_data_nets():
    """A block RAM whose outputs feed only a packed register has no data net in the
    report: its address and enable pins still end paths (a LUT's pins never do)."""
    import copy
    r = copy.deepcopy(REPORT)
    r["detailed_net_timings"].append(
        {"net": "addr", "driver": "b_LUT4_Z", "port": "F", "event": "posedge clk",
         "endpoints": [{"cell": "buf.bank0.0.1", "port": "ADB10", "delay": [1.0, 8.5],
                        "event": "posedge clk"},
                       {"cell": "buf.bank0.0.1", "port": "CEB", "delay": [1.0, 2.0],
                        "event": "posedge clk"},
                       {"cell": "lut9", "port": "D", "delay": [1.0, 12.0],
                        "event": "posedge clk"}]})
    eps = {(e.cell, e.port): e for e in timing.analyse(r, 8.0)}
    assert eps[("buf.bank0.0.1", "ADB10")].slack == pytest.approx(-0.5)
    assert eps[("buf.bank0.0.1", "ADB10")].register == "buf.bank0.0.1.ADB10"
    assert ("buf.bank0.0.1", "CEB") in eps and ("lut9", "D") not in eps


def _two_clock_report():
    """REPORT plus a slow clock ``eth`` with one register, and a crossing clk -> eth."""
    import copy
    r = copy.deepcopy(REPORT)
    r["fmax"]["eth"] = {"achieved": 70.0, "constraint": 50}
    r["detailed_net_timings"] += [
        {"net": "e", "driver": "e_TRELLIS_FF_Q", "port": "Q", "event": "posedge eth",
         "endpoints": [{"cell": "f_TRELLIS_FF_Q", "port": "DI", "delay": [1.0, 15.0],
                        "event": "posedge eth"}]},
        {"net": "x", "driver": "a_TRELLIS_FF_Q", "port": "Q", "event": "posedge clk",
         "endpoints": [{"cell": "f_TRELLIS_FF_Q", "port": "M", "delay": [1.0, 30.0],
                        "event": "posedge eth"}]}]
    return r


def test_timing_per_clock_against_its_own_period():
    r = _two_clock_report()
    clk = timing.analyse(r, 8.0, clock="clk")
    assert [(e.cell, e.port) for e in clk] == [(e.cell, e.port) for e in timing.analyse(REPORT, 8.0)]
    eth = timing.analyse(r, 20.0, clock="eth")       # the clk -> eth crossing is left out
    assert [(e.cell, e.port, round(e.slack, 3)) for e in eth] == [("f_TRELLIS_FF_Q", "DI", 4.8)]   # 20 - setup 0.2 - 15


def test_bitstream_timing_md_per_clock(tmp_path):
    import json as _json
    from treenic.boards import bitstream
    (tmp_path / bitstream.PNR_FILES[0]).write_text(_json.dumps(_two_clock_report()))
    (tmp_path / bitstream.PNR_FILES[1]).write_text(_json.dumps(ROUTED))
    failing = bitstream._timing_md(tmp_path, {"clk": 125.0, "eth": 50.0})
    assert failing == {"clk": 1, "eth": 0}
    md = (tmp_path / "timing.md").read_text()
    assert "## `clk`" in md and "at 125.0 MHz" in md and "## `eth`" in md and "at 50.0 MHz" in md
    assert bitstream.PNR_FILES[0] != "report.json"     # the bitstream's summary keeps that name


def test_direct_submodules_and_component_table():
    verilog = ("module top(clk);\nendmodule\nmodule \\top.rx0 (clk);\nendmodule\n"
               "module \\top.rx0.add (clk);\nendmodule\nmodule \\top.watchdog$12 (clk);\n"
               "endmodule\nmodule other(clk);\nendmodule\n")
    assert synth.direct_submodules(verilog, "top") == ["top.rx0", "top.watchdog$12"]
    cell = dict(luts=0, carry=0, ffs=0, brams=0, lutram=0, dsps=0)
    blk = {"top": "top", "luts": 100, "carry_cells": 10, "ffs": 50, "brams": 2, "lutram": 0,
           "dsps": 0, "by_component": {"components": {
               "rx0": dict(cell, luts=60, carry=4, ffs=30, brams=2),
               "watchdog": dict(cell, luts=45, ffs=15)}}}
    md = "\n".join(synth._component_table(blk))
    assert "| rx0 | 60 | 4 | 30 | 2 | 0 | 0 |" in md
    assert "| (top level) | -5 | 6 | 5 | 0 | 0 | 0 |" in md       # flattened minus parts
    assert md.index("| rx0 |") < md.index("| watchdog |")          # largest first


def test_placement_only_run_reports_an_estimate(tmp_path):
    """``--nextpnr-opts --no-route``: no net is timed, so no endpoint report; the Fmax is
    labelled a placement estimate, never a post-route figure."""
    import json
    (tmp_path / "t.tim").write_text(NEXTPNR.split("Info: Routing..")[0].replace("PASS at 100.00",
                                                                              "FAIL at 125.00"))
    (tmp_path / "t.rpt").write_text(YOSYS_NEW)
    (tmp_path / "report.json").write_text(json.dumps({"critical_paths": [],
                                                      "detailed_net_timings": []}))
    r = synth.timing_summary("t", tmp_path, 125.0)
    assert r["placement_only"] and r["failing_endpoints"] is None
    assert r["fmax_mhz"] == pytest.approx(100.60)
    assert r["worst_slack_ns"] == pytest.approx(8.0 - 1000 / 100.60, abs=1e-3)
    assert "Placement only" in (tmp_path / "timing.md").read_text()
    blk = {"top": "t", "fmax_mhz": 100.6, "placement_only": True, "luts": 1, "carry_cells": 2,
           "ffs": 3, "brams": 4, "lutram": 0, "dsps": 0}
    md = synth._markdown({"device": synth.DEVICE, "blocks": [blk], "out": "o", "tops": ["t"]})
    assert "| t | 100.6 (placement estimate, not routed) |" in md
