"""N simulated boards in one simulation: each a complete :class:`BoardCore` (LiteEth
RGMII PHY/MAC/UDP core, host protocol engine, NIC) with its own RGMII pins, their NIC
link ports wired per a direct topology.

``links="serial"`` (default): pin to pin, as the ECPIX-5 boards are cabled -- board u's
port i serial lanes (link CRC + :class:`~treenic.hdl.link.serial.SerialLinkPhy`, the
PMOD link) drive board v's port j receive lanes; all boards share one clock, so each
receive domain ``link<i>_rx`` is the ``sync`` clock here::

    b0_rgmii ─ BoardCore 0 ─ lanes_tx[i] ─────────► lanes_rx[j] ─ BoardCore 1 ─ b1_rgmii

``links="channel"``: the NIC ports wired flit for flit through the RTL fabric's link
model (:class:`treenic.hdl.link.link.LinkChannel`, ``latency`` register stages), no PHY.
:data:`CLUSTER_LINKS` names each in reports.
"""
from __future__ import annotations

from amaranth.hdl import DomainRenamer, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from treenic import topology as topo_mod
from treenic.hdl.host.liteeth import RgmiiSignature
from treenic.hdl.link.link import LinkChannel
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import wiring_plan

from .core import BoardCore

__all__ = ["BoardCluster", "CLUSTER_LINKS"]

CLUSTER_LINKS = {"serial": "serial link PHY pin to pin (PMOD lanes, link CRC)",
                 "channel": "LinkChannel (no link PHY)"}


class BoardCluster(wiring.Component):
    """Simulation top: one :class:`BoardCore` per node of *topology*.

    Parameters
    ----------
    topology : str or Topology
        A direct network (``ring:4``); node ``u`` is board ``u``.
    params : NicParams
        Every board's NIC.
    verilog : Path
        The generated ``liteeth_core.v``.
    latency : int
        Link model register stages each way (``links="channel"``).
    links : str
        ``"serial"`` (PHY lanes pin to pin) or ``"channel"`` (see the module docstring).

    Members
    -------
    b<u>_rgmii : Out(RgmiiSignature())
        Board ``u``'s Ethernet pins.
    """

    def __init__(self, *, topology, params: NicParams, verilog, latency: int = 2,
                 links: str = "serial"):
        if links not in CLUSTER_LINKS:
            raise ValueError(f"links must be one of {sorted(CLUSTER_LINKS)}, not {links!r}")
        self.links = links
        self.topology = topo_mod.parse(topology) if isinstance(topology, str) else topology
        if self.topology.max_ports() > params.ports:
            raise ValueError(f"{self.topology.spec} needs {self.topology.max_ports()} ports, "
                             f"the boards' NIC has {params.ports}")
        self.plan = wiring_plan(self.topology)        # refuses switched topologies
        self.params, self.verilog, self.latency = params, verilog, latency
        super().__init__({f"b{u}_rgmii": Out(RgmiiSignature())
                          for u in range(self.topology.n)})

    def elaborate(self, platform):
        m = Module()
        p = self.params
        boards = []
        serial = self.links == "serial"
        for u in range(self.topology.n):
            b = BoardCore(params=p, verilog=self.verilog, links="serial" if serial else "ports")
            if serial:                                # one clock for every board here
                b = DomainRenamer({f"link{i}_rx": "sync" for i in range(p.ports)})(b)
            m.submodules[f"board{u}"] = b
            wiring.connect(m, b.rgmii, wiring.flipped(getattr(self, f"b{u}_rgmii")))
            boards.append(b)
        if serial:
            for (u, i, v, j) in self.plan:            # unused ports' lanes stay 0: untrained
                m.d.comb += boards[v].lanes_rx[j].eq(boards[u].lanes_tx[i])
            return m
        used = set()
        for (u, i, v, j) in self.plan:
            lk = LinkChannel(p.fmt, latency=self.latency, stall=0, seed=1 + u * p.ports + i,
                           depth=max(8, p.credits))
            m.submodules[f"link_{u}_{i}"] = lk
            wiring.connect(m, boards[u].tx[i], lk.i)
            wiring.connect(m, lk.o, boards[v].rx[j])
            used.add((u, i))
        for u, b in enumerate(boards):                # unused ports: idle, no credits
            for i in range(p.ports):
                if (u, i) not in used:
                    m.d.comb += b.rx[i].valid.eq(0)
        return m
