"""The ``udp`` backend against golden boards: UDP servers on loopback whose host engine is
the golden :class:`~treenic.hdl.host.model.HostEngineModel` and whose NIC is a register
file + buffer that runs the golden executor once every board is STARTed.  Datagrams are
dropped at random both ways, so retries, DUP acknowledgements and timeouts are exercised;
the results must be bit-exact with the ``model`` backend."""
import random
import socket
import threading

import numpy as np
import pytest

from treenic.driver import DriverError, FabricTimeout, LocalFabric, open_nic
from treenic.driver.core import schedule_for
from treenic.driver.udp import DEFAULT_NIC_PARAMS, MAX_WORDS, parse_board
from treenic.hdl.host import model as wire
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.params import ID_VALUE, Ctrl, Reg, Status
from treenic.schedule.execute import execute

PARAMS = NicParams(**DEFAULT_NIC_PARAMS)
STATUS_REGS = (Reg.STATUS, Reg.CYCLES, Reg.ERR_FLAGS, Reg.ERR_COUNT, Reg.TIMESTEP)


class GoldenCluster:
    """N golden boards; START on all of them runs the golden executor on their buffers."""

    def __init__(self, schedule, loss=0.0, seed=0):
        self.schedule, self.n = schedule, schedule.n
        self.loss, self.rng = loss, random.Random(seed)
        self.lock = threading.Lock()
        self.buf = np.zeros((self.n, PARAMS.depth), np.uint32)
        self.status = [0] * self.n
        self.started = set()
        self.elements = 0
        self.socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(self.n)]
        for s in self.socks:
            s.bind(("127.0.0.1", 0))
            s.settimeout(0.1)
        self.engines = [self._engine(u) for u in range(self.n)]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._serve, args=(u,), daemon=True)
                        for u in range(self.n)]
        for t in self.threads:
            t.start()

    @property
    def addresses(self):
        return [s.getsockname() for s in self.socks]

    def _engine(self, u):
        R = PARAMS.region_bits

        def read(a):
            if a >> R == 2:
                return int(self.buf[u, a & ((1 << R) - 1)])
            return {Reg.ID: ID_VALUE, Reg.STATUS: self.status[u],
                    Reg.PARAMS: PARAMS.ports | PARAMS.lanes << 4 | 14 << 8 |
                    PARAMS.max_entries << 16}.get(a, 0)

        def write(a, v):
            if a >> R == 2:
                self.buf[u, a & ((1 << R) - 1)] = v
            elif a == Reg.ELEMENTS:
                self.elements = v
            elif a == Reg.CTRL and v & Ctrl.CLEAR:
                self.status[u] = 0
            elif a == Reg.CTRL and v & Ctrl.START:
                self._start(u)
        return wire.HostEngineModel(read, write, PARAMS.addr_bits, MAX_WORDS,
                                    tuple(int(r) for r in STATUS_REGS),
                                    (int(Reg.CTRL), int(Ctrl.START)))

    def _start(self, u):
        self.status[u] = Status.RUNNING
        self.started.add(u)
        if len(self.started) == self.n:
            e = self.elements
            res = execute(self.schedule, self.buf[:, :e].view(np.float32))
            self.buf[:, :e] = np.asarray(res, np.float32).view(np.uint32)
            self.status = [Status.DONE] * self.n
            self.started.clear()

    def _serve(self, u):
        s = self.socks[u]
        while not self.stop.is_set():
            try:
                data, peer = s.recvfrom(65536)
            except socket.timeout:
                continue
            if self.rng.random() < self.loss:
                continue
            with self.lock:
                reply = self.engines[u].process(data)
            if reply is not None and self.rng.random() >= self.loss:
                s.sendto(reply, peer)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        for s in self.socks:
            s.close()


def _run_ranks(cluster, tensors, topology, **opts):
    world = len(tensors)
    barrier = threading.Barrier(world)
    errors, comms = [], []

    def rank(r):
        try:
            comm = open_nic("udp", r, world, topology, boards=cluster.addresses,
                            local_port=0, barrier=barrier.wait, timeout=0.05, **opts)
            comms.append(comm)
            comm.allreduce(tensors[r])
            comm.allreduce(tensors[r])          # same size again: CLEAR path, no reload
            comm.close()
        except Exception as e:                 # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return errors, comms


@pytest.mark.parametrize("loss", [0.0, 0.15])
def test_udp_backend_bit_exact_with_model(loss):
    rng = np.random.default_rng(3)
    world, e = 4, 700                           # 700: three WRITE datagrams per rank
    data = rng.standard_normal((world, e)).astype(np.float32)
    sched = schedule_for("multitree", "ring:4", world)
    fab = LocalFabric(sched)
    ref = [d.copy() for d in data]
    ths = [threading.Thread(target=lambda r=r: (lambda c: (c.allreduce(ref[r]),
                                                            c.allreduce(ref[r])))(
        open_nic("model", r, world, "ring:4", fabric=fab))) for r in range(world)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    cluster = GoldenCluster(sched, loss=loss)
    try:
        tensors = [d.copy() for d in data]
        errors, comms = _run_ranks(cluster, tensors, "ring:4", retries=40)
        assert not errors, errors
        for r in range(world):
            assert tensors[r].view(np.uint32).tolist() == ref[r].view(np.uint32).tolist()
        if loss:
            assert sum(c._impl.client.retransmits for c in comms) > 0
    finally:
        cluster.close()


def test_silent_board_times_out_naming_board_and_step():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(FabricTimeout, match=r"rank 1 board .*no reply at IDENTIFY"):
            open_nic("udp", 1, 2, boards=[s.getsockname(), s.getsockname()],
                     local_port=0, timeout=0.02, retries=2, barrier=lambda: None)
    finally:
        s.close()


def test_bad_board_lists_are_refused():
    with pytest.raises(DriverError, match="one address per rank"):
        open_nic("udp", 0, 2, boards=["10.0.0.1"])
    with pytest.raises(DriverError, match="not a number"):
        parse_board("host:http")
    assert parse_board("10.0.0.2") == ("10.0.0.2", 7411)
    assert parse_board(("h", 5)) == ("h", 5)
