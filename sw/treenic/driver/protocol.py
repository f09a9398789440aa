"""treenic host protocol: what a training process speaks to its NIC.

The same protocol is spoken to the simulated fabric server (:mod:`treenic.driver.server`, one
process simulating N NICs and their links, reached over loopback TCP) and to a board over
Ethernet. Each training process (rank) opens one connection to "its" NIC.

Framing (all integers little-endian)
------------------------------------

====== ==== ==================================================================
offset size field
====== ==== ==================================================================
0      4    magic ``b"TNIC"``
4      1    protocol version (:data:`PROTOCOL_VERSION`, currently 4)
5      1    message type (:class:`Msg`)
6      2    flags (bit 0: reply; other bits reserved, must be 0)
8      4    tag: request id chosen by the client; the reply echoes it
12     4    payload length ``L`` (at most :data:`MAX_PAYLOAD`, less for some types:
            :data:`PAYLOAD_LIMITS`; at most :data:`MAX_PAYLOAD_BEFORE_HELLO` until the
            connection's HELLO is accepted)
16     L    payload (layout per message type, below)
16+L   4    CRC-32 (IEEE 802.3, ``zlib.crc32``) of bytes ``0 .. 16+L-1``
====== ==== ==================================================================

Every request gets exactly one reply: the matching ``*_ACK``/data message, or ``ERROR``.
After ``BAD_MAGIC``, ``VERSION_MISMATCH`` (frame header) or ``FRAME_TOO_LARGE`` the receiver
cannot trust the framing any more: it replies ``ERROR`` and closes the connection. After any
other error the connection stays usable and nothing changed on the NIC.

Messages (request → reply; payload layouts as :mod:`struct` formats)
--------------------------------------------------------------------

``HELLO`` 0x01 → ``HELLO_ACK`` 0x81
    request ``<HHHH32s`` protocol version, rank, world size, reserved(0), the 32-byte job
    secret + UTF-8 client name. reply ``<HHHH`` protocol version, nodes simulated, engine id
    (0 golden, 1 rtl), reserved + UTF-8 engine description. Must be the first message of a
    connection (else ``NOT_READY``) and arrive within the server's hello timeout (else the
    connection is closed). A wrong secret gets ``AUTH`` and the connection is closed (one
    guess per connection; compared in constant time; never echoed). The world must equal
    the fabric's node count; a rank is held by at most one connection.
``LOAD_CONFIG`` 0x02 → ``CONFIG_ACK`` 0x82
    request ``<II`` image kind (:data:`IMAGE_SET`: the schedule compiler's configuration
    image set, :meth:`treenic.firmware.image.ImageSet.to_bytes` -- every NIC's image for one
    element count), CRC-32 of the image set + its bytes. The declared payload length is
    bounded (:data:`MAX_IMAGE_SET_BYTES`) before a byte of it is received. reply ``<IIII``
    config id (the CRC-32 of the image set bytes), nodes, steps, elements; the client checks
    that the id and node count are the ones it sent. The set must decode and pass the image
    checks (container, CRC, every field's meaning), name an inline topology of at most the
    fabric's size (no file path is ever opened), be exactly the compiler's encoding of the
    schedule its rows describe, and that schedule must pass the schedule checkers
    (:mod:`treenic.driver.config`); a set with a sparse section (image version 3) must also
    hold exactly the sparse compiler's program for the parameters it names; else
    ``BAD_CONFIG``. The configuration is this rank's
    and holds for collectives of its element count (a rank loads the set for each new
    element count; ``START`` of another count gets ``SIZE_MISMATCH``): a collective runs
    only when every rank loaded the same one; otherwise every rank's ``START`` of it gets
    ``CONFIG_MISMATCH`` naming each rank's config id.
``WRITE_BUFFER`` 0x03 → ``WRITE_ACK`` 0x83
    request ``<IBBHQ`` collective sequence number (from 1, +1 per collective), dtype code
    (1: float32 — the reduction unit's only type, docs/architecture.md §5), buffer id
    (0: gradient), reserved, element count + ``count * 4`` bytes of little-endian data.
    reply ``<IQ`` sequence, count. At most 4 collectives may be written and not yet started
    per rank (``SEQUENCE`` beyond that); a sequence number is written once.
``START`` 0x04 → ``COMPLETE`` 0x84
    request ``<IBBHdQ`` sequence, mode (0: dense schedule, 1: sparse), sparse options
    (:func:`pack_sparse_options`: bit 0 residual 0 local / 1 global, bit 1 flow assignment
    0 contiguous / 1 hash, other bits 0; 0 for dense and for schemes without options), name
    length ``n``, density (float64, sparse only), seed (sparse only) + ``n`` bytes UTF-8
    sparse scheme name (``treenic.sparse`` registry). The NIC starts once all ranks have
    written and started collective ``sequence`` with the same parameters; the reply is sent
    when it finished. A sparse scheme the fabric's engine does not run is ``ENGINE``.
    A sparse scheme the configuration image encodes (``multitree-sparse``, ``topka``) runs
    the **sparse program of the rank's loaded image set** (its version-3 sparse section;
    both engines: the RTL loads its rows, the golden engine runs the model of its
    parameters) and never a program compiled for the request: the set must have one
    (else ``NOT_READY``), for the buffer's element count (else ``SIZE_MISMATCH``) and the
    request's scheme, density, residual, flow assignment and -- hash flows -- seed (else
    ``CONFIG_MISMATCH`` naming both sides); refused before the buffer is taken. The
    driver loads the request's sparse set (``compile_images(..., density=...)``) before
    such a START. Other schemes (golden engine only) run the request's golden model.
    reply ``<IIQQQ`` sequence, steps, cycles (:data:`CYCLES_UNKNOWN` when the engine does
    not model time), bytes this NIC sent on its links, bytes it received on its links.
``READ_BUFFER`` 0x05 → ``BUFFER_DATA`` 0x85
    request ``<IB`` sequence, buffer id (0: result, 1: residual — sparse only).
    reply ``<IBBHQ`` + data, the ``WRITE_BUFFER`` layout. A collective is retired once every
    rank has read its result (and residual, for sparse).
Errors of a collective (``SIZE_MISMATCH`` when ranks wrote different element counts or
sparse parameters, ``CONFIG_MISMATCH``, ``ABORTED`` when a rank's connection closed —
``rank N disconnected`` — or a rank sent ``ABORT``, ``TIMEOUT`` when a rank never started it
within the server's collective timeout, ``ENGINE``) are answered to every rank's ``START``
of that collective, naming the ranks involved. A rank connection closed without ``BYE``
aborts every collective in flight at once (a rank waiting in ``START`` watches its own socket
too) and every later one until the rank connects again; an orderly ``BYE`` aborts nothing.

``STATUS`` 0x06 → ``STATUS_REPLY`` 0x86
    request empty. reply ``<IIQQQQQQ`` state (0 idle, 1 collective in flight, 2 error),
    loaded config id (0: none), collectives completed, host bytes received, host bytes sent,
    link bytes sent, link bytes received (this rank's NIC), cycles total (this NIC).
``BYE`` 0x07 → ``BYE_ACK`` 0x87
    request empty; the server releases the rank, replies and closes the connection.
``ABORT`` 0x08 → ``ABORT_ACK`` 0x88
    request ``<I`` sequence + UTF-8 reason (at most :data:`MAX_ABORT_REASON` bytes). This
    rank gives up collective ``sequence`` (e.g. its tensor has the wrong dtype): its staged
    buffer is dropped and every rank's ``START`` of it fails at once with ``ABORTED: rank N
    aborted collective #k: reason``. reply ``<I`` sequence.
``ERROR`` 0x7F (reply only)
    ``<HH`` error code (:class:`ErrorCode`), reserved + UTF-8 message naming the problem.

``BUSY`` (connection cap reached) is sent unasked to a connection the server refuses, which
it then closes. Security model, limits and guarantees: ``docs/driver-protocol.md``.

Versioning: the version byte changes whenever a layout changes (2: HELLO carries the job
secret; ABORT. 3: LOAD_CONFIG carries the configuration image set instead of schedule JSON,
CONFIG_ACK the element count instead of the chunk count, and START's third byte carries the
sparse options, reserved before. 4: a sparse START of a scheme the image encodes runs the
loaded image set's sparse program and must match it, no longer one the server compiles for
the request). A server answers a frame of
another version with ``ERROR VERSION_MISMATCH`` (payload names both versions and what
changed) in *its own* framing, which every version keeps (magic, version, type at the same
offsets).
"""
from __future__ import annotations

