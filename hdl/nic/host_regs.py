"""Host bus of a NIC: register file, write decode into the table, buffer and ORDER table,
and the read path (see :mod:`.params` for the register map).

Every read answers :data:`REGS_READ_LATENCY` cycles after ``re``: one cycle in which the
bus's and the DMA port's read requests are merged and registered, then the buffer's read
latency (registers and the step log are delayed to match); reads may be issued back to
back.  The register is there for timing: the host is the buffer's highest-priority
reader, so its request gates every other reader's grant, and a request decoded straight
from the bus pins would put the whole host decode in front of the RX ports' skid buffers.  The host is the buffer's first reader (never refused, so reads also work while
RUNNING) and its last writer (writes only while not RUNNING, so never contended).

The bulk DMA port (:class:`DmaSignature`) moves ``lanes`` consecutive buffer elements per
cycle through the same reader and writer -- the full width of the bank crossbar, where
the register bus uses lane 0 only.  It shares them with the bus: a DMA beat in a cycle
in which the bus also reads or writes is dropped and flagged HOST_RANGE (the fabric and
the board's DMA engine never overlap the two); so is a write while RUNNING or a lane past
``depth``.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .buffer import READ_LATENCY, BufferReadSignature, BufferWriteSignature
from .params import ID_VALUE, SPARSE_READ_REGS, ErrBit, NicParams, PortCounter, Reg
from .tx import buffer_abits

__all__ = ["HostRegs", "HostSignature", "DmaSignature", "REGS_READ_LATENCY"]

#: cycles from a read (``re``) at HostRegs to its ``rdata`` (every region): the registered
#: read request, then the buffer's read path (the NIC's host sees
#: :data:`~.core.HOST_READ_LATENCY`, its host slice added)
REGS_READ_LATENCY = 1 + READ_LATENCY

REGISTERS, TABLE, BUFFER, STEPLOG_ORDER = 0, 1, 2, 3      # host-bus regions


class HostSignature(wiring.Signature):
    """Host register/memory bus seen from the NIC (``In``): ``addr``, ``wdata``, ``we``,
    ``re``; ``rdata`` is valid :data:`REGS_READ_LATENCY` cycles after ``re`` at HostRegs,
    :data:`~.core.HOST_READ_LATENCY` at a NIC's pins (reads may be
    issued back to back)."""

    def __init__(self, addr_bits: int):
        super().__init__({"addr": In(addr_bits), "wdata": In(32), "we": In(1), "re": In(1),
                          "rdata": Out(32)})


class DmaSignature(wiring.Signature):
    """Bulk buffer port seen from the NIC (``In``): ``addr`` (element of lane 0), ``we``
    with a per-lane ``wmask`` and ``wdata`` (lane k = element ``addr + k``), ``re``;
    ``rdata`` (all lanes) is valid as the bus's ``rdata`` after ``re``; a beat
    per cycle either way."""

    def __init__(self, abits: int, lanes: int):
        super().__init__({"addr": In(abits), "we": In(1), "wmask": In(lanes),
                          "wdata": In(32 * lanes), "re": In(1), "rdata": Out(32 * lanes)})


class HostRegs(wiring.Component):
    """Register file and host-bus decode of one NIC.

    Parameters
    ----------
    params : NicParams

    Members
    -------
    host : ``Out(HostSignature(params.addr_bits))``
        The bus.
    dma : ``Out(DmaSignature(buffer address bits, params.lanes))``
        The bulk buffer port (``lanes`` elements per cycle).
    ctrl_start : ``Out(1)``
        CTRL write with START (combinational).
    clear : ``Out(1)``
        CTRL write with CLEAR, registered: it resets counters across the core.
    node_id, entries, lockstep, elements, flows : ``Out``;  peer : ``Out(16).array(ports)``
        The configuration registers.
    ev_table_index, ev_host_range : ``Out(1)``
        A rejected host write (pulses).
    table_en, table_addr, table_data : ``Out``
        Schedule-table RAM write (a 32-bit word of a row; only while not RUNNING).
    buf_read : ``Out(BufferReadSignature)``;  buf_write : ``Out(BufferWriteSignature)``
        The host's reader (the buffer's first) and writer (its last) of the buffer.
    order_we, order_addr, order_data : ``Out``
        ORDER-table write (only while not RUNNING).
    steplog_addr : ``Out``;  steplog_data : ``In(32)``
        Step-log RAM read.
    running, done, scan_failed : ``In(1)``;  err_flags, err_count, cycles, timestep, head : ``In``
        Status for the read path.
    counters : ``In(32).array(ports, len(PortCounter))``
        Per-port counters (TX flits, heads, words; RX frags, words, link errors, dropped,
        bad).
    watchdog : ``Out(32)``
        The WATCHDOG register: cycles without progress before ERR WATCHDOG (0: off).
    wd_info : ``In(32)``
        What the watchdog waited for (WD_INFO, :func:`~.watchdog.decode_info`).
    link_crc : ``In(32).array(ports)``
        Per port: sub-packets its link CRC checker failed (LINK_CRC[p]).
    sparse_regs : ``In(32).array(len(SPARSE_READ_REGS))``, only in sparse builds
        The sparse engine's readable registers (:class:`~.sparse_host.SparseHost`, which
        also decodes their writes and the SP_OUT_POP side effect).
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        self.params = p = params
        BA, W, E = buffer_abits(p), p.lanes, range(p.max_entries + 1)
        sparse = {} if p.sparse is None else {
            "sparse_regs": In(32).array(len(SPARSE_READ_REGS))}
        super().__init__({
            "host": Out(HostSignature(p.addr_bits)), "dma": Out(DmaSignature(BA, W)),
            "ctrl_start": Out(1), "clear": Out(1),
            "node_id": Out(16), "entries": Out(E), "lockstep": Out(32),
            "elements": Out(p.abits), "flows": Out(range(p.max_nodes + 1)),
            "peer": Out(16).array(p.ports),
            "ev_table_index": Out(1), "ev_host_range": Out(1),
            "table_en": Out(p.row_words), "table_addr": Out(range(p.max_entries)),
            "table_data": Out(p.row_words * 32),
            "buf_read": Out(BufferReadSignature(BA, W)),
            "buf_write": Out(BufferWriteSignature(BA, W)),
            "order_we": Out(1), "order_addr": Out(p.region_bits), "order_data": Out(32),
            "steplog_addr": Out(p.step_bits), "steplog_data": In(32),
            "running": In(1), "done": In(1), "scan_failed": In(1),
            "err_flags": In(len(ErrBit)), "err_count": In(32), "cycles": In(32),
            "timestep": In(p.step_bits), "head": In(E),
            "counters": In(32).array(p.ports, len(PortCounter)),
            "watchdog": Out(32), "wd_info": In(32), "link_crc": In(32).array(p.ports),
            **sparse})

    def elaborate(self, platform):
        m = Module()
        R = self.params.region_bits
        region, off = self.host.addr[R:R + 2], self.host.addr[:R]
        m.d.comb += self.ctrl_start.eq(self.host.we & (region == REGISTERS) &
                                       (off == Reg.CTRL) & self.host.wdata[0])
        bus_buf = Signal()          # the bus uses the buffer's reader or writer this cycle
        m.d.comb += bus_buf.eq((self.host.we | self.host.re) & (region == BUFFER))
        read_req = Signal()         # the bus's or the DMA port's read, registered into
        read_addr = Signal.like(self.buf_read.addr)    # the buffer a cycle later
        m.d.sync += [self.buf_read.req.eq(read_req), self.buf_read.addr.eq(read_addr)]
        self._writes(m, region, off)
        self._reads(m, region, off, read_req, read_addr)
        self._dma(m, bus_buf, read_req, read_addr)
        return m

    def _dma(self, m, bus_buf, read_req, read_addr):
        """The DMA port drives the host's buffer reader and writer (all lanes) in cycles
        the bus leaves them alone; anything else it asks is dropped and flagged."""
        p, dma, W = self.params, self.dma, self.params.lanes
        # lane k is in the buffer when addr < depth - k: a compare with a constant per lane,
        # no adder ahead of the write enables and the HOST_RANGE flag
        in_range = Cat(*[dma.addr < p.depth - k for k in range(W)])
        write = dma.we & ~bus_buf & ~self.running
        with m.If(write):
            m.d.comb += [self.buf_write.addr.eq(dma.addr), self.buf_write.data.eq(dma.wdata),
                         self.buf_write.en.eq(dma.wmask & in_range)]
        with m.If(dma.re & ~bus_buf):
            m.d.comb += [read_req.eq(1), read_addr.eq(dma.addr)]
        refused = (dma.we & (bus_buf | self.running | (dma.wmask & ~in_range).any())) | \
            (dma.re & bus_buf)
        with m.If(refused):
            m.d.comb += self.ev_host_range.eq(1)
        m.d.comb += dma.rdata.eq(self.buf_read.data)

    def _writes(self, m, region, off):
        p, host = self.params, self.host
        RW, F = p.row_words, p.max_nodes
        clear_req = Signal()
        m.d.sync += self.clear.eq(clear_req)
        # the host's buffer writer is the buffer's last (writes only while not RUNNING)
        m.d.comb += [self.buf_write.addr.eq(off), self.buf_write.data.eq(host.wdata),
                     self.order_addr.eq(off), self.order_data.eq(host.wdata)]
        with m.If(host.we):
            with m.Switch(region):
                with m.Case(REGISTERS):
                    with m.Switch(off):
                        with m.Case(Reg.CTRL):
                            with m.If(host.wdata[1]):
                                m.d.comb += clear_req.eq(1)
                        with m.Case(Reg.NODE):
                            m.d.sync += self.node_id.eq(host.wdata)
                        with m.Case(Reg.ENTRIES):
                            m.d.sync += self.entries.eq(Mux(host.wdata > p.max_entries,
                                                            p.max_entries + 1, host.wdata))
                            with m.If(host.wdata > p.max_entries):
                                m.d.comb += self.ev_table_index.eq(1)
                        with m.Case(Reg.WATCHDOG):
                            m.d.sync += self.watchdog.eq(host.wdata)
                        with m.Case(Reg.LOCKSTEP):
                            m.d.sync += self.lockstep.eq(host.wdata)
                        with m.Case(Reg.ELEMENTS):
                            with m.If(host.wdata > p.depth):
                                m.d.comb += self.ev_host_range.eq(1)
                            with m.Else():
                                m.d.sync += self.elements.eq(host.wdata)
                        with m.Case(Reg.FLOWS):
                            with m.If(host.wdata > F):
                                m.d.comb += self.ev_host_range.eq(1)
                            with m.Else():
                                m.d.sync += self.flows.eq(host.wdata)
                        for i in range(p.ports):
                            with m.Case(Reg.PEER + i):
                                m.d.sync += self.peer[i].eq(host.wdata)
                with m.Case(TABLE):
                    SB = ceil_log2(p.row_stride)
                    row = off >> SB
                    word = off[:SB] if SB else Const(0, 1)
                    with m.If((row < p.max_entries) & (word < RW) & ~self.running):
                        m.d.comb += [self.table_addr.eq(row),
                                     self.table_data.eq(host.wdata.replicate(RW)),
                                     self.table_en.eq((Const(1, RW) << word)[:RW])]
                    with m.Else():
                        m.d.comb += self.ev_table_index.eq(1)
                with m.Case(STEPLOG_ORDER):
                    m.d.comb += self.order_we.eq(~self.running)
                with m.Case(BUFFER):
                    with m.If((off < p.depth) & ~self.running):
                        m.d.comb += self.buf_write.en.eq(1)
                    with m.Else():
                        m.d.comb += self.ev_host_range.eq(1)

    def _register_groups(self) -> list[dict]:
        """The readable registers, one group for the core's own and one per port."""
        p = self.params
        P, W = p.ports, p.lanes
        status = Cat(self.running, self.done, self.err_flags.any(), self.scan_failed)
        groups = [{Reg.ID: ID_VALUE, Reg.STATUS: status, Reg.NODE: self.node_id,
                   Reg.ENTRIES: self.entries, Reg.LOCKSTEP: self.lockstep,
                   Reg.ELEMENTS: self.elements, Reg.FLOWS: self.flows,
                   Reg.ERR_FLAGS: self.err_flags, Reg.ERR_COUNT: self.err_count,
                   Reg.CYCLES: self.cycles, Reg.TIMESTEP: self.timestep, Reg.HEAD: self.head,
                   Reg.PARAMS: P | (W << 4) | (ceil_log2(p.depth) << 8) | (p.max_entries << 16),
                   **{Reg.PEER + i: self.peer[i] for i in range(P)},
                   Reg.WATCHDOG: self.watchdog, Reg.WD_INFO: self.wd_info}]
        for i in range(P):
            groups.append({**{p.port_counter_addr(i, k): self.counters[i][k]
                              for k in PortCounter},
                           Reg.LINK_CRC + i: self.link_crc[i]})
        if p.sparse is not None:
            groups.append(dict(zip(SPARSE_READ_REGS, self.sparse_regs)))
        return groups

    def _reads(self, m, region, off, read_req, read_addr):
        host = self.host
        m.d.comb += [read_req.eq(host.re & (region == BUFFER)), read_addr.eq(off),
                     self.steplog_addr.eq(off)]
        # Register reads: the offset is registered a cycle after ``re``; then each group of
        # registers (the core's own, each port's counters) is multiplexed into a register
        # of its own, and the groups into ``rreg`` -- two short levels instead of one
        # 40-way mux across the die.  Registers answer three cycles after ``re``, the step
        # log one: both are brought to the same point and delayed to REGS_READ_LATENCY.
        region_q = Signal(2)
        m.d.sync += region_q.eq(region)
        reg_re = Signal()
        reg_off = Signal.like(off)
        m.d.sync += [reg_re.eq(host.re & (region == REGISTERS)), reg_off.eq(off)]
        groups = self._register_groups()
        group_sel = Signal(range(len(groups) + 1))     # group of the read (len: none)
        group_q = [Signal(32, name=f"group{g}_q") for g in range(len(groups))]
        m.d.sync += group_sel.eq(len(groups))
        for g, regs in enumerate(groups):
            with m.Switch(reg_off):
                for a, v in regs.items():
                    with m.Case(int(a)):
                        m.d.sync += group_q[g].eq(v)
                        with m.If(reg_re):
                            m.d.sync += group_sel.eq(g)
        reg_q = Signal(32)
        m.d.sync += reg_q.eq(Array(group_q + [Const(0, 32)])[group_sel])
        region_q1, region_q2 = Signal(2), Signal(2)
        steplog_q = [Signal(32, name=f"steplog_q{k}") for k in range(2)]
        m.d.sync += [region_q1.eq(region_q), region_q2.eq(region_q1),
                     steplog_q[0].eq(self.steplog_data), steplog_q[1].eq(steplog_q[0])]
        early = Signal(32)
        with m.Switch(region_q2):
            with m.Case(REGISTERS):
                m.d.comb += early.eq(reg_q)
            with m.Case(STEPLOG_ORDER):
                m.d.comb += early.eq(steplog_q[1])
        sel_q, early_q = region_q2, early
        for k in range(3, REGS_READ_LATENCY):
            sel_n, early_n = Signal(2, name=f"region_q{k}"), Signal(32, name=f"early_q{k}")
            m.d.sync += [sel_n.eq(sel_q), early_n.eq(early_q)]
            sel_q, early_q = sel_n, early_n
        m.d.comb += host.rdata.eq(Mux(sel_q == BUFFER, self.buf_read.data[:32], early_q))
