"""Issue 19, item 15: hypothesis stateful tests of the host protocol against a live fabric
server. Several clients send sequences of valid and invalid messages (HELLO with and without
the job secret, wrong worlds and ranks, configurations valid, unchecked and file-naming,
buffers of every size and dtype, bad STARTs, ABORTs, corrupted and garbage frames, BYEs, and
full collectives of all four ranks); a model of the server predicts every reply. The server
must answer each request as the model says, never die, and keep serving. Bounded: a fixed
number of examples and steps (about 20 s here)."""
import socket
import threading
import time
import zlib

import numpy as np
from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from treenic import algorithms
from treenic.driver import protocol as P
from treenic.driver.server import FabricServer
from treenic.firmware.image import ImageSet, compile_images
from treenic.schedule.execute import execute
from treenic.schedule.ir import Schedule

WORLD = 4
#: (schedule, element count) of each valid image set; a collective runs the loaded count
CONFIGS = [(algorithms.build("ring", "ring:4"), 12), (algorithms.build("multitree", "ring:4"), 12),
           (algorithms.build("ring", "ring:4"), 30)]
IMAGES = [compile_images(None, s, e).to_bytes() for s, e in CONFIGS]
_ring = CONFIGS[0][0]
_empty = Schedule("ring", _ring.topology, _ring.num_chunks, [], _ring.reduce_steps,
                  _ring.gather_steps)
BAD_IMAGES = [b"TNIS not an image set", compile_images(None, _empty, 12).to_bytes(),
              ImageSet(compile_images(None, _ring, 12).images, "file:/etc/passwd").to_bytes(),
              ImageSet(compile_images(None, _ring, 12).images, "mesh:900x900").to_bytes()]
MAX_CLIENTS = 6


class Client:
    def __init__(self, server):
        self.sock = socket.create_connection(server.address, timeout=5)
        self.rank = None
        self.config = 0
        self.staged: set[int] = set()
        self.tag = 0

    def request(self, msg, payload=b"", *, frame=None):
        self.tag += 1
        self.sock.sendall(frame if frame is not None else P.encode(msg, payload, self.tag))
        return P.read_frame(self.sock)


