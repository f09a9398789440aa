"""``udp`` backend: each rank drives its own board over the host protocol on UDP.

::

    comm = open_nic("udp", rank, world, topology="ring:4",
                    boards=["192.168.1.50", "192.168.1.51", ...])   # or (host, port)
    comm.allreduce(t)

Per collective the rank (1) loads its NIC's configuration for the tensor's element count
when it changed (firmware image -> register, table and ORDER writes, as
:mod:`treenic.hdl.nic.host` computes them for every NIC build), else CLEARs the NIC,
(2) writes its buffer (pipelined WRITE datagrams, ``window`` in flight), (3) waits at the
ranks' barrier, (4) STARTs, (5) polls STATUS until DONE, (6) reads the buffer back.

The wire format is :mod:`treenic.hdl.host.model` (the board's engine is its RTL
twin).  Every request is retried up to ``retries`` times after ``timeout`` seconds
without its reply; a repeated mutating request is acknowledged by the board without being
executed twice (DUP), and buffer writes are idempotent by themselves.  Errors name the
rank, the board's address and the step.

Notes: LiteEth replies to the board's own UDP port (:data:`UDP_PORT`) on the host, so
against real boards the socket binds that port (``local_port``); simulated boards
(``treenic boardsim``) answer to the sender's port and use ``local_port=0``.  Several ranks
on one host cannot all bind port 7411 of every address: ``host_addresses`` gives each rank
its own IPv4 address of the host (rank r binds ``host_addresses[r]:local_port``; the board
replies to that address, so each rank's socket receives only its own board's replies).
"""
from __future__ import annotations

import errno
import ipaddress
import random
import select
import socket
import time

import numpy as np

from treenic.hdl.host import model as wire
from treenic.hdl.host.liteeth import UDP_PORT

from .errors import DriverError, FabricError, FabricTimeout

__all__ = ["BoardClient", "UDPBackend", "parse_board", "parse_host_addresses",
           "DEFAULT_NIC_PARAMS"]

#: the NIC built into the boards' bitstreams (``boards/synth.py`` NIC_CORE_PARAMS)
DEFAULT_NIC_PARAMS = dict(ports=4, width=64, depth=16384, max_nodes=16, max_entries=64,
                          sub_words=16)
#: must match the board build's HostEngine max_words (``boards/core.py`` MAX_WORDS)
MAX_WORDS = 256


def parse_host_addresses(spec, world: int) -> list[str]:
    """``host_addresses`` (a list, or ``"a,b,..."``) -> one IPv4 address per rank."""
    addrs = spec.split(",") if isinstance(spec, str) else list(spec)
    if len(addrs) != world:
        raise DriverError(f"backend 'udp': host_addresses needs one IPv4 address per rank "
                          f"({world}), got {len(addrs)}: {spec!r}")
    for a in addrs:
        try:
            ipaddress.IPv4Address(a)
        except ValueError:
            raise DriverError(f"backend 'udp': host address {a!r} is not an IPv4 "
                              "address") from None
    if len(set(addrs)) != len(addrs):
        raise DriverError(f"backend 'udp': host_addresses repeats an address: {spec!r} "
                          "(each rank needs its own)")
    return [str(a) for a in addrs]


def train_host_addresses(spec, world: int, *, backend: str, boards) -> list[str]:
    """``treenic train --host-addresses``: only with ``--backend udp --boards``; parsed
    by :func:`parse_host_addresses`."""
    if backend != "udp" or not boards:
        raise DriverError("--host-addresses goes with --backend udp --boards (real boards)")
    return parse_host_addresses(spec, world)


def parse_board(spec) -> tuple[str, int]:
    """``"host"``, ``"host:port"`` or ``(host, port)`` -> (host, port)."""
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        host, port = spec
    elif isinstance(spec, str) and spec:
        host, _, port = spec.rpartition(":") if ":" in spec else (spec, "", UDP_PORT)
    else:
        raise DriverError(f"bad board address {spec!r}: want 'host', 'host:port' or "
                          "(host, port)")
    try:
        port = int(port)
    except ValueError:
        raise DriverError(f"bad board address {spec!r}: port {port!r} is not a number") \
            from None
    if not 0 < port < 65536:
        raise DriverError(f"bad board address {spec!r}: port {port} out of range")
    return str(host), port


