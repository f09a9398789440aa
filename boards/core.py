"""What every treenic board carries: the NIC core, the host protocol engine and the
Ethernet host interface, wired together.

::

    RGMII ─► LiteEthHost (eth, 75 MHz) ═AsyncFIFO═► HostEngine ─► Nic.host   (sync, 125 MHz)
          ◄─                            ◄═══════════          ◄─

Board tops (``boards/ecpix5.py``) add clocks, resets, LEDs and the link pins; the
whole-board simulation elaborates this component without a platform and drives its
clocks and RGMII pins from the bench.

Links (``links``):

* ``"serial"`` (the ECPIX-5 board): each NIC port goes through a
  :class:`~treenic.hdl.link.serial.SerialLinkPort` (link CRC + source-synchronous serial
  PHY) to ``lanes_tx[i]`` / ``lanes_rx[i]``; the board top puts them on PMOD pins through
  DDR buffers, port ``i``'s receive lanes are clocked by domain ``link<i>_rx`` (the
  peer's forwarded clock).
* ``"ethernet"`` (the Colorlight board): each NIC port is a UDP datagram link to one
  port of one peer board (:class:`~treenic.hdl.link.ethernet.DatagramLinks`, link CRC
  around it) through a second LiteEth core on the board's second RGMII port.
* ``"ports"``: the NIC's ``tx<i>``/``rx<i>`` become members, wired by the caller.
* ``"loopback"``: each port's transmit side looped into its own receive side (a
  loopback plug; the complete NIC is still in the bitstream).
"""
from __future__ import annotations

from amaranth.hdl import ClockSignal, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from treenic.hdl.host.engine import HostEngine
from treenic.hdl.host.liteeth import UDP_PORT, LiteEthHost, RgmiiSignature
from treenic.hdl.nic import Nic, NicParams
from treenic.hdl.nic.core import HOST_READ_LATENCY
from treenic.hdl.nic.params import Ctrl, Reg

__all__ = ["BoardCore", "STATUS_REGS", "LINKS", "MAX_WORDS", "ecp5_pll", "heartbeat"]

#: registers a STATUS request returns, in order (then the engine's counters)
STATUS_REGS = (Reg.STATUS, Reg.CYCLES, Reg.ERR_FLAGS, Reg.ERR_COUNT, Reg.TIMESTEP)
#: how the NIC's link ports are wired on the ECPIX-5 board
LINKS = "serial"
#: data lanes per direction of a serial (PMOD) link
SERIAL_LANES = 3
#: largest READ/WRITE per datagram: 1 KiB of data, 1044-byte UDP payload (under one MTU)
MAX_WORDS = 256


class BoardCore(wiring.Component):
    """NIC + host protocol engine + LiteEth host interface (``sync`` and ``eth`` domains
    from outside).

    Parameters
    ----------
    params : NicParams
        The NIC's build parameters.
    verilog : Path
        The generated ``liteeth_core.v``.
    links : str
        ``"serial"``, ``"ethernet"``, ``"ports"`` or ``"loopback"`` (module docstring).
    peers : list of (str, int)
        (``links="ethernet"``) per NIC port: the peer board's link IPv4 address and port.
    link_verilog : Path
        (``links="ethernet"``) the link network's LiteEth core (module ``liteeth_link``).

    Members
    -------
    rgmii : Out(RgmiiSignature())
        PHY pins (used when elaborated without a platform).
    running, done, error : Out(1)
        The NIC's status wires.
    host_accepted, host_dropped : Out(32)
        Host-protocol requests executed / malformed datagrams dropped.
    lanes_tx, lanes_rx : Out/In(2 * SERIAL_LANES).array(ports)
        (``links="serial"``) each port's serial lanes, 2 bits per lane per cycle.
    links_up : Out(ports)
        (``links="serial"``) trained links.
    link_fault : Out(1)
        (``links="serial"``/``"ethernet"``) sticky: a dropped word or datagram, a link CRC
        error or an overflow.
    """

    def __init__(self, *, params: NicParams, verilog, port: int = UDP_PORT,
                 links: str = "loopback", peers=None, link_verilog=None):
        if not isinstance(params, NicParams):
            raise TypeError("params must be a NicParams")
        if links not in ("serial", "ethernet", "loopback", "ports"):
            raise ValueError(f"links must be 'serial', 'ethernet', 'loopback' or 'ports', "
                             f"not {links!r}")
        if links == "ethernet" and (peers is None or len(peers) != params.ports or
                                    link_verilog is None):
            raise ValueError(f"links='ethernet' needs one peer per NIC port "
                             f"({params.ports}) and link_verilog")
        self.peers, self.link_verilog = peers, link_verilog
        self.params, self.verilog, self.port, self.links = params, verilog, port, links
        members = {"rgmii": Out(RgmiiSignature()), "running": Out(1), "done": Out(1),
                   "error": Out(1), "host_accepted": Out(32), "host_dropped": Out(32)}
        if links == "ports":               # the NIC's link ports, wired by the caller
            from treenic.hdl.link.flit import LinkSignature
            members["tx"] = Out(LinkSignature(params.fmt)).array(params.ports)
            members["rx"] = In(LinkSignature(params.fmt)).array(params.ports)
        if links == "serial":
            from treenic.hdl.link.serial import SerialFraming
            self.framing = SerialFraming(params.fmt, lanes=SERIAL_LANES)
            members["lanes_tx"] = Out(2 * SERIAL_LANES).array(params.ports)
            members["lanes_rx"] = In(2 * SERIAL_LANES).array(params.ports)
            members["links_up"] = Out(params.ports)
            members["link_fault"] = Out(1)
        if links == "ethernet":
            members["link_fault"] = Out(1)
            members["links_dropped"] = Out(16)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        m.submodules.nic = nic = Nic(p)
        m.submodules.engine = eng = HostEngine(
            addr_bits=p.addr_bits, read_latency=HOST_READ_LATENCY, max_words=MAX_WORDS,
            status_regs=tuple(int(r) for r in STATUS_REGS), start=(int(Reg.CTRL), int(Ctrl.START)))
        m.submodules.eth = eth = LiteEthHost(verilog=self.verilog, port=self.port)
        wiring.connect(m, eth.rx, eng.rx)
        wiring.connect(m, eng.tx, eth.tx)
        wiring.connect(m, eng.host, nic.host)
        if platform is None:
            wiring.connect(m, eth.rgmii, wiring.flipped(self.rgmii))
        if self.links == "ethernet":
            self._ethernet_links(m, nic)
        for i in range(p.ports if self.links != "ethernet" else 0):
            tx, rx = nic.tx[i], nic.rx[i]
            if self.links == "ports":
                wiring.connect(m, tx, wiring.flipped(self.tx[i]))
                wiring.connect(m, wiring.flipped(self.rx[i]), rx)
            elif self.links == "serial":
                self._serial_port(m, i, tx, rx)
            else:                          # loopback plug
                wiring.connect(m, tx, rx)
        m.d.comb += [nic.start.eq(0), self.running.eq(nic.running), self.done.eq(nic.done),
                     self.error.eq(nic.error), self.host_accepted.eq(eng.accepted),
                     self.host_dropped.eq(eng.dropped)]
        return m

    def _ethernet_links(self, m, nic):
        from treenic.hdl.link.crc import CrcAppender, CrcChecker
        from treenic.hdl.link.ethernet import LINK_UDP_PORT, DatagramLinks
        p = self.params
        links = m.submodules.links = DatagramLinks(
            p.fmt, peers=self.peers, tx_depth=max(32, p.credits * p.fmt.vcs))
        net = m.submodules.link_eth = LiteEthHost(verilog=self.link_verilog,
                                                  port=LINK_UDP_PORT, module="liteeth_link",
                                                  resource=1)
        wiring.connect(m, links.tx, net.tx)
        wiring.connect(m, net.rx, links.rx)
        fault = links.overflow | (links.dropped != 0)
        for i in range(p.ports):
            app = m.submodules[f"crc_append{i}"] = CrcAppender(p.fmt)
            chk = m.submodules[f"crc_check{i}"] = CrcChecker(p.fmt)
            wiring.connect(m, nic.tx[i], app.i)
            wiring.connect(m, app.o, links.i[i])
            wiring.connect(m, links.o[i], chk.i)
            wiring.connect(m, chk.o, nic.rx[i])
            fault = fault | (chk.errors != 0)
        m.d.comb += self.links_dropped.eq(links.dropped)
        with m.If(fault):
            m.d.sync += self.link_fault.eq(1)

    def _serial_port(self, m, i, tx, rx):
        from treenic.hdl.link.serial import SerialLinkPort
        p = self.params
        port = m.submodules[f"link{i}"] = SerialLinkPort(
            self.framing, rx_domain=f"link{i}_rx", tx_depth=max(8, p.credits * p.fmt.vcs))
        wiring.connect(m, tx, port.tx)
        wiring.connect(m, port.rx, rx)
        m.d.comb += [self.lanes_tx[i].eq(port.tx_lanes), port.rx_lanes.eq(self.lanes_rx[i]),
                     self.links_up[i].eq(port.up)]
        with m.If((port.frame_errors != 0) | (port.crc_errors != 0) | port.overflow):
            m.d.sync += self.link_fault.eq(1)


def heartbeat(m, domain: str, hz: float, clock_hz: float) -> Signal:
    """A ~``hz`` square wave in *domain* (LED blink: the clock runs)."""
    bits = max(1, int(clock_hz / hz).bit_length() - 1)
    count = Signal(bits + 1, name=f"beat_{domain}")
    m.d[domain] += count.eq(count + 1)
    return count[-1]


def ecp5_pll(m, clk_in, pll: dict, *, clki_mhz: int) -> Signal:
    """One ECP5 ``EHXPLLL`` for a board top; returns its LOCK.

    CLKOP drives ``sync`` (the NIC clock, also the feedback), CLKOS ``eth`` (LiteEth's)
    and, when ``pll`` has ``CLKOS2_DIV``, CLKOS2 drives ``sync90`` (CLKOP's frequency,
    phase from ``CLKOS2_CPHASE``/``CLKOS2_FPHASE``). ``pll`` holds the dividers
    (``CLKI_DIV``, ``CLKFB_DIV``, ``CLKOP_DIV``, ``CLKOS_DIV``); the frequency attributes
    are computed from them; the caller creates the domains."""
    clkop = clki_mhz * pll["CLKFB_DIV"] / pll["CLKI_DIV"]       # CLKOP feedback
    vco = clkop * pll["CLKOP_DIV"]
    if not 400 <= vco <= 800:
        raise ValueError(f"EHXPLLL VCO {vco:g} MHz outside 400..800 MHz ({pll})")
    locked = Signal()
    ports = dict(
        p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
        p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
        p_CLKOP_ENABLE="ENABLED", p_CLKOS_ENABLE="ENABLED", p_FEEDBK_PATH="CLKOP",
        p_CLKI_DIV=pll["CLKI_DIV"], p_CLKFB_DIV=pll["CLKFB_DIV"],
        p_CLKOP_DIV=pll["CLKOP_DIV"], p_CLKOP_CPHASE=pll["CLKOP_DIV"] - 1, p_CLKOP_FPHASE=0,
        p_CLKOS_DIV=pll["CLKOS_DIV"], p_CLKOS_CPHASE=pll["CLKOS_DIV"] - 1, p_CLKOS_FPHASE=0,
        a_FREQUENCY_PIN_CLKI=f"{clki_mhz:g}", a_FREQUENCY_PIN_CLKOP=f"{clkop:g}",
        a_FREQUENCY_PIN_CLKOS=f"{vco / pll['CLKOS_DIV']:g}",
        i_CLKI=clk_in, i_CLKFB=ClockSignal("sync"), o_CLKOP=ClockSignal("sync"),
        o_CLKOS=ClockSignal("eth"), o_LOCK=locked,
        i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=0,
        i_PHASESTEP=0, i_PHASELOADREG=0, i_PLLWAKESYNC=0, i_ENCLKOP=0, i_ENCLKOS=0)
    if "CLKOS2_DIV" in pll:
        ports.update(
            p_CLKOS2_ENABLE="ENABLED", p_CLKOS2_DIV=pll["CLKOS2_DIV"],
            p_CLKOS2_CPHASE=pll["CLKOS2_CPHASE"], p_CLKOS2_FPHASE=pll["CLKOS2_FPHASE"],
            a_FREQUENCY_PIN_CLKOS2=f"{vco / pll['CLKOS2_DIV']:g}", o_CLKOS2=ClockSignal("sync90"), i_ENCLKOS2=0)
    m.submodules.pll = Instance("EHXPLLL", **ports)
    return locked
