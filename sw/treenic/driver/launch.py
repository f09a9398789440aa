"""Run a function in ``world`` local processes joined by a torch.distributed group.

``run_world(fn, world, *args)`` spawns ``world`` processes (``spawn`` start method, loopback
rendezvous), initialises ``torch.distributed`` (gloo by default) in each, calls
``fn(rank, world, *args)`` and returns the per-rank results in rank order. Every wait is
bounded: a process that dies or a world that exceeds ``timeout`` raises :class:`DriverError`
with the failing rank's traceback, and the remaining processes are terminated.
"""
from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from datetime import timedelta

from .errors import DriverError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, world, port, dist_backend, pg_timeout, threads, fn, args, q):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(threads)
        if dist_backend:
            dist.init_process_group(dist_backend, init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=pg_timeout))
        try:
            result = fn(rank, world, *args)
        finally:
            if dist_backend and dist.is_initialized():
                dist.destroy_process_group()
        q.put((rank, True, result))
    except BaseException as e:                      # report, never hang the parent
        q.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_world(fn, world: int, *args, timeout: float = 120.0, dist_backend: str | None = "gloo",
              pg_timeout: float = 60.0, threads: int = 1):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = [ctx.Process(target=_child, args=(r, world, port, dist_backend, pg_timeout, threads,
                                              fn, args, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DriverError(f"world of {world} did not finish within {timeout:.0f}s; "
                                  f"ranks done: {sorted(results)}")
            try:
                rank, ok, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    raise DriverError(f"rank(s) {dead} died (exit codes "
                                      f"{[procs[r].exitcode for r in dead]})") from None
                continue
            if not ok:
                raise DriverError(f"rank {rank} failed: {value}")
            results[rank] = value
        return [results[r] for r in range(world)]
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) == world else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        q.close()
