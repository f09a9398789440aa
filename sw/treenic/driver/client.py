"""Client side of the host protocol: one rank talking to its NIC (fabric server or board)."""
from __future__ import annotations

import itertools
import socket
import time
import zlib

import numpy as np

from . import protocol as P
from .fabric import check_sparse_request
from .errors import DriverError, FabricDisconnected, FabricError, FabricTimeout, \
    RTLFabricUnavailable


class NICClient:
    """Blocking request/reply client. Every call is bounded by ``timeout`` seconds; a silent
    server raises :class:`FabricTimeout` naming the rank, the collective and the step."""

    def __init__(self, address, rank: int, world: int, timeout: float = 30.0,
                 connect_timeout: float = 10.0, name: str = "treenic-driver",
                 secret: str | bytes | None = None):
        try:
            secret = P.secret_bytes(secret)      # explicit, else $TREENIC_FABRIC_SECRET
        except ValueError as e:
            raise DriverError(f"rank {rank}: {e}") from None
        self.address = (address[0], int(address[1]))
        self.rank, self.world = rank, world
        self.timeout = timeout
        self._tags = itertools.count(1)
        deadline = time.monotonic() + connect_timeout
        last = None
        while True:
            try:
                self.sock = socket.create_connection(self.address, timeout=min(2.0, timeout))
                break
            except OSError as e:
                last = e
                if time.monotonic() > deadline:
                    raise FabricDisconnected(f"rank {rank}: cannot connect to the fabric at "
                                             f"{self.address[0]}:{self.address[1]} ({last})") \
                        from None
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self.host_tx = 0
        self.host_rx = 0
        (ver, nodes, engine_id, _), desc = self._request(
            P.Msg.HELLO, P.HELLO.pack(P.PROTOCOL_VERSION, rank, world, 0, secret) + name.encode(),
            what="HELLO", layout=P.HELLO_ACK)
        self.nodes = nodes
        self.engine_id = engine_id
        self.engine_description = desc.decode("utf-8", "replace")

    # ---- transport ------------------------------------------------------------------------
    def _request(self, msg, payload: bytes, *, what: str, layout=None, exact=False):
        tag = next(self._tags) & 0xFFFFFFFF
        frame = P.encode(msg, payload, tag)
        try:
            self.sock.sendall(frame)
            self.host_tx += len(frame)
            rmsg, rtag, _, rpayload = P.read_frame(self.sock)
        except socket.timeout:
            raise FabricTimeout(f"rank {self.rank}: fabric server at {self.address[0]}:"
                                f"{self.address[1]} did not answer within {self.timeout:.1f}s "
                                f"at {what}") from None
        except (P.ConnectionClosed, ConnectionError, OSError) as e:
            raise FabricDisconnected(f"rank {self.rank}: fabric server at {self.address[0]}:"
                                     f"{self.address[1]} closed the connection at {what} "
                                     f"({e})") from None
        except P.ProtocolError as e:
            raise FabricError(f"rank {self.rank}: malformed reply at {what}: {e}",
                              code=e.code.name) from None
        self.host_rx += len(rpayload) + P.HEADER.size + P.CRC.size
        if rmsg == P.Msg.ERROR:
            code, text = P.decode_error(rpayload)
            cname = code.name if isinstance(code, P.ErrorCode) else str(code)
            message = f"rank {self.rank}: fabric server refused {what}: {cname}: {text}"
            if code == P.ErrorCode.TIMEOUT:
                raise FabricTimeout(message, code=cname)
            if code == P.ErrorCode.ENGINE and "RTL fabric engine unavailable" in text:
                raise RTLFabricUnavailable(message, code=cname)
            raise FabricError(message, code=cname)
        if rtag != tag or rmsg != P.REQUEST_REPLY[msg]:
            raise FabricError(f"rank {self.rank}: unexpected reply {rmsg:#04x}/tag {rtag} to "
                              f"{what} (tag {tag})")
        if layout is None:
            return rpayload
        try:
            return P.unpack(layout, rpayload, what, exact=exact)
        except P.ProtocolError as e:
            raise FabricError(f"rank {self.rank}: malformed reply to {what}: {e}") from None

    # ---- operations -----------------------------------------------------------------------
    def load_config(self, image_set: bytes, what: str = "LOAD_CONFIG"):
        """Load the configuration image set (:meth:`treenic.firmware.image.ImageSet.to_bytes`)
        into this rank's NIC; returns ``(config id, steps, elements)``. The id is the
        CRC-32 of ``image_set``; the fabric must acknowledge it for this world. ``what`` names
        the request in errors (e.g. the collective that needed it)."""
        crc = zlib.crc32(image_set)
        (cid, nodes, steps, elements), _ = self._request(
            P.Msg.LOAD_CONFIG, P.LOAD_CONFIG.pack(P.IMAGE_SET, crc) + image_set,
            what=what, layout=P.CONFIG_ACK, exact=True)
        if cid != crc or nodes != self.world:
            raise FabricError(f"rank {self.rank}: the fabric acknowledged config "
                              f"{cid:#010x} for {nodes} nodes, but this rank loaded "
                              f"{crc:#010x} for {self.world}", code="CONFIG_MISMATCH")
        return cid, steps, elements

    def collective(self, seq: int, data: np.ndarray, *, sparse: tuple | None = None):
        """Run collective ``seq`` on ``data`` ((E,) float32). ``sparse`` = (scheme, density,
        seed[, options]) for a sparse one (options: :data:`~treenic.driver.fabric.
        SPARSE_OPTIONS`, validated here). Returns (result, residual|None, complete_fields)."""
        if data.dtype != np.float32 or data.ndim != 1:
            raise DriverError(f"rank {self.rank}: buffers must be 1-D float32, got "
                              f"{data.dtype}{data.shape}")
        raw = np.ascontiguousarray(data, dtype="<f4").tobytes()
        self._request(P.Msg.WRITE_BUFFER,
                      P.BUFFER.pack(seq, P.DTYPE_FLOAT32, P.BUF_GRADIENT, 0, data.shape[0]) + raw,
                      what=f"collective #{seq} step WRITE_BUFFER", layout=P.WRITE_ACK, exact=True)
        if sparse is None:
            start = P.START.pack(seq, P.MODE_DENSE, 0, 0, 0.0, 0)
        else:
            scheme, density, seed, *rest = sparse
            options = check_sparse_request(scheme, rest[0] if rest else None, None)
            name = scheme.encode()
            start = P.START.pack(seq, P.MODE_SPARSE, P.pack_sparse_options(options),
                                 len(name), float(density), int(seed)) + name
        (rseq, steps, cycles, sent, recv), _ = self._request(
            P.Msg.START, start, what=f"collective #{seq} step START", layout=P.COMPLETE,
            exact=True)
        result = self._read(seq, P.BUF_RESULT, data.shape[0])
        residual = self._read(seq, P.BUF_RESIDUAL, data.shape[0]) if sparse else None
        return result, residual, dict(steps=steps, sent=sent, received=recv,
                                      cycles=None if cycles == P.CYCLES_UNKNOWN else cycles)

    def _read(self, seq, which, count):
        (rseq, dtype, rwhich, _, rcount), data = self._request(
            P.Msg.READ_BUFFER, P.READ_BUFFER.pack(seq, which),
            what=f"collective #{seq} step READ_BUFFER", layout=P.BUFFER)
        if (rseq, dtype, rwhich, rcount) != (seq, P.DTYPE_FLOAT32, which, count) or \
                len(data) != 4 * count:
            raise FabricError(f"rank {self.rank}: BUFFER_DATA for collective #{seq} does not "
                              f"match the request ({rseq}, {dtype}, {rwhich}, {rcount})")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)

    def abort(self, seq: int, reason: str) -> None:
        """Give up collective ``seq``: every other rank's part of it fails at once with
        ``reason``, naming this rank."""
        self._request(P.Msg.ABORT, P.ABORT.pack(seq) + reason.encode()[:P.MAX_ABORT_REASON],
                      what=f"collective #{seq} step ABORT", layout=P.ABORT, exact=True)

    def status(self) -> dict:
        fields, _ = self._request(P.Msg.STATUS, b"", what="STATUS", layout=P.STATUS_REPLY,
                                  exact=True)
        keys = ("state", "config_id", "collectives", "host_rx", "host_tx", "link_tx",
                "link_rx", "cycles")
        return dict(zip(keys, fields))

    def close(self) -> None:
        try:
            self.sock.settimeout(min(self.timeout, 2.0))
            self._request(P.Msg.BYE, b"", what="BYE")
        except FabricError:
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass
