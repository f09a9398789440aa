"""Fabric server: one process simulating N NICs and their links (backend ``rtl``).

Each training process connects to it over loopback TCP and speaks the host protocol of
:mod:`treenic.driver.protocol` — the protocol a board speaks over Ethernet. The fabric engine
is pluggable (:mod:`treenic.driver.fabric`): ``rtl`` (Verilated NIC fabric, when built) or
``golden`` (golden executor).

Run it by hand::

    python -m treenic.driver.server --nodes 4 --engine golden --port 0

It prints ``LISTENING <host> <port> <engine>`` on its first stdout line and serves until
killed or until ``--idle-exit`` seconds pass without a connection. Robustness rules: a bad
frame, a wrong version, a wrong size or dtype gets an ``ERROR`` reply naming the problem and
changes nothing; a connection thread never takes the server down; every wait is bounded.
"""
from __future__ import annotations

import argparse
import errno
import hmac
import os
import socket
import subprocess
import sys
import threading
import time
import zlib

import numpy as np

from . import protocol as P
from .config import ConfigRejected
from .errors import DriverError, FabricError, FabricTimeout, RTLFabricUnavailable
from .fabric import (RTL_MODULE, SCHEMES_WITH_OPTIONS, SPARSE_OPTIONS, GoldenEngine, Request,
                     Rendezvous, check_sparse_request, loaded_engine, sparse_request_refusal)

LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: Loaded configurations no rank holds that the server keeps built (oldest dropped first)
CONFIGS_KEPT = 16
ENGINE_DESCRIPTIONS = {"golden": GoldenEngine.description,
                       "rtl": f"Verilated NIC fabric ({RTL_MODULE})"}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _Reply(Exception):
    """Internal: abort handling of one request with an ERROR reply."""

    def __init__(self, code: P.ErrorCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class FabricServer:
    def __init__(self, nodes: int, engine: str = "golden", host: str = "127.0.0.1",
                 port: int = 0, collective_timeout: float = 60.0, idle_timeout: float = 600.0,
                 *, hello_timeout: float = 5.0, frame_timeout: float = 120.0,
                 max_connections: int | None = None, secret: str | bytes | None = None):
        if host not in LOOPBACK:
            raise DriverError(f"the fabric server binds loopback only, not {host!r}")
        if nodes < 2:
            raise DriverError(f"a fabric needs at least 2 nodes, got {nodes}")
        self.nodes = nodes
        # The job secret every HELLO must carry: given by whoever starts the fabric, or
        # generated here (read it from .secret and hand it to the ranks out of band).
        self.secret = P.new_secret() if secret is None else P.secret_bytes(secret).hex()
        self._secret = bytes.fromhex(self.secret)
        self.engine_name = engine
        self.collective_timeout = collective_timeout
        self.idle_timeout = idle_timeout
        self.hello_timeout = hello_timeout        # whole handshake of a new connection
        self.frame_timeout = frame_timeout        # rest of a frame once its header arrived
        # every rank plus as many again connecting or leaving, plus a few for tools
        self.max_connections = max_connections or 2 * nodes + 8
        if self.max_connections < nodes:
            raise DriverError(f"max_connections {self.max_connections} < {nodes} nodes")
        self.connections = 0
        self.lock = threading.Lock()
        # Loaded configurations by config id: (image, schedule, engine). Each rank holds its
        # own (ctx["config"]); a collective runs only when all ranks hold the same one.
        self.configs: dict[int, tuple] = {}
        self.build_lock = threading.Lock()        # one configuration built at a time; never
        self.engine = None                        # held together with self.lock
        self.rendezvous = Rendezvous(nodes, None, None, collective_timeout)
        self.engine_error: str | None = None
        self.ranks: dict[int, object] = {}
        self.nic = [dict(host_rx=0, host_tx=0, link_tx=0, link_rx=0, cycles=0, collectives=0)
                    for _ in range(nodes)]
        self.errors = 0
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.address = self.sock.getsockname()[:2]
        self._stop = threading.Event()
        self.last_activity = time.monotonic()

    # ---- lifecycle ------------------------------------------------------------------------
    def serve_forever(self, idle_exit: float | None = None) -> None:
        self.sock.settimeout(0.5)
        why = "stopped"
        try:
            while not self._stop.is_set():
                if idle_exit and not self.ranks and \
                        time.monotonic() - self.last_activity > idle_exit:
                    why = f"no client for {idle_exit:g}s (--idle-exit)"
                    break
                try:
                    conn, _ = self.sock.accept()
                except socket.timeout:
                    continue
                except OSError as e:
                    if self._stop.is_set():
                        break
                    # EMFILE/ENFILE/ENOBUFS/ECONNABORTED...: transient; the listening socket
                    # is fine. Say so (rate-limited) and keep serving the connected ranks.
                    self._log_accept_error(e)
                    time.sleep(0.1)
                    continue
                self.last_activity = time.monotonic()
                self._admit(conn)
        finally:
            self.sock.close()
            if why != "stopped":                  # stop() is the owner's own decision
                log(f"treenic fabric server: exiting ({why})")

    def _log_accept_error(self, e: OSError) -> None:
        now = time.monotonic()
        if now - getattr(self, "_last_accept_log", -1e9) >= 5.0:
            self._last_accept_log = now
            name = errno.errorcode.get(e.errno, str(e.errno))
            log(f"treenic fabric server: accept failed ({name}: {e.strerror}); "
                f"{self.connections} connections open; still serving, retrying")

    def _admit(self, conn: socket.socket) -> None:
        """Serve ``conn`` in its own thread, or refuse it (BUSY) when the cap is reached."""
        with self.lock:
            full = self.connections >= self.max_connections
            if not full:
                self.connections += 1
        if full:
            try:
                conn.settimeout(1.0)
                conn.sendall(P.encode(P.Msg.ERROR, P.error_payload(
                    P.ErrorCode.BUSY, f"connection cap of {self.max_connections} reached"),
                    0, reply=True))
            except OSError:
                pass
            conn.close()
            return
        try:
            threading.Thread(target=self._serve_conn, args=(conn,), daemon=True).start()
        except RuntimeError:                  # cannot start a thread: refuse, keep serving
            with self.lock:
                self.connections -= 1
            conn.close()

    @property
    def endpoint(self) -> dict:
        """``open_nic("rtl", ..., **endpoint)``: the address and the job secret."""
        return {"address": tuple(self.address), "secret": self.secret}

    def start_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()

    # ---- one connection -------------------------------------------------------------------
    def _serve_conn(self, conn: socket.socket) -> None:
        ctx = {"rank": None, "staged": {}, "done": {}, "conn": conn}
        # a new connection has hello_timeout seconds in all to get its HELLO accepted
        hello_deadline = time.monotonic() + self.hello_timeout
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._stop.is_set():
                try:
                    if ctx["rank"] is None:
                        msg, tag, flags, payload = P.read_frame(
                            conn, P.MAX_PAYLOAD_BEFORE_HELLO, deadline=hello_deadline)
                    else:
                        conn.settimeout(self.idle_timeout)
                        msg, tag, flags, payload = P.read_frame(
                            conn, frame_seconds=self.frame_timeout)
                except P.ProtocolError as e:
                    self._send(conn, P.Msg.ERROR, P.error_payload(e.code, e.message), 0)
                    if e.fatal:
                        return
                    continue
                self.last_activity = time.monotonic()
                if msg == P.Msg.BYE:
                    # release the rank before acknowledging: a client that reconnects right
                    # after BYE_ACK must find its rank free. An orderly leave aborts nothing:
                    # ranks reopen their communicator between phases, not in lockstep.
                    ctx["bye"] = True
                    self._release(ctx)
                    self._send(conn, P.Msg.BYE_ACK, b"", tag)
                    return
                try:
                    rmsg, rpayload = self._handle(ctx, msg, payload)
                except _Reply as e:
                    self.errors += 1
                    rmsg, rpayload = P.Msg.ERROR, P.error_payload(e.code, e.message)
                except Exception as e:        # never let a request take the server down
                    self.errors += 1
                    rmsg, rpayload = P.Msg.ERROR, P.error_payload(
                        P.ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
                self._send(conn, rmsg, rpayload, tag)
                if ctx.get("auth_failed"):
                    return                          # no second guess on this connection
        except (P.ConnectionClosed, socket.timeout, OSError):
            pass
        finally:
            self._release(ctx)
            with self.lock:
                self.connections -= 1
            try:
                conn.close()
            except OSError:
                pass

    def _send(self, conn, msg, payload, tag) -> None:
        frame = P.encode(msg, payload, tag, reply=True)
        conn.settimeout(self.idle_timeout)     # a peer that stops reading is dropped too
        conn.sendall(frame)

    def _release(self, ctx) -> None:
        """Unbind a connection's rank (idempotent). A connection that closed without BYE (a
        crashed or killed rank) aborts its peers' collectives at once: it cannot contribute,
        so nobody waits for the timeout."""
        with self.lock:              # with HELLO's rejoin: a new connection of the same
            rank = ctx["rank"]       # rank is never marked departed by an old one
            if rank is None or self.ranks.get(rank) is not ctx:
                return
            del self.ranks[rank]
            if not ctx.get("bye"):
                self.rendezvous.abort_rank(rank, "disconnected")
            if not self.ranks:
                self.rendezvous.forget_departed()

    def _handle(self, ctx, msg, payload):
        try:
            msg = P.Msg(msg)
        except ValueError:
            raise _Reply(P.ErrorCode.UNKNOWN_TYPE, f"unknown message type {msg:#04x}") from None
        if msg not in P.REQUEST_REPLY:
            raise _Reply(P.ErrorCode.UNKNOWN_TYPE, f"{msg.name} is not a request")
        try:
            if msg == P.Msg.HELLO:
                return self._hello(ctx, payload)
            if ctx["rank"] is None:
                raise _Reply(P.ErrorCode.NOT_READY, f"{msg.name} before HELLO")
            rank = ctx["rank"]
            nic = self.nic[rank]
            nic["host_rx"] += len(payload) + P.HEADER.size + P.CRC.size
            if msg == P.Msg.LOAD_CONFIG:
                return self._load_config(ctx, payload)
            if msg == P.Msg.WRITE_BUFFER:
                return self._write(ctx, payload)
            if msg == P.Msg.START:
                return self._start(ctx, payload)
            if msg == P.Msg.READ_BUFFER:
                return self._read(ctx, payload)
            if msg == P.Msg.STATUS:
                return self._status(ctx, payload)
            if msg == P.Msg.ABORT:
                return self._abort(ctx, payload)
        except P.ProtocolError as e:
            raise _Reply(e.code, e.message) from None
        raise _Reply(P.ErrorCode.UNKNOWN_TYPE, f"unhandled {msg.name}")

    def _hello(self, ctx, payload):
        (version, rank, world, _, secret), name = P.unpack(P.HELLO, payload, "HELLO",
                                                           exact=False)
        # constant-time compare; the reply never says more than "wrong" (nor echoes it)
        if not hmac.compare_digest(secret, self._secret):
            ctx["auth_failed"] = True
            raise _Reply(P.ErrorCode.AUTH, "HELLO without this fabric's job secret")
        if version != P.PROTOCOL_VERSION:
            raise _Reply(P.ErrorCode.VERSION_MISMATCH,
                         f"client speaks protocol version {version}, server speaks "
                         f"{P.PROTOCOL_VERSION}")
        if world != self.nodes:
            raise _Reply(P.ErrorCode.WORLD_MISMATCH,
                         f"client world size {world} != {self.nodes} NICs in this fabric")
        if not 0 <= rank < world:
            raise _Reply(P.ErrorCode.BAD_RANK, f"rank {rank} outside 0..{world - 1}")
        with self.lock:
            if ctx["rank"] is not None:
                raise _Reply(P.ErrorCode.BAD_RANK, f"connection already bound to rank "
                                                   f"{ctx['rank']}")
            if rank in self.ranks:
                raise _Reply(P.ErrorCode.BAD_RANK, f"rank {rank} is already connected")
            self.ranks[rank] = ctx
            ctx["rank"] = rank
            ctx["name"] = name.decode("utf-8", "replace")
            self.rendezvous.rejoin(rank)
        desc = (self.engine.description if self.engine is not None
                else ENGINE_DESCRIPTIONS[self.engine_name])
        return P.Msg.HELLO_ACK, P.HELLO_ACK.pack(P.PROTOCOL_VERSION, self.nodes,
                                                 P.ENGINE_IDS[self.engine_name], 0) + \
            desc.encode()

    def _load_config(self, ctx, payload):
        (kind, crc), image = P.unpack(P.LOAD_CONFIG, payload, "LOAD_CONFIG", exact=False)
        if kind != P.IMAGE_SET:
            raise _Reply(P.ErrorCode.BAD_CONFIG, f"unknown config image kind {kind}: protocol "
                         f"version {P.PROTOCOL_VERSION} loads image sets (kind {P.IMAGE_SET})")
        if zlib.crc32(image) != crc:
            raise _Reply(P.ErrorCode.BAD_CONFIG, f"config image CRC-32 {zlib.crc32(image):#010x}"
                                                 f" != declared {crc:#010x}")
        config = self._config(crc, image)
        ctx["config"] = config
        _, schedule, engine = config
        return P.Msg.CONFIG_ACK, P.CONFIG_ACK.pack(crc, schedule.n, schedule.steps,
                                                   engine.images.elements)

    def _config(self, crc: int, image: bytes) -> tuple:
        """``(config id, schedule, engine)`` of an image set: cached, or decoded, bounded,
        checked and built under build_lock only -- HELLO and the other ranks never wait for
        a build. ``schedule`` is the one the set's rows describe (link bytes, steps)."""
        with self.build_lock:
            cached = self.configs.get(crc)
            if cached is not None and cached[0] == image:
                return (crc,) + cached[1:]
            try:
                schedule, engine = loaded_engine(self.engine_name, image, self.nodes)
                engine.config_id = crc
            except ConfigRejected as e:
                raise _Reply(P.ErrorCode.BAD_CONFIG, str(e)) from None
            except RTLFabricUnavailable as e:
                raise _Reply(P.ErrorCode.ENGINE, str(e)) from None
            with self.lock:
                in_use = {c["config"][0] for c in self.ranks.values() if c.get("config")}
                # bounded: unused ones, oldest first. An image set is for one element count
                # and a training job's buckets alternate between a few counts, so keep
                # that many built (an RTL engine holds its Verilated fabric)
                unused = [k for k in self.configs if k not in in_use]
                for old in unused[:max(0, len(unused) - CONFIGS_KEPT)]:
                    del self.configs[old]
                self.configs[crc] = (image, schedule, engine)
                self.engine = engine
        return crc, schedule, engine

    def _write(self, ctx, payload):
        (seq, dtype, buf_id, _, count), data = P.unpack(P.BUFFER, payload, "WRITE_BUFFER",
                                                        exact=False)
        if dtype != P.DTYPE_FLOAT32:
            raise _Reply(P.ErrorCode.UNSUPPORTED_DTYPE,
                         f"dtype code {dtype} not supported: the reduction unit implements "
                         f"binary32 only (code {P.DTYPE_FLOAT32})")
        if buf_id != P.BUF_GRADIENT:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"unknown buffer id {buf_id}")
        if len(data) != count * 4:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"WRITE_BUFFER declares {count} float32 "
                                                  f"elements but carries {len(data)} bytes")
        if seq in ctx["staged"] or seq in ctx["done"]:
            raise _Reply(P.ErrorCode.SEQUENCE, f"collective #{seq} already written by rank "
                                               f"{ctx['rank']}")
        if len(ctx["staged"]) >= 4:
            raise _Reply(P.ErrorCode.SEQUENCE, "more than 4 collectives staged without START")
        ctx["staged"][seq] = np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)
        return P.Msg.WRITE_ACK, P.WRITE_ACK.pack(seq, count)

    def _start(self, ctx, payload):
        (seq, mode, opt_bits, nlen, density, seed), rest = P.unpack(P.START, payload, "START",
                                                                    exact=False)
        if len(rest) != nlen:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"START name length {nlen} but {len(rest)} "
                                                  "bytes follow")
        if ctx.get("config") is None:
            raise _Reply(P.ErrorCode.NOT_READY, "START before LOAD_CONFIG")
        # every check before the staged buffer is taken: a refused START changes nothing
        if mode == P.MODE_SPARSE:
            if not 0.0 < density <= 1.0:
                raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"density {density} outside (0, 1]")
            try:
                scheme = rest.decode("utf-8")
            except UnicodeDecodeError:
                raise _Reply(P.ErrorCode.BAD_PAYLOAD, "sparse scheme name is not UTF-8") \
                    from None
            options = self._sparse_options(ctx, scheme, opt_bits)
        elif mode != P.MODE_DENSE:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"unknown START mode {mode}")
        elif opt_bits:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"dense START with sparse options "
                                                  f"{opt_bits:#04x} (must be 0)")
        if seq not in ctx["staged"]:
            raise _Reply(P.ErrorCode.SEQUENCE, f"START of collective #{seq} without its "
                                               "WRITE_BUFFER")
        if mode == P.MODE_DENSE:
            _check_config_elements(ctx, seq)
        else:
            _check_sparse_program(ctx, seq, scheme, density, seed, options)
        data = ctx["staged"].pop(seq)
        rank = ctx["rank"]
        if mode == P.MODE_DENSE:
            req = Request("dense", data, config=ctx["config"])
        else:
            req = Request("sparse", data, scheme, density, seed,
                          tuple(sorted(options.items())), config=ctx["config"])
        try:
            out = self.rendezvous.submit(seq, rank, req, alive=lambda: _peer_open(ctx["conn"]))
        except FabricTimeout as e:
            raise _Reply(P.ErrorCode.TIMEOUT, str(e)) from None
        except FabricError as e:
            code = {"SIZE_MISMATCH": P.ErrorCode.SIZE_MISMATCH,
                    "CONFIG_MISMATCH": P.ErrorCode.CONFIG_MISMATCH,
                    "ENGINE": P.ErrorCode.ENGINE}.get(e.code, P.ErrorCode.ABORTED)
            raise _Reply(code, str(e)) from None
        ctx["done"][seq] = out
        while len(ctx["done"]) > 4:                       # bounded: drop the oldest unread
            ctx["done"].pop(next(iter(ctx["done"])))
        nic = self.nic[rank]
        nic["link_tx"] += out.sent
        nic["link_rx"] += out.received
        nic["cycles"] += out.cycles or 0
        nic["collectives"] += 1
        cycles = P.CYCLES_UNKNOWN if out.cycles is None else out.cycles
        return P.Msg.COMPLETE, P.COMPLETE.pack(seq, out.steps, cycles, out.sent, out.received)

    @staticmethod
    def _sparse_options(ctx, scheme: str, opt_bits: int) -> dict:
        """The validated options of a sparse START (before its buffer is taken): unknown
        option bits, options the scheme lacks, a scheme the engine does not run (the
        ``rtl`` engine never hands one to the golden models) are one-line errors."""
        options = P.unpack_sparse_options(opt_bits)
        if options is None:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"START sparse options {opt_bits:#04x} set "
                                                  "undefined bits")
        if scheme not in SCHEMES_WITH_OPTIONS:
            options = {k: v for k, v in options.items() if v != SPARSE_OPTIONS[k][0]}
        _, schedule, engine = ctx["config"]
        try:
            options = check_sparse_request(scheme, options, schedule)
        except DriverError as e:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, str(e)) from None
        reason = engine.sparse_unsupported(scheme, options)
        if reason:
            raise _Reply(P.ErrorCode.ENGINE, reason)
        return options

    def _read(self, ctx, payload):
        (seq, which), _ = P.unpack(P.READ_BUFFER, payload, "READ_BUFFER")
        out = ctx["done"].get(seq)
        if out is None:
            raise _Reply(P.ErrorCode.SEQUENCE, f"collective #{seq} has no result for rank "
                                               f"{ctx['rank']} (not started or already read)")
        if which == P.BUF_RESULT:
            arr = out.result
            out.result = None
        elif which == P.BUF_RESIDUAL:
            if out.residual is None:
                raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"collective #{seq} was dense: no "
                                                      "residual")
            arr = out.residual
            out.residual = None
        else:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"unknown buffer id {which}")
        if arr is None:
            raise _Reply(P.ErrorCode.SEQUENCE, f"buffer {which} of collective #{seq} already "
                                               "read")
        if out.result is None and out.residual is None:
            del ctx["done"][seq]
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        self.nic[ctx["rank"]]["host_tx"] += len(data) + P.BUFFER.size
        return P.Msg.BUFFER_DATA, P.BUFFER.pack(seq, P.DTYPE_FLOAT32, which, 0,
                                                arr.shape[0]) + data

    def _abort(self, ctx, payload):
        (seq,), reason = P.unpack(P.ABORT, payload, "ABORT", exact=False)
        if len(reason) > P.MAX_ABORT_REASON:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"ABORT reason longer than "
                                                  f"{P.MAX_ABORT_REASON} bytes")
        ctx["staged"].pop(seq, None)
        self.rendezvous.fail(seq, ctx["rank"], reason.decode("utf-8", "replace"))
        return P.Msg.ABORT_ACK, P.ABORT.pack(seq)

    def _status(self, ctx, payload):
        if payload:
            raise _Reply(P.ErrorCode.BAD_PAYLOAD, f"STATUS takes no payload, got "
                                                  f"{len(payload)} bytes")
        nic = self.nic[ctx["rank"]]
        busy = self.rendezvous.busy()
        config_id = ctx["config"][0] if ctx.get("config") else 0
        return P.Msg.STATUS_REPLY, P.STATUS_REPLY.pack(
            1 if busy else 0, config_id, nic["collectives"], nic["host_rx"],
            nic["host_tx"], nic["link_tx"], nic["link_rx"], nic["cycles"])


