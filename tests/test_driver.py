"""Host driver without process spawning: protocol framing, fabric server robustness,
in-process model fabric, RTL engine error path, failure behaviour (timeouts, kills)."""
import os
import signal
import socket
import time
import zlib

import numpy as np
import pytest
import driver_helpers
from driver_helpers import expect_error, image_set, load, req

from treenic import algorithms
from treenic.driver import (DriverError, FabricDisconnected, FabricError, FabricTimeout,
                            LocalFabric, RTLFabricUnavailable, open_nic, schedule_image)
from treenic.driver import protocol as P
from treenic.driver.client import NICClient
from treenic.driver.fabric import RTLEngine, link_bytes, rtl_unavailable_reason
from treenic.driver.server import FabricServer, ServerProcess
from treenic.schedule.execute import execute

WORLD = 4


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def schedules():
    return {(a, t): algorithms.build(a, t) for a, t in
            [("ring", "ring:4"), ("multitree", "ring:4"), ("multitree", "torus:2x2"),
             ("multitree", "switch:4")]}


@pytest.fixture
def server():
    srv = FabricServer(WORLD, "golden", collective_timeout=5.0, idle_timeout=30.0)
    srv.start_thread()
    yield srv
    srv.stop()


def run_threads(fn, world=WORLD, timeout=30.0):
    return driver_helpers.run_threads(fn, world, timeout)


def grads(seed, n, world=WORLD, edge=True):
    g = np.random.default_rng(seed).standard_normal((world, n))
    if edge:   # subnormals, signed zeros, overflow to inf: exactness must hold for all
        g[:, :3] = [1e-40, -0.0, 3e38]
    return g.astype(np.float32)


# ---- protocol framing ---------------------------------------------------------------------

def test_frame_roundtrip_and_crc():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(P.encode(P.Msg.STATUS, b"xyz", 7))
        assert P.read_frame(b) == (P.Msg.STATUS, 7, 0, b"xyz")
        frame = bytearray(P.encode(P.Msg.HELLO, b"\x01\x02", 9))
        frame[17] ^= 0xFF                                   # corrupt the payload
        a.sendall(bytes(frame))
        with pytest.raises(P.ProtocolError) as e:
            P.read_frame(b)
        assert e.value.code == P.ErrorCode.BAD_CRC and not e.value.fatal
        a.sendall(b"XXXX" + bytes(16))
        with pytest.raises(P.ProtocolError) as e:
            P.read_frame(b)
        assert e.value.code == P.ErrorCode.BAD_MAGIC and e.value.fatal


# ---- fabric server: bit-exact and accounting -----------------------------------------------

@pytest.mark.parametrize("key", [("ring", "ring:4"), ("multitree", "ring:4"),
                                 ("multitree", "torus:2x2"), ("multitree", "switch:4")])
def test_server_dense_bit_exact(server, schedules, key):
    s = schedules[key]
    for n in (1, 3, 1001):                        # fewer elements than chunks, odd sizes
        g = grads(n, n) if n >= 3 else np.random.default_rng(n).standard_normal(
            (WORLD, n)).astype(np.float32)
        ref = execute(s, g)
        sent, recv = link_bytes(s, n)

        def rank(r):
            with open_nic("rtl", r, WORLD, algorithm=s, **server.endpoint,
                          timeout=10) as c:
                t = g[r].copy()
                c.allreduce(t)
                return t, c.status()
        out, errs = run_threads(rank)
        assert errs == [None] * WORLD, errs
        for r in range(WORLD):
            assert np.array_equal(bits(out[r][0]), bits(ref[r]))
            cnt = out[r][1]["counters"]
            assert (cnt["bytes_sent"], cnt["bytes_received"]) == (sent[r], recv[r])
            assert out[r][1]["nic"]["link_tx"] >= sent[r]
            assert cnt["host_bytes_sent"] > 4 * n         # the buffer crossed the host link


