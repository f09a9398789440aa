"""The NIC's host protocol over UDP: datagram format, encoder/decoder and golden engine.

One source of truth for the wire format: the Amaranth engine
(:class:`treenic.hdl.host.engine.HostEngine`), the ``udp`` driver backend and the benches
all use the constants and functions here.

Datagram (UDP payload, a whole number of 32-bit little-endian words; the first byte on the
wire is bit 7..0 of word 0, as LiteEth's 32-bit UDP port presents it)::

    word 0  MAGIC (bits 15..0) | VERSION << 16 | op << 24      (reply: op | REPLY)
    word 1  seq                 host's sequence number, echoed in the reply
    word 2  addr                NIC host-bus word address (READ/WRITE); 0 otherwise
    word 3  count               requests: bits 31..16 zero; replies: flags << 16
    word 4  check               ~(word0 ^ word1 ^ word2 ^ word3)
    word 5.. payload

Requests (``count`` and payload words per op)::

    READ         1  count 1..max_words words from addr, addr+1, ...  payload: none
    WRITE        2  count 1..max_words words to addr, addr+1, ...    payload: count words
    WRITE_PAIRS  3  count 1..max_words//2 (address, value) writes    payload: 2*count words
    START        4  count 0, addr 0: writes the start value to the start register
    STATUS       5  count 0, addr 0: reads the status registers

Replies carry the request's seq and addr; READ: count words read; STATUS: the status
registers' values then the engine's counters (accepted, dropped, duplicates); the others:
no payload (``count`` echoes the request's).  ``flags`` bit 0 (DUP) says that the request
repeated the last executed *mutating* request (WRITE, WRITE_PAIRS, START: same seq) and was
acknowledged without being executed again -- so a host can retry a lost datagram safely.
READ and STATUS have no side effects and always execute.  A host uses one seq per new
request (a session starts at a random seq); pipelined WRITEs of buffer data are idempotent
by themselves as long as no two writes in flight target one address with different values.

Malformed datagrams are dropped (no reply, nothing executed) and counted: length not a
whole number of words or not what the header's op/count imply, bad magic/version/op/check,
count out of range, an address range beyond the host bus, a WRITE_PAIRS address beyond the
host bus, or longer than the engine's packet memory.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MAGIC", "VERSION", "REPLY", "HEADER_WORDS", "Op", "Flag", "Malformed",
           "Request", "Reply", "encode_request", "decode_request", "encode_reply",
           "decode_reply", "payload_words", "ENGINE_COUNTERS", "HostEngineModel"]

MAGIC = 0x544E              # "NT" little-endian: bytes 'N','T' first on the wire
VERSION = 1
REPLY = 0x80
HEADER_WORDS = 5
MASK32 = 0xFFFFFFFF
#: names of the engine's counters appended to a STATUS reply, in order
ENGINE_COUNTERS = ("accepted", "dropped", "duplicates")


class Op(enum.IntEnum):
    READ = 1
    WRITE = 2
    WRITE_PAIRS = 3
    START = 4
    STATUS = 5


MUTATING = (Op.WRITE, Op.WRITE_PAIRS, Op.START)


class Flag(enum.IntFlag):
    DUP = 1


class Malformed(ValueError):
    """A datagram that the engine drops (the message names the reason)."""


@dataclass(frozen=True)
class Request:
    op: Op
    seq: int
    addr: int = 0
    count: int = 0
    payload: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reply:
    op: Op
    seq: int
    addr: int
    count: int
    flags: Flag
    payload: tuple[int, ...] = ()


def _check(w0: int, w1: int, w2: int, w3: int) -> int:
    return ~(w0 ^ w1 ^ w2 ^ w3) & MASK32


def _words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}I", data[:len(data) // 4 * 4]))


def _pack(words) -> bytes:
    return struct.pack(f"<{len(words)}I", *[int(w) & MASK32 for w in words])


def payload_words(op: int, count: int) -> int:
    """Payload words a request of this op/count carries."""
    return {Op.WRITE: count, Op.WRITE_PAIRS: 2 * count}.get(op, 0)


def encode_request(op: Op, seq: int, addr: int = 0, count: int | None = None,
                   payload=()) -> bytes:
    """Bytes of one request; ``count`` defaults to what the payload implies (WRITE: its
    length, WRITE_PAIRS: half of it)."""
    payload = [int(w) for w in payload]
    if count is None:
        count = {Op.WRITE: len(payload), Op.WRITE_PAIRS: len(payload) // 2}.get(op, 0)
    w0 = MAGIC | VERSION << 16 | int(op) << 24
    hdr = [w0, seq & MASK32, addr & MASK32, count & MASK32]
    return _pack(hdr + [_check(*hdr)] + payload)


def _header(data: bytes) -> list[int]:
    if len(data) % 4:
        raise Malformed(f"length {len(data)} is not a whole number of 32-bit words")
    if len(data) < 4 * HEADER_WORDS:
        raise Malformed(f"length {len(data)} < {4 * HEADER_WORDS}-byte header")
    w = _words(data)
    if w[0] & 0xFFFF != MAGIC or (w[0] >> 16) & 0xFF != VERSION:
        raise Malformed(f"bad magic/version word {w[0]:#010x}")
    if w[4] != _check(*w[:4]):
        raise Malformed("header check word mismatch")
    return w


def decode_request(data: bytes, *, addr_bits: int, max_words: int) -> Request:
    """Parse and validate one request datagram; raises :class:`Malformed`."""
    w = _header(data)
    try:
        op = Op(w[0] >> 24)
    except ValueError:
        raise Malformed(f"unknown op {w[0] >> 24}") from None
    seq, addr, count = w[1], w[2], w[3]
    limit = {Op.READ: (1, max_words), Op.WRITE: (1, max_words),
             Op.WRITE_PAIRS: (1, max_words // 2)}.get(op, (0, 0))
    if not limit[0] <= count <= limit[1]:
        raise Malformed(f"{op.name}: count {count} outside {limit[0]}..{limit[1]}")
    if op in (Op.READ, Op.WRITE) and addr + count > 1 << addr_bits:
        raise Malformed(f"{op.name}: addresses {addr:#x}+{count} beyond the "
                        f"{addr_bits}-bit host bus")
    if op in (Op.START, Op.STATUS) and addr != 0:
        raise Malformed(f"{op.name}: addr must be 0, got {addr:#x}")
    n = payload_words(op, count)
    if len(w) != HEADER_WORDS + n:
        raise Malformed(f"{op.name} count {count}: {len(w)} words, expected "
                        f"{HEADER_WORDS + n}")
    payload = tuple(w[HEADER_WORDS:])
    if op == Op.WRITE_PAIRS and any(a >> addr_bits for a in payload[0::2]):
        raise Malformed(f"WRITE_PAIRS: address beyond the {addr_bits}-bit host bus")
    return Request(op, seq, addr, count, payload)


def encode_reply(reply: Reply) -> bytes:
    w0 = MAGIC | VERSION << 16 | (int(reply.op) | REPLY) << 24
    hdr = [w0, reply.seq, reply.addr, (reply.count & 0xFFFF) | int(reply.flags) << 16]
    return _pack(hdr + [_check(*hdr)] + list(reply.payload))


def decode_reply(data: bytes) -> Reply:
    """Parse one reply datagram; raises :class:`Malformed` when it is not one."""
    w = _header(data)
    if not w[0] >> 24 & REPLY:
        raise Malformed("not a reply (REPLY bit clear)")
    try:
        op = Op((w[0] >> 24) & ~REPLY)
    except ValueError:
        raise Malformed(f"unknown op {(w[0] >> 24) & ~REPLY}") from None
    return Reply(op, w[1], w[2], w[3] & 0xFFFF, Flag(w[3] >> 16 & 0xFF),
                 tuple(w[HEADER_WORDS:]))


@dataclass
class HostEngineModel:
    """Golden engine: executes requests on a host bus (``read(addr)``/``write(addr, v)``
    callables), bit for bit what :class:`~treenic.hdl.host.engine.HostEngine` does.

    ``status_regs``: addresses read by STATUS; ``start``: (address, value) START writes.
    """
    read: object
    write: object
    addr_bits: int
    max_words: int
    status_regs: tuple[int, ...]
    start: tuple[int, int]
    counters: dict = field(default_factory=lambda: dict.fromkeys(ENGINE_COUNTERS, 0))
    last_seq: int | None = None

    def process(self, data: bytes) -> bytes | None:
        """One datagram in; the reply's bytes, or None when it was dropped."""
        try:
            if len(data) > 4 * (HEADER_WORDS + self.max_words):
                raise Malformed(f"{len(data)} bytes > packet memory")
            req = decode_request(data, addr_bits=self.addr_bits, max_words=self.max_words)
        except Malformed:
            self.counters["dropped"] += 1
            return None
        flags = Flag(0)
        if req.op in MUTATING and req.seq == self.last_seq:
            self.counters["duplicates"] += 1
            flags = Flag.DUP
            return encode_reply(Reply(req.op, req.seq, req.addr, req.count, flags))
        self.counters["accepted"] += 1
        payload, count = self._execute(req)
        if req.op in MUTATING:
            self.last_seq = req.seq
        return encode_reply(Reply(req.op, req.seq, req.addr, count, flags, tuple(payload)))

    def _execute(self, req: Request):
        if req.op == Op.WRITE:
            for i, v in enumerate(req.payload):
                self.write(req.addr + i, v)
        elif req.op == Op.WRITE_PAIRS:
            for a, v in zip(req.payload[0::2], req.payload[1::2]):
                self.write(a, v)
        elif req.op == Op.START:
            self.write(*self.start)
        elif req.op == Op.READ:
            return [self.read(req.addr + i) & MASK32 for i in range(req.count)], req.count
        elif req.op == Op.STATUS:
            vals = [self.read(a) & MASK32 for a in self.status_regs]
            # counters as they stand once this request is accepted
            vals += [self.counters[k] & MASK32 for k in ENGINE_COUNTERS]
            return vals, len(vals)
        return [], req.count


def memory_bus(addr_bits: int):
    """(memory, read, write) of a plain word memory covering the host bus (tests)."""
    mem = np.zeros(1 << addr_bits, np.uint64)

    def read(a):
        return int(mem[a])

    def write(a, v):
        mem[a] = v & MASK32
    return mem, read, write