import os
import secrets
import socket
import struct
import time
import zlib
from enum import IntEnum

MAGIC = b"TNIC"
PROTOCOL_VERSION = 4             # 4: sparse START runs the loaded set's program (VERSION_CHANGES)
#: What each version changed, for the VERSION_MISMATCH message an older or newer peer gets.
VERSION_CHANGES = {2: "HELLO carries the job secret; ABORT",
                   3: "LOAD_CONFIG carries the configuration image set, not schedule JSON; "
                      "START carries the sparse options",
                   4: "a sparse START runs the sparse program of the loaded image set "
                      "(LOAD_CONFIG the request's sparse set first), none compiled for it"}
HEADER = struct.Struct("<4sBBHII")
CRC = struct.Struct("<I")
MAX_PAYLOAD = 1 << 30            # 1 GiB: 256 M float32 elements per buffer
#: Largest payload a connection may send before its HELLO is accepted: a stranger cannot make
#: the server buffer more than this (HELLO is 8 bytes + secret + a short client name).
MAX_PAYLOAD_BEFORE_HELLO = 4096
#: Payloads are received in pieces of at most this size, so memory grows only as fast as the
#: peer actually sends bytes (a header declaring 1 GiB costs nothing until 1 GiB arrives).
RECV_PIECE = 1 << 20
FLAG_REPLY = 0x1
CYCLES_UNKNOWN = (1 << 64) - 1