def _check_config_elements(ctx, seq: int) -> None:
    """A dense collective runs the loaded image set, which is for one element count."""
    cid, _, engine = ctx["config"]
    count, want = ctx["staged"][seq].shape[0], engine.images.elements
    if count != want:
        raise _Reply(P.ErrorCode.SIZE_MISMATCH,
                     f"collective #{seq} has {count} elements, the loaded image set "
                     f"{cid:#010x} is for {want}: load the image set for {count} first")


def _check_sparse_program(ctx, seq: int, scheme: str, density: float, seed: int,
                          options: dict) -> None:
    """A sparse collective runs the sparse program of the loaded image set: a request it
    does not match is refused (nothing recompiled, the staged buffer kept)."""
    refusal = sparse_request_refusal(ctx["config"][2], scheme, ctx["staged"][seq].shape[0],
                                     density, seed, options)
    if refusal:
        code, text = refusal
        raise _Reply(P.ErrorCode[code], f"collective #{seq}: {text}")


def _peer_open(conn: socket.socket) -> bool:
    """False once the peer closed (or reset) ``conn``; never blocks, never consumes data."""
    # called by the connection's own thread; a socket with a timeout would wait in recv
    timeout = conn.gettimeout()
    try:
        conn.setblocking(False)
        return conn.recv(1, socket.MSG_PEEK) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    finally:
        try:
            conn.settimeout(timeout)
        except OSError:
            pass


