"""Flits in Ethernet frames: the NIC's links as UDP datagrams, for boards on a switch.

::

    port i: CrcAppender ─► i[i] ─► flit FIFO ─┐                ┌─► tx (datagrams, 32-bit
                                               ├─ round robin ─┘    words) ─► LiteEth UDP
    port j: CrcChecker  ◄─ o[j] ◄──────────────┴─ header check ◄── rx (datagrams)

Each NIC port ``i`` is a point-to-point link to one port of one peer board, named at build
time (``peers[i] = (IPv4 address, peer's port index)``); the datagrams go through an
Ethernet switch, so N boards with ``ports`` NIC ports each form any direct topology of up
to ``ports`` neighbours per board (ring:N, a full mesh of ``ports + 1`` boards).  The
NIC's own schedule tables address ports, not nodes, which is why a port maps to one peer.

**Datagram** (32-bit words, the UDP payload; :func:`encode_datagram` is the golden
encoder)::

    word 0   magic 0x544E ("TN") [15:0] | version [23:16] | dst port [27:24] | src port [31:28]
    word 1   flits n [7:0] | credits owed to the receiver, 8 bits per VC [8:8+8*vcs)
    then n flits, 3 words each: flit + link CRC sideband (LSB first), zero padded to 96 bits

One datagram carries the flits of a port's FIFO up to and including the next *end* flit
(sub-packet end, see :mod:`treenic.hdl.link.crc`), at most ``max_flits``: one sub-packet
per frame.  A datagram with no flits carries credits alone; it is sent when credits are
owed and no flits have gone to that peer for ``credit_delay`` cycles.

**Receive checks.**  Magic, version, ``dst port`` < ports, the sender's IPv4 address and
``src port`` equal to ``peers[dst port]``, ``n`` <= ``max_flits`` and the UDP length
``8 + 12 n``: otherwise the datagram is drained, counted (``dropped``) and nothing in it is
acted upon.  Flits are delivered as they are read (no store and forward): a datagram
that ends early (``last`` before its length) stops delivering, and the link CRC's
implicit sub-packet sequence number fails the sub-packet.  A datagram lost in the switch
is caught the same way (fail-stop: Ethernet switches drop frames only when congested or
corrupted; the credits keep each link's traffic within the receiver's buffer).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from treenic.hdl.host.engine import datagram_layout

from .crc import END_TYPES, LINK_CRC, CrcLinkSignature
from .flit import FlitFormat

__all__ = ["DatagramLinks", "encode_datagram", "decode_datagram", "MAGIC", "VERSION",
           "LINK_UDP_PORT"]

MAGIC = 0x544E
VERSION = 1
#: UDP port of the link datagrams (both ways, see the LiteEth port-filter quirk)
LINK_UDP_PORT = 7412
WORDS_PER_FLIT = 3
#: most flits in one datagram: 8 + 12 n bytes of UDP payload within a 1500-byte MTU
MAX_FLITS = (1500 - 20 - 8 - 8) // (4 * WORDS_PER_FLIT)
_END_CODES = tuple(int(t.value) for t in END_TYPES)


def _ip(addr) -> int:
    if isinstance(addr, int):
        return addr
    a = [int(x) for x in str(addr).split(".")]
    if len(a) != 4 or not all(0 <= x < 256 for x in a):
        raise ValueError(f"not an IPv4 address: {addr!r}")
    return (a[0] << 24) | (a[1] << 16) | (a[2] << 8) | a[3]


def encode_datagram(fmt: FlitFormat, *, dst_port: int, src_port: int, credits=(),
                    flits=(), crc_width: int = LINK_CRC.crc_width) -> list[int]:
    """Golden encoder: ``flits`` = ``[(flit, crc), ...]`` -> the datagram's words."""
    credits = list(credits) + [0] * (fmt.vcs - len(credits))
    w1 = len(flits)
    for v, c in enumerate(credits):
        w1 |= (c & 0xFF) << (8 + 8 * v)
    words = [MAGIC | (VERSION << 16) | (dst_port << 24) | (src_port << 28), w1]
    for f, c in flits:
        x = int(f) | (int(c) << fmt.flit_bits)
        words += [(x >> (32 * k)) & 0xFFFF_FFFF for k in range(WORDS_PER_FLIT)]
    return words


