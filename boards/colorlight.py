"""Colorlight 5A-75B (r7.0, LFE5U-25F-6BG256C, two RGMII PHYs) board top: a low-cost
board whose NIC links are carried in Ethernet frames, so boards on a switch form a
cluster.

::

    clk25 (P6) ─► EHXPLLL ─┬─ CLKOP 62.5 MHz ─► sync (NIC, host engine, datagram links)
                           └─ CLKOS 41.7 MHz ─► eth  (both LiteEth UDP cores)
    button (M13) / PLL unlock ─► reset synchronisers
    eth_rgmii 0 ─► LiteEth (host link, UDP 7411, 192.168.1.(50 + node))
    eth_rgmii 1 ─► LiteEth (NIC links, UDP 7412, 192.168.2.(50 + node)) ─► DatagramLinks

The two PHYs share their reset, MDC and MDIO pins (P5, P3, T2): the host core drives
them, the link core's resource has none.  Each board is built for its node of a topology
(``--node``, ``--topology``): port i of node u is a datagram link to the peer's port that
:func:`treenic.hdl.nic.fabric.wiring_plan` names, at the peer's link address.  Plug every
board's second Ethernet port into one switch (the link network) and the first into the
host network.

The NIC is :data:`COLORLIGHT_NIC`: 2 ports (a ring), 32-bit flits, 1 Ki elements, a
4-node table.  With 64-bit flits and 4 Ki elements the whole top was about 24.6 k LUT4
equivalents against the device's 24 288; ``python -m treenic.boards.bitstream --board
colorlight --area-only`` measures the area (``docs/boards.md``).
LED (P11, active low): on while the PLL is locked and no link fault was seen; blinks at
~1.5 Hz once the NIC is DONE.
"""
from __future__ import annotations

from amaranth.build import Attrs, Clock, Pins, PinsN, Resource, Subsignal
from amaranth.hdl import ClockDomain, Elaboratable, Module
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from treenic import topology as topo_mod
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import wiring_plan

from .core import BoardCore, ecp5_pll, heartbeat

__all__ = ["ColorlightTop", "colorlight_platform", "COLORLIGHT_NIC", "board_addresses",
           "link_peers"]

#: Clocks for the 25F's slowest speed grade (-6): at the ECPIX-5's 125 / 75 MHz the routed
#: top reached 53.7 MHz (NIC) and 49.1 MHz (LiteEth, its own receive path through the
#: IP/ICMP/MAC depacketizers) at 88 % of the LUTs.  The NIC's links here are 1 Gb/s
#: Ethernet, so 32-bit flits at 62.5 MHz (2 Gb/s a port) still outrun them; LiteEth's
#: 32-bit datapath at 41.7 MHz carries 1.33 Gb/s, above the 1 Gb/s line rate.
NIC_CLOCK_HZ = 62.5e6
ETH_CLOCK_HZ = 500e6 / 12
#: the NIC beside two LiteEth cores on the LFE5U-25F: 2 ports, 32-bit flits (one FP32
#: adder lane), 1 Ki elements, 4 nodes (ring:4 multitree needs 8 rows and 4 steps).  The
#: sub-packet head then fills the 32-bit flit exactly: port 1 + port 1 + flow 2 + op 2 +
#: step 4 + offset 11 + length 11 bits (FlitFormat refuses anything larger)
COLORLIGHT_NIC = dict(ports=2, width=32, depth=1024, max_nodes=4, max_entries=16,
                      max_steps=8, sub_words=16)
#: EHXPLLL for 25 MHz in: CLKOP = 25 * 5 / 2 = 62.5 MHz (feedback), VCO 500 MHz, CLKOS /12
PLL = dict(CLKI_DIV=2, CLKFB_DIV=5, CLKOP_DIV=8, CLKOS_DIV=12)


def board_addresses(node: int) -> dict:
    """Host and link IPv4 addresses and MACs of board *node*."""
    if not 0 <= node < 200:
        raise ValueError(f"node must be 0..199, not {node}")
    return {"host_ip": f"192.168.1.{50 + node}", "link_ip": f"192.168.2.{50 + node}",
            "host_mac": 0x10e2d5000000 + node, "link_mac": 0x10e2d5000100 + node}


