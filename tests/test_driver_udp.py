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

    def __init__(self, schedule, loss=0.0, seed=0, reply_port=None):
        self.schedule, self.n = schedule, schedule.n
        # reply_port: answer to this port of the sender's address, as LiteEth answers to its
        # own UDP port (else to the sender's port)
        self.reply_port = reply_port
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
                s.sendto(reply, (peer[0], self.reply_port or peer[1]))

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        for s in self.socks:
            s.close()


def _run_ranks(cluster, tensors, topology, local_port=0, **opts):
    world = len(tensors)
    barrier = threading.Barrier(world)
    errors, comms = [], []

    def rank(r):
        try:
            comm = open_nic("udp", r, world, topology, boards=cluster.addresses,
                            local_port=local_port, barrier=barrier.wait, timeout=0.05,
                            **opts)
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


def _model_reference(data, sched):
    """*data* all-reduced twice by the ``model`` backend (the expected bits)."""
    world = len(data)
    fab = LocalFabric(sched)
    ref = [d.copy() for d in data]
    ths = [threading.Thread(target=lambda r=r: (lambda c: (c.allreduce(ref[r]),
                                                            c.allreduce(ref[r])))(
        open_nic("model", r, world, "ring:4", fabric=fab))) for r in range(world)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return ref


@pytest.mark.parametrize("loss", [0.0, 0.15])
def test_udp_backend_bit_exact_with_model(loss):
    rng = np.random.default_rng(3)
    world, e = 4, 700                           # 700: three WRITE datagrams per rank
    data = rng.standard_normal((world, e)).astype(np.float32)
    sched = schedule_for("multitree", "ring:4", world)
    ref = _model_reference(data, sched)
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


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_host_address_per_rank_when_boards_reply_to_a_fixed_port():
    """Boards that answer at one fixed port of the sender's address (LiteEth: its own UDP
    port): 4 ranks on one host share that port, each on its own loopback address."""
    world, e = 4, 300
    data = np.random.default_rng(5).standard_normal((world, e)).astype(np.float32)
    sched = schedule_for("multitree", "ring:4", world)
    ref = _model_reference(data, sched)
    port = _free_udp_port()
    hosts = [f"127.0.0.{10 + r}" for r in range(world)]
    cluster = GoldenCluster(sched, loss=0.1, reply_port=port)
    try:
        tensors = [d.copy() for d in data]
        errors, comms = _run_ranks(cluster, tensors, "ring:4", local_port=port,
                                   host_addresses=",".join(hosts), retries=40)
        assert not errors, errors
        for r in range(world):
            assert tensors[r].view(np.uint32).tolist() == ref[r].view(np.uint32).tolist()
        assert sorted(c.status()["host"] for c in comms) == [f"{h}:{port}" for h in hosts]
    finally:
        cluster.close()


def test_ranks_sharing_the_reply_port_without_host_addresses_get_a_clear_error():
    port = _free_udp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:   # "rank 0"
        held.bind(("", port))
        with pytest.raises(DriverError, match=r"rank 1 board: cannot bind UDP \*:\d+ .*"
                                              r"--host-addresses"):
            open_nic("udp", 1, 2, boards=["127.0.0.1:9", "127.0.0.1:9"], local_port=port,
                     barrier=lambda: None)


def test_bad_host_address_lists_are_refused():
    b = ["127.0.0.1:9", "127.0.0.1:9"]
    with pytest.raises(DriverError, match="one IPv4 address per rank"):
        open_nic("udp", 0, 2, boards=b, host_addresses=["127.0.0.1"])
    with pytest.raises(DriverError, match="'host-a' is not an IPv4"):
        open_nic("udp", 0, 2, boards=b, host_addresses="127.0.0.1,host-a")
    with pytest.raises(DriverError, match="repeats an address"):
        open_nic("udp", 0, 2, boards=b, host_addresses=["127.0.0.1", "127.0.0.1"])
    with pytest.raises(DriverError, match="not an address of this host"):
        open_nic("udp", 1, 2, boards=b, host_addresses=["127.0.0.1", "192.0.2.77"],
                 local_port=0)


def test_train_passes_one_host_address_per_rank():
    from treenic.train import _config, _udp_boards
    boards = [f"192.168.1.{50 + r}" for r in range(4)]
    hosts = ",".join(f"192.168.1.{100 + r}" for r in range(4))
    cfg = _config("udp", workers=4, boards=boards, host_addresses=hosts)
    opts, sim = _udp_boards([cfg], 4, print)
    assert sim is None
    assert opts == {"boards": boards, "host_addresses": hosts.split(",")}
    with pytest.raises(ValueError, match="one IPv4 address per rank"):
        _config("udp", workers=4, boards=boards, host_addresses="10.0.0.1")
    with pytest.raises(ValueError, match="goes with --backend udp --boards"):
        _config("udp", workers=4, simulated_boards=True, host_addresses=hosts)
