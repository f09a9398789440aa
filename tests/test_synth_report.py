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
