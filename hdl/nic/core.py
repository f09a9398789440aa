"""The treenic NIC core: schedule management (MultiTree paper §IV-A, Fig. 6), DMA, link
ports and in-NIC reduction, as a set of components joined here.

::

           host bus (regs / table rows / buffer / step log / ORDER table)
                │
     ┌──────────┴──────────────────────────────────────────────────────────────┐
     │ HostRegs ──► schedule table (lib.memory) ──► TableScan ──► FlowTable      │
     │     │             │ head row                  (per flow: expected child  │
     │     │             ▼                            ports, gather port,       │
     │     │          Issue: run FSM, timestep,       chunk, ORDER steps)       │
     │     │          lockstep, head entry ◄── arrived bits ◄─┐    │            │
     │     │             │ go + descriptor                    │    ▼            │
     │     │          TxUnit[p]: DMA ─► FIFO ─► Packetiser ─► tx[p]              │
     │     │                                                  │                 │
     │     │  rx[p] ─► RxUnit[p]: Depacketiser ─► checks + OrderGate ─► stream   │
     │     │                      ─► Accumulate (FP32 adders) ─► write-back ─────┘
     │     ▼                                                                     │
     │  BankedBuffer (gradient buffer, buffer.py): host reader/writer, RX         │
     │  read-modify-write, TX reads, arbitrated per bank                          │
     │  ErrorCollect: events of every unit ─► ERR_FLAGS, ERR_COUNT, error         │
     │  Watchdog: no progress for WATCHDOG cycles ─► ERR WATCHDOG, WD_INFO        │
     └──────────────────────────────────────────────────────────────────────────┘

What each component does and its cycle contract: ``docs/nic-components.md``; the
semantics are those of the golden model :mod:`treenic.hdl.nic.model`.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from ..link.flit import LinkSignature, Op
from .buffer import BankedBuffer
from .errors import ErrorCollect
from .flow_table import FlowTable
from .host_regs import REGS_READ_LATENCY, DmaSignature, HostRegs, HostSignature
from .issue import Issue
from .params import NicParams, PortCounter
from .rx import RxUnit
from .scan import TableScan
from .share import ReadShare, WriteMerge
from .sparse_engine import SparseEngine
from .sparse_host import LinkShare, SparseHost
from .tx import TxUnit, buffer_abits
from .watchdog import Watchdog

__all__ = ["Nic", "HostSignature", "HOST_READ_LATENCY", "HOST_SLICE"]

#: cycles of the register slice on the NIC's host side (bus, DMA port, ``start``): every
#: host-side input reaches the core a cycle late, so its decode starts at a register the
#: placer puts near the decode, not at whatever drives the pins (``Nic._host_slice``)
HOST_SLICE = 1

#: cycles from a host read (``re``) to its ``rdata`` (every region): the slice, the
#: registered read request, then the buffer's read path
HOST_READ_LATENCY = HOST_SLICE + REGS_READ_LATENCY


@dataclass(frozen=True)
class BufferPorts:
    """The buffer ports the NIC's units connect to (``rd``, ``wr``, as
    :class:`.buffer.BankedBuffer` numbers them), shared or not, and the buffer's
    ``conflict`` (with a shared writer's)."""
    rd: list
    wr: list
    conflict: object


class Nic(wiring.Component):
    """One NIC.

    Parameters
    ----------
    params : NicParams or None
        The build (default: ``NicParams()``).
    link_crc : bool
        The NIC's links have a CRC checker (:mod:`treenic.hdl.link.crc`): adds the
        ``link_crc`` input (counted in LINK_CRC[p], flagged ERR LINK_CRC).

    With ``params.sparse`` set the NIC also holds a
    :class:`~treenic.hdl.nic.sparse_engine.SparseEngine` (submodule ``sparse``): its links
    are the NIC's, shared with the dense datapath under SP_MODE
    (:class:`~treenic.hdl.nic.sparse_host.LinkShare`), its host streams are the ``SP_*``
    registers (:class:`~treenic.hdl.nic.sparse_host.SparseHost`); the ports below are the
    same.  In sparse mode START (CTRL or ``start``) queues a sparse run, and ``done`` /
    ``running`` are the sparse run's.

    Members
    -------
    tx : ``Out(LinkSignature(params.fmt)).array(ports)``
        Link outputs (flits out, credits in).
    rx : ``In(LinkSignature(params.fmt)).array(ports)``
        Link inputs.
    host : ``Out(HostSignature(params.addr_bits))``
        Host bus (register map: :mod:`.params`).
    dma : ``Out(DmaSignature(buffer address bits, params.lanes))``
        Bulk gradient-buffer port, ``lanes`` elements per cycle (:mod:`.host_regs`).
    start : ``In(1)``
        Same as CTRL START, for a fabric-wide start.
    done, running, error : ``Out(1)``
        Status wires.
    link_crc : ``In(ports)``, only with ``link_crc=True``
        Per port: its link CRC checker failed a sub-packet this cycle (the checker
        rolled the fragment back; it is counted and flagged here).
    """

    def __init__(self, params: NicParams | None = None, *, link_crc: bool = False):
        if params is not None and not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        if not isinstance(link_crc, bool):
            raise TypeError(f"link_crc must be a bool, not {type(link_crc).__name__}")
        self.p = p = params or NicParams()
        self.fmt = p.fmt
        self.has_link_crc = link_crc
        # the engine is built here so a bad sparse build fails at construction
        self.sparse_engine = None if p.sparse is None else \
            SparseEngine(**p.sparse.engine_kwargs(p.ports))
        members = {
            "host": Out(HostSignature(p.addr_bits)), "start": In(1),
            "dma": Out(DmaSignature(buffer_abits(p), p.lanes)),
            "done": Out(1), "running": Out(1), "error": Out(1),
            "tx": Out(LinkSignature(self.fmt)).array(p.ports),
            "rx": In(LinkSignature(self.fmt)).array(p.ports)}
        if link_crc:
            members["link_crc"] = In(p.ports)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p = self.p
        P = p.ports
        m.submodules.host_regs = regs = HostRegs(params=p)
        m.submodules.issue = issue = Issue(params=p)
        m.submodules.table_scan = scan = TableScan(params=p)
        m.submodules.flow_table = flows = FlowTable(params=p)
        m.submodules.errors = errors = ErrorCollect(params=p)
        # buffer readers (in priority order under the "fixed" arbiter; the others reorder
        # 1..2P per cycle, the host stays first): 0 host, 1..P RX (a stalled RX stalls
        # its link), P+1..2P TX; writers: 0..P-1 RX write-back, P host (only while not
        # RUNNING).  Every RX beat writes back a fixed time after its grant, so the RX
        # readers reserve write slots; a GATHER beat reads nothing (write_only) and leaves
        # the banks' read ports to the TX streams
        buf = self._buffer(m)
        host, dma, start = self._host_slice(m)
        wiring.connect(m, wiring.flipped(host), regs.host)
        wiring.connect(m, wiring.flipped(dma), regs.dma)
        wiring.connect(m, regs.buf_read, buf.rd[0])
        wiring.connect(m, regs.buf_write, buf.wr[P])
        self._memories(m, regs, issue)
        clear = regs.clear
        m.d.comb += [issue.clear.eq(clear),
                     issue.entries.eq(regs.entries), issue.lockstep.eq(regs.lockstep)]
        if p.sparse is None:
            m.d.comb += issue.start.eq(start | regs.ctrl_start)
            self._status(m, start | regs.ctrl_start, issue.done, issue.running)
        # table scan -> flow tables
        m.d.comb += [scan.reset.eq(issue.scan_reset), scan.active.eq(issue.scan_active),
                     scan.row.eq(issue.row), scan.entries.eq(regs.entries),
                     scan.elements.eq(regs.elements), scan.flows.eq(regs.flows),
                     issue.scan_row_addr.eq(scan.row_addr),
                     issue.scan_finished.eq(scan.finished), issue.scan_bad.eq(scan.bad),
                     flows.reset.eq(issue.scan_reset), flows.write_en.eq(scan.write_en),
                     flows.write_row.eq(scan.write_row), flows.write_end.eq(scan.write_end),
                     flows.order_we.eq(regs.order_we),
                     flows.order_addr.eq(regs.order_addr),
                     flows.order_data.eq(regs.order_data), flows.clear.eq(clear)]
        wiring.connect(m, flows.tables, issue.tables)
        sparse_refused = None
        if p.sparse is None:
            tx_links = [wiring.flipped(t) for t in self.tx]
            rx_links = [wiring.flipped(r) for r in self.rx]
        else:
            share, sparse_refused = self._sparse(m, regs, issue, host, start)
            tx_links, rx_links = share.dense_tx, share.dense_rx
        tx_units = self._tx_units(m, regs, issue, buf, tx_links)
        rx_units = self._rx_units(m, regs, issue, flows, buf, rx_links)
        if p.cut_through:
            self._pace_sources(m, tx_units, rx_units)
        for i, (tx, rx) in enumerate(zip(tx_units, rx_units)):
            for k, value in zip(PortCounter, [tx.flits, tx.heads, tx.words, rx.frags,
                                              rx.words, rx.link_errors, rx.link_dropped,
                                              rx.bad]):
                m.d.comb += regs.counters[i][k].eq(value)
        m.d.comb += [regs.running.eq(issue.running), regs.done.eq(issue.done),
                     regs.scan_failed.eq(issue.scan_failed), regs.cycles.eq(issue.cycles),
                     regs.timestep.eq(issue.timestep), regs.head.eq(issue.head),
                     regs.err_flags.eq(errors.err_flags), regs.err_count.eq(errors.err_count)]
        self._errors(m, errors, regs, issue, scan, rx_units, buf, sparse_refused)
        self._fault_detection(m, errors, regs, issue, flows, tx_units)
        return m

    def _host_slice(self, m):
        """A register on every host-side input (``HOST_SLICE`` cycles): the host bus and
        the DMA port keep their order among themselves and with ``start``, so a host sees
        the same NIC, only later (reads answer ``HOST_READ_LATENCY`` after ``re``). Before
        the slice the bus decode began at the wrapper's input register, wherever the
        placer put it: two long routes ahead of the error flags and the sparse host FIFO
        (-1.22 and -1.01 ns routed, seventeenth wave)."""
        host = HostSignature(self.p.addr_bits).create(path=("host_q",))
        dma = DmaSignature(buffer_abits(self.p), self.p.lanes).create(path=("dma_q",))
        start = Signal(name="start_q")
        assert HOST_SLICE == 1
        m.d.sync += [host.addr.eq(self.host.addr), host.wdata.eq(self.host.wdata),
                     host.we.eq(self.host.we), host.re.eq(self.host.re),
                     dma.addr.eq(self.dma.addr), dma.we.eq(self.dma.we),
                     dma.wmask.eq(self.dma.wmask), dma.wdata.eq(self.dma.wdata),
                     dma.re.eq(self.dma.re), start.eq(self.start)]
        m.d.comb += [self.host.rdata.eq(host.rdata), self.dma.rdata.eq(dma.rdata)]
        return host, dma, start

    def _status(self, m, starting, done, running):
        """``done`` and ``running`` as the pins saw them before the slice: in the cycle a
        START leaves the slice (``starting``, before the run has registered it) ``done``
        is already low and ``running`` high, as they were a cycle after the START pin
        (a fabric that waits for ``done`` right after its START must not see the last
        run's)."""
        m.d.comb += [self.done.eq(done & ~starting),
                     self.running.eq(running | starting)]

    def _buffer(self, m):
        """The gradient buffer, and the ports the units see (``BufferPorts``): the
        buffer's own readers and writers, or with ``shared_ports`` one reader for the RX
        units, one for the TX units and one writer for the RX write-backs (:mod:`.share`)."""
        p = self.p
        P = p.ports
        if not p.shared_ports:
            m.submodules.buf = buf = BankedBuffer(
                depth=p.depth, banks=p.banks, lanes=p.lanes, readers=2 * P + 1,
                writers=P + 1, write_back=range(1, P + 1), arbiter=p.arbiter)
            return BufferPorts(rd=list(buf.rd), wr=list(buf.wr), conflict=buf.conflict)
        m.submodules.buf = buf = BankedBuffer(
            depth=p.depth, banks=p.banks, lanes=p.lanes, readers=3, writers=2,
            write_back=[1], arbiter=p.arbiter)
        abits, L = buf.abits, p.lanes
        m.submodules.rx_share = rx_share = ReadShare(abits=abits, lanes=L, clients=P)
        m.submodules.tx_share = tx_share = ReadShare(abits=abits, lanes=L, clients=P)
        m.submodules.rx_merge = rx_merge = WriteMerge(abits=abits, lanes=L, clients=P)
        wiring.connect(m, rx_share.port, buf.rd[1])
        wiring.connect(m, tx_share.port, buf.rd[2])
        wiring.connect(m, rx_merge.port, buf.wr[0])
        # the units' view, indexed as the unshared buffer's: rd[0] host, rd[1..P] RX,
        # rd[P+1..2P] TX; wr[0..P-1] RX write-backs, wr[P] host
        return BufferPorts(rd=[buf.rd[0], *rx_share.clients, *tx_share.clients],
                           wr=[*rx_merge.clients, buf.wr[1]],
                           conflict=buf.conflict | rx_merge.conflict)

    def _memories(self, m, regs, issue):
        """The schedule table (host writes a 32-bit word of a row, the issue logic reads
        rows) and the step cycle log (the issue logic writes, the host reads)."""
        p = self.p
        m.submodules.table = table = memory.Memory(shape=p.row_words * 32,
                                                   depth=p.max_entries, init=[])
        t_wr = table.write_port(granularity=32)
        t_rd = table.read_port()
        m.submodules.steplog = steplog = memory.Memory(shape=32, depth=p.max_steps + 2,
                                                       init=[])
        s_wr = steplog.write_port()
        s_rd = steplog.read_port()
        m.d.comb += [t_wr.addr.eq(regs.table_addr), t_wr.data.eq(regs.table_data),
                     t_wr.en.eq(regs.table_en),
                     t_rd.addr.eq(issue.row_addr), issue.row_data.eq(t_rd.data),
                     s_wr.addr.eq(issue.steplog_addr), s_wr.data.eq(issue.steplog_data),
                     s_wr.en.eq(issue.steplog_en),
                     s_rd.addr.eq(regs.steplog_addr), regs.steplog_data.eq(s_rd.data)]

    def _sparse(self, m, regs, issue, host, start):
        """The sparse engine, its host registers and the link sharing (sparse builds):
        START, ``done`` and ``running`` follow SP_MODE; a refused sparse host write is
        flagged ERR HOST_RANGE with the dense core's."""
        p = self.p
        m.submodules.sparse = eng = self.sparse_engine
        m.submodules.sparse_host = sh = SparseHost(params=p)
        m.submodules.link_share = share = LinkShare(
            fmt=self.fmt, engine_fmt=eng.fmt, ports=p.ports,
            max_outstanding=max(p.credits, p.sparse.rx_depth))
        for i in range(p.ports):
            wiring.connect(m, share.tx[i], wiring.flipped(self.tx[i]))
            wiring.connect(m, wiring.flipped(self.rx[i]), share.rx[i])
            wiring.connect(m, eng.tx[i], share.engine_tx[i])
            wiring.connect(m, share.engine_rx[i], eng.rx[i])
        wiring.connect(m, sh.host_i, eng.host_i)
        wiring.connect(m, eng.host_o, sh.host_o)
        start = start | regs.ctrl_start
        # the dense core is busy from its START (registered in Issue), through INIT,
        # SCAN and FINISH (a cycle after the scan), to the end of RUN: no mode change
        start_q, scan_q = Signal(), Signal()
        m.d.sync += [start_q.eq(start & ~sh.mode), scan_q.eq(issue.scan_active)]
        dense_busy = start_q | issue.scan_reset | issue.scan_active | scan_q | issue.running
        m.d.comb += [sh.addr.eq(host.addr), sh.wdata.eq(host.wdata),
                     sh.we.eq(host.we), sh.re.eq(host.re), sh.start.eq(start),
                     sh.clear.eq(regs.clear), sh.dense_running.eq(dense_busy),
                     sh.drained.eq(share.drained), share.sparse.eq(sh.mode),
                     sh.busy.eq(eng.busy), sh.cycles.eq(eng.cycles), sh.flits.eq(eng.flits),
                     sh.malformed.eq(eng.malformed), sh.finals.eq(eng.finals),
                     eng.start.eq(0),            # runs start through the HOST_IN FIFO
                     issue.start.eq(start & ~sh.mode)]
        self._status(m, start, Mux(sh.mode, sh.done, issue.done),
                     Mux(sh.mode, sh.running, issue.running))
        for k in range(len(sh.regs)):
            m.d.comb += regs.sparse_regs[k].eq(sh.regs[k])
        return share, sh.refused

    def _tx_units(self, m, regs, issue, buf, links) -> list[TxUnit]:
        p = self.p
        units = []
        idle = []
        for i in range(p.ports):
            m.submodules[f"tx{i}"] = tx = TxUnit(params=p, port=i)
            wiring.connect(m, tx.link, links[i])
            wiring.connect(m, tx.read, buf.rd[1 + p.ports + i])
            m.d.comb += [tx.go.eq(issue.tx_go[i]), tx.desc.eq(issue.tx_desc),
                         tx.peer.eq(regs.peer[i]), tx.node_id.eq(regs.node_id),
                         tx.clear.eq(regs.clear)]
            idle.append(tx.idle)
            units.append(tx)
        m.d.comb += issue.tx_idle.eq(Cat(*idle))
        return units

    @staticmethod
    def _pace_sources(m, tx_units, rx_units):
        """Cut-through: every TX unit sees every receive unit's progress."""
        for tx in tx_units:
            for q, rx in enumerate(rx_units):
                wiring.connect(m, rx.state, tx.sources[q])

    def _rx_units(self, m, regs, issue, flows, buf, links) -> list[RxUnit]:
        p = self.p
        F = p.max_nodes
        flow_enable = Cat(*[f < regs.flows for f in range(F)])
        units = []
        for i in range(p.ports):
            m.submodules[f"rx{i}"] = rx = RxUnit(params=p, port=i)
            wiring.connect(m, links[i], rx.link)
            wiring.connect(m, rx.read, buf.rd[1 + i])
            wiring.connect(m, rx.write, buf.wr[i])
            wiring.connect(m, flows.tables, rx.tables)
            m.d.comb += [rx.running.eq(issue.running), rx.clear.eq(regs.clear),
                         rx.run_init.eq(issue.run_init), rx.flow_enable.eq(flow_enable),
                         rx.init_reduce_done.eq(flows.empty_reduce[i]),
                         rx.init_gather_done.eq(flows.empty_gather[i]),
                         issue.reduce_done[i].eq(rx.state.reduce_done),
                         issue.gather_done[i].eq(rx.state.gather_done)]
            units.append(rx)
        for rx in units:
            wiring.connect(m, rx.state, *[other.peers[rx.port] for other in units])
        return units

    def _errors(self, m, errors, regs, issue, scan, rx_units, buf, sparse_refused=None):
        ev = errors.events
        host_range = regs.ev_host_range
        if sparse_refused is not None:     # a refused sparse host write (sparse builds)
            host_range = host_range | sparse_refused
        m.d.comb += [ev.table_index.eq(issue.ev_table_index | regs.ev_table_index),
                     ev.host_range.eq(host_range), ev.bad_op.eq(scan.ev_bad_op),
                     ev.entry_range.eq(scan.ev_entry_range),
                     ev.frag_range.eq(Cat(*[rx.ev_range for rx in rx_units])),
                     ev.unexpected.eq(Cat(*[rx.ev_unexpected for rx in rx_units])),
                     ev.sequence.eq(Cat(*[rx.ev_sequence for rx in rx_units])),
                     ev.bank_conflict.eq(buf.conflict),
                     errors.link_error.eq(Cat(*[rx.link_errors != 0 for rx in rx_units]).any()),
                     errors.clear.eq(regs.clear), self.error.eq(errors.error)]

    def _fault_detection(self, m, errors, regs, issue, flows, tx_units):
        """The watchdog (issue 19 item 13) and the per-port link-CRC failure counters
        (item 12)."""
        p = self.p
        P, F = p.ports, p.max_nodes
        m.submodules.watchdog = wd = Watchdog(params=p)
        # progress: a flit on any link (either way), the head retiring, the timestep
        # moving, the lockstep counter running
        head_q, ts_q = Signal.like(issue.head), Signal.like(issue.timestep)
        m.d.sync += [head_q.eq(issue.head), ts_q.eq(issue.timestep)]
        links = Cat(*[tx.valid for tx in self.tx], *[rx.valid for rx in self.rx])
        # registered: a TX valid sits behind the link share and the sparse engine's send
        # decision (the routed worst enable family, -3.69 ns at 125 MHz); the watchdog
        # then sees a flit a cycle later and fires at most a cycle later
        links_q = Signal()
        m.d.sync += links_q.eq(links.any())
        e, t = issue.row, flows.tables
        m.d.comb += [wd.running.eq(issue.running), wd.clear.eq(regs.clear),
                     wd.limit.eq(regs.watchdog), regs.wd_info.eq(wd.info),
                     wd.progress.eq(links_q | (issue.head != head_q) |
                                    (issue.timestep != ts_q) | issue.lockstep_busy),
                     # a paced TX unit waiting for its sources' data is not short of
                     # credits: the watchdog names the receive it waits for instead
                     wd.tx_busy.eq(~Cat(*[tx.idle | (tx.starved if p.cut_through else 0)
                                          for tx in tx_units])),
                     wd.timestep.eq(issue.timestep),
                     wd.head_valid.eq(issue.head < regs.entries),
                     wd.head_gather.eq(e.op == Op.GATHER), wd.head_flow.eq(e.flow),
                     wd.head_step.eq(e.step), wd.head_owed.eq(issue.head_owed),
                     errors.events.watchdog.eq(wd.fire)]
        for i, tx in enumerate(tx_units):
            m.d.comb += [wd.tx_flow[i].eq(tx.msg_flow), wd.tx_step[i].eq(tx.msg_step)]
        for f in range(F):
            for q in range(P):
                m.d.comb += [
                    wd.owed_red[f][q].eq(t.expect[f][q] & ~issue.reduce_done[q][f]),
                    wd.owed_gat[f][q].eq((t.gather_port[f] == q) & ~issue.gather_done[q][f])]
        if not self.has_link_crc:
            return
        m.d.comb += errors.events.link_crc.eq(self.link_crc)
        for i in range(P):
            count = regs.link_crc[i]
            with m.If(regs.clear):
                m.d.sync += count.eq(0)
            with m.Elif(self.link_crc[i]):
                m.d.sync += count.eq(count + 1)