def link_peers(topology, node: int, ports: int) -> list[tuple[str, int]]:
    """Per NIC port of *node*: (peer's link address, peer's port); unused ports point
    at the board itself on port 15 (nothing is ever sent there; anything received is
    dropped by the peer check)."""
    topo = topo_mod.parse(topology) if isinstance(topology, str) else topology
    if not 0 <= node < topo.n:
        raise ValueError(f"node {node} is not in {topo.spec} (0..{topo.n - 1})")
    if topo.max_ports() > ports:
        raise ValueError(f"{topo.spec} needs {topo.max_ports()} ports, the NIC has {ports}")
    peers = [(board_addresses(node)["link_ip"], 15)] * ports
    for (u, i, v, j) in wiring_plan(topo):
        if u == node:
            peers[i] = (board_addresses(v)["link_ip"], j)
    return peers


def colorlight_platform():
    """amaranth-boards' 5A-75B r7.0, both RGMII receive clocks constrained (125 MHz), the
    second PHY's resource without the pins it shares with the first."""
    from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform as Base

    def eth(n, tx_clk, tx_ctl, tx_data, rx_clk, rx_ctl, rx_data, shared):
        sub = [Subsignal("rst", PinsN("P5", dir="o")), Subsignal("mdc", Pins("P3", dir="o")),
               Subsignal("mdio", Pins("T2", dir="io"))] if shared else []
        return Resource("eth_rgmii", n, *sub,
                        Subsignal("tx_clk", Pins(tx_clk, dir="o")),
                        Subsignal("tx_ctl", Pins(tx_ctl, dir="o")),
                        Subsignal("tx_data", Pins(tx_data, dir="o")),
                        Subsignal("rx_clk", Pins(rx_clk, dir="i"), Clock(125e6)),
                        Subsignal("rx_ctl", Pins(rx_ctl, dir="i")),
                        Subsignal("rx_data", Pins(rx_data, dir="i")),
                        Attrs(IO_TYPE="LVCMOS33"))
    ports = [eth(0, "M2", "M3", "L1 L3 P2 L4", "M1", "N6", "N1 M5 N5 M6", True),
             eth(1, "M12", "R15", "T14 R12 R13 R14", "M16", "L15", "P13 N13 P14 M15", False)]

    class Platform(Base):
        resources = [r for r in Base.resources if r.name != "eth_rgmii"] + ports

        @property
        def required_tools(self):
            # the base adds its programmer; building never flashes (openFPGALoader is the
            # separate step in docs/boards.md), so a machine without it can still build
            return [t for t in super().required_tools if t != "openFPGALoader"]
    return Platform()


class ColorlightTop(Elaboratable):
    """The 5A-75B bitstream's top for one node (see the module docstring).

    Parameters
    ----------
    params : NicParams
        NIC build parameters (:data:`COLORLIGHT_NIC`).
    host_verilog, link_verilog : Path
        The two generated LiteEth cores (modules ``liteeth_core``, ``liteeth_link``).
    peers : list of (str, int)
        :func:`link_peers` of this node.
    """

    def __init__(self, *, params: NicParams, host_verilog, link_verilog, peers):
        self.params, self.host_verilog = params, host_verilog
        self.link_verilog, self.peers = link_verilog, peers

    def elaborate(self, platform):
        m = Module()
        clk25 = io.Buffer("i", platform.request("clk25", 0, dir="-"))
        button = io.Buffer("i", platform.request("button", 0, dir="-"))
        m.submodules.clk25, m.submodules.button = clk25, button
        m.domains.sync = ClockDomain("sync")
        m.domains.eth = ClockDomain("eth")
        locked = ecp5_pll(m, clk25.i, PLL, clki_mhz=25)
        for name in ("sync", "eth"):
            m.submodules[f"rst_{name}"] = ResetSynchronizer(~locked | button.i, domain=name)
        m.submodules.board = board = BoardCore(
            params=self.params, verilog=self.host_verilog, links="ethernet",
            peers=self.peers, link_verilog=self.link_verilog)
        led = io.Buffer("o", platform.request("led", 0, dir="-"))
        m.submodules.led = led
        blink = heartbeat(m, "sync", 1.5, NIC_CLOCK_HZ)
        m.d.comb += led.o.eq(locked & ~board.link_fault & (~board.done | blink))
        return m