DTYPE_FLOAT32 = 1
BUF_GRADIENT = 0
BUF_RESULT = 0
BUF_RESIDUAL = 1
MODE_DENSE = 0
MODE_SPARSE = 1
#: LOAD_CONFIG image kind: a serialized :class:`treenic.firmware.image.ImageSet`. (Kind 1,
#: treenic-schedule JSON, was protocol version 2's and is refused.)
IMAGE_SET = 2
#: Largest image set LOAD_CONFIG may carry (bytes); a 64-node torus set is about 0.2 MiB.
MAX_IMAGE_SET_BYTES = 4 << 20
#: START's sparse options byte: (option, value that sets the bit) per bit, bit 0 first
SPARSE_OPTION_BITS = (("residual", "global"), ("flow_assignment", "hash"))
ENGINE_IDS = {"golden": 0, "rtl": 1}


class Msg(IntEnum):
    HELLO = 0x01
    LOAD_CONFIG = 0x02
    WRITE_BUFFER = 0x03
    START = 0x04
    READ_BUFFER = 0x05
    STATUS = 0x06
    BYE = 0x07
    ABORT = 0x08
    HELLO_ACK = 0x81
    CONFIG_ACK = 0x82
    WRITE_ACK = 0x83
    COMPLETE = 0x84
    BUFFER_DATA = 0x85
    STATUS_REPLY = 0x86
    BYE_ACK = 0x87
    ABORT_ACK = 0x88
    ERROR = 0x7F


class ErrorCode(IntEnum):
    BAD_MAGIC = 1          # framing lost: connection closed
    VERSION_MISMATCH = 2   # header or HELLO version differs
    BAD_CRC = 3
    FRAME_TOO_LARGE = 4    # framing lost: connection closed
    UNKNOWN_TYPE = 5
    BAD_PAYLOAD = 6        # payload too short/long for its type, bad field
    NOT_READY = 7          # HELLO missing, no config loaded, or no sparse program in it
    BAD_RANK = 8           # rank outside 0..world-1 or already connected
    WORLD_MISMATCH = 9
    CONFIG_MISMATCH = 10   # ranks' configs differ, or a sparse START not the loaded program
    BAD_CONFIG = 11        # image does not parse / wrong node count / CRC
    UNSUPPORTED_DTYPE = 12
    SIZE_MISMATCH = 13     # ranks wrote buffers of different sizes
    SEQUENCE = 14          # unknown / out-of-order collective sequence number
    ABORTED = 15           # collective aborted because of another rank's error
    TIMEOUT = 16           # server gave up waiting for the other ranks
    ENGINE = 17            # the fabric engine failed
    INTERNAL = 18
    BUSY = 19              # connection cap reached: connection closed
    AUTH = 20              # HELLO without the fabric's job secret


REQUEST_REPLY = {Msg.HELLO: Msg.HELLO_ACK, Msg.LOAD_CONFIG: Msg.CONFIG_ACK,
                 Msg.WRITE_BUFFER: Msg.WRITE_ACK, Msg.START: Msg.COMPLETE,
                 Msg.READ_BUFFER: Msg.BUFFER_DATA, Msg.STATUS: Msg.STATUS_REPLY,
                 Msg.BYE: Msg.BYE_ACK, Msg.ABORT: Msg.ABORT_ACK}