def test_server_sparse_matches_model_and_keeps_residual(server, schedules):
    from treenic.sparse.base import make
    s = schedules[("multitree", "ring:4")]
    n, density = 2000, 0.02
    g1, g2 = grads(1, n, edge=False), grads(2, n, edge=False)
    model = make("topka", workers=WORLD, elements=n, density=density, seed=0)
    r1, r2 = model.step(g1), model.step(g2)

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=s, **server.endpoint, timeout=10) as c:
            a, b = g1[r].copy(), g2[r].copy()
            o1 = c.sparse_allreduce(a, density, scheme="topka", key="bucket0")
            o2 = c.sparse_allreduce(b, density, scheme="topka", key="bucket0")
            return a, b, o2.residual, o1.bytes_sent
    out, errs = run_threads(rank)
    assert errs == [None] * WORLD, errs
    for r in range(WORLD):
        assert np.array_equal(bits(out[r][0]), bits(r1.result[r]))
        assert np.array_equal(bits(out[r][1]), bits(r2.result[r]))     # residual fed back
        assert np.array_equal(bits(out[r][2]), bits(r2.residuals[r]))
        assert out[r][3] == r1.bytes_sent_per_worker()[r]
        k = round(density * n)                  # all-gather of k (u32, f32) pairs per rank
        assert out[r][3] == 8 * k * (WORLD - 1) < link_bytes(s, n)[0][r]


# ---- robustness: bad input never crashes the server ---------------------------------------

def raw_conn(server):
    s = socket.create_connection(server.address, timeout=5)
    return s


def hello(server, sock, rank, world=WORLD, version=P.PROTOCOL_VERSION):
    return req(sock, P.Msg.HELLO, P.HELLO.pack(version, rank, world, 0,
                                               bytes.fromhex(server.secret)) + b"test")


def test_server_rejects_bad_input_and_survives(server, schedules):
    s = schedules[("ring", "ring:4")]
    with raw_conn(server) as c:
        assert "before HELLO" in expect_error(req(c, P.Msg.STATUS), P.ErrorCode.NOT_READY)
        assert "version 9" in expect_error(hello(server, c, 0, version=9),
                                           P.ErrorCode.VERSION_MISMATCH)
        assert "world size 3" in expect_error(hello(server, c, 0, world=3),
                                              P.ErrorCode.WORLD_MISMATCH)
        expect_error(hello(server, c, 7), P.ErrorCode.BAD_RANK)
        expect_error(req(c, P.Msg.HELLO, b"\x01"), P.ErrorCode.BAD_PAYLOAD)
        assert hello(server, c, 0)[0] == P.Msg.HELLO_ACK
        expect_error(req(c, 0x42), P.ErrorCode.UNKNOWN_TYPE)
        expect_error(req(c, P.Msg.ERROR), P.ErrorCode.UNKNOWN_TYPE)
        expect_error(req(c, P.Msg.STATUS, b"junk"), P.ErrorCode.BAD_PAYLOAD)
        # START before any config
        expect_error(req(c, P.Msg.START, P.START.pack(1, 0, 0, 0, 0.0, 0)),
                     P.ErrorCode.NOT_READY)
        image = image_set(s, 4)
        expect_error(load(c, image, crc=123), P.ErrorCode.BAD_CONFIG)           # wrong CRC
        assert "kind 2" in expect_error(load(c, schedule_image(s), kind=1),     # version 2's
                                        P.ErrorCode.BAD_CONFIG)
        expect_error(load(c, b"TNIS" + bytes(8)), P.ErrorCode.BAD_CONFIG)      # not a set
        ack = load(c, image)
        assert ack[0] == P.Msg.CONFIG_ACK
        assert P.CONFIG_ACK.unpack(ack[3]) == (zlib.crc32(image), WORLD, s.steps, 4)
        # wrong dtype, wrong sizes
        text = expect_error(req(c, P.Msg.WRITE_BUFFER, P.BUFFER.pack(1, 2, 0, 0, 4) + bytes(32)),
                            P.ErrorCode.UNSUPPORTED_DTYPE)
        assert "binary32" in text
        expect_error(req(c, P.Msg.WRITE_BUFFER, P.BUFFER.pack(1, 1, 0, 0, 4) + bytes(12)),
                     P.ErrorCode.BAD_PAYLOAD)
        expect_error(req(c, P.Msg.START, P.START.pack(5, 0, 0, 0, 0.0, 0)),
                     P.ErrorCode.SEQUENCE)
        expect_error(req(c, P.Msg.READ_BUFFER, P.READ_BUFFER.pack(5, 0)), P.ErrorCode.SEQUENCE)
        expect_error(req(c, P.Msg.START, P.START.pack(5, 0, 0, 3, 0.0, 0) + b"x"),
                     P.ErrorCode.BAD_PAYLOAD)
        # corrupted CRC: error reply, connection stays usable
        frame = bytearray(P.encode(P.Msg.STATUS, b"", 3))
        frame[-1] ^= 1
        c.sendall(bytes(frame))
        expect_error(P.read_frame(c), P.ErrorCode.BAD_CRC)
        assert req(c, P.Msg.STATUS)[0] == P.Msg.STATUS_REPLY
        # a second connection cannot take rank 0
        with raw_conn(server) as c2:
            assert "already connected" in expect_error(hello(server, c2, 0), P.ErrorCode.BAD_RANK)
    # fatal framing errors: ERROR reply then the server closes that connection only
    for junk, code in [(b"GARBAGE-NOT-A-FRAME", P.ErrorCode.BAD_MAGIC),
                       (P.encode(P.Msg.STATUS, b"", 1, version=9), P.ErrorCode.VERSION_MISMATCH),
                       (P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, 6, 0, 1, P.MAX_PAYLOAD + 1),
                        P.ErrorCode.FRAME_TOO_LARGE)]:
        with raw_conn(server) as c:
            c.sendall(junk.ljust(16, b"\0"))
            expect_error(P.read_frame(c), code)
            with pytest.raises((P.ConnectionClosed, ConnectionResetError)):
                P.read_frame(c)
    with raw_conn(server) as c:                     # truncated frame then hang-up
        c.sendall(P.encode(P.Msg.STATUS)[:10])
    # the server still works for a full collective afterwards
    g = grads(5, 100)

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=s, **server.endpoint, timeout=10) as cc:
            t = g[r].copy()
            cc.allreduce(t)
            return t
    out, errs = run_threads(rank)
    assert errs == [None] * WORLD
    assert np.array_equal(bits(out[2]), bits(execute(s, g)[2]))