class BoardClient:
    """Request/reply with one board: sequence numbers, retries, timeouts, pipelining."""

    def __init__(self, address, *, name: str, timeout: float = 0.5, retries: int = 8,
                 window: int = 8, local_port: int = 0, local_host: str = "",
                 max_words: int = MAX_WORDS):
        if timeout <= 0 or retries < 1 or window < 1:
            raise DriverError("timeout must be > 0, retries and window >= 1")
        self.address, self.name = parse_board(address), name
        self.timeout, self.retries, self.window, self.max_words = \
            timeout, retries, window, max_words
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((local_host, local_port))
        except OSError as e:
            self.sock.close()
            hint = {errno.EADDRINUSE: " (another rank on this host holds it: give each "
                    "rank its own host address, host_addresses= / --host-addresses)",
                    errno.EADDRNOTAVAIL: " (not an address of this host: add it to the "
                    "interface on the boards' network, e.g. ip addr add "
                    f"{local_host}/24 dev eth0)"}.get(e.errno, "")
            raise DriverError(f"{name}: cannot bind UDP {local_host or '*'}:{local_port} for "
                              f"the board's replies: {e.strerror}{hint}") from None
        self.local = self.sock.getsockname()
        self.seq = random.getrandbits(32)       # a new session never repeats the old seqs
        self.sent_bytes = self.received_bytes = 0
        self.retransmits = 0

    def close(self):
        self.sock.close()

    def _next_seq(self) -> int:
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return self.seq

    def _send(self, data: bytes):
        self.sock.sendto(data, self.address)
        self.sent_bytes += len(data)

    def _replies(self, wait: float):
        """Replies that arrive within *wait* seconds (malformed ones are ignored)."""
        end = time.monotonic() + wait
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return
            data, _ = self.sock.recvfrom(65536)
            self.received_bytes += len(data)
            try:
                yield wire.decode_reply(data)
            except wire.Malformed:
                continue

    def transact(self, requests: list[tuple], step: str) -> list[wire.Reply]:
        """Send (op, addr, count, payload) requests, up to ``window`` in flight; returns
        their replies in order.  Raises :class:`FabricTimeout` naming the board and the
        step when one is still unanswered after ``retries`` tries."""
        pending: dict[int, tuple[bytes, int]] = {}     # seq -> (datagram, tries)
        order, replies = [], {}
        todo = list(requests)
        while todo or pending:
            while todo and len(pending) < self.window:
                op, addr, count, payload = todo.pop(0)
                s = self._next_seq()
                d = wire.encode_request(op, s, addr, count, payload)
                pending[s] = (d, 1)
                order.append(s)
                self._send(d)
            got = False
            for r in self._replies(self.timeout):
                if r.seq in pending:
                    replies[r.seq] = r
                    del pending[r.seq]
                    got = True
                if not pending or (todo and len(pending) < self.window):
                    break
            if got or not pending:
                continue
            for s, (d, tries) in list(pending.items()):     # a whole timeout, no reply
                if tries >= self.retries:
                    raise FabricTimeout(f"{self.name} ({self.address[0]}:{self.address[1]}): "
                                        f"no reply at {step} after {tries} tries of "
                                        f"{self.timeout:g} s")
                pending[s] = (d, tries + 1)
                self.retransmits += 1
                self._send(d)
        return [replies[s] for s in order]

    # ---- operations -------------------------------------------------------------------
    def read(self, addr: int, count: int, step: str) -> np.ndarray:
        reqs = [(wire.Op.READ, addr + o, min(self.max_words, count - o), ())
                for o in range(0, count, self.max_words)]
        words = [w for r in self.transact(reqs, step) for w in r.payload]
        return np.array(words, np.uint32)

    def write(self, addr: int, words, step: str) -> None:
        words = np.asarray(words, np.uint32)
        reqs = [(wire.Op.WRITE, addr + o, None, words[o:o + self.max_words].tolist())
                for o in range(0, len(words), self.max_words)]
        self.transact(reqs, step)

    def write_pairs(self, pairs, step: str) -> None:
        n = self.max_words // 2
        pairs = [(int(a), int(v)) for a, v in pairs]
        reqs = [(wire.Op.WRITE_PAIRS, 0, None, [x for p in pairs[o:o + n] for x in p])
                for o in range(0, len(pairs), n)]
        # in order, one at a time: a later write may depend on an earlier one (CLEAR first)
        for r in reqs:
            self.transact([r], step)

    def start(self, step: str = "START") -> None:
        self.transact([(wire.Op.START, 0, 0, ())], step)

    def status(self, step: str = "STATUS") -> tuple[int, ...]:
        return self.transact([(wire.Op.STATUS, 0, 0, ())], step)[0].payload


