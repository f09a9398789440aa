"""ECPIX-5 85F board top (LFE5UM5G-85F-8BG554, KSZ9031RNX RGMII PHY).

::

    clk100 (K23) ─► EHXPLLL ─┬─ CLKOP  125 MHz      ─► sync   (NIC, host engine, link TX)
                             ├─ CLKOS   75 MHz      ─► eth    (LiteEth UDP core)
                             └─ CLKOS2 125 MHz, 90° ─► sync90 (forwarded link clocks)

(``--nic-mhz 100``: every clock at 100 MHz but LiteEth's; ``--nic-mhz 62.5``: every clock,
LiteEth's too, at 62.5 MHz; see :data:`CLOCK_PLANS`.)
    rst button (AB1) / PLL unlock ─► reset synchronisers of every domain
    eth_rgmii ─► BoardCore (:mod:`treenic.boards.core`)
    pmod 0..3 ─► NIC ports 0..3: serial links (:mod:`treenic.hdl.link.serial`), pins
                 1-4 TX (clock, 3 data lanes), pins 7-10 RX (clock, 3 data lanes)

Serial links: data leave ODDRX1F registers on ``sync`` (bit 0 of a lane in the first
half of the cycle), the clock leaves an ODDRX1F on ``sync90``, so its edges sit in the
middle of the data bits; the receiver's IDDRX1F samples both edges with the forwarded
clock (domain ``link<i>_rx``, constrained at the NIC clock).  Line rate 2 bits per lane
a NIC cycle: at 125 MHz 250 Mb/s per lane, 750 Mb/s per direction, 470.6 Mb/s of flit
payload per direction (one 68-bit flit per 17-cycle word; 376.5 Mb/s at 100 MHz).
Cable: a crossover PMOD cable (board A pins 1-4 to board B pins 7-10, and back); a port
whose cable is absent never trains, and the NIC sees no credits.

LEDs (active low on the board, Amaranth inverts)::

    rgb_led 0  green: NIC clock heartbeat (~1.5 Hz)   red: PLL not locked / in reset
    rgb_led 1  blue : NIC RUNNING                    green: NIC DONE   red: NIC ERROR
    rgb_led 2  green: host request seen (toggles per accepted request)
               red  : a malformed datagram was dropped since reset
    rgb_led 3  blue : Ethernet-side (LiteEth clock) heartbeat
               green: every NIC link trained    red: a link dropped a word / failed a CRC

Pin map: ``docs/boards.md`` (RGMII: amaranth-boards' ``eth_rgmii`` resource; the RGMII
receive clock gets a 125 MHz constraint here so its domain is timed too).
"""
from __future__ import annotations

from amaranth.build import Attrs, Clock, Pins, PinsN, Resource, Subsignal
from amaranth.hdl import Cat, ClockDomain, ClockSignal, Elaboratable, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from treenic.hdl.nic import NicParams

from .core import LINKS, SERIAL_LANES, BoardCore, ecp5_pll, heartbeat

__all__ = ["ECPIX5Top", "ecpix5_platform", "CLOCK_PLANS", "DEFAULT_NIC_MHZ", "BITSTREAM_PLAN", "NIC_CLOCK_HZ",
           "ETH_CLOCK_HZ", "PLL", "eth_clock_hz"]