# ---- a server in its own process ----------------------------------------------------------

class ServerProcess:
    """A fabric server subprocess (``python -m treenic.driver.server``)."""

    def __init__(self, nodes: int, engine: str = "golden", *, collective_timeout: float = 60.0,
                 idle_exit: float = 600.0, startup_timeout: float = 30.0):
        #: the job secret (64 hex digits): give it to the ranks (open_nic ``secret=``)
        self.secret = P.new_secret()
        env = dict(os.environ, **{P.SECRET_ENV: self.secret})
        cmd = [sys.executable, "-m", "treenic.driver.server", "--nodes", str(nodes),
               "--engine", engine, "--port", "0", "--collective-timeout",
               str(collective_timeout), "--idle-exit", str(idle_exit)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        line = _readline_with_timeout(self.proc, startup_timeout)
        parts = line.split()
        if len(parts) < 3 or parts[0] != "LISTENING":
            err = ""
            if self.proc.poll() is not None:
                err = self.proc.stderr.read()[-2000:]
            self.stop()
            raise DriverError(f"fabric server did not start: {line!r} {err}")
        self.address = (parts[1], int(parts[2]))
        self.engine = engine

    @property
    def endpoint(self) -> dict:
        """``open_nic("rtl", ..., **endpoint)``: the address and the job secret."""
        return {"address": tuple(self.address), "secret": self.secret}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _readline_with_timeout(proc, timeout: float) -> str:
    out = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0].strip() if out else ""