# payload layouts
HELLO = struct.Struct("<HHHH32s")         # version, rank, world, reserved, job secret
HELLO_ACK = struct.Struct("<HHHH")
LOAD_CONFIG = struct.Struct("<II")
CONFIG_ACK = struct.Struct("<IIII")      # config id, nodes, steps, elements
BUFFER = struct.Struct("<IBBHQ")          # WRITE_BUFFER and BUFFER_DATA
WRITE_ACK = struct.Struct("<IQ")
START = struct.Struct("<IBBHdQ")
COMPLETE = struct.Struct("<IIQQQ")
READ_BUFFER = struct.Struct("<IB")
STATUS_REPLY = struct.Struct("<IIQQQQQQ")
ERROR = struct.Struct("<HH")
ABORT = struct.Struct("<I")               # sequence + UTF-8 reason
MAX_ABORT_REASON = 1024

#: Per message type, the largest payload a receiver accepts (checked on the frame header,
#: before the payload is received); other types: :data:`MAX_PAYLOAD`.
PAYLOAD_LIMITS = {Msg.LOAD_CONFIG: LOAD_CONFIG.size + MAX_IMAGE_SET_BYTES}


def pack_sparse_options(options: dict) -> int:
    """START's sparse options byte of validated options (missing: the default, bit 0)."""
    return sum(1 << bit for bit, (key, value) in enumerate(SPARSE_OPTION_BITS)
               if options.get(key) == value)


def unpack_sparse_options(byte: int) -> dict | None:
    """The options a START byte names (every option, defaults included); None when a bit
    outside :data:`SPARSE_OPTION_BITS` is set."""
    if byte >> len(SPARSE_OPTION_BITS):
        return None
    from .fabric import SPARSE_OPTIONS
    return {key: (value if byte >> bit & 1 else SPARSE_OPTIONS[key][0])
            for bit, (key, value) in enumerate(SPARSE_OPTION_BITS)}


#: Job secret: 32 random bytes, written as 64 hex digits outside the protocol.
SECRET_BYTES = 32
#: Environment variable a rank reads its job secret from when none is passed explicitly.
SECRET_ENV = "TREENIC_FABRIC_SECRET"


def new_secret() -> str:
    """A fresh job secret (64 hex digits) for whoever starts a fabric."""
    return secrets.token_hex(SECRET_BYTES)


def secret_bytes(secret: str | bytes | None) -> bytes:
    """The 32 bytes of a job secret given as 64 hex digits (or raw bytes); ``None`` reads
    :data:`SECRET_ENV`. Raises ValueError naming the problem (never the secret)."""
    if secret is None:
        secret = os.environ.get(SECRET_ENV)
        if not secret:
            raise ValueError(f"no job secret: pass secret= or set {SECRET_ENV} (whoever "
                             "starts the fabric generates it)")
    if isinstance(secret, bytes) and len(secret) == SECRET_BYTES:
        return secret
    try:
        raw = bytes.fromhex(secret.strip() if isinstance(secret, str) else "")
    except ValueError:
        raw = b""
    if len(raw) != SECRET_BYTES:
        raise ValueError(f"a job secret is {2 * SECRET_BYTES} hex digits")
    return raw


class ProtocolError(Exception):
    """A frame that violates the protocol (raised by the decoder, carries an ErrorCode)."""

    def __init__(self, code: ErrorCode, message: str, fatal: bool = False):
        super().__init__(f"{code.name}: {message}")
        self.code = ErrorCode(code)
        self.message = message
        self.fatal = fatal            # framing lost: the connection must be closed


class ConnectionClosed(Exception):
    """The peer closed the connection (EOF before a complete frame)."""