ETH_CLOCK_HZ = 75e6
#: EHXPLLL dividers for the 100 MHz oscillator, per NIC clock (MHz). CLKOS2 is the NIC clock
#: delayed a quarter period = 90° (CPHASE - (DIV - 1) + FPHASE/8 VCO cycles), CLKOS LiteEth's
#: clock (:func:`eth_clock_hz`: 75 MHz, 62.5 in the 62.5 MHz plan).
#:  125: PFD 25 MHz, VCO 750 MHz, CLKOP /6 (the NIC core's synthesis target; the default)
#:  100: PFD 100 MHz, VCO 600 MHz, CLKOP /6 (margin for the whole board top, whose NIC clock
#:       placed at 78-81 MHz estimates for either target: docs/boards.md)
CLOCK_PLANS = {
    125: dict(CLKI_DIV=4, CLKFB_DIV=5, CLKOP_DIV=6, CLKOS_DIV=10, CLKOS2_DIV=6,
              CLKOS2_CPHASE=6, CLKOS2_FPHASE=4),
    100: dict(CLKI_DIV=1, CLKFB_DIV=1, CLKOP_DIV=6, CLKOS_DIV=8, CLKOS2_DIV=6,
              CLKOS2_CPHASE=6, CLKOS2_FPHASE=4),
    #: 62.5: PFD 12.5 MHz, VCO 500 MHz, CLKOP /8, LiteEth /8 too (its 32-bit datapath needs
    #: >= 31.25 MHz for 1 Gb/s); the Colorlight top's NIC clock, for a whole board top whose
    #: 125 and 100 MHz builds do not route (docs/boards.md)
    62.5: dict(CLKI_DIV=8, CLKFB_DIV=5, CLKOP_DIV=8, CLKOS_DIV=8, CLKOS2_DIV=8,
               CLKOS2_CPHASE=9, CLKOS2_FPHASE=0),
}
#: the NIC clock of the board top (simulations); ``make bitstream BOARD=ecpix5`` builds
#: :data:`BITSTREAM_PLAN` (``--nic-mhz`` picks another clock plan)
DEFAULT_NIC_MHZ = 125
#: what ``make bitstream BOARD=ecpix5`` builds unless told otherwise: the plan that routes
#: here (docs/boards.md, "Eighth wave"): NIC and LiteEth at 62.5 MHz, the RX and TX units on
#: shared buffer ports over 4 banks (the PMOD links carry a flit in 17 cycles, so this
#: costs the board no bandwidth), nextpnr's router2 (router1 does not converge on it)
BITSTREAM_PLAN = dict(nic_mhz=62.5, shared_ports=True, banks=4,
                      nextpnr_opts="--router router2")
NIC_CLOCK_HZ = DEFAULT_NIC_MHZ * 1e6
PLL = CLOCK_PLANS[DEFAULT_NIC_MHZ]
#: PMOD connectors carrying NIC ports 0..3
LINK_PMODS = (0, 1, 2, 3)


def eth_clock_hz(nic_mhz=DEFAULT_NIC_MHZ) -> float:
    """LiteEth's clock (CLKOS) in the PLL plan of *nic_mhz*."""
    p = _plan(nic_mhz)
    return 100e6 * p["CLKFB_DIV"] / p["CLKI_DIV"] * p["CLKOP_DIV"] / p["CLKOS_DIV"]


def _plan(nic_mhz) -> dict:
    if nic_mhz not in CLOCK_PLANS:
        raise ValueError(f"ECPIX-5 NIC clock {nic_mhz} MHz has no PLL plan; "
                         f"known: {', '.join(map(str, CLOCK_PLANS))}")
    return CLOCK_PLANS[nic_mhz]


def ecpix5_platform(nic_mhz: int = DEFAULT_NIC_MHZ):
    """amaranth-boards' ECPIX-5 85F with the RGMII receive clock constrained (125 MHz) and
    the PMOD links' forwarded receive clocks at the NIC clock."""
    _plan(nic_mhz)
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

    links = [Resource("treenic_link", n,
                      Subsignal("tx_clk", Pins("1", dir="o", conn=("pmod", pmod))),
                      Subsignal("tx_data", Pins("2 3 4", dir="o", conn=("pmod", pmod))),
                      Subsignal("rx_clk", Pins("7", dir="i", conn=("pmod", pmod)),
                                Clock(nic_mhz * 1e6)),
                      Subsignal("rx_data", Pins("8 9 10", dir="i", conn=("pmod", pmod))),
                      Attrs(IO_TYPE="LVCMOS33", SLEWRATE="FAST"))
             for n, pmod in enumerate(LINK_PMODS)]

    class Platform(ECPIX585Platform):
        resources = [eth if r.name == "eth_rgmii" else r
                     for r in ECPIX585Platform.resources] + links
    return Platform()