def error_code(reply):
    msg, _, _, payload = reply
    assert msg == P.Msg.ERROR, f"expected ERROR, got {msg:#x}"
    return P.decode_error(payload)[0]


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.server = FabricServer(WORLD, "golden", collective_timeout=5.0, hello_timeout=30.0)
        self.server.start_thread()
        self.clients: list[Client] = []
        self.secret = bytes.fromhex(self.server.secret)
        self.collective_seq = 1000

    def teardown(self):
        for c in self.clients:
            c.sock.close()
        # still serving after everything the run threw at it
        with socket.create_connection(self.server.address, timeout=5) as s:
            s.sendall(P.encode(P.Msg.STATUS, b"", 1))
            assert error_code(P.read_frame(s)) == P.ErrorCode.NOT_READY
        self.server.stop()

    # ---- helpers --------------------------------------------------------------------------
    def pick(self, i) -> Client:
        return self.clients[i % len(self.clients)]

    def bound_ranks(self):
        return {c.rank for c in self.clients if c.rank is not None}

    def drop(self, c: Client, *, wait_release: bool):
        c.sock.close()
        self.clients.remove(c)
        if wait_release and c.rank is not None:          # the server notices EOF soon
            deadline = time.monotonic() + 2
            while c.rank in self.server.ranks and time.monotonic() < deadline:
                time.sleep(0.01)
            assert c.rank not in self.server.ranks

    # ---- rules ----------------------------------------------------------------------------
    @precondition(lambda self: len(self.clients) < MAX_CLIENTS)
    @rule()
    def connect(self):
        self.clients.append(Client(self.server))

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), rank=st.integers(0, 5), world=st.sampled_from([4, 4, 4, 3]),
          good_secret=st.booleans())
    def hello(self, i, rank, world, good_secret):
        c = self.pick(i)
        secret = self.secret if good_secret else bytes(32)
        reply = c.request(P.Msg.HELLO, P.HELLO.pack(P.PROTOCOL_VERSION, rank, world, 0,
                                                    secret) + b"fuzz")
        if not good_secret:
            assert error_code(reply) == P.ErrorCode.AUTH
            self.drop(c, wait_release=True)                  # hung up after AUTH
        elif world != WORLD:
            assert error_code(reply) == P.ErrorCode.WORLD_MISMATCH
        elif rank >= WORLD or c.rank is not None or rank in self.bound_ranks():
            assert error_code(reply) == P.ErrorCode.BAD_RANK
        else:
            assert reply[0] == P.Msg.HELLO_ACK
            c.rank = rank

    @precondition(lambda self: len(self.clients) + WORLD - len(self.bound_ranks()) <= MAX_CLIENTS)
    @rule(which=st.integers(0, len(IMAGES) - 1))
    def join_world(self, which):
        """The valid path: every free rank connects, says HELLO and loads one image; ranks
        already bound load it too."""
        for r in sorted(set(range(WORLD)) - self.bound_ranks()):
            c = Client(self.server)
            self.clients.append(c)
            self.hello(len(self.clients) - 1, r, WORLD, True)
        for c in self.clients:
            if c.rank is not None:
                self.load_config(self.clients.index(c), which, False)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9))
    def status(self, i):
        c = self.pick(i)
        reply = c.request(P.Msg.STATUS)
        if c.rank is None:
            assert error_code(reply) == P.ErrorCode.NOT_READY
        else:
            assert reply[0] == P.Msg.STATUS_REPLY
            assert P.STATUS_REPLY.unpack(reply[3])[1] == c.config

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), which=st.integers(0, len(IMAGES) + len(BAD_IMAGES) - 1),
          corrupt_crc=st.booleans())
    def load_config(self, i, which, corrupt_crc):
        c = self.pick(i)
        image = (IMAGES + BAD_IMAGES)[which]
        crc = zlib.crc32(image) ^ (1 if corrupt_crc else 0)
        reply = c.request(P.Msg.LOAD_CONFIG, P.LOAD_CONFIG.pack(P.IMAGE_SET, crc) + image)
        if c.rank is None:
            assert error_code(reply) == P.ErrorCode.NOT_READY
        elif corrupt_crc or which >= len(IMAGES):
            assert error_code(reply) == P.ErrorCode.BAD_CONFIG
        else:
            assert reply[0] == P.Msg.CONFIG_ACK
            c.config = P.CONFIG_ACK.unpack(reply[3])[0]
            assert c.config == zlib.crc32(image)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), seq=st.integers(1, 8), count=st.integers(0, 40),
          dtype=st.sampled_from([1, 1, 1, 2]), short=st.booleans())
    def write(self, i, seq, count, dtype, short):
        c = self.pick(i)
        data = bytes(4 * count - (4 if short and count else 0))
        reply = c.request(P.Msg.WRITE_BUFFER, P.BUFFER.pack(seq, dtype, 0, 0, count) + data)
        if c.rank is None:
            assert error_code(reply) == P.ErrorCode.NOT_READY
        elif dtype != 1:
            assert error_code(reply) == P.ErrorCode.UNSUPPORTED_DTYPE
        elif short and count:
            assert error_code(reply) == P.ErrorCode.BAD_PAYLOAD
        elif seq in c.staged or len(c.staged) >= 4:
            assert error_code(reply) == P.ErrorCode.SEQUENCE
        else:
            assert reply[0] == P.Msg.WRITE_ACK
            c.staged.add(seq)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), seq=st.integers(1, 8), mode=st.sampled_from([1, 2, 200]))
    def bad_start(self, i, seq, mode):
        """STARTs that must be refused without consuming anything (density 0, bad mode)."""
        c = self.pick(i)
        reply = c.request(P.Msg.START, P.START.pack(seq, mode, 0, 0, 0.0, 0))
        if c.rank is None:
            assert error_code(reply) == P.ErrorCode.NOT_READY
        elif not c.config:
            assert error_code(reply) == P.ErrorCode.NOT_READY
        else:
            assert error_code(reply) == P.ErrorCode.BAD_PAYLOAD

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), seq=st.integers(1, 8))
    def abort(self, i, seq):
        c = self.pick(i)
        reply = c.request(P.Msg.ABORT, P.ABORT.pack(seq) + b"fuzz")
        if c.rank is None:
            assert error_code(reply) == P.ErrorCode.NOT_READY
        else:
            assert reply[0] == P.Msg.ABORT_ACK
            c.staged.discard(seq)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), kind=st.sampled_from(["crc", "type", "reply_type"]))
    def recoverable_frame_error(self, i, kind):
        c = self.pick(i)
        if kind == "crc":
            frame = bytearray(P.encode(P.Msg.STATUS, b"", 9))
            frame[-1] ^= 0x40
            assert error_code(c.request(None, frame=bytes(frame))) == P.ErrorCode.BAD_CRC
        else:
            msg = 0x42 if kind == "type" else P.Msg.COMPLETE
            code = error_code(c.request(msg))
            assert code == (P.ErrorCode.UNKNOWN_TYPE if c.rank is not None or kind == "type"
                            else P.ErrorCode.UNKNOWN_TYPE)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9), junk=st.binary(min_size=16, max_size=64),
          huge=st.booleans())
    def fatal_frame(self, i, junk, huge):
        c = self.pick(i)
        if huge:        # a frame declaring more than the connection may send
            limit = P.MAX_PAYLOAD if c.rank is not None else P.MAX_PAYLOAD_BEFORE_HELLO
            frame = P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.Msg.STATUS, 0, 1, limit + 1)
            want = P.ErrorCode.FRAME_TOO_LARGE
        else:
            frame = b"JUNK" + junk
            want = P.ErrorCode.BAD_MAGIC
        assert error_code(c.request(None, frame=frame)) == want
        self.drop(c, wait_release=True)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 9))
    def bye(self, i):
        c = self.pick(i)
        assert c.request(P.Msg.BYE)[0] == P.Msg.BYE_ACK
        self.drop(c, wait_release=False)             # released before BYE_ACK

    @precondition(lambda self: len({c.rank for c in self.clients if c.rank is not None
                                    and c.config}) == WORLD
                  and len({c.config for c in self.clients if c.rank is not None}) == 1
                  and all(len(c.staged) < 4 for c in self.clients))
    @rule(data=st.data())
    def collective(self, data):
        """All four ranks run one dense collective of the loaded image set's element count;
        every result is the golden executor's on the schedule the set was compiled from."""
        self.collective_seq += 1
        seq = self.collective_seq
        ranks = {c.rank: c for c in self.clients if c.rank is not None}
        sched, n = CONFIGS[[zlib.crc32(i) for i in IMAGES].index(ranks[0].config)]
        g = np.asarray(data.draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=WORLD * n,
                                          max_size=WORLD * n)), np.float32).reshape(WORLD, n)
        out = [None] * WORLD

        def rank(r):
            c = ranks[r]
            raw = g[r].astype("<f4").tobytes()
            assert c.request(P.Msg.WRITE_BUFFER, P.BUFFER.pack(seq, 1, 0, 0, n) + raw)[0] == \
                P.Msg.WRITE_ACK
            reply = c.request(P.Msg.START, P.START.pack(seq, 0, 0, 0, 0.0, 0))
            assert reply[0] == P.Msg.COMPLETE, P.decode_error(reply[3])
            reply = c.request(P.Msg.READ_BUFFER, P.READ_BUFFER.pack(seq, 0))
            out[r] = np.frombuffer(reply[3][P.BUFFER.size:], "<f4")
        ts = [threading.Thread(target=rank, args=(r,)) for r in range(WORLD)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        event("collective ran")
        want = execute(sched, g)
        for r in range(WORLD):
            assert out[r] is not None and np.array_equal(out[r].view(np.uint32),
                                                         want[r].view(np.uint32))

    @invariant()
    def server_bookkeeping_matches(self):
        assert set(self.server.ranks) == self.bound_ranks()
        assert self.server.connections <= self.server.max_connections


TestProtocolMachine = ProtocolMachine.TestCase
TestProtocolMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None,
                                        suppress_health_check=list(HealthCheck))