def encode(msg: int, payload: bytes = b"", tag: int = 0, *, reply: bool = False,
           version: int = PROTOCOL_VERSION) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(ErrorCode.FRAME_TOO_LARGE,
                            f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    head = HEADER.pack(MAGIC, version, int(msg), FLAG_REPLY if reply else 0,
                       tag & 0xFFFFFFFF, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((head, payload, CRC.pack(crc)))


def _recv_exact(sock: socket.socket, n: int, *, started: bool = False,
                deadline: float | None = None) -> bytes:
    """Receive exactly ``n`` bytes, growing the buffer piece by piece as bytes arrive. With a
    ``deadline`` (``time.monotonic()``) the whole read must finish by then: a peer trickling
    one byte at a time cannot hold the reader longer (``socket.timeout``)."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"frame not complete by its deadline ({len(buf)} of {n} "
                                     "bytes)")
            sock.settimeout(left)
        piece = sock.recv(min(n - len(buf), RECV_PIECE))
        if not piece:
            raise ConnectionClosed("connection closed by peer"
                                   + (" in the middle of a frame" if buf or started else ""))
        buf += piece
    return bytes(buf)


def read_frame(sock: socket.socket, max_payload: int = MAX_PAYLOAD, *,
               deadline: float | None = None, frame_seconds: float | None = None):
    """Read one frame: returns ``(msg_type, tag, flags, payload)``.

    ``max_payload`` bounds the declared payload length (the server passes
    :data:`MAX_PAYLOAD_BEFORE_HELLO` until the connection's HELLO is accepted). ``deadline``
    bounds the whole frame; ``frame_seconds`` bounds the rest of the frame once its first
    bytes arrived (both ``socket.timeout``). Raises
    :class:`ProtocolError` (``fatal`` when the framing can no longer be trusted),
    :class:`ConnectionClosed` on EOF and ``socket.timeout`` from the socket.
    """
    head = _recv_exact(sock, HEADER.size, deadline=deadline)
    if frame_seconds is not None:
        rest = time.monotonic() + frame_seconds
        deadline = rest if deadline is None else min(deadline, rest)
    magic, version, msg, flags, tag, length = HEADER.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(ErrorCode.BAD_MAGIC, f"bad magic {magic!r} (expected {MAGIC!r})",
                            fatal=True)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.VERSION_MISMATCH, version_mismatch(version), fatal=True)
    if length > max_payload:
        limit = "" if max_payload == MAX_PAYLOAD else " allowed before HELLO"
        raise ProtocolError(ErrorCode.FRAME_TOO_LARGE,
                            f"payload length {length} exceeds the {max_payload} bytes{limit}",
                            fatal=True)
    if length > PAYLOAD_LIMITS.get(msg, MAX_PAYLOAD):
        raise ProtocolError(ErrorCode.FRAME_TOO_LARGE,
                            f"{_type_name(msg)} payload length {length} exceeds its "
                            f"{PAYLOAD_LIMITS[msg]} bytes", fatal=True)
    payload = _recv_exact(sock, length, started=True, deadline=deadline)
    (crc,) = CRC.unpack(_recv_exact(sock, CRC.size, started=True, deadline=deadline))
    want = zlib.crc32(payload, zlib.crc32(head))
    if crc != want:
        raise ProtocolError(ErrorCode.BAD_CRC,
                            f"CRC-32 mismatch on {_type_name(msg)} frame "
                            f"(got {crc:#010x}, computed {want:#010x})")
    return msg, tag, flags, payload


def version_mismatch(version: int) -> str:
    """The VERSION_MISMATCH text for a peer speaking ``version``: both versions, and what
    changed in between (an old client learns why it must be updated)."""
    text = f"frame has protocol version {version}, this end speaks {PROTOCOL_VERSION}"
    changes = [f"{v}: {VERSION_CHANGES[v]}" for v in sorted(VERSION_CHANGES)
               if min(version, PROTOCOL_VERSION) < v <= max(version, PROTOCOL_VERSION)]
    return text + (f" (changed in version {'; '.join(changes)})" if changes else "")


def _type_name(msg: int) -> str:
    try:
        return Msg(msg).name
    except ValueError:
        return f"type {msg:#04x}"


def unpack(layout: struct.Struct, payload: bytes, what: str, *, exact: bool = True):
    """Unpack the fixed part of ``payload``; returns ``(fields, rest)`` or raises BAD_PAYLOAD."""
    if len(payload) < layout.size or (exact and len(payload) != layout.size):
        raise ProtocolError(ErrorCode.BAD_PAYLOAD,
                            f"{what} payload is {len(payload)} bytes, expected "
                            f"{'' if exact else 'at least '}{layout.size}")
    return layout.unpack_from(payload), payload[layout.size:]


def error_payload(code: ErrorCode, message: str) -> bytes:
    return ERROR.pack(int(code), 0) + message.encode("utf-8", "replace")[:65536]


def decode_error(payload: bytes) -> tuple[ErrorCode | int, str]:
    if len(payload) < ERROR.size:
        return ErrorCode.INTERNAL, f"malformed ERROR payload ({len(payload)} bytes)"
    code, _ = ERROR.unpack_from(payload)
    try:
        code = ErrorCode(code)
    except ValueError:
        pass
    return code, payload[ERROR.size:].decode("utf-8", "replace")
