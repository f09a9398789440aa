"""Regression tests of issue 19 (reliability and security of the host protocol, the fabric
server and the driver): each test names the defect it pins down and failed before its fix."""
import os
import socket
import threading
import time
import tracemalloc
import zlib

import numpy as np
import pytest
import driver_helpers
from driver_helpers import expect_error, image_set, load, req

from treenic import algorithms
from treenic.driver import FabricError, open_nic
from treenic.firmware.image import ImageSet, compile_images
from treenic.schedule.ir import Schedule
from treenic.driver import protocol as P
from treenic.driver.server import FabricServer
from treenic.schedule.execute import execute

WORLD = 4


@pytest.fixture(scope="module")
def ring4():
    return algorithms.build("ring", "ring:4")


@pytest.fixture
def server():
    srv = FabricServer(WORLD, "golden", collective_timeout=10.0, idle_timeout=30.0)
    srv.start_thread()
    yield srv
    srv.stop()


def conn(server, timeout=5.0):
    return socket.create_connection(server.address, timeout=timeout)


def hello_payload(server, rank, world=WORLD):
    return P.HELLO.pack(P.PROTOCOL_VERSION, rank, world, 0,
                        bytes.fromhex(server.secret)) + b"test"


def run_threads(fn, world=WORLD, timeout=30.0):
    return driver_helpers.run_threads(fn, world, timeout)


# ---- defect 1: unbounded frame buffering ---------------------------------------------------

def test_huge_frame_before_hello_refused_at_once(server):
    """A stranger declaring a 1 GiB payload gets FRAME_TOO_LARGE at once and is hung up on:
    nothing is buffered for it (the server used to wait for — and allocate — 1 GiB)."""
    with conn(server, timeout=3.0) as c:
        c.sendall(P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.Msg.HELLO, 0, 1, 1 << 30))
        text = expect_error(P.read_frame(c), P.ErrorCode.FRAME_TOO_LARGE)
        assert "before HELLO" in text
        with pytest.raises((P.ConnectionClosed, ConnectionResetError)):
            P.read_frame(c)


def test_frame_payload_read_incrementally():
    """Memory for a payload grows with the bytes that arrive, not with the declared length."""
    a, b = socket.socketpair()
    with a, b:
        head = P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.Msg.WRITE_BUFFER, 0, 1, 1 << 29)
        a.sendall(head + bytes(1000))
        a.shutdown(socket.SHUT_WR)
        tracemalloc.start()
        try:
            with pytest.raises(P.ConnectionClosed, match="middle of a frame"):
                P.read_frame(b)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"reading a truncated 512 MiB frame allocated {peak} bytes"


# ---- defect 2: connection cap, idle and slowloris connections, EMFILE -----------------------

def test_connection_cap_refuses_extra_connections_busy():
    srv = FabricServer(WORLD, "golden", max_connections=WORLD + 1)
    srv.start_thread()
    try:
        held = [conn(srv) for _ in range(WORLD + 1)]
        time.sleep(0.2)
        with conn(srv) as extra:
            text = expect_error(P.read_frame(extra), P.ErrorCode.BUSY)
            assert f"cap of {WORLD + 1}" in text
        for c in held:
            c.close()
        time.sleep(0.3)                       # slots are given back when connections close
        with conn(srv) as c:
            assert req(c, P.Msg.HELLO, hello_payload(srv, 0))[0] == P.Msg.HELLO_ACK
    finally:
        srv.stop()


@pytest.mark.parametrize("trickle", [False, True])
def test_silent_or_slowloris_connection_dropped_before_hello(trickle):
    srv = FabricServer(WORLD, "golden", hello_timeout=0.5)
    srv.start_thread()
    try:
        with conn(srv) as c:
            t0 = time.monotonic()
            frame = P.encode(P.Msg.HELLO, hello_payload(srv, 0))
            with pytest.raises((P.ConnectionClosed, ConnectionResetError, BrokenPipeError)):
                for i in range(40):               # one byte every 0.1 s: 4 s if let through
                    if trickle:
                        c.sendall(frame[i:i + 1])
                    time.sleep(0.1)
                    c.setblocking(False)
                    try:
                        if c.recv(1) == b"":
                            raise P.ConnectionClosed("closed")
                    except BlockingIOError:
                        pass
                    finally:
                        c.setblocking(True)
            assert time.monotonic() - t0 < 2.0
    finally:
        srv.stop()


