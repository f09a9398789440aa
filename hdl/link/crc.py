"""Link integrity: a CRC per sub-packet, appended at the sender and checked at the receiver.

::

    Packetiser.tx ─► CrcAppender ─► (link: flit + crc sideband) ─► CrcChecker ─► Depacketiser.rx
                     (per VC:                                       (per VC: same CRC;
                      running CRC,                                   a mismatch on an end
                      sent on end flits)                             flit poisons its type)

**What is covered.** Per VC, the CRC (default CRC-16/IBM-3740, also known as
CCITT-FALSE: polynomial 0x1021, init 0xFFFF; :mod:`amaranth.lib.crc`) runs over every
flit of a *sub-packet* -- the flits after the previous end flit up to and including the
next end flit (``SUB_TAIL``, ``MSG_TAIL``, ``TAIL``, ``HEAD_TAIL``; a message's head flit
belongs to its first sub-packet).  Each flit enters the CRC as one word: the whole flit
(data, type, VC) with the VC's **sub-packet sequence number** (``SEQ_BITS`` bits, counted
by both ends from reset, +1 per end flit) above it.  The sequence number is never sent:
both ends count it, so a dropped, duplicated or re-ordered sub-packet changes the CRC the
receiver computes and fails like a corrupted one.  The end flit carries the CRC on a
``crc`` sideband (zero on other flits), so the check costs no link cycles.

**What the checker does.**  On an end flit whose CRC does not match (or on a flit naming a
VC that does not exist), the checker rewrites the flit's type to the *body* type of the
other flit family (``BODY`` for an all-reduce flit, ``SUB_BODY`` for a normal-packet
flit) and counts it.  No depacketiser context expects that type, and it is not a head, so
the depacketiser rolls back the open fragment (SEQ error, the message's remaining flits are
discarded) or treats it as an orphan: the corrupted sub-packet is never committed, so never
accumulated.  A depacketiser commits only on an end flit, and every end flit it sees has
passed the CRC over everything since the previous end flit on its VC.

After a lost or extra sub-packet the two sequence counters stay apart: every later
sub-packet on that link fails too (fail-stop) until the link ends are reset together.

The golden functions :func:`append_crc` / :func:`check_crc` state the same semantics on
integer flits; :func:`subpacket_crc` is the CRC itself (``lib.crc``'s software model).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import crc, wiring
from amaranth.lib.crc import catalog
from amaranth.lib.wiring import In, Out

from .flit import FlitFormat, FlitType

__all__ = ["LINK_CRC", "SEQ_BITS", "END_TYPES", "CrcLinkSignature", "CrcAppender",
           "CrcChecker", "subpacket_crc", "crc_parameters", "append_crc", "check_crc",
           "poison_type"]

#: default link CRC: CRC-16/IBM-3740 (CCITT-FALSE), Hamming distance 4 up to 32 751 bits,
#: so every 1-, 2- and 3-bit error and every burst of <= 16 bits in a sub-packet is caught
LINK_CRC = catalog.CRC16_IBM_3740
#: implicit sub-packet sequence number (never sent; both ends count it)
SEQ_BITS = 8
#: flit types that end a sub-packet (where the CRC is sent and checked)
END_TYPES = (FlitType.SUB_TAIL, FlitType.MSG_TAIL, FlitType.TAIL, FlitType.HEAD_TAIL)
_END_CODES = tuple(int(t.value) for t in END_TYPES)


def crc_parameters(fmt: FlitFormat, algorithm=LINK_CRC) -> crc.Parameters:
    """CRC parameters of a link: one word per flit, ``flit_bits + SEQ_BITS`` wide."""
    return algorithm(fmt.flit_bits + SEQ_BITS)


def subpacket_crc(fmt: FlitFormat, flits, seq: int, algorithm=LINK_CRC) -> int:
    """CRC of one sub-packet (integer flits, in order) with sequence number ``seq``."""
    seq &= (1 << SEQ_BITS) - 1
    return crc_parameters(fmt, algorithm).compute(
        [int(f) | (seq << fmt.flit_bits) for f in flits])


def _ftype(fmt, f):
    return (int(f) >> fmt.width) & 7


def _fvc(fmt, f):
    return (int(f) >> (fmt.width + 3)) & ((1 << fmt.vc_bits) - 1)


def poison_type(ftype: int) -> int:
    """Type a checker gives a failed flit: the body type of the other family."""
    return int(FlitType.SUB_BODY.value if ftype & 4 else FlitType.BODY.value)


def append_crc(fmt: FlitFormat, flits, algorithm=LINK_CRC) -> list[tuple[int, int]]:
    """Golden appender: integer flits -> ``(flit, crc)``, crc on end flits, else 0."""
    run = {v: [] for v in range(fmt.vcs)}
    seq = {v: 0 for v in range(fmt.vcs)}
    out = []
    for f in flits:
        v = _fvc(fmt, f)
        run[v].append(int(f))
        c = 0
        if _ftype(fmt, f) in _END_CODES:
            c = subpacket_crc(fmt, run[v], seq[v], algorithm)
            run[v], seq[v] = [], seq[v] + 1
        out.append((int(f), c))
    return out


def check_crc(fmt: FlitFormat, beats, algorithm=LINK_CRC) -> tuple[list[int], int]:
    """Golden checker: ``(flit, crc)`` beats -> (flits forwarded, failed end flits).

    Every beat is forwarded (in order); a failed one with its type poisoned."""
    run = {v: [] for v in range(fmt.vcs)}
    seq = {v: 0 for v in range(fmt.vcs)}
    out, errors = [], 0
    for f, c in beats:
        f, v, t = int(f), _fvc(fmt, f), _ftype(fmt, f)
        bad = v >= fmt.vcs
        if not bad:
            run[v].append(f)
            if t in _END_CODES:
                bad = subpacket_crc(fmt, run[v], seq[v], algorithm) != c
                run[v], seq[v] = [], (seq[v] + 1) % (1 << SEQ_BITS)
        if bad:
            errors += 1
            f = (f & ~(7 << fmt.width)) | (poison_type(t) << fmt.width)
        out.append(f)
    return out, errors


class CrcLinkSignature(wiring.Signature):
    """A link carrying the CRC sideband: :class:`~.flit.LinkSignature`'s ``valid``,
    ``flit`` and ``credit`` plus ``crc`` (valid with an end flit's ``valid``)."""

    def __init__(self, fmt: FlitFormat, crc_width: int):
        self.fmt, self.crc_width = fmt, crc_width
        super().__init__({"valid": Out(1), "flit": Out(fmt.flit), "crc": Out(crc_width),
                          "credit": In(fmt.vcs)})

    def __eq__(self, other):
        return (isinstance(other, CrcLinkSignature) and self.fmt == other.fmt and
                self.crc_width == other.crc_width)

    def __hash__(self):
        return hash((self.fmt, self.crc_width))

    def __repr__(self):
        return f"CrcLinkSignature({self.fmt!r}, {self.crc_width})"


def _is_end(t):
    t = t.as_value() if hasattr(t, "as_value") else t
    return Cat(*[t == c for c in _END_CODES]).any()


def _vc_crcs(m, fmt, algorithm, valid, flit):
    """Per-VC running CRC of the flits on ``valid``/``flit``; returns (processors, seq,
    is_end, vc_ok).  A VC's CRC restarts on the flit after its end flit; the sequence
    number advances on each end flit.  ``processors[v].crc`` includes a flit from the
    cycle after it was presented."""
    params = crc_parameters(fmt, algorithm)
    V = fmt.vcs
    is_end = Signal(name="is_end")
    vc_ok = Signal(name="vc_ok")
    m.d.comb += [is_end.eq(_is_end(flit.type)), vc_ok.eq(flit.vc < V)]
    procs, seqs = [], []
    for v in range(V):
        p = params.create()
        m.submodules[f"crc{v}"] = p
        fresh = Signal(init=1, name=f"fresh{v}")      # the next flit starts a sub-packet
        seq = Signal(SEQ_BITS, name=f"seq{v}")
        mine = Signal(name=f"mine{v}")
        m.d.comb += [mine.eq(valid & vc_ok & ((flit.vc == v) if V > 1 else 1)),
                     p.valid.eq(mine), p.start.eq(fresh),
                     p.data.eq(Cat(flit.as_value(), seq))]
        with m.If(mine):
            m.d.sync += fresh.eq(is_end)
            with m.If(is_end):
                m.d.sync += seq.eq(seq + 1)
        procs.append(p)
        seqs.append(seq)
    return procs, seqs, is_end, vc_ok


class CrcAppender(wiring.Component):
    """Adds the per-sub-packet CRC to a link (one register stage, credits pass through).

    Parameters
    ----------
    fmt : FlitFormat
        Flit format of the link.
    algorithm : amaranth.lib.crc.Algorithm
        CRC algorithm (default :data:`LINK_CRC`).

    Members
    -------
    i : In(LinkSignature(fmt))
        Flits from a packetiser.
    o : Out(CrcLinkSignature(fmt, crc_width))
        The same flits one cycle later, end flits with their sub-packet's CRC.
    """

    def __init__(self, fmt: FlitFormat | None = None, *, algorithm=LINK_CRC):
        from .flit import LinkSignature
        self.fmt = fmt = fmt or FlitFormat()
        self.algorithm = algorithm
        self.crc_width = algorithm.crc_width
        super().__init__({"i": In(LinkSignature(fmt)),
                          "o": Out(CrcLinkSignature(fmt, self.crc_width))})

    def elaborate(self, platform):
        m = Module()
        procs, _, is_end, _ = _vc_crcs(m, self.fmt, self.algorithm, self.i.valid, self.i.flit)
        # the CRC of a flit's sub-packet is in its VC's processor a cycle later: register
        # the flit so that both leave together
        end_q = Signal()
        vc_q = Signal.like(self.i.flit.vc)
        m.d.sync += [self.o.valid.eq(self.i.valid), self.o.flit.eq(self.i.flit),
                     end_q.eq(self.i.valid & is_end), vc_q.eq(self.i.flit.vc)]
        crc_now = Signal(self.crc_width)
        m.d.comb += crc_now.eq(procs[0].crc)
        for v in range(1, len(procs)):
            with m.If(vc_q == v):
                m.d.comb += crc_now.eq(procs[v].crc)
        m.d.comb += [self.o.crc.eq(Mux(end_q, crc_now, 0)), self.i.credit.eq(self.o.credit)]
        return m


class CrcChecker(wiring.Component):
    """Checks the per-sub-packet CRC; poisons failed end flits (one register stage).

    Parameters
    ----------
    fmt : FlitFormat
        Flit format of the link.
    algorithm : amaranth.lib.crc.Algorithm
        CRC algorithm (default :data:`LINK_CRC`); must match the appender's.

    Members
    -------
    i : In(CrcLinkSignature(fmt, crc_width))
        Flits with the CRC sideband from the link.
    o : Out(LinkSignature(fmt))
        The flits one cycle later (a failed end flit with the poison type), to a
        depacketiser; its credits pass through to ``i``.
    error : Out(1)
        High in the cycle a failed flit is on ``o``.
    errors : Out(16)
        Failed flits since reset (saturates at 0xFFFF).
    """

    def __init__(self, fmt: FlitFormat | None = None, *, algorithm=LINK_CRC):
        from .flit import LinkSignature
        self.fmt = fmt = fmt or FlitFormat()
        self.algorithm = algorithm
        self.crc_width = algorithm.crc_width
        super().__init__({"i": In(CrcLinkSignature(fmt, self.crc_width)),
                          "o": Out(LinkSignature(fmt)), "error": Out(1), "errors": Out(16)})

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        procs, _, is_end, vc_ok = _vc_crcs(m, fmt, self.algorithm, self.i.valid, self.i.flit)
        v_q = Signal()
        f_q = Signal(fmt.flit)
        sent_q = Signal(self.crc_width)
        end_q = Signal()
        vcbad_q = Signal()
        m.d.sync += [v_q.eq(self.i.valid), f_q.eq(self.i.flit), sent_q.eq(self.i.crc),
                     end_q.eq(is_end), vcbad_q.eq(~vc_ok)]
        got = Signal(self.crc_width)
        m.d.comb += got.eq(procs[0].crc)
        for v in range(1, len(procs)):
            with m.If(f_q.vc == v):
                m.d.comb += got.eq(procs[v].crc)
        bad = Signal()
        m.d.comb += bad.eq(v_q & (vcbad_q | (end_q & (got != sent_q))))
        poison = Mux(f_q.type.as_value()[2], Const(FlitType.SUB_BODY.value, 3),
                     Const(FlitType.BODY.value, 3))
        m.d.comb += [self.o.valid.eq(v_q), self.o.flit.eq(f_q), self.error.eq(bad),
                     self.i.credit.eq(self.o.credit)]
        with m.If(bad):
            m.d.comb += self.o.flit.type.eq(poison)
        with m.If(bad & (self.errors != 0xFFFF)):
            m.d.sync += self.errors.eq(self.errors + 1)
        return m
