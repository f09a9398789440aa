"""What every treenic board carries: the NIC core, the host protocol engine and the
Ethernet host interface, wired together.

::

    RGMII ─► LiteEthHost (eth, 75 MHz) ═AsyncFIFO═► HostEngine ─► Nic.host   (sync, 125 MHz)
          ◄─                            ◄═══════════          ◄─

Board tops (``boards/ecpix5.py``) add clocks, resets, LEDs and the link pins; the
whole-board simulation elaborates this component without a platform and drives its
clocks and RGMII pins from the bench.

Links: the PMOD / flits-in-Ethernet link PHYs are not built yet.  Until they are, each
port's transmit side is looped back into its own receive side (a loopback plug), so the
complete NIC -- packetisers, depacketisers, RX/TX units, buffer -- is in the bitstream and
its area and Fmax are the real ones.  ``links="loopback"`` names this in every report.
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from treenic.hdl.host.engine import HostEngine
from treenic.hdl.host.liteeth import UDP_PORT, LiteEthHost, RgmiiSignature
from treenic.hdl.nic import Nic, NicParams
from treenic.hdl.nic.core import HOST_READ_LATENCY
from treenic.hdl.nic.params import Ctrl, Reg

__all__ = ["BoardCore", "STATUS_REGS", "LINKS", "MAX_WORDS"]

#: registers a STATUS request returns, in order (then the engine's counters)
STATUS_REGS = (Reg.STATUS, Reg.CYCLES, Reg.ERR_FLAGS, Reg.ERR_COUNT, Reg.TIMESTEP)
#: how the NIC's link ports are wired on the boards built so far
LINKS = "loopback"
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
        ``"loopback"`` (each NIC port's TX into its own RX: the boards built so far) or
        ``"ports"`` (the NIC's ``tx<i>``/``rx<i>`` become members, wired by the caller:
        the multi-board simulation).

    Members
    -------
    rgmii : Out(RgmiiSignature())
        PHY pins (used when elaborated without a platform).
    running, done, error : Out(1)
        The NIC's status wires.
    host_accepted, host_dropped : Out(32)
        Host-protocol requests executed / malformed datagrams dropped.
    """

    def __init__(self, *, params: NicParams, verilog, port: int = UDP_PORT,
                 links: str = LINKS):
        if not isinstance(params, NicParams):
            raise TypeError("params must be a NicParams")
        if links not in ("loopback", "ports"):
            raise ValueError(f"links must be 'loopback' or 'ports', not {links!r}")
        self.params, self.verilog, self.port, self.links = params, verilog, port, links
        members = {"rgmii": Out(RgmiiSignature()), "running": Out(1), "done": Out(1),
                   "error": Out(1), "host_accepted": Out(32), "host_dropped": Out(32)}
        if links == "ports":               # the NIC's link ports, wired by the caller
            from treenic.hdl.link.flit import LinkSignature
            members["tx"] = Out(LinkSignature(params.fmt)).array(params.ports)
            members["rx"] = In(LinkSignature(params.fmt)).array(params.ports)
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
        for i in range(p.ports):
            tx, rx = nic.tx[i], nic.rx[i]
            if self.links == "ports":
                wiring.connect(m, tx, wiring.flipped(self.tx[i]))
                wiring.connect(m, wiring.flipped(self.rx[i]), rx)
            else:                          # loopback plugs until the link PHYs exist
                wiring.connect(m, tx, rx)
        m.d.comb += [nic.start.eq(0), self.running.eq(nic.running), self.done.eq(nic.done),
                     self.error.eq(nic.error), self.host_accepted.eq(eng.accepted),
                     self.host_dropped.eq(eng.dropped)]
        return m


def heartbeat(m, domain: str, hz: float, clock_hz: float) -> Signal:
    """A ~``hz`` square wave in *domain* (LED blink: the clock runs)."""
    bits = max(1, int(clock_hz / hz).bit_length() - 1)
    count = Signal(bits + 1, name=f"beat_{domain}")
    m.d[domain] += count.eq(count + 1)
    return count[-1]
