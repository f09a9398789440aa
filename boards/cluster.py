"""N simulated boards in one simulation: each a complete :class:`BoardCore` (LiteEth
RGMII PHY/MAC/UDP core, host protocol engine, NIC) with its own RGMII pins, their NIC
link ports wired per a direct topology.

::

    b0_rgmii ─ BoardCore 0 ─ tx i ─► LinkChannel ─► rx j ─ BoardCore 1 ─ b1_rgmii   ...

The link ports are wired flit for flit through the link model the RTL fabric uses
(:class:`treenic.hdl.link.link.LinkChannel`, ``latency`` register stages): the PMOD and
flits-in-Ethernet link PHYs are not built yet, so nothing here simulates a cable.  Every
report of a simulated cluster says ``links: "LinkChannel (no link PHY)"``.
"""
from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from treenic import topology as topo_mod
from treenic.hdl.host.liteeth import RgmiiSignature
from treenic.hdl.link.link import LinkChannel
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import wiring_plan

from .core import BoardCore

__all__ = ["BoardCluster", "CLUSTER_LINKS"]

CLUSTER_LINKS = "LinkChannel (no link PHY)"


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
        Link model register stages each way.

    Members
    -------
    b<u>_rgmii : Out(RgmiiSignature())
        Board ``u``'s Ethernet pins.
    """

    def __init__(self, *, topology, params: NicParams, verilog, latency: int = 2):
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
        for u in range(self.topology.n):
            b = BoardCore(params=p, verilog=self.verilog, links="ports")
            m.submodules[f"board{u}"] = b
            wiring.connect(m, b.rgmii, wiring.flipped(getattr(self, f"b{u}_rgmii")))
            boards.append(b)
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
