"""A fabric of N NICs wired by a direct-network :class:`~treenic.topology.Topology`.

::

     hw (node, addr, data) ─► demux ─► NIC u host bus ◄─ hr (node, addr) ─► hrd (data)
                                          │
      NIC u tx[i] ─► LinkChannel(latency, seeded random stalls) ─► NIC v rx[j]
      NIC u rx[i] ◄─ LinkChannel ◄─ NIC v tx[j]            (port i of u  <->  port j of v,
                                                            the same multigraph edge)
      start ─► every NIC;  done = all NICs done;  cycles = the NICs' START .. done
                                                    (a host slice after ``start``)

With ``crc=True`` every link is ``tx ─► CrcAppender ─► LinkChannel ─► CrcChecker ─► rx``
(:mod:`treenic.hdl.link.crc`; a checker's failures go to its NIC's ``link_crc`` input,
counted in LINK_CRC[p] and flagged ERR LINK_CRC).  ``faults=True`` (implies ``crc``) adds
a :class:`~treenic.hdl.link.inject.FaultInjector` after each appender, driven through the
``fi_*`` ports (``fi_link`` picks the link, by index into :attr:`Fabric.plan`), a per-NIC
``nic_reset``, and timestamps for campaigns: ``clock`` (free-running cycles since reset),
``fault_at`` (clock when the first fault fired or a NIC was reset), ``error_at`` (clock
when the first NIC error or link CRC failure appeared; 0 = none).

With ``params.sparse`` every NIC holds the sparse engine (``NicParams.sparse``,
:mod:`.sparse_host`): the same links carry a dense all-reduce or, with SP_MODE set on every
NIC, a sparse one; ``start``, ``done`` and ``cycles`` then concern the sparse run.

Host access is streams so a testbench or the C++ stream pump of
:mod:`treenic.hdl.cosim` can load images and buffers at one write per cycle:
``hw`` (node, addr, data) writes, ``hr`` (node, addr) read requests answered in order
on ``hrd``; and all-node streams for bulk traffic, one word per NIC per cycle (each NIC's
own host bus, in parallel): ``hwa`` (en, addr[N], data[N]), ``hra`` (en, addr[N]) answered
on ``hrda`` (data[N]). Reads are pipelined (one request per cycle).  The buffers move
through every NIC's DMA port at ``lanes`` elements per NIC per cycle: ``dwa`` (mask[N] of
lanes, addr[N], data[N] of lanes), ``dra`` (en, addr[N]) answered on ``drda`` (data[N] of
lanes); they run in cycles the host streams leave free.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, ResetInserter, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from treenic import topology as topo_mod
from treenic.topology import Topology, is_switch

from ..link.crc import LINK_CRC, CrcAppender, CrcChecker
from ..link.inject import FaultInjector
from ..link.link import LinkChannel
from .core import HOST_READ_LATENCY, HOST_SLICE, Nic
from .tx import buffer_abits
from .params import NicParams

__all__ = ["Fabric", "link_depth", "wiring_plan", "link_seed", "nic_verilog", "fabric_verilog"]


def link_seed(seed: int, u: int, port: int, ports: int) -> int:
    """Stall-LFSR seed of the link out of NIC ``u``'s port ``port`` in a fabric seeded
    ``seed`` (``ports``: the NIC's port count): distinct per link, so links stall
    independently; the network model replays the same patterns
    (:func:`~treenic.hdl.link.link.stall_pattern`)."""
    return (seed * 7919 + 131 * (u * ports + port) + 1) & 0xFFFF


def wiring_plan(topology: Topology) -> list[tuple[int, int, int, int]]:
    """Directed links as (u, port i of u, v, port j of v): u's port i feeds v's port j."""
    out = []
    for u in topology.nodes:
        for pu in topology.ports(u):
            if is_switch(pu.peer):
                raise ValueError(f"{topology.spec}: the fabric wires direct networks only")
            v = pu.peer
            match = [pv for pv in topology.ports(v) if pv.peer == u and pv.key == pu.key]
            if len(match) != 1:
                raise ValueError(f"{topology.spec}: no unique reverse port for {u}->{v}")
            out.append((u, pu.index, v, match[0].index))
    return out


def link_depth(params: NicParams) -> int:
    """Flits a fabric link buffers: at least the receive buffer behind it (the dense
    RX's ``credits``; with a sparse engine built in, also its receive FIFO, which its
    sender's credits cover), so no flit is lost while the link stalls."""
    depth = max(8, params.credits)
    if params.sparse is not None:
        depth = max(depth, params.sparse.rx_depth)
    return depth


class Fabric(wiring.Component):
    def __init__(self, topology: Topology | str, params: NicParams | None = None, *,
                 latency: int = 1, stall: int = 0, seed: int = 1,
                 nic_module: str | None = None, crc: bool = False, faults: bool = False):
        self.topology = topo = topo_mod.parse(topology) if isinstance(topology, str) else topology
        if topo.max_ports() > (params or NicParams()).ports:
            raise ValueError(f"{topo.spec} needs {topo.max_ports()} ports")
        self.params = params = params or NicParams(ports=topo.max_ports())
        if topo.n > params.max_nodes:
            raise ValueError(f"{topo.spec} has {topo.n} nodes > max_nodes {params.max_nodes}")
        self.latency, self.stall, self.seed = latency, stall, seed
        self.faults = bool(faults)
        self.crc = bool(crc) or self.faults
        #: None: NICs elaborated inline; a name: NICs are Instance()s of that Verilog
        #: module (see :func:`nic_verilog`), converted once instead of N times.
        self.nic_module = nic_module
        self.plan = wiring_plan(topo)
        nb = max(1, ceil_log2(topo.n))
        AW = params.addr_bits
        self.hw_layout = data.StructLayout({"node": nb, "addr": AW, "data": 32})
        self.hr_layout = data.StructLayout({"node": nb, "addr": AW})
        # all-node host streams: one word per NIC per cycle (lanes enabled by ``en``)
        N = topo.n
        self.hwa_layout = data.StructLayout({"en": N, "addr": data.ArrayLayout(AW, N),
                                             "data": data.ArrayLayout(32, N)})
        self.hra_layout = data.StructLayout({"en": N, "addr": data.ArrayLayout(AW, N)})
        # all-node DMA streams: ``lanes`` buffer elements per NIC per cycle
        BA, W = buffer_abits(params), params.lanes
        self.dwa_layout = data.StructLayout({"mask": data.ArrayLayout(W, N),
                                             "addr": data.ArrayLayout(BA, N),
                                             "data": data.ArrayLayout(32 * W, N)})
        self.dra_layout = data.StructLayout({"en": N, "addr": data.ArrayLayout(BA, N)})
        members = {
            "hw": In(stream.Signature(self.hw_layout)),
            "hr": In(stream.Signature(self.hr_layout)),
            "hrd": Out(stream.Signature(32)),
            "hwa": In(stream.Signature(self.hwa_layout)),
            "hra": In(stream.Signature(self.hra_layout)),
            "hrda": Out(stream.Signature(data.ArrayLayout(32, N))),
            "dwa": In(stream.Signature(self.dwa_layout)),
            "dra": In(stream.Signature(self.dra_layout)),
            "drda": Out(stream.Signature(data.ArrayLayout(32 * W, N))),
            "start": In(1), "done": Out(1), "error": Out(1), "cycles": Out(32),
            # any NIC RUNNING (a started fabric with none running and not done is stuck)
            "running": Out(1),
        }
        if self.faults:
            self.beat_bits = params.fmt.flit_bits + LINK_CRC.crc_width
            members.update({
                "fi_link": In(range(max(2, len(self.plan)))), "fi_mode": In(3),
                "fi_mask": In(self.beat_bits), "fi_length": In(16), "fi_arm": In(1),
                "fi_fired": Out(1), "fi_overflow": Out(1), "nic_reset": In(topo.n),
                "clock": Out(32), "fault_at": Out(32), "error_at": Out(32)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        topo, p = self.topology, self.params
        nics = []
        for u in range(topo.n):
            rst = self.nic_reset[u] if self.faults else None
            if self.nic_module is None:
                nic = Nic(p, link_crc=self.crc)
                m.submodules[f"nic{u}"] = nic if rst is None else ResetInserter(rst)(nic)
            else:
                nic = _NicPorts(p, u, link_crc=self.crc)
                m.submodules[f"nic{u}"] = nic.instance(self.nic_module, reset=rst)
            nics.append(nic)
            m.d.comb += nic.start.eq(self.start)
        injectors = []
        for k, (u, i, v, j) in enumerate(self.plan):
            lk = LinkChannel(p.fmt, latency=self.latency, stall=self.stall,
                           seed=link_seed(self.seed, u, i, p.ports),
                           depth=link_depth(p),
                           crc_width=LINK_CRC.crc_width if self.crc else 0)
            m.submodules[f"link_{u}_{i}"] = lk
            if not self.crc:
                wiring.connect(m, nics[u].tx[i], lk.i)
                wiring.connect(m, lk.o, nics[v].rx[j])
                continue
            app, chk = CrcAppender(p.fmt), CrcChecker(p.fmt)
            m.submodules[f"crcgen_{u}_{i}"], m.submodules[f"crcchk_{v}_{j}"] = app, chk
            wiring.connect(m, nics[u].tx[i], app.i)
            if self.faults:
                inj = FaultInjector(p.fmt, crc_width=LINK_CRC.crc_width,
                                    depth=2 * max(8, p.credits),
                                    max_sub_flits=1 + p.sub_words // p.lanes + 1)
                m.submodules[f"inject_{u}_{i}"] = inj
                wiring.connect(m, app.o, inj.i)
                wiring.connect(m, inj.o, lk.i)
                m.d.comb += [inj.arm.eq(self.fi_arm & (self.fi_link == k)),
                             inj.mode.eq(self.fi_mode), inj.mask.eq(self.fi_mask),
                             inj.length.eq(self.fi_length)]
                injectors.append(inj)
            else:
                wiring.connect(m, app.o, lk.i)
            wiring.connect(m, lk.o, chk.i)
            wiring.connect(m, chk.o, nics[v].rx[j])
            m.d.comb += nics[v].link_crc[j].eq(chk.error)
        if self.faults:
            self._campaign_ports(m, nics, injectors)

        self._host_streams(m, nics)
        self._dma_streams(m, nics)

        # status
        all_done = Cat(*[n.done for n in nics]).all()
        m.d.comb += [self.done.eq(all_done), self.error.eq(Cat(*[n.error for n in nics]).any()),
                     self.running.eq(Cat(*[n.running for n in nics]).any())]
        # ``cycles`` counts from the cycle the NICs see START: behind their host slice
        counting, seen_start = Signal(), Signal()
        assert HOST_SLICE == 1
        m.d.sync += seen_start.eq(self.start)
        with m.If(seen_start):
            m.d.sync += [counting.eq(1), self.cycles.eq(0)]
        with m.Elif(counting):
            with m.If(all_done):
                m.d.sync += counting.eq(0)
            with m.Else():
                m.d.sync += self.cycles.eq(self.cycles + 1)
        return m


    def _host_streams(self, m, nics):
        """Host access: ``hw``/``hr``/``hrd`` address one NIC per cycle, ``hwa``/``hra``/
        ``hrda`` every NIC at once (one word each).  Priority hw > hwa > hr > hra; writes
        are always accepted.  Reads are pipelined: a request is accepted every cycle while
        the response FIFO has room for it and every read still in flight; responses leave
        in request order on ``hrd`` (single) or ``hrda`` (all-node)."""
        N, L = len(nics), HOST_READ_LATENCY
        m.submodules.resp_fifo = resp_fifo = fifo.SyncFIFOBuffered(width=1 + 32 * N,
                                                                   depth=L + 2)
        rd_pipe = Signal(L)                          # a read answers HOST_READ_LATENCY later
        wide_pipe = Signal(L)                        # ... and was an all-node read
        node_pipe = [Signal.like(self.hr.payload.node, name=f"rd_node{k}") for k in range(L)]
        in_flight = sum(rd_pipe[k] for k in range(L))
        room = (resp_fifo.level + in_flight) < resp_fifo.depth
        wa = self.hwa.valid & ~self.hw.valid
        m.d.comb += [self.hw.ready.eq(1), self.hwa.ready.eq(~self.hw.valid),
                     self.hr.ready.eq(~self.hw.valid & ~self.hwa.valid & room),
                     self.hra.ready.eq(~self.hw.valid & ~self.hwa.valid & ~self.hr.valid &
                                       room)]
        rd = self.hr.valid & self.hr.ready
        rda = self.hra.valid & self.hra.ready
        m.d.sync += [rd_pipe.eq(Cat(rd | rda, rd_pipe[:-1])),
                     wide_pipe.eq(Cat(rda, wide_pipe[:-1])),
                     node_pipe[0].eq(self.hr.payload.node)]
        m.d.sync += [node_pipe[k].eq(node_pipe[k - 1]) for k in range(1, L)]
        rdata = Signal(32)
        for u, nic in enumerate(nics):
            sel_w = self.hw.valid & (self.hw.payload.node == u)
            sel_wa = wa & self.hwa.payload.en[u]
            sel_r = rd & (self.hr.payload.node == u)
            sel_ra = rda & self.hra.payload.en[u]
            addr = Mux_(self.hw.valid, self.hw.payload.addr,
                        Mux_(self.hwa.valid, self.hwa.payload.addr[u],
                             Mux_(self.hr.valid, self.hr.payload.addr,
                                  self.hra.payload.addr[u])))
            m.d.comb += [nic.host.we.eq(sel_w | sel_wa),
                         nic.host.wdata.eq(Mux_(self.hw.valid, self.hw.payload.data,
                                                self.hwa.payload.data[u])),
                         nic.host.re.eq(sel_r | sel_ra), nic.host.addr.eq(addr)]
            with m.If(node_pipe[-1] == u):
                m.d.comb += rdata.eq(nic.host.rdata)
        lanes = Mux_(wide_pipe[-1], Cat(*[n.host.rdata for n in nics]), rdata)
        head_wide = resp_fifo.r_data[-1]
        m.d.comb += [resp_fifo.w_en.eq(rd_pipe[-1]), resp_fifo.w_data.eq(Cat(lanes, wide_pipe[-1])),
                     self.hrd.valid.eq(resp_fifo.r_rdy & ~head_wide),
                     self.hrd.payload.eq(resp_fifo.r_data[:32]),
                     self.hrda.valid.eq(resp_fifo.r_rdy & head_wide),
                     self.hrda.payload.eq(resp_fifo.r_data[:32 * N]),
                     resp_fifo.r_en.eq(Mux_(head_wide, self.hrda.ready, self.hrd.ready))]

    def _dma_streams(self, m, nics):
        """``dwa``/``dra``/``drda``: every NIC's DMA port at once, in cycles no host stream
        is valid (a NIC refuses a DMA beat that meets a bus access).  Reads are pipelined
        like the host's: accepted while the response FIFO has room for every read in
        flight, answered in order."""
        N, L = len(nics), HOST_READ_LATENCY
        W = self.params.lanes
        # L + 4: the reads in flight plus the FIFO's own output latency, so a consumer
        # that takes a beat every cycle never stalls the requests (L + 2 lost ~13%)
        m.submodules.dma_fifo = resp = fifo.SyncFIFOBuffered(width=32 * W * N, depth=L + 4)
        pipe = Signal(L)
        room = (resp.level + sum(pipe[k] for k in range(L))) < resp.depth
        host_busy = self.hw.valid | self.hwa.valid | self.hr.valid | self.hra.valid
        m.d.comb += [self.dwa.ready.eq(~host_busy),
                     self.dra.ready.eq(~host_busy & ~self.dwa.valid & room)]
        write = self.dwa.valid & self.dwa.ready
        read = self.dra.valid & self.dra.ready
        m.d.sync += pipe.eq(Cat(read, pipe[:-1]))
        for u, nic in enumerate(nics):
            m.d.comb += [nic.dma.we.eq(write & self.dwa.payload.mask[u].any()),
                         nic.dma.wmask.eq(self.dwa.payload.mask[u]),
                         nic.dma.wdata.eq(self.dwa.payload.data[u]),
                         nic.dma.re.eq(read & self.dra.payload.en[u]),
                         nic.dma.addr.eq(Mux_(self.dwa.valid, self.dwa.payload.addr[u],
                                              self.dra.payload.addr[u]))]
        m.d.comb += [resp.w_en.eq(pipe[-1]), resp.w_data.eq(Cat(*[n.dma.rdata for n in nics])),
                     self.drda.valid.eq(resp.r_rdy), self.drda.payload.eq(resp.r_data),
                     resp.r_en.eq(self.drda.ready)]

    def _campaign_ports(self, m, nics, injectors):
        """Fault-campaign outputs: any injector fired / overflowed, timestamps."""
        m.d.comb += [self.fi_fired.eq(Cat(*[x.fired for x in injectors]).any()),
                     self.fi_overflow.eq(Cat(*[x.overflow for x in injectors]).any())]
        m.d.sync += self.clock.eq(self.clock + 1)
        with m.If((self.fault_at == 0) & (self.fi_fired | self.nic_reset.any())):
            m.d.sync += self.fault_at.eq(self.clock)
        seen = Cat(*[n.error for n in nics]).any() | \
            Cat(*[n.link_crc.any() for n in nics]).any()
        with m.If((self.error_at == 0) & seen):
            m.d.sync += self.error_at.eq(self.clock)


class _NicPorts:
    """Signals standing in for a Nic's ports when the NIC is a Verilog Instance."""

    def __init__(self, p: NicParams, u: int, *, link_crc: bool = False):
        self.p = p
        self.has_link_crc = link_crc
        proto = Nic(p, link_crc=link_crc)
        proto._MustUse__silence = True          # only its signature is used
        if proto.sparse_engine is not None:
            proto.sparse_engine._MustUse__silence = True
        self.sig = wiring.Signature(proto.signature.members).create(path=(f"n{u}",))
        for name in ("host", "dma", "start", "done", "running", "error", "tx", "rx") + \
                (("link_crc",) if link_crc else ()):
            setattr(self, name, getattr(self.sig, name))

    def instance(self, module: str, reset=None):
        from amaranth.hdl import ClockSignal, Instance, ResetSignal
        kw = {"i_clk": ClockSignal(),
              "i_rst": ResetSignal() if reset is None else ResetSignal() | reset}
        if self.has_link_crc:
            kw["i_link_crc"] = self.link_crc
        h = self.host
        kw.update({"i_host__addr": h.addr, "i_host__wdata": h.wdata, "i_host__we": h.we,
                   "i_host__re": h.re, "o_host__rdata": h.rdata, "i_start": self.start,
                   "i_dma__addr": self.dma.addr, "i_dma__we": self.dma.we,
                   "i_dma__wmask": self.dma.wmask, "i_dma__wdata": self.dma.wdata,
                   "i_dma__re": self.dma.re, "o_dma__rdata": self.dma.rdata,
                   "o_done": self.done, "o_running": self.running, "o_error": self.error})
        for i in range(self.p.ports):
            tx, rx = self.tx[i], self.rx[i]
            kw.update({f"o_tx__{i}__valid": tx.valid, f"o_tx__{i}__flit": tx.flit.as_value(),
                       f"i_tx__{i}__credit": tx.credit, f"i_rx__{i}__valid": rx.valid,
                       f"i_rx__{i}__flit": rx.flit.as_value(),
                       f"o_rx__{i}__credit": rx.credit})
        return Instance(module, **kw)


def nic_verilog(params: NicParams, name: str = "treenic_nic", *, link_crc: bool = False) -> str:
    """Verilog of one NIC (cached under build/cosim by parameters)."""
    import hashlib, os
    from dataclasses import asdict
    from pathlib import Path
    root = Path(os.environ.get("TREENIC_COSIM_BUILD") or
                Path(__file__).resolve().parents[2] / "build" / "cosim")
    key = hashlib.sha256(repr((asdict(params), name, _src_hash()) +
                              ((True,) if link_crc else ())).encode()).hexdigest()[:12]
    f = root / f"nic-{key}.v"
    if not f.exists():
        from amaranth.back import verilog
        root.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(verilog.convert(Nic(params, link_crc=link_crc), name=name))
        os.replace(tmp, f)
    return f.read_text()


def _src_hash() -> str:
    import hashlib
    from pathlib import Path
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    # every RTL source the NIC elaborates from (skid.py, fp32.py, link/, nic/)
    for f in sorted(list(here.glob("*.py")) + list((here.parent / "link").glob("*.py")) +
                    list(here.parent.glob("*.py"))):
        h.update(f.read_bytes())
    return h.hexdigest()


def fabric_verilog(topology, params: NicParams, *, latency: int = 1, stall: int = 0,
                   seed: int = 1, name: str = "fabric", crc: bool = False,
                   faults: bool = False) -> str:
    """Verilog of a fabric: one NIC module + the fabric top instantiating it N times."""
    from amaranth.back import verilog
    nic = nic_verilog(params, name=f"{name}_nic", link_crc=crc or faults)
    fab = Fabric(topology, params, latency=latency, stall=stall, seed=seed,
                 nic_module=f"{name}_nic", crc=crc, faults=faults)
    return nic + "\n" + verilog.convert(fab, name=name)


def Mux_(c, a, b):
    from amaranth.hdl import Mux
    return Mux(c, a, b)
