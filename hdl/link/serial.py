"""Source-synchronous serial link PHY: the NIC's link (flits + CRC sideband one way,
credits the other) over a few DDR data lanes and a forwarded clock, e.g. a PMOD cable.

::

    local CrcAppender ─► i ─► TX FIFO ─► word builder ─► lane serialisers ─► tx_lanes ═╗
                              (credits owed to the peer ride in every data word)       ║ cable
    local CrcChecker  ◄─ o ◄─ AsyncFIFO ◄─ word decoder ◄─ deskew ◄─ lane aligners ◄─ rx_lanes
          (rx clock domain = the peer's forwarded clock) ─────────────────────────────┘

**Framing.**  Every ``frame_cycles`` (F) cycles the transmitter sends one *word*, split
into one *lane frame* per data lane; a lane carries 2 bits per cycle (DDR), so a lane
frame is 2F bits: a 2-bit header (``0b01`` data, ``0b10`` training, LSB first on the
wire, as in 64b/66b) and 2F-2 payload bits.  A data word is ``valid, credits[vcs],
flit, crc`` (the link layer's per-sub-packet CRC sideband, carried untouched), zero
padding and an 8-bit frame check (CRC-8/AUTOSAR) over everything before it.  A training
lane frame is ``seq`` (4 bits, the same on every lane, +1 per training word), ``aligned``
(the sender's receiver is aligned) and a fixed pseudo-random pattern.

**Alignment / training at reset.**  Each lane is aligned on its own by bit slip: at each
frame boundary the aligner checks for a training header and pattern and otherwise moves
its boundary by one bit; ``LOCK_FRAMES`` good training frames in a row lock the lane.  A
locked lane stays locked while its headers are valid (a leaky counter of bad headers:
+4 per bad header, -1 per good one, unlock at 32), so isolated bit errors never unlock
it.  Lanes are then deskewed word-wise by the training ``seq`` (per-lane frame FIFOs:
skew up to 3 frames, i.e. 3 * 2F bit times).  The transmitter sends training words until
its own receiver is aligned *and* the peer says it is aligned (``aligned`` bit in the
peer's training words; a data word implies it); only then data words (``up``).

**Errors.**  A word with an invalid or mixed header, or a failing frame check, is dropped
and counted (``frame_errors``): its flit never reaches the depacketiser.  The link
layer's implicit sub-packet sequence number then fails the next end flit on that VC
(fail-stop, see :mod:`treenic.hdl.link.crc`); credits in a dropped word are lost.  The
frame check catches every 1-, 2- and 3-bit error in a word (CRC-8/AUTOSAR, Hamming
distance 4 at these lengths).

**Credits.**  Credits the local depacketiser returns (``o.credit``) are counted and sent
in the next data word (up to 7 per VC per word); the peer replays them as one pulse per
cycle on its ``i.credit``.  The TX FIFO holds ``tx_depth`` flits, at least the receiver's
buffer (credits), so a sender that honours credits never overflows it.

The golden model of the framing (encode, decode, alignment, deskew) is
:class:`SerialFraming`; the cocotb bench (``sim/link_serial/``) decodes the RTL's lane
bits with it, after injected skew and bit errors, and compares bit for bit.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, DomainRenamer, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.crc import catalog
from amaranth.lib.wiring import In, Out

from .crc import LINK_CRC, CrcLinkSignature
from .flit import FlitFormat
from .link import lfsr16_next

__all__ = ["SerialFraming", "SerialLinkPhy", "SerialLinkPort", "HEADER_DATA", "HEADER_TRAIN",
           "LOCK_FRAMES"]

HEADER_DATA = 0b01
HEADER_TRAIN = 0b10
#: good training frames in a row that lock a lane
LOCK_FRAMES = 16
TRAIN_SEQ_BITS = 4
CREDIT_BITS = 3
#: frame check over a data word
FRAME_CHECK = catalog.CRC8_AUTOSAR
FCS_BITS = 8
DESKEW_FRAMES = 4


class SerialFraming:
    """Geometry and golden model of the serial link framing.

    Parameters
    ----------
    fmt : FlitFormat
        The link's flit format.
    lanes : int
        Data lanes per direction (each 2 bits per cycle, DDR).
    crc_width : int
        Width of the link layer's CRC sideband carried with each flit.
    """

    def __init__(self, fmt: FlitFormat, *, lanes: int = 3, crc_width: int = LINK_CRC.crc_width):
        if not 1 <= lanes <= 16:
            raise ValueError(f"lanes must be 1..16, not {lanes}")
        self.fmt, self.lanes, self.crc_width = fmt, lanes, crc_width
        self.vcs = fmt.vcs
        need = 1 + self.vcs * CREDIT_BITS + fmt.flit_bits + crc_width + FCS_BITS
        lane_payload = max(-(-need // lanes), TRAIN_SEQ_BITS + 1 + 16)
        lane_payload += lane_payload % 2                # whole cycles: 2F - 2 bits
        self.lane_payload = lane_payload
        self.frame_cycles = (lane_payload + 2) // 2
        self.lane_frame_bits = 2 * self.frame_cycles
        self.word_bits = lanes * lane_payload
        self.body_bits = self.word_bits - FCS_BITS
        self.pattern_bits = lane_payload - TRAIN_SEQ_BITS - 1
        x, pat = 0xACE1, 0
        for b in range(self.pattern_bits):            # fixed, aperiodic training pattern
            x = lfsr16_next(x)
            pat |= (x & 1) << b
        self.pattern = pat
        self._fcs = FRAME_CHECK(self.body_bits)

    # field positions in a data word (LSB first)
    @property
    def fields(self):
        f, pos = {}, 0
        for name, w in (("valid", 1), ("credits", self.vcs * CREDIT_BITS),
                        ("flit", self.fmt.flit_bits), ("crc", self.crc_width)):
            f[name] = (pos, w)
            pos += w
        return f

    def line_rate(self, clock_hz: float) -> dict:
        """Raw line rate and flit payload rate at *clock_hz* (DDR lanes)."""
        raw = 2 * self.lanes * clock_hz
        return {"lanes": self.lanes, "frame_cycles": self.frame_cycles,
                "line_rate_bps": raw, "flit_rate_per_s": clock_hz / self.frame_cycles,
                "payload_bps": self.fmt.width * clock_hz / self.frame_cycles}

    # golden encoding ------------------------------------------------------------------
    def fcs(self, body: int) -> int:
        return self._fcs.compute([body])

    def encode_data(self, *, valid: int, flit: int = 0, crc: int = 0, credits=()) -> int:
        """One data word (integer, ``word_bits``) with its frame check."""
        credits = list(credits) + [0] * (self.vcs - len(credits))
        f = self.fields
        body = valid & 1
        for v, c in enumerate(credits):
            if not 0 <= c < (1 << CREDIT_BITS):
                raise ValueError(f"credit count {c} does not fit {CREDIT_BITS} bits")
            body |= c << (f["credits"][0] + v * CREDIT_BITS)
        body |= (flit if valid else 0) << f["flit"][0]
        body |= (crc if valid else 0) << f["crc"][0]
        return body | (self.fcs(body) << self.body_bits)

    def decode_data(self, word: int):
        """Data word -> ``{valid, flit, crc, credits}``, or ``None`` if its check fails."""
        body = word & ((1 << self.body_bits) - 1)
        if self.fcs(body) != word >> self.body_bits:
            return None
        f = self.fields

        def get(name):
            pos, w = f[name]
            return (body >> pos) & ((1 << w) - 1)
        credits = [(get("credits") >> (v * CREDIT_BITS)) & ((1 << CREDIT_BITS) - 1)
                   for v in range(self.vcs)]
        return {"valid": get("valid"), "flit": get("flit"), "crc": get("crc"),
                "credits": credits}

    def lane_frames(self, word: int) -> list[int]:
        """A data word as one lane frame per lane (header in bits 0..1)."""
        m = (1 << self.lane_payload) - 1
        return [HEADER_DATA | (((word >> (k * self.lane_payload)) & m) << 2)
                for k in range(self.lanes)]

    def train_frame(self, seq: int, aligned: int) -> int:
        """One training lane frame (the same on every lane)."""
        pay = (seq & 0xF) | ((aligned & 1) << TRAIN_SEQ_BITS) | (
            self.pattern << (TRAIN_SEQ_BITS + 1))
        return HEADER_TRAIN | (pay << 2)

    # golden receiver ---------------------------------------------------------------------
    def _lane_offset(self, bits: list[int]):
        """First bit offset where LOCK_FRAMES training frames start in a row (or None)."""
        n = self.lane_frame_bits
        for start in range(0, max(0, len(bits) - n * LOCK_FRAMES)):
            if all(self._is_train(bits, start + k * n) for k in range(LOCK_FRAMES)):
                return start
        return None

    def _is_train(self, bits, at):
        fr = self._frame_at(bits, at)
        return (fr & 3) == HEADER_TRAIN and (fr >> (2 + TRAIN_SEQ_BITS + 1)) == self.pattern

    def _frame_at(self, bits, at):
        return sum(b << i for i, b in enumerate(bits[at:at + self.lane_frame_bits]))

    def decode_streams(self, lane_bits: list[list[int]]) -> dict:
        """Golden receiver over captured lane bit streams (bit 0 first).

        Aligns each lane on its first run of ``LOCK_FRAMES`` training frames, deskews the
        lanes on the first training word whose ``seq`` agrees on every lane, then decodes
        word by word as the RTL does.  Returns ``{"data": [decoded data words],
        "bad": dropped words}``."""
        n = self.lane_frame_bits
        frames = []
        for k, bits in enumerate(lane_bits):
            off = self._lane_offset(bits)
            if off is None:
                raise ValueError(f"lane {k}: no training sequence found")
            frames.append([self._frame_at(bits, a) for a in range(off, len(bits) - n + 1, n)])
        # deskew: drop leading frames of the lanes that are behind on seq
        heads = [0] * self.lanes
        while True:
            seqs = [(frames[k][heads[k]] >> 2) & 0xF for k in range(self.lanes)]
            if len(set(seqs)) == 1:
                break
            for k in range(self.lanes):
                if any(0 < (seqs[j] - seqs[k]) % 16 < 8 for j in range(self.lanes)):
                    heads[k] += 1
        out, bad = [], 0
        for i in range(min(len(f) - h for f, h in zip(frames, heads))):
            lf = [frames[k][heads[k] + i] for k in range(self.lanes)]
            hdrs = {fr & 3 for fr in lf}
            if hdrs == {HEADER_TRAIN}:
                continue
            dec = None
            if hdrs == {HEADER_DATA}:
                word = sum((fr >> 2) << (k * self.lane_payload) for k, fr in enumerate(lf))
                dec = self.decode_data(word)
            if dec is None:
                bad += 1
            else:
                out.append(dec)
        return {"data": out, "bad": bad}


class _LaneAligner(wiring.Component):
    """Bit-slip word aligner of one lane (2 bits per cycle in, lane frames out)."""

    def __init__(self, framing: SerialFraming):
        self.framing = framing
        super().__init__({"bits": In(2), "frame": Out(framing.lane_frame_bits),
                          "frame_valid": Out(1), "locked": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fr = self.framing
        n, F = fr.lane_frame_bits, fr.frame_cycles
        sr = Signal(n + 1)                            # oldest bit at bit 0
        m.d.sync += sr.eq(Cat(sr[2:], self.bits))
        slot = Signal(range(F))
        slip = Signal()
        good = Signal(range(LOCK_FRAMES + 1))
        bad = Signal(6)
        window = Mux(slip, sr[:n], sr[1:])
        at = slot == F - 1
        hdr = window[:2]
        is_train = (hdr == HEADER_TRAIN) & (window[2 + TRAIN_SEQ_BITS + 1:] == fr.pattern)
        hdr_ok = (hdr == HEADER_DATA) | (hdr == HEADER_TRAIN)
        m.d.sync += slot.eq(Mux(at, 0, slot + 1))
        m.d.comb += [self.frame.eq(window), self.frame_valid.eq(at & self.locked)]
        with m.If(at & ~self.locked):
            with m.If(is_train):
                m.d.sync += good.eq(good + 1)
                with m.If(good == LOCK_FRAMES - 1):
                    m.d.sync += [self.locked.eq(1), bad.eq(0)]
            with m.Else():                            # move the boundary by one bit
                m.d.sync += [good.eq(0), slip.eq(~slip)]
                with m.If(slip):                      # 1 -> 0: boundary one cycle earlier
                    m.d.sync += slot.eq(1)
        with m.If(at & self.locked):
            with m.If(~hdr_ok):
                with m.If(bad >= 28):
                    m.d.sync += [self.locked.eq(0), good.eq(0)]
                with m.Else():
                    m.d.sync += bad.eq(bad + 4)
            with m.Elif(bad != 0):
                m.d.sync += bad.eq(bad - 1)
        return m


class _SerialRx(wiring.Component):
    """Lane aligners, deskew and word decoder (all in the receive clock domain)."""

    def __init__(self, framing: SerialFraming):
        self.framing = fr = framing
        self.entry_bits = 2 + fr.vcs * CREDIT_BITS + fr.fmt.flit_bits + fr.crc_width
        super().__init__({"lanes": In(2 * fr.lanes), "entry": Out(self.entry_bits),
                          "entry_valid": Out(1), "aligned": Out(1), "peer_aligned": Out(1),
                          "lane_locked": Out(fr.lanes)})

    def elaborate(self, platform):
        m = Module()
        fr = self.framing
        qs = []
        for k in range(fr.lanes):
            al = m.submodules[f"align{k}"] = _LaneAligner(fr)
            q = m.submodules[f"deskew{k}"] = fifo.SyncFIFO(width=fr.lane_frame_bits,
                                                            depth=DESKEW_FRAMES)
            m.d.comb += [al.bits.eq(self.lanes[2 * k:2 * k + 2]), q.w_data.eq(al.frame),
                         q.w_en.eq(al.frame_valid), self.lane_locked[k].eq(al.locked)]
            qs.append(q)
        heads = [q.r_data for q in qs]
        ready = Cat(q.r_rdy for q in qs).all()
        all_locked = self.lane_locked.all()
        seq = [h[2:2 + TRAIN_SEQ_BITS] for h in heads]
        all_train = Cat(h[:2] == HEADER_TRAIN for h in heads).all()
        all_data = Cat(h[:2] == HEADER_DATA for h in heads).all()
        same_seq = Cat(s == seq[0] for s in seq).all()
        deskewed = self.aligned
        pop = Signal(fr.lanes)
        for k in range(fr.lanes):                     # lane k is behind some lane j
            behind = Cat(((seq[j] - seq[k])[:TRAIN_SEQ_BITS] != 0) &
                         ((seq[j] - seq[k])[:TRAIN_SEQ_BITS] < 8)
                         for j in range(fr.lanes)).any()
            with m.If(~all_locked):
                m.d.comb += pop[k].eq(qs[k].r_rdy)    # keep the FIFOs fresh
            with m.Elif(ready & (deskewed | ~all_train | same_seq)):
                m.d.comb += pop[k].eq(1)
            with m.Elif(ready):
                m.d.comb += pop[k].eq(behind)
        for k, q in enumerate(qs):
            m.d.comb += q.r_en.eq(pop[k])
        word_now = ready & all_locked & (deskewed | (all_train & same_seq))
        with m.If(~all_locked):
            m.d.sync += [deskewed.eq(0), self.peer_aligned.eq(0)]
        with m.Elif(word_now):
            m.d.sync += deskewed.eq(1)
        self._decode(m, fr, heads, word_now, all_train, all_data)
        return m

    def _decode(self, m, fr, heads, word_now, all_train, all_data):
        word = Cat(h[2:] for h in heads)
        body, fcs = word[:fr.body_bits], word[fr.body_bits:]
        ok = Signal()
        m.d.comb += ok.eq(all_data & (fcs_matrix(fr, body) == fcs))
        with m.If(word_now & all_train):
            m.d.sync += self.peer_aligned.eq(heads[0][2 + TRAIN_SEQ_BITS])
        with m.If(word_now & ok):
            m.d.sync += self.peer_aligned.eq(1)
        n = self.entry_bits - 1                       # entry = (bad, body fields)
        m.d.sync += [self.entry_valid.eq(word_now & ~all_train),
                     self.entry.eq(Cat(body[:n], ~ok))]


def fcs_matrix(fr: SerialFraming, body):
    """The frame check of *body* as XOR trees (CRC is affine: crc(x) = crc(0) ^ L(x)),
    with ``lib.crc``'s software model of CRC-8/AUTOSAR as the only definition."""
    zero = fr.fcs(0)
    cols = [fr.fcs(1 << i) ^ zero for i in range(fr.body_bits)]
    out = []
    for b in range(FCS_BITS):
        taps = [body[i] for i in range(fr.body_bits) if (cols[i] >> b) & 1]
        out.append(Cat(*taps).xor() ^ ((zero >> b) & 1) if taps else Const((zero >> b) & 1))
    return Cat(*out)


