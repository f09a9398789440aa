"""ECPIX-5 85F board top (LFE5UM5G-85F-8BG554, KSZ9031RNX RGMII PHY).

::

    clk100 (K23) ─► EHXPLLL ─┬─ CLKOP 125 MHz ─► sync (NIC, host engine)
                             └─ CLKOS  75 MHz ─► eth  (LiteEth UDP core)
    rst button (AB1) / PLL unlock ─► reset synchronisers of both domains
    eth_rgmii ─► BoardCore (:mod:`treenic.boards.core`)

LEDs (active low on the board, Amaranth inverts)::

    rgb_led 0  green: 125 MHz heartbeat (~1.5 Hz)   red: PLL not locked / in reset
    rgb_led 1  blue : NIC RUNNING                    green: NIC DONE   red: NIC ERROR
    rgb_led 2  green: host request seen (toggles per accepted request)
               red  : a malformed datagram was dropped since reset
    rgb_led 3  blue : 75 MHz Ethernet-side heartbeat

Pin map: ``docs/boards.md`` (RGMII: amaranth-boards' ``eth_rgmii`` resource; the RGMII
receive clock gets a 125 MHz constraint here so its domain is timed too).
"""
from __future__ import annotations

from amaranth.build import Attrs, Clock, Pins, PinsN, Resource, Subsignal
from amaranth.hdl import ClockDomain, ClockSignal, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from treenic.hdl.nic import NicParams

from .core import BoardCore, heartbeat

__all__ = ["ECPIX5Top", "ecpix5_platform", "NIC_CLOCK_HZ", "ETH_CLOCK_HZ", "PLL"]

NIC_CLOCK_HZ = 125e6
ETH_CLOCK_HZ = 75e6
#: EHXPLLL for 100 MHz in: PFD 25 MHz, VCO 750 MHz, CLKOP /6 = 125 MHz (feedback),
#: CLKOS /10 = 75 MHz
PLL = dict(CLKI_DIV=4, CLKFB_DIV=5, CLKOP_DIV=6, CLKOS_DIV=10)


def ecpix5_platform():
    """amaranth-boards' ECPIX-5 85F with the RGMII receive clock constrained (125 MHz)."""
    from amaranth_boards.ecpix5 import ECPIX585Platform

    eth = Resource("eth_rgmii", 0,
                   Subsignal("rst", PinsN("C13", dir="o")),
                   Subsignal("mdio", Pins("A13", dir="io")),
                   Subsignal("mdc", Pins("C11", dir="o")),
                   Subsignal("tx_clk", Pins("A12", dir="o")),
                   Subsignal("tx_ctrl", Pins("C9", dir="o")),
                   Subsignal("tx_data", Pins("D8 C8 B8 A8", dir="o")),
                   Subsignal("rx_clk", Pins("E11", dir="i"), Clock(125e6)),
                   Subsignal("rx_ctrl", Pins("A11", dir="i")),
                   Subsignal("rx_data", Pins("B11 A10 B10 A9", dir="i")),
                   Attrs(IO_TYPE="LVCMOS33"))

    class Platform(ECPIX585Platform):
        resources = [eth if r.name == "eth_rgmii" else r for r in ECPIX585Platform.resources]
    return Platform()


class ECPIX5Top(Elaboratable):
    """The ECPIX-5 85F bitstream's top: PLL, resets, :class:`BoardCore`, LEDs.

    Parameters
    ----------
    params : NicParams
        NIC build parameters (4 ports).
    verilog : Path
        Generated ``liteeth_core.v`` (see :func:`treenic.hdl.host.liteeth.generate`).
    """

    def __init__(self, *, params: NicParams, verilog):
        self.params, self.verilog = params, verilog

    def elaborate(self, platform):
        m = Module()
        clk100 = io.Buffer("i", platform.request("clk100", 0, dir="-"))
        button = io.Buffer("i", platform.request("rst", 0, dir="-"))
        m.submodules.clk100, m.submodules.button = clk100, button
        locked = self._pll(m, clk100.i)
        for name, hz in (("sync", NIC_CLOCK_HZ), ("eth", ETH_CLOCK_HZ)):
            m.submodules[f"rst_{name}"] = ResetSynchronizer(~locked | button.i, domain=name)
        m.submodules.board = board = BoardCore(params=self.params, verilog=self.verilog)
        self._leds(m, platform, board, locked & ~button.i)
        return m

    def _pll(self, m, clk_in) -> Signal:
        m.domains.sync = ClockDomain("sync")
        m.domains.eth = ClockDomain("eth")
        locked = Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_CLKOP_ENABLE="ENABLED", p_CLKOS_ENABLE="ENABLED", p_FEEDBK_PATH="CLKOP",
            p_CLKI_DIV=PLL["CLKI_DIV"], p_CLKFB_DIV=PLL["CLKFB_DIV"],
            p_CLKOP_DIV=PLL["CLKOP_DIV"], p_CLKOP_CPHASE=PLL["CLKOP_DIV"] - 1,
            p_CLKOP_FPHASE=0,
            p_CLKOS_DIV=PLL["CLKOS_DIV"], p_CLKOS_CPHASE=PLL["CLKOS_DIV"] - 1,
            p_CLKOS_FPHASE=0,
            a_FREQUENCY_PIN_CLKI="100", a_FREQUENCY_PIN_CLKOP="125",
            a_FREQUENCY_PIN_CLKOS="75",
            i_CLKI=clk_in, i_CLKFB=ClockSignal("sync"), o_CLKOP=ClockSignal("sync"),
            o_CLKOS=ClockSignal("eth"), o_LOCK=locked,
            i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=0,
            i_PHASESTEP=0, i_PHASELOADREG=0, i_PLLWAKESYNC=0, i_ENCLKOP=0, i_ENCLKOS=0)
        return locked

    def _leds(self, m, platform, board, ok):
        pins = {}

        def led(n, colour):
            if n not in pins:
                pins[n] = platform.request("rgb_led", n, dir="-")
            buf = io.Buffer("o", getattr(pins[n], colour))
            m.submodules[f"led{n}{colour}"] = buf
            return buf.o
        seen = Signal()
        last = Signal(32)
        m.d.sync += last.eq(board.host_accepted)
        with m.If(last != board.host_accepted):
            m.d.sync += seen.eq(~seen)
        m.d.comb += [led(0, "g").eq(heartbeat(m, "sync", 1.5, NIC_CLOCK_HZ)),
                     led(0, "r").eq(~ok), led(1, "b").eq(board.running),
                     led(1, "g").eq(board.done), led(1, "r").eq(board.error),
                     led(2, "g").eq(seen), led(2, "r").eq(board.host_dropped != 0),
                     led(3, "b").eq(heartbeat(m, "eth", 1.5, ETH_CLOCK_HZ))]
