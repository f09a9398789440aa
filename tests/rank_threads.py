"""Run one function per rank in threads (the driver tests' in-process world)."""
import threading


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
