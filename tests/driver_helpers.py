"""Helpers shared by the driver tests: one function per rank in threads (the in-process
world), one raw host-protocol request, the check of an ERROR reply, and a raw LOAD_CONFIG of
a configuration image set, a golden fabric server, and a stand-in for the Verilator build."""
import threading
import zlib

from treenic.driver import protocol as P
from treenic.firmware.image import compile_images


def run_threads(fn, world, timeout=30.0):
    """``fn(rank)`` on ``world`` threads; returns (results, exceptions), one per rank, and
    fails the test if a rank is still running after ``timeout`` seconds."""
    out, errs = [None] * world, [None] * world

    def wrap(r):
        try:
            out[r] = fn(r)
        except BaseException as e:
            errs[r] = e
    ts = [threading.Thread(target=wrap, args=(r,), daemon=True) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), "rank thread hung"
    return out, errs


def req(sock, msg, payload=b"", version=P.PROTOCOL_VERSION):
    """Send one host-protocol frame (tag 1) and return the reply frame."""
    sock.sendall(P.encode(msg, payload, 1, version=version))
    return P.read_frame(sock)


def expect_error(reply, code):
    """Assert ``reply`` is an ERROR with ``code``; returns its text."""
    msg, _, _, payload = reply
    assert msg == P.Msg.ERROR, f"expected ERROR {code.name}, got {msg:#x}"
    got, text = P.decode_error(payload)
    assert got == code, (got, text)
    return text


def image_set(schedule, elements=64):
    """The bytes a rank sends with LOAD_CONFIG: the compiler's image set for ``elements``."""
    return compile_images(None, schedule, elements).to_bytes()


def load(sock, data, *, kind=P.IMAGE_SET, crc=None):
    """Raw LOAD_CONFIG of ``data`` (an image set, or anything a test wants refused)."""
    crc = zlib.crc32(data) if crc is None else crc
    return req(sock, P.Msg.LOAD_CONFIG, P.LOAD_CONFIG.pack(kind, crc) + data)


def golden_server(world, **kw):
    """A golden-engine fabric server in this process (a fixture body: ``yield from``)."""
    from treenic.driver.server import FabricServer
    srv = FabricServer(world, "golden", **{"collective_timeout": 10.0, "idle_timeout": 30.0,
                                           **kw})
    srv.start_thread()
    yield srv
    srv.stop()


def stub_verilator(monkeypatch, seen: dict) -> None:
    """Replace the Verilator build (:func:`treenic.hdl.cosim.build_cosim`) by a stand-in
    whose model does nothing; ``seen["fabric"]`` is the design it was handed. The RTL
    engine's constructor check (``cosim_available``) passes."""
    import treenic.hdl.cosim as cosim

    class Stub:
        def new(self):
            return self

        def reset(self):
            pass

    def build(fabric, **kw):
        seen["fabric"] = fabric
        return Stub()
    monkeypatch.setattr(cosim, "build_cosim", build)
    monkeypatch.setattr(cosim, "cosim_available", lambda: True)