def _job_secret(path: str | None) -> tuple[str, str | None]:
    """(secret, file it was written to or None): from ``path``, the environment, or fresh."""
    if path is None and os.environ.get(P.SECRET_ENV):
        return P.secret_bytes(os.environ[P.SECRET_ENV]).hex(), None
    if path is not None and os.path.exists(path):
        with open(path) as f:
            return P.secret_bytes(f.read()).hex(), None
    if path is None:
        import tempfile
        path = os.path.join(tempfile.mkdtemp(prefix="treenic-fabric-"), "secret")
    secret = P.new_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret, path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m treenic.driver.server",
                                 description="treenic fabric server (N simulated NICs)")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--engine", choices=("golden", "rtl"), default="golden")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--collective-timeout", type=float, default=60.0)
    ap.add_argument("--idle-exit", type=float, default=600.0,
                    help="exit after this many seconds without any client (0: never)")
    ap.add_argument("--idle-timeout", type=float, default=600.0,
                    help="drop a rank's connection silent for this many seconds")
    ap.add_argument("--hello-timeout", type=float, default=5.0,
                    help="a new connection must complete its HELLO within this many seconds")
    ap.add_argument("--max-connections", type=int, default=None,
                    help="connection cap (default 2 x nodes + 8); beyond it: ERROR BUSY")
    ap.add_argument("--secret-file", default=None,
                    help=f"job secret file (64 hex digits; created with a fresh secret, mode "
                         f"0600, when missing). Default: ${P.SECRET_ENV}, else a fresh secret "
                         "written to a new private file named on the LISTENING line")
    a = ap.parse_args(argv)
    secret, secret_file = _job_secret(a.secret_file)
    server = FabricServer(a.nodes, a.engine, a.host, a.port, a.collective_timeout,
                          a.idle_timeout, hello_timeout=a.hello_timeout,
                          max_connections=a.max_connections, secret=secret)
    print(f"LISTENING {server.address[0]} {server.address[1]} {a.engine}"
          + (f" {secret_file}" if secret_file else ""), flush=True)
    server.serve_forever(idle_exit=a.idle_exit or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
