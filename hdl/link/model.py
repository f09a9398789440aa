"""Golden models of the link layer: the exact flit sequences the packetiser must send and
the fragments/errors the depacketiser must produce (bit for bit), plus the payload
efficiency figures (message-based vs packet flow control).

* :func:`packetise` -- ``(header, words) -> [flit ints]`` (message or packet mode);
* :func:`depacketise` -- ``[flit ints] -> (fragments, errors)``;
* :func:`efficiency`, :func:`efficiency_report` -- payload bits / total bits.

Receive semantics (identical in RTL, :class:`~treenic.hdl.link.depacketiser.Depacketiser`):
every VC has its own message context; payload is delivered in **fragments** that are
committed atomically -- a sub-packet (message mode, ended by SUB_TAIL or TAIL) or a packet
(packet mode) -- so words of a malformed sub-packet never reach the output.  A fragment's
header is the message header with ``offset`` = the fragment's first element, ``length`` =
its word count, ``last`` = it ends the message (always 1 in packet mode, where every packet
is self-contained).  Per flit on VC ``v`` (state IDLE / ACTIVE / DISCARD):

* a head (SUB_HEAD, HEAD, HEAD_TAIL) while ACTIVE: ``SEQ`` (missing tail), the open
  fragment is dropped; then the head is checked -- ``FLOW`` (flow not enabled), else ``OP``
  (not REDUCE/GATHER), else ``LENGTH`` (message length 0; packet length 0 or > max for
  HEAD; != 0 for HEAD_TAIL).  A bad head -> DISCARD (IDLE for HEAD_TAIL).  A good HEAD_TAIL
  delivers a zero-length fragment;
* body/sub-tail/tail while IDLE: ``ORPHAN`` once, then DISCARD (a tail-type flit: IDLE);
* while DISCARD flits are dropped until a tail-type flit (MSG_TAIL / TAIL) or a head;
* while ACTIVE the expected type is fixed by the position -- message mode: MSG_TAIL if the
  flit holds the message's last word, else SUB_TAIL if it fills the sub-packet
  (``sub_words``), else SUB_BODY; packet mode: TAIL / BODY.  Anything else: ``SEQ``, the
  open fragment is dropped, DISCARD (a tail-type flit: IDLE).

Buffer overflows (``OVERFLOW``, a sender ignoring credits) depend on timing and are only
counted by the RTL.
"""

from __future__ import annotations

from dataclasses import dataclass

from .flit import ErrorCause, FlitFormat, FlitType, Op, WORD_BITS

__all__ = ["packetise", "depacketise", "check_flit", "new_contexts", "head_checks",
           "FlitDecision", "commit_stage", "mutate_flits", "Fragment", "efficiency", "link_stats",
           "efficiency_report", "format_report", "load_rtl_counts", "MESSAGE", "PACKET", "DEFAULT_SUB_WORDS"]

MESSAGE = "message"
PACKET = "packet"
DEFAULT_SUB_WORDS = 64
_TAIL_TYPES = (FlitType.MSG_TAIL, FlitType.TAIL)
_HEAD_TYPES = (FlitType.SUB_HEAD, FlitType.HEAD, FlitType.HEAD_TAIL)

HEADER_FIELDS = ("vc", "next", "eject", "dest", "src", "flow", "op", "step", "offset",
                 "length")


def _check_mode(fmt, mode, sub_words, packet_words):
    if mode not in (MESSAGE, PACKET):
        raise ValueError(f"mode must be {MESSAGE!r} or {PACKET!r}")
    if sub_words <= 0 or sub_words % fmt.lanes:
        raise ValueError(f"sub_words {sub_words} must be a positive multiple of {fmt.lanes}")
    if packet_words <= 0 or packet_words % fmt.lanes or packet_words > fmt.max_packet_words:
        raise ValueError(f"packet_words {packet_words} must be a positive multiple of "
                         f"{fmt.lanes} and <= {fmt.max_packet_words}")