def test_mismatched_sizes_across_ranks_named(server, schedules):
    s = schedules[("ring", "ring:4")]

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=s, **server.endpoint, timeout=10) as c:
            c.allreduce(np.zeros(100 if r != 2 else 99, np.float32))
    _, errs = run_threads(rank)
    for e in errs:
        assert isinstance(e, FabricError) and e.code == "SIZE_MISMATCH"
        assert "rank 2: dense 99 elements" in str(e)


def test_config_mismatch_across_ranks(server, schedules):
    with open_nic("rtl", 0, WORLD, algorithm=schedules[("ring", "ring:4")],
                  **server.endpoint, timeout=10) as c0:
        c0.load_schedule(schedules[("multitree", "ring:4")])          # idle: replaces
        assert c0.status()["algorithm"] == "multitree"


def test_wrong_dtype_rejected_by_driver(schedules):
    fab = LocalFabric(schedules[("ring", "ring:4")])
    c = open_nic("model", 0, WORLD, algorithm=fab.schedule, fabric=fab)
    with pytest.raises(DriverError, match="binary32"):
        c.allreduce(np.zeros(8, np.float64))
    with pytest.raises(DriverError, match="4 nodes but the world has 3"):
        open_nic("model", 0, 3, algorithm=fab.schedule, fabric=fab)
    with pytest.raises(DriverError, match="unknown backend"):
        open_nic("infiniband", 0, WORLD, algorithm=fab.schedule)
    with pytest.raises(DriverError, match="needs boards"):
        open_nic("udp", 0, WORLD, algorithm=fab.schedule)
    with pytest.raises(DriverError, match="needs address"):
        open_nic("rtl", 0, WORLD, algorithm=fab.schedule)


# ---- failure behaviour: silent or killed server --------------------------------------------