def decode_datagram(fmt: FlitFormat, words, *, length: int, src_ip, peers, max_flits: int,
                    crc_width: int = LINK_CRC.crc_width):
    """Golden receiver: ``(dst port, credits, [(flit, crc)])`` or ``None`` (dropped)."""
    if len(words) < 2:
        return None
    w0, w1 = words[0], words[1]
    dst, src, n = (w0 >> 24) & 0xF, (w0 >> 28) & 0xF, w1 & 0xFF
    if ((w0 & 0xFFFF) != MAGIC or (w0 >> 16) & 0xFF != VERSION or dst >= len(peers) or
            (_ip(peers[dst][0]), peers[dst][1]) != (_ip(src_ip), src) or n > max_flits or
            length != 8 + 4 * WORDS_PER_FLIT * n):
        return None
    credits = [(w1 >> (8 + 8 * v)) & 0xFF for v in range(fmt.vcs)]
    flits = []
    for k in range(n):
        chunk = words[2 + WORDS_PER_FLIT * k:2 + WORDS_PER_FLIT * (k + 1)]
        if len(chunk) < WORDS_PER_FLIT:
            break                                     # ended early: what came is delivered
        x = sum(w << (32 * i) for i, w in enumerate(chunk))
        flits.append((x & ((1 << fmt.flit_bits) - 1),
                      (x >> fmt.flit_bits) & ((1 << crc_width) - 1)))
    return dst, credits, flits



def _times_const(x, k: int):
    """x * k as a sum of shifts of x (Yosys maps a constant multiply to a DSP block,
    slow after a block-RAM read)."""
    return sum((x << b for b in range(k.bit_length()) if k >> b & 1), Const(0))