def packetise(header: dict, words, mode: str = MESSAGE, fmt: FlitFormat | None = None, *,
              sub_words: int = DEFAULT_SUB_WORDS, packet_words: int | None = None) -> list[int]:
    """Flits (ints, layout :attr:`FlitFormat.flit`) for one message.

    ``header``: dict with ``vc, flow, op, step, offset`` and ``next, eject`` (message mode)
    or ``dest, src`` (packet mode); ``length`` defaults to ``len(words)`` and must equal it.
    """
    fmt = fmt or FlitFormat()
    packet_words = fmt.max_packet_words if packet_words is None else packet_words
    _check_mode(fmt, mode, sub_words, packet_words)
    words = [int(w) & 0xFFFF_FFFF for w in words]
    n = len(words)
    if int(header.get("length", n)) != n:
        raise ValueError("header length does not match the number of words")
    if n >= 1 << fmt.length_bits:
        raise ValueError(f"message of {n} words exceeds the length field")
    vc = int(header.get("vc", 0))
    W = fmt.lanes
    omask = (1 << fmt.offset_bits) - 1
    common = {k: int(header.get(k, 0)) for k in ("flow", "op", "step")}
    off0 = int(header.get("offset", 0))
    flits = []
    if mode == MESSAGE:
        if n == 0:
            raise ValueError("message mode needs at least one word (Table II has no "
                             "single-flit sub-packet)")
        flits.append(fmt.make_flit(FlitType.SUB_HEAD, vc, fmt.pack_sub_head(
            next=header.get("next", 0), eject=header.get("eject", 0), offset=off0,
            length=n, **common)))
        done = sub = 0
        while done < n:
            rem = n - done
            k = min(W, rem)
            if rem <= W:
                t = FlitType.MSG_TAIL
            elif sub_words - sub <= W:
                t = FlitType.SUB_TAIL
            else:
                t = FlitType.SUB_BODY
            flits.append(fmt.make_flit(t, vc, fmt.pack_words(words[done:done + k])))
            done += k
            sub = 0 if t == FlitType.SUB_TAIL else sub + k
        return flits
    # packet mode
    route = {"dest": header.get("dest", 0), "src": header.get("src", 0)}
    if n == 0:
        return [fmt.make_flit(FlitType.HEAD_TAIL, vc, fmt.pack_pkt_head(
            offset=off0, length=0, **route, **common))]
    for start in range(0, n, packet_words):
        chunk = words[start:start + packet_words]
        flits.append(fmt.make_flit(FlitType.HEAD, vc, fmt.pack_pkt_head(
            offset=(off0 + start) & omask, length=len(chunk), **route, **common)))
        for i in range(0, len(chunk), W):
            t = FlitType.TAIL if i + W >= len(chunk) else FlitType.BODY
            flits.append(fmt.make_flit(t, vc, fmt.pack_words(chunk[i:i + W])))
    return flits


@dataclass
class Fragment:
    """A delivered fragment: header dict (fields of :attr:`FlitFormat.header`) + words."""
    header: dict
    words: list

    def key(self):
        return (tuple(self.header[k] for k in ("vc", "packet", "last") + HEADER_FIELDS[1:]),
                tuple(self.words))


class _Ctx:
    __slots__ = ("state", "mode", "hdr", "done", "sub", "buf")

    def __init__(self):
        self.state = "IDLE"
        self.mode = None
        self.hdr = None
        self.done = self.sub = 0
        self.buf = []


@dataclass
class FlitDecision:
    """What the receive side makes of one flit (:func:`check_flit`).

    ``accept``: the flit is used (else it is dropped); ``write``: an accepted payload flit
    (its words enter the open fragment); ``rollback``: the open fragment is dropped;
    ``commit``: the fragment this flit completes, or None; ``causes``: the errors it
    raised, in the order they are counted."""
    accept: bool = False
    write: bool = False
    rollback: bool = False
    commit: Fragment | None = None
    causes: tuple = ()


def head_checks(fmt: FlitFormat, t: FlitType, d: int, flow_enable: int):
    """``(unpacked head, cause or None, short)`` of a head flit of type ``t``: the checks
    the input side makes before the arbiter (flow, then op, then length; ``short``: the
    message fits one payload flit)."""
    sub = t == FlitType.SUB_HEAD
    h = fmt.unpack_sub_head(d) if sub else fmt.unpack_pkt_head(d)
    if t == FlitType.SUB_HEAD:
        bad_len = h["length"] == 0
    elif t == FlitType.HEAD:
        bad_len = h["length"] == 0 or h["length"] > fmt.max_packet_words
    else:
        bad_len = h["length"] != 0
    if not (flow_enable >> h["flow"]) & 1:
        cause = ErrorCause.FLOW
    elif h["op"] not in (Op.REDUCE.value, Op.GATHER.value):
        cause = ErrorCause.OP
    elif bad_len:
        cause = ErrorCause.LENGTH
    else:
        cause = None
    return h, cause, h["length"] <= fmt.lanes


def _commit(fmt: FlitFormat, c: _Ctx, last: bool) -> Fragment:
    h = dict(c.hdr)
    h["offset"] = (h["offset"] + c.done - c.sub) & ((1 << fmt.offset_bits) - 1)
    h["length"] = c.sub
    h["last"] = int(last)
    frag = Fragment(h, list(c.buf))
    c.buf = []
    c.sub = 0
    return frag