class SerialLinkPhy(wiring.Component):
    """Serial link PHY for one NIC port (see the module docstring).

    Parameters
    ----------
    framing : SerialFraming
        Lanes and word geometry (both ends must agree).
    rx_domain : str
        Clock domain of the receive lanes (the peer's forwarded clock).
    tx_depth : int
        TX FIFO depth in flits (at least the peer's receive buffer, all VCs).

    Members
    -------
    i : In(CrcLinkSignature(fmt, crc_width))
        Flits to send (from a :class:`~treenic.hdl.link.crc.CrcAppender`); the peer's
        credits come back on ``i.credit``.
    o : Out(CrcLinkSignature(fmt, crc_width))
        Flits received (to a :class:`~treenic.hdl.link.crc.CrcChecker`); its ``credit``
        goes to the peer.
    tx_lanes : Out(2 * lanes)
        Lane ``k``'s two bits of this cycle at ``[2k]`` (first, rising edge) and
        ``[2k+1]``; the clock is forwarded with the data (``sync``).
    rx_lanes : In(2 * lanes)
        The same from the peer, in ``rx_domain``.
    up : Out(1)
        Both receivers aligned: data words flow.
    lane_locked : Out(lanes)
        Receive lanes aligned (``rx_domain``).
    frame_errors : Out(16)
        Received words dropped (bad header or frame check), saturating.
    overflow : Out(1)
        Sticky: a flit arrived with the TX FIFO full (the sender ignored credits).
    """

    def __init__(self, framing: SerialFraming, *, rx_domain: str = "link_rx",
                 tx_depth: int = 32):
        if not isinstance(framing, SerialFraming):
            raise TypeError("framing must be a SerialFraming")
        if tx_depth < 2:
            raise ValueError(f"tx_depth must be >= 2, not {tx_depth}")
        self.framing, self.rx_domain, self.tx_depth = framing, rx_domain, tx_depth
        sig = CrcLinkSignature(framing.fmt, framing.crc_width)
        n = framing.lanes
        super().__init__({"i": In(sig), "o": Out(sig), "tx_lanes": Out(2 * n),
                          "rx_lanes": In(2 * n), "up": Out(1), "lane_locked": Out(n),
                          "frame_errors": Out(16), "overflow": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fr = self.framing
        rx = m.submodules.rx = DomainRenamer(self.rx_domain)(_SerialRx(fr))
        m.d.comb += rx.lanes.eq(self.rx_lanes)
        q = m.submodules.rxq = fifo.AsyncFIFO(width=rx.entry_bits, depth=8,
                                               r_domain="sync", w_domain=self.rx_domain)
        m.d.comb += [q.w_data.eq(rx.entry), q.w_en.eq(rx.entry_valid),
                     self.lane_locked.eq(rx.lane_locked)]
        aligned, peer = Signal(), Signal()
        m.submodules.sync_aligned = FFSynchronizer(rx.aligned, aligned)
        m.submodules.sync_peer = FFSynchronizer(rx.peer_aligned, peer)
        m.d.comb += self.up.eq(aligned & peer)
        self._receive(m, fr, q)
        self._transmit(m, fr, aligned)
        return m

    def _receive(self, m, fr, q):
        """Entries from the receive domain: flits out, credits replayed, errors counted."""
        f = fr.fields
        e = q.r_data
        bad = e[-1]
        m.d.comb += q.r_en.eq(1)
        take = q.r_rdy & ~bad
        m.d.comb += [self.o.valid.eq(take & e[0]),
                     self.o.flit.eq(e[f["flit"][0]:f["flit"][0] + f["flit"][1]]),
                     self.o.crc.eq(e[f["crc"][0]:f["crc"][0] + f["crc"][1]])]
        with m.If(q.r_rdy & bad & (self.frame_errors != 0xFFFF)):
            m.d.sync += self.frame_errors.eq(self.frame_errors + 1)
        for v in range(fr.vcs):                       # replay: one pulse per cycle
            owed = Signal(8, name=f"replay{v}")
            pos = f["credits"][0] + v * CREDIT_BITS
            got = Mux(take, e[pos:pos + CREDIT_BITS], 0)
            m.d.comb += self.i.credit[v].eq(owed != 0)
            m.d.sync += owed.eq(owed + got - (owed != 0))

    def _transmit(self, m, fr, aligned):
        """TX FIFO, word builder and lane serialisers (``sync``)."""
        f = fr.fields
        tq = m.submodules.txq = fifo.SyncFIFO(width=fr.fmt.flit_bits + fr.crc_width,
                                              depth=self.tx_depth)
        m.d.comb += [tq.w_data.eq(Cat(self.i.flit.as_value(), self.i.crc)),
                     tq.w_en.eq(self.i.valid)]
        with m.If(self.i.valid & ~tq.w_rdy):
            m.d.sync += self.overflow.eq(1)
        slot = Signal(range(fr.frame_cycles))
        at = slot == fr.frame_cycles - 1
        m.d.sync += slot.eq(Mux(at, 0, slot + 1))
        send = Signal()
        m.d.comb += [send.eq(at & self.up & tq.r_rdy), tq.r_en.eq(send)]
        owed, sent = [], []
        for v in range(fr.vcs):                       # credits owed to the peer
            c = Signal(8, name=f"owed{v}")
            s = Mux(c > 7, 7, c)[:CREDIT_BITS]
            m.d.sync += c.eq(c + self.o.credit[v] - Mux(at & self.up, s, 0))
            owed.append(c)
            sent.append(s)
        body = Signal(fr.body_bits)
        flit_crc = Mux(send, tq.r_data, 0)
        m.d.comb += body.eq(Cat(send, *sent, flit_crc))
        word = Cat(body, fcs_matrix(fr, body))
        seq = Signal(TRAIN_SEQ_BITS)
        with m.If(at & ~self.up):
            m.d.sync += seq.eq(seq + 1)
        train = Const(fr.train_frame(0, 0), fr.lane_frame_bits) | Cat(
            Const(0, 2), seq, aligned)
        for k in range(fr.lanes):
            sr = Signal(fr.lane_frame_bits, name=f"tx_sr{k}")
            data = Cat(Const(HEADER_DATA, 2),
                       word[k * fr.lane_payload:(k + 1) * fr.lane_payload])
            with m.If(at):
                m.d.sync += sr.eq(Mux(self.up, data, train))
            with m.Else():
                m.d.sync += sr.eq(sr[2:])
            m.d.comb += self.tx_lanes[2 * k:2 * k + 2].eq(sr[:2])
        assert f["valid"] == (0, 1)


class SerialLinkPort(wiring.Component):
    """A NIC port's link over the serial PHY, behind the NIC's own link interface::

        Nic.tx[i] ─► CrcAppender ─► SerialLinkPhy ─► tx_lanes      (to the cable)
        Nic.rx[i] ◄─ CrcChecker  ◄─ SerialLinkPhy ◄─ rx_lanes      (from the cable)

    Parameters
    ----------
    framing : SerialFraming
        Lane geometry (the flit format is ``framing.fmt``).
    rx_domain : str
        Clock domain of ``rx_lanes`` (the peer's forwarded clock).
    tx_depth : int
        TX FIFO depth (at least the peer's receive buffer).

    Members
    -------
    tx : In(LinkSignature(fmt))
        From the NIC port's packetiser side (``Nic.tx[i]``).
    rx : Out(LinkSignature(fmt))
        To the NIC port's depacketiser side (``Nic.rx[i]``).
    tx_lanes, rx_lanes, up, lane_locked, frame_errors, overflow
        As :class:`SerialLinkPhy`.
    crc_errors : Out(16)
        Sub-packets that failed the link CRC (:class:`~treenic.hdl.link.crc.CrcChecker`).
    """

    def __init__(self, framing: SerialFraming, *, rx_domain: str = "link_rx",
                 tx_depth: int = 32):
        from .flit import LinkSignature
        self.phy = SerialLinkPhy(framing, rx_domain=rx_domain, tx_depth=tx_depth)
        self.framing = framing
        n = framing.lanes
        super().__init__({"tx": In(LinkSignature(framing.fmt)),
                          "rx": Out(LinkSignature(framing.fmt)),
                          "tx_lanes": Out(2 * n), "rx_lanes": In(2 * n), "up": Out(1),
                          "lane_locked": Out(n), "frame_errors": Out(16),
                          "overflow": Out(1), "crc_errors": Out(16)})

    def elaborate(self, platform):
        from .crc import CrcAppender, CrcChecker
        m = Module()
        fmt = self.framing.fmt
        m.submodules.phy = phy = self.phy
        m.submodules.append = app = CrcAppender(fmt)
        m.submodules.check = chk = CrcChecker(fmt)
        wiring.connect(m, wiring.flipped(self.tx), app.i)
        wiring.connect(m, app.o, phy.i)
        wiring.connect(m, phy.o, chk.i)
        wiring.connect(m, chk.o, wiring.flipped(self.rx))
        m.d.comb += [self.tx_lanes.eq(phy.tx_lanes), phy.rx_lanes.eq(self.rx_lanes),
                     self.up.eq(phy.up), self.lane_locked.eq(phy.lane_locked),
                     self.frame_errors.eq(phy.frame_errors), self.overflow.eq(phy.overflow),
                     self.crc_errors.eq(chk.errors)]
        return m