class DatagramLinks(wiring.Component):
    """The NIC's ports as UDP datagram links (see the module docstring).

    Parameters
    ----------
    fmt : FlitFormat
        The links' flit format.
    peers : sequence of (str or int, int)
        Per NIC port: the peer board's IPv4 address and the peer's port index.
    tx_depth : int
        Flits each port's FIFO holds (at least the peer's receive buffer, all VCs).
    max_flits : int
        Most flits in one datagram.
    credit_delay : int
        Cycles owed credits wait for a flit datagram before they go alone.

    Members
    -------
    i : In(CrcLinkSignature).array(ports)
        Flits to send per port (from CrcAppenders); credits back to them.
    o : Out(CrcLinkSignature).array(ports)
        Flits received per port (to CrcCheckers); their credits go to the peer.
    tx : Out(stream.Signature(datagram_layout()))
        Datagrams to send (``peer`` bits 31..0 = destination address).
    rx : In(stream.Signature(datagram_layout()))
        Datagrams received (``peer`` = source address; ``length`` = UDP payload bytes).
    dropped : Out(16)
        Datagrams that failed the receive checks.
    overflow : Out(1)
        Sticky: a flit arrived at a full port FIFO (its sender ignored credits).
    """

    def __init__(self, fmt: FlitFormat, *, peers, tx_depth: int = 32, max_flits: int = 32,
                 credit_delay: int = 64, crc_width: int = LINK_CRC.crc_width):
        peers = [(_ip(a), int(p)) for a, p in peers]
        if not 1 <= len(peers) <= 15:
            raise ValueError(f"1..15 ports, not {len(peers)}")
        if any(not 0 <= p < 16 for _, p in peers):
            raise ValueError("peer port indices must be 0..15")
        if not 1 <= max_flits <= MAX_FLITS or tx_depth < max_flits:
            raise ValueError(f"need 1 <= max_flits <= {MAX_FLITS} (one 1500-byte MTU) and "
                             f"tx_depth >= max_flits, got {max_flits}, {tx_depth}")
        self.fmt, self.peers, self.crc_width = fmt, peers, crc_width
        self.tx_depth, self.max_flits, self.credit_delay = tx_depth, max_flits, credit_delay
        sig = CrcLinkSignature(fmt, crc_width)
        n = len(peers)
        super().__init__({"i": In(sig).array(n), "o": Out(sig).array(n),
                          "tx": Out(stream.Signature(datagram_layout())),
                          "rx": In(stream.Signature(datagram_layout())),
                          "dropped": Out(16), "overflow": Out(1)})

    @property
    def ports(self):
        return len(self.peers)

    def elaborate(self, platform):
        m = Module()
        vcs = self.fmt.vcs
        owed = [[Signal(8, name=f"owed{j}_{v}") for v in range(vcs)] for j in range(self.ports)]
        paid = [[Signal(8, name=f"paid{j}_{v}") for v in range(vcs)] for j in range(self.ports)]
        for j in range(self.ports):                    # credits owed to each peer
            for v in range(vcs):
                m.d.sync += owed[j][v].eq(owed[j][v] + self.o[j].credit[v] - paid[j][v])
        queues = [self._port_queue(m, j) for j in range(self.ports)]
        self._transmit(m, queues, owed, paid)
        self._receive(m)
        return m

    # transmit ------------------------------------------------------------------------
    def _port_queue(self, m, j):
        """Port j's flit FIFO and the flit counts of the datagrams ready in it."""
        w = self.fmt.flit_bits + self.crc_width
        q = m.submodules[f"txq{j}"] = fifo.SyncFIFO(width=w, depth=self.tx_depth)
        lens = m.submodules[f"lens{j}"] = fifo.SyncFIFO(width=8, depth=self.tx_depth)
        i = self.i[j]
        run = Signal(8, name=f"run{j}")                # flits since the last cut
        ftype = i.flit.type.as_value()
        is_end = Cat(*[ftype == c for c in _END_CODES]).any()
        cut = Signal(name=f"cut{j}")
        m.d.comb += [cut.eq(i.valid & (is_end | (run == self.max_flits - 1))),
                     q.w_data.eq(Cat(i.flit.as_value(), i.crc)), q.w_en.eq(i.valid),
                     lens.w_en.eq(cut), lens.w_data.eq(run + 1)]
        with m.If(i.valid):
            m.d.sync += run.eq(Mux(cut, 0, run + 1))
        with m.If(i.valid & ~q.w_rdy):
            m.d.sync += self.overflow.eq(1)
        return q, lens

    def _pick(self, m, due, cur, found):
        """Round robin: the first due port after ``cur``."""
        P = self.ports
        pick = Signal(range(P))
        for c in range(P):
            with m.If(cur == c):
                for k in reversed(range(1, P + 1)):   # the last assignment wins: k = 1 first
                    with m.If(due[(c + k) % P]):
                        m.d.comb += [pick.eq((c + k) % P), found.eq(1)]
        return pick

    def _transmit(self, m, queues, owed, paid):
        P, vcs, tx = self.ports, self.fmt.vcs, self.tx
        idle = [Signal(range(self.credit_delay + 1), name=f"idle{j}") for j in range(P)]
        due = Signal(P)
        for j in range(P):
            owes = Cat(o != 0 for o in owed[j]).any()
            m.d.comb += due[j].eq(queues[j][1].r_rdy |
                                  (owes & (idle[j] == self.credit_delay)))
        cur, n, left = Signal(range(P)), Signal(8), Signal(8)
        word = Signal(range(WORDS_PER_FLIT))
        credits = Signal(8 * vcs)
        found = Signal()
        pick = self._pick(m, due, cur, found)
        m.d.comb += tx.payload.length.eq(8 + 4 * WORDS_PER_FLIT * n)
        for j, (ip, port) in enumerate(self.peers):
            with m.If(cur == j):
                m.d.comb += [tx.payload.peer.eq(ip), tx.payload.data.eq(
                    MAGIC | (VERSION << 16) | (port << 24) | (j << 28))]
        fifo_width = self.fmt.flit_bits + self.crc_width
        head = Signal(fifo_width)
        with m.FSM():
            with m.State("PICK"):
                with m.If(found):
                    for j in range(P):
                        with m.If(pick == j):
                            lens = queues[j][1]
                            m.d.comb += lens.r_en.eq(1)
                            m.d.sync += [n.eq(Mux(lens.r_rdy, lens.r_data, 0)),
                                         credits.eq(Cat(*owed[j])), idle[j].eq(0)]
                            m.d.comb += [paid[j][v].eq(owed[j][v]) for v in range(vcs)]
                    m.d.sync += cur.eq(pick)
                    m.next = "HEAD0"
            with m.State("HEAD0"):
                m.d.comb += tx.valid.eq(1)
                with m.If(tx.ready):
                    m.next = "HEAD1"
            with m.State("HEAD1"):
                m.d.comb += [tx.valid.eq(1), tx.payload.data.eq(Cat(n, credits)),
                             tx.payload.last.eq(n == 0)]
                with m.If(tx.ready):
                    m.d.sync += [left.eq(n), word.eq(0)]
                    m.next = "FLITS"
                    with m.If(n == 0):
                        m.next = "PICK"
            with m.State("FLITS"):
                for j in range(P):
                    with m.If(cur == j):
                        m.d.comb += head.eq(queues[j][0].r_data)
                padded = Cat(head, Const(0, 32 * WORDS_PER_FLIT - fifo_width))
                m.d.comb += [tx.valid.eq(1), tx.payload.last.eq((left == 1) &
                                                                (word == WORDS_PER_FLIT - 1))]
                m.d.comb += tx.payload.data.eq(padded.word_select(word, 32))
                with m.If(tx.ready):
                    m.d.sync += word.eq(word + 1)
                    with m.If(word == WORDS_PER_FLIT - 1):
                        for j in range(P):
                            with m.If(cur == j):
                                m.d.comb += queues[j][0].r_en.eq(1)
                        m.d.sync += [word.eq(0), left.eq(left - 1)]
                        with m.If(left == 1):
                            m.next = "PICK"
        for j in range(P):                             # credits wait for flits a while
            with m.If(self.i[j].valid):
                m.d.sync += idle[j].eq(0)
            with m.Elif(idle[j] != self.credit_delay):
                m.d.sync += idle[j].eq(idle[j] + 1)

    # receive -------------------------------------------------------------------------
    def _receive(self, m):
        P, vcs, rx, fmt = self.ports, self.fmt.vcs, self.rx, self.fmt
        w = rx.payload
        dst, left = Signal(4), Signal(8)
        word = Signal(range(WORDS_PER_FLIT))
        w0, src_ip, length = Signal(32), Signal(32), Signal(16)
        held = Signal(32 * (WORDS_PER_FLIT - 1))
        replay = [[Signal(10, name=f"replay{j}_{v}") for v in range(vcs)] for j in range(P)]
        grant = [[Signal(8, name=f"grant{j}_{v}") for v in range(vcs)] for j in range(P)]
        for j in range(P):
            for v in range(vcs):
                m.d.sync += grant[j][v].eq(0)         # a one-cycle grant (registered)
                m.d.comb += self.i[j].credit[v].eq(replay[j][v] != 0)
                m.d.sync += replay[j][v].eq(replay[j][v] + grant[j][v] - (replay[j][v] != 0))
        w1, last1, size_ok = Signal(32), Signal(), Signal()
        n = w1[:8]
        ok = Signal()
        checks = [w0[:16] == MAGIC, w0[16:24] == VERSION, size_ok]
        peer_ok = Const(0)
        for j, (ip, port) in enumerate(self.peers):
            peer_ok = peer_ok | ((w0[24:28] == j) & (src_ip == ip) & (w0[28:32] == port))
        m.d.comb += ok.eq(Cat(*checks).all() & peer_ok)
        x = Cat(held, w.data)
        with m.FSM():
            with m.State("HEAD0"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [w0.eq(w.data), src_ip.eq(w.peer[:32]), length.eq(w.length)]
                    with m.If(w.last):
                        self._drop(m)
                    with m.Else():
                        m.next = "HEAD1"
            with m.State("HEAD1"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [w1.eq(w.data), last1.eq(w.last)]
                    m.next = "SIZE"
            with m.State("SIZE"):
                # the length arithmetic from registers, in a cycle of its own: from the
                # receive FIFO's block-RAM output it missed the 25F's 125 MHz
                m.d.sync += size_ok.eq((n <= self.max_flits) &
                                       (length == 8 + _times_const(n, 4 * WORDS_PER_FLIT)))
                m.next = "CHECK"
            with m.State("CHECK"):                     # registered header: one cycle to check
                m.d.sync += [dst.eq(w0[24:28]), left.eq(n), word.eq(0)]
                with m.If(ok):
                    for j in range(P):
                        with m.If(w0[24:28] == j):
                            m.d.sync += [grant[j][v].eq(w1[8 + 8 * v:16 + 8 * v])
                                         for v in range(vcs)]
                with m.Else():
                    self._drop(m)
                m.next = "DRAIN"
                with m.If(last1):
                    m.next = "HEAD0"
                with m.Elif(ok & (n != 0)):
                    m.next = "FLITS"
            with m.State("FLITS"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [held.eq(Cat(held[32:], w.data)), word.eq(word + 1)]
                    with m.If(word == WORDS_PER_FLIT - 1):
                        for j in range(P):
                            with m.If(dst == j):
                                m.d.comb += [self.o[j].valid.eq(1),
                                             self.o[j].flit.eq(x[:fmt.flit_bits]),
                                             self.o[j].crc.eq(x[fmt.flit_bits:fmt.flit_bits +
                                                                self.crc_width])]
                        m.d.sync += [word.eq(0), left.eq(left - 1)]
                    with m.If(w.last):
                        m.next = "HEAD0"               # ended (early or on time)
                    with m.Elif((word == WORDS_PER_FLIT - 1) & (left == 1)):
                        m.next = "DRAIN"               # longer than it said
            with m.State("DRAIN"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid & w.last):
                    m.next = "HEAD0"

    def _drop(self, m):
        with m.If(self.dropped != 0xFFFF):
            m.d.sync += self.dropped.eq(self.dropped + 1)