def _check_head(fmt, c: _Ctx, t, vc, d, flow_enable) -> FlitDecision:
    out = FlitDecision()
    causes = []
    if c.state == "ACTIVE":
        causes.append(ErrorCause.SEQ)
        out.rollback = True
        c.buf, c.sub = [], 0
    h, cause, _ = head_checks(fmt, t, d, flow_enable)
    sub = t == FlitType.SUB_HEAD
    if cause is not None:
        causes.append(cause)
        c.state = "IDLE" if t == FlitType.HEAD_TAIL else "DISCARD"
    else:
        out.accept = True
        hdr = {k: 0 for k in HEADER_FIELDS}
        hdr.update({k: h[k] for k in h})
        hdr["vc"] = vc
        hdr["packet"] = 0 if sub else 1
        c.hdr, c.done, c.sub, c.buf = hdr, 0, 0, []
        c.mode = MESSAGE if sub else PACKET
        if t == FlitType.HEAD_TAIL:
            out.commit = _commit(fmt, c, True)
            c.state = "IDLE"
        else:
            c.state = "ACTIVE"
    out.causes = tuple(causes)
    return out


def _check_payload(fmt, c: _Ctx, t, d, sub_words) -> FlitDecision:
    W = fmt.lanes
    rem = c.hdr["length"] - c.done
    k = min(W, rem)
    if c.mode == MESSAGE:
        exp = (FlitType.MSG_TAIL if rem <= W else
               FlitType.SUB_TAIL if sub_words - c.sub <= W else FlitType.SUB_BODY)
    else:
        exp = FlitType.TAIL if rem <= W else FlitType.BODY
    if t != exp:
        c.buf, c.sub = [], 0
        c.state = "IDLE" if t in _TAIL_TYPES else "DISCARD"
        return FlitDecision(rollback=True, causes=(ErrorCause.SEQ,))
    out = FlitDecision(accept=True, write=True)
    c.buf += fmt.unpack_words(d, k)
    c.done += k
    c.sub += k
    if t in _TAIL_TYPES:
        out.commit = _commit(fmt, c, True)
        c.state = "IDLE"
    elif t == FlitType.SUB_TAIL:
        out.commit = _commit(fmt, c, False)
    return out


def check_flit(ctx: list, flit: int, fmt: FlitFormat, *, sub_words: int = DEFAULT_SUB_WORDS,
               flow_enable: int | None = None) -> FlitDecision:
    """Golden check stage: one flit against its VC's message context (``ctx``: one
    :func:`new_contexts` entry per VC, updated in place).  Same semantics as the RTL's
    :class:`~treenic.hdl.link.depacketiser.FragmentCheck`; :func:`depacketise` is this,
    flit after flit."""
    if flow_enable is None:
        flow_enable = (1 << fmt.flows) - 1
    t, vc, d = fmt.split_flit(int(flit))
    if vc >= fmt.vcs:
        raise ValueError("flit on a non-existent VC")
    c = ctx[vc]
    if t in _HEAD_TYPES:
        return _check_head(fmt, c, t, vc, d, flow_enable)
    if c.state == "IDLE":
        c.state = "IDLE" if t in _TAIL_TYPES else "DISCARD"
        return FlitDecision(causes=(ErrorCause.ORPHAN,))
    if c.state == "DISCARD":
        c.state = "IDLE" if t in _TAIL_TYPES else "DISCARD"
        return FlitDecision()
    return _check_payload(fmt, c, t, d, sub_words)


def new_contexts(fmt: FlitFormat) -> list:
    """Fresh (IDLE) message contexts, one per VC, for :func:`check_flit`."""
    return [_Ctx() for _ in range(fmt.vcs)]


def depacketise(flits, fmt: FlitFormat | None = None, *, sub_words: int = DEFAULT_SUB_WORDS,
                flow_enable: int | None = None):
    """Golden receive side.  Returns ``(fragments, errors)``: a list of :class:`Fragment`
    in delivery order per VC (VCs do not reorder within themselves) and a dict
    ``{ErrorCause: count}`` plus ``"dropped"`` (flits discarded)."""
    fmt = fmt or FlitFormat()
    ctx = new_contexts(fmt)
    frags: list[Fragment] = []
    errs = {c: 0 for c in ErrorCause if c != ErrorCause.NONE}
    errs["dropped"] = 0
    for f in flits:
        out = check_flit(ctx, f, fmt, sub_words=sub_words, flow_enable=flow_enable)
        for cause in out.causes:
            errs[cause] += 1
        if out.commit is not None:
            frags.append(out.commit)
        if not out.accept:
            errs["dropped"] += 1
    return frags, errs


def commit_stage(events, *, vcs: int, region_flits: int):
    """Golden commit stage of the depacketiser (the RTL's
    :class:`~treenic.hdl.link.depacketiser.FragmentCommit`): per VC a write pointer and a
    committed end in a circular region of ``region_flits`` flits.

    ``events``: per cycle None (no flit checked) or ``(vc, write, rollback, commit,
    length, header)`` -- the check stage's decision.  Every checked flit is written at its
    VC's write pointer; a rollback moves the write pointer back to the committed end; an
    accepted payload flit advances it (and a commit moves the committed end past it).
    Returns per cycle ``(buffer address or None, header queued or None, (length, vc)
    queued or None)``; the queue writes appear the cycle after their event (a register),
    and a fragment without words queues no length."""
    wptr, cptr = [0] * vcs, [0] * vcs
    wrap = 2 * region_flits                  # pointers carry one bit above the region
    out, queued = [], (None, None)
    for ev in events:
        addr = None
        nxt = (None, None)
        if ev is not None:
            vc, write, rollback, commit, length, header = ev
            addr = vc * region_flits + wptr[vc] % region_flits
            if rollback:
                wptr[vc] = cptr[vc]
            elif write:
                wptr[vc] = (wptr[vc] + 1) % wrap
                if commit:
                    cptr[vc] = wptr[vc]
            if commit:
                nxt = (header, (length, vc) if write else None)
        out.append((addr,) + queued)
        queued = nxt
    return out


def mutate_flits(flits, rng, fmt: FlitFormat | None = None, n: int = 1):
    """Fault injection for benches: apply ``n`` random corruptions to a flit list (drop a
    flit, duplicate one, change a flit's type, corrupt a head's flow/op/length, insert an
    orphan body).  The golden :func:`depacketise` defines what the receiver must make of
    the result."""
    fmt = fmt or FlitFormat()
    flits = list(flits)
    W = fmt.width
    for _ in range(n):
        if not flits:
            break
        i = rng.randrange(len(flits))
        t, vc, d = fmt.split_flit(flits[i])
        kind = rng.randrange(6)
        if kind == 0:
            del flits[i]
        elif kind == 1:
            flits.insert(i, flits[i])
        elif kind == 2:
            flits[i] = fmt.make_flit(rng.randrange(8), vc, d)
        elif kind == 3:
            flits.insert(i, fmt.make_flit(FlitType.SUB_BODY if rng.random() < 0.5
                                          else FlitType.BODY, vc, rng.getrandbits(W)))
        else:  # corrupt a head field (flow / op / length)
            heads = [j for j, f in enumerate(flits) if fmt.split_flit(f)[0] in _HEAD_TYPES]
            if not heads:
                continue
            j = rng.choice(heads)
            t, vc, d = fmt.split_flit(flits[j])
            lay = fmt.sub_head if t == FlitType.SUB_HEAD else fmt.pkt_head
            h = fmt._unpack(lay, d)
            if kind == 4:
                h["op"] = rng.choice([0, 3])
            else:
                h["length"] = rng.choice([0, h["length"] + 1,
                                          max(h["length"] - 2, 0), fmt.max_packet_words + 1])
                h["length"] &= (1 << lay["length"].width) - 1
            flits[j] = fmt.make_flit(t, vc, fmt._pack(lay, h))
    return flits


def link_stats(flits, fmt: FlitFormat | None = None):
    """(payload bits, flits, head flits) of a flit list (payload = message words)."""
    fmt = fmt or FlitFormat()
    payload = heads = 0
    for f in flits:
        t, _, d = fmt.split_flit(f)
        if t in _HEAD_TYPES:
            heads += 1
            if t == FlitType.SUB_HEAD:
                payload += fmt.unpack_sub_head(d)["length"] * WORD_BITS
            else:
                payload += fmt.unpack_pkt_head(d)["length"] * WORD_BITS
    return payload, len(flits), heads