class ECPIX5Top(Elaboratable):
    """The ECPIX-5 85F bitstream's top: PLL, resets, :class:`BoardCore`, LEDs.

    Parameters
    ----------
    params : NicParams
        NIC build parameters (4 ports).
    verilog : Path
        Generated ``liteeth_core.v`` (see :func:`treenic.hdl.host.liteeth.generate`).
    nic_mhz : int
        NIC clock, a key of :data:`CLOCK_PLANS` (default :data:`DEFAULT_NIC_MHZ`).
    """

    def __init__(self, *, params: NicParams, verilog, nic_mhz: int = DEFAULT_NIC_MHZ):
        self.pll = _plan(nic_mhz)
        self.params, self.verilog, self.nic_mhz = params, verilog, nic_mhz

    def elaborate(self, platform):
        m = Module()
        clk100 = io.Buffer("i", platform.request("clk100", 0, dir="-"))
        button = io.Buffer("i", platform.request("rst", 0, dir="-"))
        m.submodules.clk100, m.submodules.button = clk100, button
        locked = self._pll(m, clk100.i)
        domains = ["sync", "eth", "sync90"] + [f"link{i}_rx" for i in range(self.params.ports)]
        m.submodules.board = board = BoardCore(params=self.params, verilog=self.verilog,
                                               links=LINKS)
        self._links(m, platform, board)
        for name in domains:
            m.submodules[f"rst_{name}"] = ResetSynchronizer(~locked | button.i, domain=name)
        self._leds(m, platform, board, locked & ~button.i)
        return m

    def _links(self, m, platform, board):
        """Each NIC port's serial lanes on its PMOD through DDR buffers."""
        if self.params.ports > len(LINK_PMODS):
            raise ValueError(f"{self.params.ports} NIC ports, {len(LINK_PMODS)} link PMODs")
        n = SERIAL_LANES
        for i in range(self.params.ports):
            pins = platform.request("treenic_link", i, dir="-")
            dom = f"link{i}_rx"
            m.domains += ClockDomain(dom)
            rx_clk = m.submodules[f"link{i}_rx_clk"] = io.Buffer("i", pins.rx_clk)
            m.d.comb += ClockSignal(dom).eq(rx_clk.i)
            tx_clk = m.submodules[f"link{i}_tx_clk"] = io.DDRBuffer("o", pins.tx_clk,
                                                                    o_domain="sync90")
            tx = m.submodules[f"link{i}_tx"] = io.DDRBuffer("o", pins.tx_data)
            rx = m.submodules[f"link{i}_rx"] = io.DDRBuffer("i", pins.rx_data, i_domain=dom)
            m.d.comb += [tx_clk.o[0].eq(1), tx_clk.o[1].eq(0),
                         tx.o[0].eq(Cat(board.lanes_tx[i][2 * k] for k in range(n))),
                         tx.o[1].eq(Cat(board.lanes_tx[i][2 * k + 1] for k in range(n))),
                         board.lanes_rx[i].eq(Cat(Cat(rx.i[0][k], rx.i[1][k])
                                                  for k in range(n)))]

    def _pll(self, m, clk_in) -> Signal:
        m.domains.sync = ClockDomain("sync")
        m.domains.eth = ClockDomain("eth")
        m.domains.sync90 = ClockDomain("sync90")
        return ecp5_pll(m, clk_in, self.pll, clki_mhz=100)

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
        m.d.comb += [led(0, "g").eq(heartbeat(m, "sync", 1.5, self.nic_mhz * 1e6)),
                     led(0, "r").eq(~ok), led(1, "b").eq(board.running),
                     led(1, "g").eq(board.done), led(1, "r").eq(board.error),
                     led(2, "g").eq(seen), led(2, "r").eq(board.host_dropped != 0),
                     led(3, "b").eq(heartbeat(m, "eth", 1.5, eth_clock_hz(self.nic_mhz))),
                     led(3, "g").eq(board.links_up.all()), led(3, "r").eq(board.link_fault)]
