"""Host protocol engine: request datagrams in, NIC host-bus accesses, reply datagrams out.

::

    rx (32-bit words, last; first word: length, peer) ─► RECV ─► packet memory
                                                           │ header registers
                                                           ▼
    CHECK (malformed? drop + count; repeated mutating seq? DUP ack) ─► EXEC ─► host bus
                                                                         │ read data
    tx (32-bit words, last, length, peer) ◄─ FIFO ◄─ REPLY ◄─ packet memory

The wire format and the golden model are :mod:`treenic.hdl.host.model`; this engine does
the same bit for bit (``tests/hdl/test_host_engine.py``).  A datagram is stored whole
before it is checked, so a malformed one is never acted upon.  The engine is transport
agnostic: ``peer`` is an opaque 48-bit return address (LiteEth: IPv4 address and UDP
port), copied from the request to its reply.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Signal
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..nic.core import HostSignature
from .model import ENGINE_COUNTERS, HEADER_WORDS, MAGIC, REPLY, VERSION, Flag, Op

__all__ = ["HostEngine", "datagram_layout"]

#: reply FIFO depth (words): covers the packet memory's read latency at full rate
TX_FIFO_DEPTH = 4


def datagram_layout() -> data.StructLayout:
    """One 32-bit word of a datagram; ``length`` (bytes) and ``peer`` are read with the
    first word of a request and sent with every word of a reply."""
    return data.StructLayout({"data": 32, "last": 1, "length": 16, "peer": 48})


class _State(enum.Enum, shape=3):
    RECV = 0
    CHECK = 1
    EXEC = 2
    REPLY = 3
    DRAIN = 4


class HostEngine(wiring.Component):
    """Executes host-protocol requests on a NIC host bus.

    Parameters
    ----------
    addr_bits : int
        Host-bus word-address width (``NicParams.addr_bits``).
    read_latency : int
        Cycles from ``re`` to ``rdata`` (``HOST_READ_LATENCY``); reads are issued back to
        back.
    max_words : int
        Payload words the packet memory holds (largest READ/WRITE count).
    status_regs : tuple of int
        Addresses a STATUS request reads (their values lead its reply).
    start : (int, int)
        (address, value) a START request writes.

    Members
    -------
    rx : In(stream.Signature(datagram_layout()))
        Request words.
    tx : Out(stream.Signature(datagram_layout()))
        Reply words.
    host : In(HostSignature(addr_bits))
        The NIC's host bus (this engine drives ``addr``/``wdata``/``we``/``re``).
    accepted, dropped, duplicates : Out(32)
        Requests executed / malformed datagrams dropped / repeated requests acknowledged.
    """

    def __init__(self, *, addr_bits: int, read_latency: int, max_words: int = 256,
                 status_regs: tuple = (), start: tuple = (1, 1)):
        if not 1 <= addr_bits <= 32:
            raise ValueError(f"addr_bits must be 1..32, not {addr_bits}")
        if not 0 <= read_latency <= 16:
            raise ValueError(f"read_latency must be 0..16, not {read_latency}")
        if not 2 <= max_words <= 4096:
            raise ValueError(f"max_words must be 2..4096, not {max_words}")
        if len(status_regs) + len(ENGINE_COUNTERS) > max_words:
            raise ValueError("status_regs do not fit one reply")
        if any(not 0 <= a < 1 << addr_bits for a in (*status_regs, start[0])):
            raise ValueError("status_regs/start address beyond the host bus")
        self.addr_bits, self.read_latency, self.max_words = addr_bits, read_latency, max_words
        self.status_regs, self.start_write = tuple(status_regs), tuple(start)
        layout = datagram_layout()
        super().__init__({"rx": In(stream.Signature(layout)),
                          "tx": Out(stream.Signature(layout)),
                          "host": In(HostSignature(addr_bits)),
                          "accepted": Out(32), "dropped": Out(32), "duplicates": Out(32)})

    def elaborate(self, platform):
        m = Module()
        s = _Regs(self)
        m.submodules.pkt = pkt = memory.Memory(shape=32, depth=self.max_words, init=[])
        s.wr, s.rd = pkt.write_port(), pkt.read_port()
        m.submodules.txq = txq = fifo.SyncFIFOBuffered(width=33, depth=TX_FIFO_DEPTH)
        s.txq = txq
        self._recv(m, s)
        self._check(m, s)
        self._exec(m, s)
        self._reply(m, s)
        m.d.comb += [self.accepted.eq(s.cnt[0]), self.dropped.eq(s.cnt[1]),
                     self.duplicates.eq(s.cnt[2])]
        return m

    # ---------------------------------------------------------------- receive
    def _recv(self, m, s):
        rx, n = self.rx, s.n
        idx = n - HEADER_WORDS
        m.d.comb += [s.wr.addr.eq(idx), s.wr.data.eq(rx.payload.data)]
        with m.If(s.state == _State.RECV):
            m.d.comb += rx.ready.eq(1)
            with m.If(rx.valid):
                with m.If(n == 0):
                    m.d.sync += [s.length.eq(rx.payload.length), s.peer.eq(rx.payload.peer)]
                with m.If(n < HEADER_WORDS):
                    m.d.sync += s.hdr_at[n[:3]].eq(rx.payload.data)
                with m.Elif(idx < self.max_words):
                    m.d.comb += s.wr.en.eq(1)
                    # a WRITE_PAIRS address (even payload word) must lie on the host bus
                    beyond = (rx.payload.data[self.addr_bits:] != 0 if self.addr_bits < 32
                              else Const(0))
                    with m.If((s.hdr[0][24:] == Op.WRITE_PAIRS) & ~idx[0] & beyond):
                        m.d.sync += s.bad_pair.eq(1)
                with m.Else():
                    m.d.sync += s.overflow.eq(1)
                with m.If(~s.overflow):
                    m.d.sync += n.eq(n + 1)
                with m.If(rx.payload.last):
                    m.d.sync += s.state.eq(_State.CHECK)

    # ---------------------------------------------------------------- check
    def _check(self, m, s):
        w0, seq, addr, count, check = s.hdr
        op = w0[24:]
        lo = Signal(13)
        hi = Signal(13)
        plen = Signal(14)
        m.d.comb += [lo.eq(0), hi.eq(0), plen.eq(0)]
        with m.Switch(op):
            with m.Case(Op.READ):
                m.d.comb += [lo.eq(1), hi.eq(self.max_words)]
            with m.Case(Op.WRITE):
                m.d.comb += [lo.eq(1), hi.eq(self.max_words), plen.eq(count)]
            with m.Case(Op.WRITE_PAIRS):
                m.d.comb += [lo.eq(1), hi.eq(self.max_words // 2), plen.eq(count << 1)]
        known = (op >= Op.READ) & (op <= Op.STATUS)
        ranged = (op != Op.READ) & (op != Op.WRITE) | \
            ((addr + count) <= (1 << self.addr_bits))
        no_addr = ((op != Op.START) & (op != Op.STATUS)) | (addr == 0)
        ok = Signal()
        m.d.comb += ok.eq(
            (w0[:16] == MAGIC) & (w0[16:24] == VERSION) & known &
            (check == ~(w0 ^ seq ^ addr ^ count)) & (count >= lo) & (count <= hi) &
            ranged & no_addr & ~s.overflow & ~s.bad_pair & (s.n >= HEADER_WORDS) &
            (s.length == (s.n << 2)) & (s.n == HEADER_WORDS + plen))
        mutating = (op == Op.WRITE) | (op == Op.WRITE_PAIRS) | (op == Op.START)
        s.plen = plen
        with m.If(s.state == _State.CHECK):
            m.d.sync += [s.n.eq(0), s.overflow.eq(0), s.bad_pair.eq(0), s.i.eq(0),
                         s.j.eq(0), s.flags.eq(0), s.wr_addr.eq(addr), s.op.eq(op)]
            with m.If(~ok):
                m.d.sync += [s.cnt[1].eq(s.cnt[1] + 1), s.state.eq(_State.RECV)]
            with m.Elif(mutating & s.have_last & (seq == s.last_seq)):
                m.d.sync += [s.cnt[2].eq(s.cnt[2] + 1), s.flags.eq(int(Flag.DUP)),
                             s.reply_count.eq(count), s.rlen.eq(0),
                             s.state.eq(_State.REPLY)]
            with m.Else():
                m.d.sync += [s.cnt[0].eq(s.cnt[0] + 1), s.state.eq(_State.EXEC),
                             s.xlen.eq(plen)]
                with m.If(op == Op.READ):
                    m.d.sync += s.xlen.eq(count)
                with m.If(op == Op.STATUS):
                    m.d.sync += s.xlen.eq(len(self.status_regs))
                with m.If(mutating):
                    m.d.sync += [s.last_seq.eq(seq), s.have_last.eq(1)]

    # ---------------------------------------------------------------- execute
    def _exec(self, m, s):
        host, L = self.host, self.read_latency
        in_exec = s.state == _State.EXEC
        reading = (s.op == Op.READ) | (s.op == Op.STATUS)
        # writes: payload word i is read from the packet memory, written a cycle later
        prev_valid, prev_odd, pair_addr = Signal(), Signal(), Signal(32)
        m.d.comb += s.rd.addr.eq(s.i)
        issue = in_exec & (s.i < s.xlen)
        with m.If(in_exec):
            m.d.sync += [prev_valid.eq(issue & ~reading), prev_odd.eq(s.i[0])]
            with m.If(issue):
                m.d.sync += s.i.eq(s.i + 1)
        with m.Else():
            m.d.sync += prev_valid.eq(0)
        with m.If(prev_valid & (s.op == Op.WRITE)):
            m.d.comb += [host.we.eq(1), host.addr.eq(s.wr_addr), host.wdata.eq(s.rd.data)]
            m.d.sync += s.wr_addr.eq(s.wr_addr + 1)
        with m.If(prev_valid & (s.op == Op.WRITE_PAIRS)):
            with m.If(~prev_odd):
                m.d.sync += pair_addr.eq(s.rd.data)
            with m.Else():
                m.d.comb += [host.we.eq(1), host.addr.eq(pair_addr), host.wdata.eq(s.rd.data)]
        with m.If(in_exec & (s.op == Op.START)):
            m.d.comb += [host.we.eq(1), host.addr.eq(self.start_write[0]),
                         host.wdata.eq(self.start_write[1])]
        # reads: issued back to back, captured read_latency cycles later into the memory
        regs = Array(Const(a, self.addr_bits) for a in (*self.status_regs, 0))
        with m.If(issue & reading):
            m.d.comb += host.re.eq(1)
            with m.If(s.op == Op.READ):
                m.d.comb += host.addr.eq(s.wr_addr + s.i)
            with m.Else():
                m.d.comb += host.addr.eq(regs[s.i])
        pend = Signal(L + 1)
        m.d.sync += pend.eq(Cat(host.re, pend[:-1]) if L else 0)
        got = pend[L - 1] if L else host.re
        with m.If(got & in_exec):
            m.d.comb += [s.wr.en.eq(1), s.wr.addr.eq(s.j), s.wr.data.eq(host.rdata)]
            m.d.sync += s.j.eq(s.j + 1)
        write_done = ~reading & (s.i == s.xlen) & ~(s.op == Op.START)
        read_done = reading & (s.j == s.xlen)
        with m.If(in_exec & (write_done | read_done | (s.op == Op.START))):
            m.d.sync += [s.state.eq(_State.REPLY), s.reply_count.eq(s.hdr[3][:16]),
                         s.rlen.eq(0), s.i.eq(0)]
            with m.If(s.op == Op.READ):
                m.d.sync += s.rlen.eq(s.xlen)
            with m.If(s.op == Op.STATUS):
                n = len(self.status_regs) + len(ENGINE_COUNTERS)
                m.d.sync += [s.rlen.eq(n), s.reply_count.eq(n)]

    # ---------------------------------------------------------------- reply
    def _reply(self, m, s):
        tx, txq = self.tx, s.txq
        w0 = MAGIC | VERSION << 16
        op = s.op
        r0 = Cat(Const(w0, 24), op | REPLY)
        r3 = Cat(s.reply_count, s.flags, Const(0, 8))
        words = [r0, s.hdr[1], s.hdr[2], r3, ~(r0 ^ s.hdr[1] ^ s.hdr[2] ^ r3)]
        total = s.rlen + HEADER_WORDS
        k, k_q, inflight = s.i, Signal.like(s.i), Signal()
        in_reply = s.state == _State.REPLY
        issue = in_reply & (k < total) & (txq.level + inflight < TX_FIFO_DEPTH)
        with m.If(in_reply):
            m.d.comb += s.rd.addr.eq(k - HEADER_WORDS)
        m.d.sync += [inflight.eq(issue), k_q.eq(k)]
        with m.If(issue):
            m.d.sync += k.eq(k + 1)
        S = len(self.status_regs)
        counters = Array([*s.cnt, Const(0, 32)])
        word = Signal(32)
        with m.If(k_q < HEADER_WORDS):
            m.d.comb += word.eq(Array(words)[k_q[:3]])
        with m.Elif((op == Op.STATUS) & (k_q >= HEADER_WORDS + S)):
            m.d.comb += word.eq(counters[k_q - HEADER_WORDS - S])
        with m.Else():
            m.d.comb += word.eq(s.rd.data)
        m.d.comb += [txq.w_en.eq(inflight), txq.w_data.eq(Cat(word, k_q == total - 1))]
        with m.If(in_reply & (k == total) & ~inflight):
            m.d.sync += s.state.eq(_State.DRAIN)
        with m.If((s.state == _State.DRAIN) & (txq.level == 0)):
            m.d.sync += [s.state.eq(_State.RECV), s.i.eq(0)]
        m.d.comb += [tx.valid.eq(txq.r_rdy), tx.payload.data.eq(txq.r_data[:32]),
                     tx.payload.last.eq(txq.r_data[32]), tx.payload.peer.eq(s.peer),
                     tx.payload.length.eq(total << 2), txq.r_en.eq(tx.ready)]


class _Regs:
    """The engine's registers, shared by the elaborate() helpers."""

    def __init__(self, eng: HostEngine):
        mw = eng.max_words
        self.state = Signal(_State)
        self.n = Signal(range(mw + HEADER_WORDS + 2))     # words received
        self.hdr = [Signal(32, name=f"hdr{k}") for k in range(HEADER_WORDS)]
        self.hdr_at = Array(self.hdr)
        self.length = Signal(16)
        self.peer = Signal(48)
        self.overflow = Signal()
        self.bad_pair = Signal()
        self.op = Signal(8)
        self.i = Signal(range(mw + HEADER_WORDS + 2))     # exec issue / reply word index
        self.j = Signal(range(mw + 1))                    # read captures
        self.xlen = Signal(range(mw + 1))                 # words to execute
        self.rlen = Signal(range(mw + 1))                 # reply payload words
        self.reply_count = Signal(16)
        self.flags = Signal(8)
        self.wr_addr = Signal(32)
        self.last_seq = Signal(32)
        self.have_last = Signal()
        self.cnt = [Signal(32, name=f"cnt_{k}") for k in ENGINE_COUNTERS]