def test_server_survives_emfile_and_keeps_serving(tmp_path):
    """Under a low file-descriptor limit the accept loop hits EMFILE: the server logs it and
    keeps serving (it used to exit with status 0 and no message)."""
    import resource
    import subprocess
    import sys

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
    secret = P.new_secret()
    proc = subprocess.Popen([sys.executable, "-m", "treenic.driver.server", "--nodes", "4",
                             "--port", "0", "--max-connections", "1000", "--hello-timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=low_limit, env=dict(os.environ, **{P.SECRET_ENV: secret}))
    try:
        line = proc.stdout.readline().split()
        address = (line[1], int(line[2]))
        held = []
        for _ in range(80):
            try:
                held.append(socket.create_connection(address, timeout=2))
            except OSError:
                break
        time.sleep(1.0)
        assert proc.poll() is None, "server exited on EMFILE"
        for c in held:
            c.close()
        time.sleep(1.0)
        with socket.create_connection(address, timeout=5) as c:
            c.sendall(P.encode(P.Msg.HELLO, P.HELLO.pack(P.PROTOCOL_VERSION, 0, WORLD, 0,
                                                         bytes.fromhex(secret))))
            assert P.read_frame(c)[0] == P.Msg.HELLO_ACK
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "EMFILE" in err


# ---- defects 3, 6 and 4 (configuration): inline, bounded, checked, per rank ----------------

def with_topology(schedule, spec, elements=64):
    """The compiler's image set of ``schedule``, claiming to be for topology ``spec``."""
    return ImageSet(compile_images(None, schedule, elements).images, spec).to_bytes()


def with_transfers(schedule, transfers, elements=64):
    """The compiler's image set of ``schedule`` cut down to ``transfers`` (every node's rows
    agree: only the schedule checkers can tell it is partial)."""
    part = Schedule(schedule.algorithm, schedule.topology, schedule.num_chunks, transfers,
                    schedule.reduce_steps, schedule.gather_steps)
    return image_set(part, elements)


def hello_conn(server, rank):
    c = conn(server)
    assert req(c, P.Msg.HELLO, hello_payload(server, rank))[0] == P.Msg.HELLO_ACK
    return c


def test_config_topology_file_never_opened(server, ring4, tmp_path):
    """A file: topology over the protocol is refused with the same text whether the file
    exists, holds secrets or not: no file is opened, nothing of it is echoed."""
    secret = tmp_path / "secret.edgelist"
    secret.write_text("0 1\n1 2\nTOPSECRET line\n")
    texts = []
    with hello_conn(server, 0) as c:
        for spec in (f"file:{secret}", f"file:{tmp_path}/missing.json", str(secret),
                     "file:/etc/passwd"):
            texts.append(expect_error(load(c, with_topology(ring4, spec)),
                                      P.ErrorCode.BAD_CONFIG))
    assert len(set(texts)) == 1 and "inline" in texts[0]
    assert "TOPSECRET" not in texts[0] and str(tmp_path) not in texts[0]


def test_huge_topology_refused_before_building_and_hello_not_blocked(server, ring4):
    image = with_topology(ring4, "mesh:300x300")
    with hello_conn(server, 0) as c:
        t0 = time.monotonic()
        c.sendall(P.encode(P.Msg.LOAD_CONFIG,
                           P.LOAD_CONFIG.pack(P.IMAGE_SET, zlib.crc32(image)) + image))
        with hello_conn(server, 1):                 # HELLO answered while LOAD_CONFIG runs
            assert time.monotonic() - t0 < 1.0
        text = expect_error(P.read_frame(c), P.ErrorCode.BAD_CONFIG)
        assert time.monotonic() - t0 < 1.0
        assert "larger than the fabric's 4 nodes" in text


def test_config_with_empty_or_partial_schedule_refused(server, ring4):
    """An empty schedule used to be accepted: every rank got its own input back."""
    with hello_conn(server, 0) as c:
        text = expect_error(load(c, with_transfers(ring4, [])), P.ErrorCode.BAD_CONFIG)
        assert "checkers" in text and "postcondition" in text
        half = with_transfers(ring4, ring4.transfers[: len(ring4.transfers) // 2])
        expect_error(load(c, half), P.ErrorCode.BAD_CONFIG)
        assert load(c, image_set(ring4))[0] == P.Msg.CONFIG_ACK


def test_image_set_whose_nodes_disagree_refused(server, ring4):
    """CRC-valid images that are not one schedule's (node 1 lost a REDUCE row that node 0's
    rows send to it): the RTL would wait for ever, so the set is refused naming the node."""
    ims = compile_images(None, ring4, 64)
    table = ims[1].table
    drop = next(i for i, e in enumerate(table.entries) if e.op.name == "REDUCE")
    table.entries = table.entries[:drop] + table.entries[drop + 1:]
    with hello_conn(server, 0) as c:
        text = expect_error(load(c, ImageSet(ims.images, "ring:4").to_bytes()),
                            P.ErrorCode.BAD_CONFIG)
    assert "node 1" in text and "table" in text


def test_oversized_image_set_refused_from_its_header(server):
    """The declared LOAD_CONFIG length is held to the image set bound before any of its
    bytes are received (the frame is refused on its 16 header bytes)."""
    with hello_conn(server, 0) as c:
        c.sendall(P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.Msg.LOAD_CONFIG, 0, 1,
                                P.LOAD_CONFIG.size + P.MAX_IMAGE_SET_BYTES + 1))
        text = expect_error(P.read_frame(c), P.ErrorCode.FRAME_TOO_LARGE)
        assert "LOAD_CONFIG" in text


def test_old_client_told_why(server, ring4):
    """A version-2 client (schedule JSON in LOAD_CONFIG) learns that version 3 ships the
    image set."""
    with conn(server) as c:
        text = expect_error(req(c, P.Msg.HELLO, b"", version=2), P.ErrorCode.VERSION_MISMATCH)
    assert "version 2" in text and "image set" in text


def test_ranks_with_different_configs_get_config_mismatch(server):
    """A second rank's image used to replace the first one's silently."""
    ring = algorithms.build("ring", "ring:4")
    tree = algorithms.build("multitree", "ring:4")

    def rank(r):
        s = tree if r == 2 else ring
        with open_nic("rtl", r, WORLD, algorithm=s, **server.endpoint, timeout=10) as c:
            c.allreduce(np.ones(64, np.float32))
    t0 = time.monotonic()
    _, errs = run_threads(rank)
    assert time.monotonic() - t0 < 5
    ids = [zlib.crc32(image_set(s, 64)) for s in (ring, tree)]
    for e in errs:
        assert isinstance(e, FabricError) and e.code == "CONFIG_MISMATCH", e
        assert f"rank 2: {ids[1]:#010x}" in str(e) and f"rank 0: {ids[0]:#010x}" in str(e)


def test_client_verifies_config_id(ring4):
    """A fabric acknowledging another config id than the one sent is an error."""
    from treenic.driver.client import NICClient
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def fake():
        c, _ = lsock.accept()
        with c:
            for reply in (P.HELLO_ACK.pack(P.PROTOCOL_VERSION, WORLD, 0, 0),
                          P.CONFIG_ACK.pack(0x1234, WORLD, 3, 4)):
                _, tag, _, _ = P.read_frame(c)
                c.sendall(P.encode(P.Msg.HELLO_ACK if len(reply) == 8 else P.Msg.CONFIG_ACK,
                                   reply, tag, reply=True))
    t = threading.Thread(target=fake, daemon=True)
    t.start()
    client = NICClient(lsock.getsockname(), 0, WORLD, timeout=5, secret=P.new_secret())
    with pytest.raises(FabricError, match="acknowledged config 0x00001234") as e:
        client.load_config(image_set(ring4))
    assert e.value.code == "CONFIG_MISMATCH"
    client.sock.close()
    lsock.close()


# ---- defect 4 (authentication): the job secret ---------------------------------------------

def test_hello_without_job_secret_refused_and_hung_up(server, ring4):
    """A local stranger can neither take a free rank, nor squat one, nor read STATUS."""
    wrong = P.HELLO.pack(P.PROTOCOL_VERSION, 1, WORLD, 0, bytes(32)) + b"stranger"
    with conn(server) as c:
        text = expect_error(req(c, P.Msg.HELLO, wrong), P.ErrorCode.AUTH)
        assert server.secret not in text and "00" * 8 not in text
        with pytest.raises((P.ConnectionClosed, ConnectionResetError)):
            P.read_frame(c)                      # one guess per connection
    with conn(server) as c:                      # nothing bound: STATUS still needs HELLO
        expect_error(req(c, P.Msg.STATUS), P.ErrorCode.NOT_READY)
    assert not server.ranks
    # the real rank 1 still gets its rank and runs with the others
    g = np.random.default_rng(1).standard_normal((WORLD, 33)).astype(np.float32)

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=ring4, **server.endpoint, timeout=10) as c:
            t = g[r].copy()
            c.allreduce(t)
            return t
    out, errs = run_threads(rank)
    assert errs == [None] * WORLD
    assert np.array_equal(out[1].view(np.uint32), execute(ring4, g)[1].view(np.uint32))


def test_rank_needs_the_secret(server, ring4, monkeypatch):
    monkeypatch.delenv(P.SECRET_ENV, raising=False)
    with pytest.raises(FabricError, match="AUTH"):
        open_nic("rtl", 0, WORLD, algorithm=ring4, address=server.address,
                 secret=P.new_secret(), timeout=5)
    from treenic.driver import DriverError
    with pytest.raises(DriverError, match=f"no job secret: pass secret= or set {P.SECRET_ENV}"):
        open_nic("rtl", 0, WORLD, algorithm=ring4, address=server.address, timeout=5)
    monkeypatch.setenv(P.SECRET_ENV, server.secret)             # out of band: environment
    with open_nic("rtl", 0, WORLD, algorithm=ring4, address=server.address, timeout=5) as c:
        assert c.status()["nic"]["config_id"] == c.config_id


# ---- defect 7: a refused START changes nothing ---------------------------------------------

def test_refused_start_keeps_the_staged_buffer(server, ring4):
    g = np.random.default_rng(7).standard_normal((WORLD, 50)).astype(np.float32)
    with hello_conn(server, 0) as c:
        assert load(c, image_set(ring4, 50))[0] == P.Msg.CONFIG_ACK
        raw = g[0].astype("<f4").tobytes()
        assert req(c, P.Msg.WRITE_BUFFER, P.BUFFER.pack(1, 1, 0, 0, 50) + raw)[0] == \
            P.Msg.WRITE_ACK
        expect_error(req(c, P.Msg.START, P.START.pack(1, 9, 0, 0, 0.0, 0)),
                     P.ErrorCode.BAD_PAYLOAD)                             # unknown mode
        expect_error(req(c, P.Msg.START, P.START.pack(1, 1, 0, 5, 2.0, 0) + b"topka"),
                     P.ErrorCode.BAD_PAYLOAD)                             # density 2
        expect_error(req(c, P.Msg.START, P.START.pack(1, 1, 0, 2, 0.5, 0) + b"\xff\xfe"),
                     P.ErrorCode.BAD_PAYLOAD)                             # name not UTF-8

        def rank(r):
            if r == 0:
                return None
            with open_nic("rtl", r, WORLD, algorithm=ring4, **server.endpoint,
                          timeout=10) as cc:
                t = g[r].copy()
                cc.allreduce(t)
                return t
        threads = threading.Thread(target=lambda: out.append(run_threads(rank)), daemon=True)
        out = []
        threads.start()
        reply = req(c, P.Msg.START, P.START.pack(1, 0, 0, 0, 0.0, 0))   # the buffer is there
        assert reply[0] == P.Msg.COMPLETE, P.decode_error(reply[3])
        threads.join(20)
        results, errs = out[0]
        assert errs == [None] * WORLD
        msg, _, _, payload = req(c, P.Msg.READ_BUFFER, P.READ_BUFFER.pack(1, 0))
        got = np.frombuffer(payload[P.BUFFER.size:], "<f4")
        assert np.array_equal(got.view(np.uint32), execute(ring4, g)[0].view(np.uint32))


# ---- defect 8: non-contiguous numpy arrays -------------------------------------------------

@pytest.mark.parametrize("layout", ["transposed", "strided", "fortran"])
def test_allreduce_writes_into_non_contiguous_numpy_array(ring4, layout):
    from treenic.driver import LocalFabric
    fab = LocalFabric(ring4)
    rng = np.random.default_rng(8)
    base = rng.standard_normal((WORLD, 6, 10)).astype(np.float32)

    def view(r):
        m = base[r].copy()
        if layout == "transposed":
            return m.T                                 # (10, 6), not C-contiguous
        if layout == "strided":
            return np.repeat(m, 2, axis=1)[:, ::2]     # every other column
        return np.asfortranarray(m)
    arrays = [view(r) for r in range(WORLD)]
    assert not arrays[0].flags.c_contiguous
    expect = execute(ring4, np.stack([a.reshape(-1) for a in arrays]))

    def rank(r):
        c = open_nic("model", r, WORLD, algorithm=ring4, fabric=fab)
        assert c.allreduce(arrays[r]) is arrays[r]
    _, errs = run_threads(rank)
    assert errs == [None] * WORLD
    for r in range(WORLD):
        assert np.array_equal(arrays[r].reshape(-1).view(np.uint32), expect[r].view(np.uint32))


def test_allreduce_refuses_read_only_array(ring4):
    from treenic.driver import DriverError, LocalFabric
    fab = LocalFabric(ring4)
    a = np.ones(8, np.float32)
    a.flags.writeable = False
    c = open_nic("model", 0, WORLD, algorithm=ring4, fabric=fab)
    t0 = time.monotonic()
    with pytest.raises(DriverError, match="read-only"):
        c.allreduce(a)
    assert time.monotonic() - t0 < 5            # refused up front, not after a collective


# ---- defect 5: a rank that dies aborts the collective for everyone --------------------------

def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.mark.parametrize("when", ["before_start", "inside_start"])
def test_killed_rank_aborts_collective_for_every_rank_within_1s(server, ring4, when):
    """Rank 3 runs in its own process and is SIGKILLed: ranks 0 and 1 (waiting in START)
    and rank 2 (starting later) all get ABORTED naming rank 3 within a second (they used
    to wait for the full collective timeout, and the message blamed the server)."""
    import subprocess
    import sys
    script = ("import sys, numpy as np, time\n"
              "from treenic.driver import open_nic\n"
              "from treenic import algorithms\n"
              "c = open_nic('rtl', 3, 4, 'ring:4', 'ring', address=(sys.argv[1], "
              "int(sys.argv[2])), secret=sys.argv[3], timeout=30)\n"
              "print('ready', flush=True)\n"
              + ("c.allreduce(np.ones(64, np.float32))\n" if when == "inside_start"
                 else "time.sleep(60)\n"))
    proc = subprocess.Popen([sys.executable, "-c", script, server.address[0],
                             str(server.address[1]), server.secret], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        errs, done = [None] * 3, [None] * 3
        clients = [open_nic("rtl", r, WORLD, algorithm=ring4, **server.endpoint, timeout=30)
                   for r in range(3)]

        def rank(r):
            try:
                clients[r].allreduce(np.ones(64, np.float32))
            except FabricError as e:
                errs[r] = e
            done[r] = time.monotonic()
        ts = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
        for t in ts:
            t.start()
        rv = server.rendezvous
        want = {0, 1, 3} if when == "inside_start" else {0, 1}
        _wait_for(lambda: any(set(rec.requests) == want for rec in list(rv._records.values())))
        proc.kill()
        killed = time.monotonic()
        for t in ts:
            t.join(5)
        rank(2)                                    # a rank arriving after the death
        for r in range(3):
            assert errs[r] is not None and errs[r].code == "ABORTED", errs[r]
            assert "ABORTED: rank 3 disconnected" in str(errs[r])
            assert done[r] - killed < 1.0, f"rank {r} learned after {done[r] - killed:.2f}s"
        for c in clients:
            c.close()
    finally:
        proc.kill()
        proc.wait(5)


# ---- defect 10: a bad tensor on one rank fails every rank at once, naming it ----------------

@pytest.mark.parametrize("backend", ["model", "rtl"])
@pytest.mark.parametrize("bad", ["dtype", "size", "read_only"])
def test_bad_tensor_on_one_rank_reported_to_every_rank(server, ring4, backend, bad):
    from treenic.driver import LocalFabric
    fab = LocalFabric(ring4, timeout=20)
    opts = dict(fabric=fab) if backend == "model" else dict(server.endpoint, timeout=20)
    comms = [open_nic(backend, r, WORLD, algorithm=ring4, **opts) for r in range(WORLD)]

    def tensor(r):
        if r != 2:
            return np.ones(40, np.float32)
        if bad == "dtype":
            return np.ones(40, np.float64)
        if bad == "size":
            return np.ones(39, np.float32)
        t = np.ones(40, np.float32)
        t.flags.writeable = False
        return t
    done = [None] * WORLD

    def rank(r):
        try:
            comms[r].allreduce(tensor(r))
        finally:
            done[r] = time.monotonic()
    t0 = time.monotonic()
    _, errs = run_threads(rank)
    for r in range(WORLD):
        assert isinstance(errs[r], FabricError if r != 2 or bad == "size" else Exception), errs
        assert "rank 2" in str(errs[r]), errs[r]
        assert done[r] - t0 < 1.0, f"rank {r} learned after {done[r] - t0:.2f}s"
    for r in range(WORLD):
        if r != 2 and bad != "size":
            assert errs[r].code == "ABORTED"
    # the next collective works again on every rank
    _, errs = run_threads(lambda r: comms[r].allreduce(np.ones(40, np.float32)))
    assert errs == [None] * WORLD
    for c in comms:
        c.close()


def test_rank_leaving_with_bye_and_reconnecting_aborts_nothing(server, ring4):
    """Ranks reopen their communicator between phases, not in lockstep: rank 3 closing its
    first connection (BYE) while rank 0 already waits in the next phase's collective must
    not abort it."""
    g = np.ones(16, np.float32)
    first = open_nic("rtl", 3, WORLD, algorithm=ring4, **server.endpoint, timeout=10)

    def rank(r):
        if r == 3:
            time.sleep(0.3)                   # the others are already waiting in START
            first.close()
        with open_nic("rtl", r, WORLD, algorithm=ring4, **server.endpoint, timeout=10) as c:
            t = g.copy()
            c.allreduce(t)
            return t
    out, errs = run_threads(rank)
    assert errs == [None] * WORLD
    assert all(np.all(o == 4) for o in out)


def test_abort_is_forgotten_once_every_rank_met_it(server, ring4):
    """After a bad tensor aborted collective #1, ranks reopening their communicators
    (sequence numbers from 1 again) run normally: the old abort does not fail them."""
    opts = dict(server.endpoint, timeout=10)

    def phase(bad_rank):
        def rank(r):
            with open_nic("rtl", r, WORLD, algorithm=ring4, **opts) as c:
                t = np.ones(8, np.float64 if r == bad_rank else np.float32)
                c.allreduce(t)
                return t
        return run_threads(rank)
    _, errs = phase(bad_rank=1)
    assert all(e is not None and "rank 1" in str(e) for e in errs)
    out, errs = phase(bad_rank=None)
    assert errs == [None] * WORLD and all(np.all(o == 4) for o in out)


def test_server_started_by_hand_writes_a_private_secret_file(ring4, tmp_path):
    """`python -m treenic.driver.server` without $TREENIC_FABRIC_SECRET: a fresh secret in a
    new mode-0600 file named on the LISTENING line; --secret-file reuses a given one."""
    import stat
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != P.SECRET_ENV}
    given = tmp_path / "job.secret"
    for argv in ([], ["--secret-file", str(given)], ["--secret-file", str(given)]):
        proc = subprocess.Popen([sys.executable, "-m", "treenic.driver.server", "--nodes", "4",
                                 "--port", "0", *argv], stdout=subprocess.PIPE, text=True,
                                env=env)
        try:
            words = proc.stdout.readline().split()
            path = words[4] if len(words) > 4 else str(given)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            secret = open(path).read().strip()
            with open_nic("rtl", 0, WORLD, algorithm=ring4, address=(words[1], int(words[2])),
                          secret=secret, timeout=5) as c:
                assert c.status()["nic"]["config_id"] == c.config_id
            with pytest.raises(FabricError, match="AUTH"):
                open_nic("rtl", 1, WORLD, algorithm=ring4, address=(words[1], int(words[2])),
                         secret=P.new_secret(), timeout=5)
        finally:
            proc.terminate()
            proc.wait(10)
    assert given.exists()                        # created by the second run, reused by the third