def efficiency(n_words: int, mode: str = MESSAGE, fmt: FlitFormat | None = None, *,
               sub_words: int = DEFAULT_SUB_WORDS, packet_words: int | None = None,
               sideband: bool = False) -> float:
    """Payload efficiency = payload bits / total bits for one message of ``n_words``
    binary32 words (closed form, equal to counting :func:`packetise`'s flits).  Total bits
    count the data field of every flit (the paper's accounting); ``sideband=True`` also
    counts the type and VC bits."""
    fmt = fmt or FlitFormat()
    packet_words = fmt.max_packet_words if packet_words is None else packet_words
    _check_mode(fmt, mode, sub_words, packet_words)
    W = fmt.lanes
    data_flits = -(-n_words // W)
    if mode == MESSAGE:
        flits = 1 + data_flits
    else:
        full, rest = divmod(n_words, packet_words)
        flits = full * (1 + packet_words // W) + ((1 + -(-rest // W)) if rest else 0)
        flits = max(flits, 1)
    per_flit = fmt.flit_bits if sideband else fmt.width
    return n_words * WORD_BITS / (flits * per_flit)


def load_rtl_counts(results_dir="build/sim/link_results") -> dict:
    """``{(width, mode): (flits, heads)}`` from the JSON files the cocotb efficiency bench
    (``sim/link``, ``test_efficiency_1mib``) writes; empty if it has not run."""
    import json
    from pathlib import Path
    out = {}
    for f in sorted(Path(results_dir).glob("efficiency_*.json")):
        r = json.loads(f.read_text())
        out[(r["width"], r["mode"], r["n_bytes"])] = (r["flits"], r["heads"])
    return out


def efficiency_report(n_bytes: int = 1 << 20, *, widths=(64, 128), packet_bytes: int = 256,
                      sub_words: int = DEFAULT_SUB_WORDS, rtl_counts: dict | None = None,
                      rtl_results_dir: str | None = None):
    """Payload efficiency of one ``n_bytes`` message, message-based vs packet flow control
    with ``packet_bytes`` payload per packet, for each flit width.

    Returns a list of dict rows (``width, mode, flits, heads, efficiency,
    efficiency_sideband``, and ``source``: ``"golden"`` -- counted from :func:`packetise`
    -- or ``"rtl"`` for rows given by ``rtl_counts`` = ``{(width, mode): (flits, heads)}``
    measured on the RTL packetiser, or loaded from ``rtl_results_dir`` -- see
    :func:`load_rtl_counts`).  The flit count of the golden rows is cross-checked against
    the closed form :func:`efficiency`.
    """
    rtl_counts = dict(rtl_counts or {})
    if rtl_results_dir is not None:
        for (w, mode, nb), v in load_rtl_counts(rtl_results_dir).items():
            if nb == n_bytes:
                rtl_counts.setdefault((w, mode), v)
    n_words = n_bytes // 4
    words = [(i * 2654435761) & 0xFFFF_FFFF for i in range(n_words)]
    rows = []
    for width in widths:
        fmt = FlitFormat(width=width, max_packet_words=max(packet_bytes // 4, width // 32))
        for mode in (MESSAGE, PACKET):
            hdr = {"flow": 1, "op": 1, "step": 1, "length": n_words}
            flits = packetise(hdr, words, mode, fmt, sub_words=max(sub_words, fmt.lanes),
                              packet_words=packet_bytes // 4)
            payload, nflits, heads = link_stats(flits, fmt)
            assert payload == n_words * WORD_BITS
            eff = payload / (nflits * width)
            closed = efficiency(n_words, mode, fmt, sub_words=max(sub_words, fmt.lanes),
                                packet_words=packet_bytes // 4)
            assert abs(eff - closed) < 1e-12, (eff, closed)
            rows.append({"source": "golden", "width": width, "mode": mode, "flits": nflits,
                         "heads": heads, "efficiency": eff,
                         "efficiency_sideband": payload / (nflits * fmt.flit_bits)})
            if rtl_counts and (width, mode) in rtl_counts:
                rf, rh = rtl_counts[(width, mode)]
                rows.append({"source": "rtl", "width": width, "mode": mode, "flits": rf,
                             "heads": rh, "efficiency": payload / (rf * width),
                             "efficiency_sideband": payload / (rf * fmt.flit_bits)})
    return rows


def format_report(rows) -> str:
    out = [f"{'source':7} {'width':>5} {'mode':8} {'flits':>8} {'heads':>6} "
           f"{'efficiency':>10} {'(+type/vc)':>10}"]
    for r in rows:
        out.append(f"{r['source']:7} {r['width']:5d} {r['mode']:8} {r['flits']:8d} "
                   f"{r['heads']:6d} {100 * r['efficiency']:9.4f}% "
                   f"{100 * r['efficiency_sideband']:9.4f}%")
    return "\n".join(out)


if __name__ == "__main__":  # python -m treenic.hdl.link.model
    print(format_report(efficiency_report(rtl_results_dir="build/sim/link_results")))