class UDPBackend:
    """The ``udp`` backend behind :class:`~treenic.driver.core.Communicator`.

    Options: ``boards`` (one address per rank, required), ``nic_params`` (dict of the
    boards' NicParams; default :data:`DEFAULT_NIC_PARAMS`), ``timeout`` (seconds per
    datagram try), ``retries``, ``window`` (WRITE/READ datagrams in flight),
    ``run_timeout`` (seconds from START to DONE), ``local_port`` (default
    :data:`UDP_PORT`, see the module notes), ``host_addresses`` (one IPv4 address of this
    host per rank, each rank's socket binds its own; default: any address), ``barrier`` (callable joining all ranks
    before START; default: ``torch.distributed.barrier`` of an initialised group),
    ``engine`` (text naming what answers at the addresses, for ``status()``).
    """

    def __init__(self, comm, boards=None, nic_params=None, timeout: float = 0.5,
                 retries: int = 8, window: int = 8, run_timeout: float = 60.0,
                 local_port: int = UDP_PORT, host_addresses=None, barrier=None,
                 engine: str | None = None):
        from treenic.hdl.nic import NicParams
        if not boards or len(boards) != comm.world:
            raise DriverError(f"backend 'udp' needs boards=[...] with one address per rank "
                              f"({comm.world}), got {boards!r}")
        self.comm, self.rank = comm, comm.rank
        self.params = NicParams(**(nic_params or DEFAULT_NIC_PARAMS))
        self.board_name = f"rank {comm.rank} board"
        local_host = (parse_host_addresses(host_addresses, comm.world)[comm.rank]
                      if host_addresses else "")
        self.client = BoardClient(boards[comm.rank], name=self.board_name, timeout=timeout,
                                  retries=retries, window=window, local_port=local_port,
                                  local_host=local_host)
        self.run_timeout = run_timeout
        self.barrier = barrier or _dist_barrier
        self.engine = engine or f"boards over UDP ({', '.join(map(str, boards))})"
        self._loaded_elements = None
        self._last = {}
        self._check_identity()

    def _check_identity(self):
        from treenic.hdl.nic.params import ID_VALUE, Reg
        ident, par = self.client.read(int(Reg.ID), 1, "IDENTIFY")[0], \
            self.client.read(int(Reg.PARAMS), 1, "IDENTIFY")[0]
        p = self.params
        if ident != ID_VALUE:
            raise FabricError(f"{self.board_name} {self.client.address}: not a treenic NIC "
                              f"(ID {int(ident):#010x})")
        want = p.ports | p.lanes << 4 | (p.depth.bit_length() - 1) << 8 | p.max_entries << 16
        if int(par) != want:
            raise FabricError(f"{self.board_name}: NIC build PARAMS {int(par):#010x} != "
                              f"{want:#010x} expected from nic_params {self.params}")

    def load(self, schedule, image):
        self._loaded_elements = None          # images depend on the element count

    def _configure(self, elements: int):
        from treenic.firmware.image import compile_images
        from treenic.hdl.nic.host import host_writes, order_writes
        from treenic.hdl.nic.params import Ctrl, Reg
        if elements != self._loaded_elements:
            images = compile_images(None, self.comm.schedule, elements)
            (writes,) = host_writes(self.params, images, nodes=[self.rank])
            self._order = order_writes(self.params, images[self.rank])
            self.client.write_pairs(writes, "LOAD_CONFIG")
            self._loaded_elements = elements
        else:       # CLEAR resets the run state and the ORDER table: write it again
            self.client.write_pairs([(int(Reg.CTRL), int(Ctrl.CLEAR))] + self._order,
                                    "CLEAR")

    def dense(self, tensor, seq):
        from .core import _to_numpy, _write_back
        from .fabric import link_bytes
        from treenic.hdl.nic.params import Status
        data, _ = _to_numpy(tensor)
        e = data.shape[0]
        if e > self.params.depth:
            raise DriverError(f"{self.board_name}: {e} elements > NIC buffer depth "
                              f"{self.params.depth}")
        self._configure(e)
        self.client.write(self.params.buf_addr(0), data.view(np.uint32), "WRITE_BUFFER")
        self.barrier()
        self.client.start()
        deadline = time.monotonic() + self.run_timeout
        while True:
            st = self.client.status("POLL")
            if st[0] & (Status.ERROR | Status.SCAN_FAILED):
                raise FabricError(f"{self.board_name}: NIC reported an error during "
                                  f"collective #{seq} (STATUS {st[0]:#x}, ERR_FLAGS "
                                  f"{st[2]:#x})")
            if st[0] & Status.DONE:
                break
            if time.monotonic() > deadline:
                raise FabricTimeout(f"{self.board_name}: not DONE {self.run_timeout:g} s after "
                                    f"START of collective #{seq} (STATUS {st[0]:#x})")
            time.sleep(0.001)
        self._last = dict(zip(("status", "cycles", "err_flags", "err_count", "timestep"),
                              st[:5]))
        self.comm.counters.cycles += int(st[1])
        out = self.client.read(self.params.buf_addr(0), e, "READ_BUFFER")
        self.barrier()                        # no rank re-writes its NIC while peers run
        _write_back(tensor, out.view(np.float32))
        c = self.comm.counters
        c.host_bytes_sent, c.host_bytes_received = \
            self.client.sent_bytes, self.client.received_bytes
        sent, recv = link_bytes(self.comm.schedule, e)
        return int(sent[self.rank]), int(recv[self.rank])

    def sparse(self, tensor, residual, scheme, density, seed, seq, options=None):
        raise DriverError("backend 'udp': sparse schemes are not in the NIC RTL yet")

    def status(self):
        return {"engine": self.engine, "board": "%s:%d" % self.client.address,
                "host": "%s:%d" % self.client.local,
                "last_run": self._last, "retransmits": self.client.retransmits}

    def close(self):
        self.client.close()


def _dist_barrier():
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is None or not dist.is_initialized():
        raise DriverError("backend 'udp' needs barrier= (a callable joining all ranks) or "
                          "an initialised torch.distributed group")
    dist.barrier()