def test_silent_server_times_out_naming_rank_and_step():
    """A peer that accepts but never answers: the client gives up after its timeout."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    t0 = time.monotonic()
    with pytest.raises(FabricTimeout, match=r"rank 3: .* did not answer within 0\.5s at HELLO"):
        NICClient(lsock.getsockname(), 3, WORLD, timeout=0.5, secret=P.new_secret())
    assert time.monotonic() - t0 < 5
    lsock.close()


def test_server_stopped_mid_collective_times_out(schedules):
    s = schedules[("ring", "ring:4")]
    with ServerProcess(WORLD, "golden", collective_timeout=30) as srv:
        clients = [open_nic("rtl", r, WORLD, algorithm=s, **srv.endpoint, timeout=1.0)
                   for r in range(WORLD)]
        os.kill(srv.pid, signal.SIGSTOP)                   # server stops answering
        try:
            with pytest.raises(FabricTimeout,
                               # the stop can land before or after START is answered
                               match=r"rank 1: .*within 1\.0s at collective #1 step "
                                     r"(START|WRITE_BUFFER|LOAD_CONFIG)"):
                clients[1].allreduce(np.ones(64, np.float32))
        finally:
            os.kill(srv.pid, signal.SIGKILL)               # server killed
        srv.proc.wait(5)
        with pytest.raises(FabricDisconnected, match=r"rank 2: .*closed the connection at "
                                                     r"collective #1 step "
                                                     r"(START|WRITE_BUFFER|LOAD_CONFIG)"):
            clients[2].allreduce(np.ones(64, np.float32))


def test_missing_rank_times_out_server_side(schedules):
    srv = FabricServer(WORLD, "golden", collective_timeout=0.5)
    srv.start_thread()
    try:
        s = schedules[("ring", "ring:4")]

        def rank(r):
            with open_nic("rtl", r, WORLD, algorithm=s, **srv.endpoint, timeout=10) as c:
                if r != 3:
                    c.allreduce(np.ones(10, np.float32))
                else:
                    time.sleep(2.0)     # connected but never starts (a closed rank aborts)
        _, errs = run_threads(rank)
        for r in range(3):
            assert isinstance(errs[r], FabricTimeout)
            assert "rank(s) [3] never started it" in str(errs[r])
    finally:
        srv.stop()


# ---- in-process model fabric ---------------------------------------------------------------

def test_local_fabric_dense_sparse_and_timeout(schedules):
    s = schedules[("multitree", "torus:2x2")]
    # generous timeout while every rank takes part (a loaded machine must not fail it);
    # a short one only where the timeout is the point
    fab = LocalFabric(s, timeout=30)
    g = grads(9, 777)

    def rank(r):
        c = open_nic("model", r, WORLD, algorithm=s, fabric=fab)
        t = g[r].copy()
        c.allreduce(t)
        o = c.sparse_allreduce(g[r].copy(), 0.05, key=3)
        assert c.residuals[3] is o.residual
        return t, c.status()
    out, errs = run_threads(rank)
    assert errs == [None] * WORLD, errs
    ref = execute(s, g)
    for r in range(WORLD):
        assert np.array_equal(bits(out[r][0]), bits(ref[r]))
        assert out[r][1]["counters"]["collectives"] == 1
        assert out[r][1]["counters"]["sparse_collectives"] == 1
    # a rank that never shows up: the others time out naming it
    # (the fabric's own timeout applies: a backend default must not override it)
    fab = LocalFabric(s, timeout=0.5)
    t0 = time.monotonic()
    out, errs = run_threads(lambda r: open_nic("model", r, WORLD, algorithm=s, fabric=fab)
                            .allreduce(np.ones(4, np.float32)) if r else None)
    assert time.monotonic() - t0 < 10
    assert all(isinstance(e, FabricTimeout) and "[0] never started" in str(e)
               for e in errs[1:])


def test_rtl_engine_unavailable_is_explicit(schedules):
    """The RTL fabric wires direct networks only: a switch topology can never open it, so the
    error path is exercised whatever is built in this checkout."""
    s = schedules[("multitree", "switch:4")]
    reason = rtl_unavailable_reason(s)
    assert reason.startswith("RTL fabric engine unavailable") and "switch" in reason
    with pytest.raises(RTLFabricUnavailable):
        RTLEngine(s)
    srv = FabricServer(WORLD, "rtl")
    srv.start_thread()
    try:
        # the image set is for the first collective's element count: loaded with it
        with open_nic("rtl", 0, WORLD, algorithm=s, **srv.endpoint, timeout=5) as c, \
                pytest.raises(RTLFabricUnavailable, match="rank 0: .*RTL fabric engine "
                                                          "unavailable"):
            c.allreduce(np.ones(8, np.float32))
    finally:
        srv.stop()
