"""Timing model of MultiTree-Sparse on the sparse NIC engine (``docs/sparse-nic.md``).

The sparse engine (``hdl/nic/sparse_sequencer.py``) runs its node's program row by row, one
row at a time: the program is the one :func:`treenic.schedule.sparse_table.compile_sparse`
emits, and this model consumes those rows (it derives no schedule of its own). Per row:

* ``SEND`` / ``ROOT``: an exact top-k selection of ``part[lo:lo+n]`` by the ``TopKUnit``
  (cycles: the unit's documented contract, :func:`topk_exact_cycles`, from its own
  constants), the selected pairs leave one a cycle through the ``PairNarrower`` (SEND: as
  body flits behind a head flit, then a tail; each is also zeroed through the scatter
  adder), then the row waits until the scatter pipeline (``scatter.LATENCY``) is empty;
* ``RECV`` / ``GRECV``: pop the port's head flit (waiting for it to arrive), one body flit a
  cycle into the scatter adder (RECV) or the final slot (GRECV), the tail, then drain;
* ``GSEND``: head, one final pair a cycle, tail;
* ``END``.

Every row pays the sequencer's FETCH, LOAD, DISPATCH and NEXT states. A message's flits
travel over a link priced by the network model's flit model (:meth:`NicTiming.link_rate`
with the engine's credits = its receive FIFO, and the link's register stages); the receive
FIFO holds every flit a port receives in a run (the compiler sizes it so), so a sender never
waits for credits.

Constants read off the sequencer's state machine are fixed here; the one left,
:attr:`SparseTiming.row_extra`, is measured from the calibration run ``sparse_ring2_1000_d10`` (``rtl_runs``) by :func:`calibrate`, and every
other recorded sparse run is held out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from treenic.hdl.sparse.scatter import LATENCY as SCATTER_LATENCY
from treenic.hdl.sparse.topk import BINS, HIST_PASSES, PASSES, SCAN_CYCLES, ROWS, Mode
from treenic.schedule.sparse_table import SparseOp, unpack_row

from .timing import RTL

__all__ = ["SparseTiming", "SPARSE_RTL", "topk_exact_cycles", "emit_pass_cycles", "predict", "calibrate"]

#: cycles of one histogram pass's scan beyond the rows it reads: the unit's docstring gives
#: the EXACT total 5 C/W + 4 * 133 + 4 at its default 128 rows, a scan of SCAN_CYCLES = 131
#: plus two cycles of pass turnaround
_SCAN_EXTRA = SCAN_CYCLES - ROWS + 2
_TOPK_TAIL = 4


def topk_exact_cycles(n: int, lanes: int, scan_bins: int) -> int:
    """The ``TopKUnit``'s EXACT-mode cycles for a chunk of ``n`` values at full input rate:
    ``PASSES[EXACT]`` data passes of ``ceil(n/W)`` beats, ``HIST_PASSES`` histogram scans of
    ``BINS/scan_bins`` rows each, and the unit's fixed tail (``hdl/sparse/topk.py``)."""
    beats = -(-n // lanes)
    return (PASSES[Mode.EXACT] * beats + HIST_PASSES * (BINS // scan_bins + _SCAN_EXTRA)
            + _TOPK_TAIL)


def emit_pass_cycles(n: int, k: int, lanes: int) -> float:
    """Expected cycles of the emit pass when the selected pairs leave one a cycle: the unit
    streams one beat a cycle, the ``PairNarrower`` holds a beat of c pairs c cycles and
    passes an empty beat at once, so a beat costs max(1, c). With the k selected indices
    spread uniformly over the flow (random gradients), E[max(1, c)] = E[c] + P(c = 0), so
    the pass takes k + sum over beats of (1 - w_b/n)^k cycles (w_b: the beat's lanes)."""
    full, rest = divmod(n, lanes)
    widths = [lanes] * full + ([rest] if rest else [])
    return k + sum((1 - w / n) ** k for w in widths)


@dataclass(frozen=True)
class SparseTiming:
    """Sparse engine and link constants, in NIC clock cycles.

    Attributes
    ----------
    lanes, scan_bins : int
        The engine's top-k lanes W and histogram bins scanned a cycle (``SparseFabricSim``
        defaults: 16 and 16).
    link_latency : int
        Register stages of every link (``SparseFabric``'s ``latency``).
    row_cycles : int
        FETCH, LOAD, DISPATCH and NEXT: every row.
    start_cycles : int
        START to the first row's FETCH (the WAIT state sets ``busy``).
    cmd_cycles : int
        SEND/ROOT: CMD and the feeder's first registered beat before the unit's first pass.
    drain : int
        Last pair into the scatter adder to ``pending == 0`` (the adder pipeline).
    rx_extra : int
        A flit on the link's output to readable in the receive FIFO (the FIFO's output
        register).
    row_extra : int
        Cycles every row takes beyond the states counted above: handshakes between the
        sequencer, the narrower, the scatter adder's ``pending`` count and the receive FIFO
        (measured on the calibration run by :func:`calibrate`).
    """
    lanes: int = 16
    scan_bins: int = 16
    link_latency: int = 1
    row_cycles: int = 4
    start_cycles: int = 1
    cmd_cycles: int = 2
    drain: int = SCATTER_LATENCY
    rx_extra: int = 1
    row_extra: int = 0

    def with_(self, **kw) -> "SparseTiming":
        return replace(self, **kw)


#: the values validated against the Verilated sparse fabric: ``row_extra`` as
#: :func:`calibrate` measures it on the calibration run ``sparse_ring2_1000_d10``
#: (a test holds the two equal)
SPARSE_RTL = SparseTiming(row_extra=7)


def _peers(program) -> dict[tuple[int, int], tuple[int, int]]:
    """(sender, its port) -> (receiver, its port), from the wiring the compiler used."""
    from treenic.hdl.nic.fabric import wiring_plan
    from treenic.topology import parse
    out = {}
    for u, pu, v, pv in wiring_plan(parse(program.topology)):
        out.setdefault((u, pu), (v, pv))
    return out


def _select(t: float, row: dict, tm: SparseTiming) -> tuple[float, float]:
    """(end of selection, cycle of the last selected pair) of a SEND/ROOT row whose
    FETCH is at ``t``; pairs leave one a cycle during the emit pass."""
    n, k = row["n"], row["k"]
    beats = -(-n // tm.lanes)
    begin = t + tm.row_cycles - 1 + tm.cmd_cycles
    done = (begin + topk_exact_cycles(n, tm.lanes, tm.scan_bins) - beats
            + emit_pass_cycles(n, k, tm.lanes))
    return done, done - 1


def _row(t, row, tm, flit_time, inbox):
    """Cycle the next row's FETCH starts; a message sent, or None; None when blocked."""
    op, k = row["op"], row["k"]
    t = t + tm.row_extra
    pre = t + tm.row_cycles - 1               # FETCH, LOAD, DISPATCH
    if op in (SparseOp.SEND, SparseOp.ROOT):
        done, last = _select(t, row, tm)
        tail = done + 1 if op == SparseOp.SEND else done
        end = max(tail, last + tm.drain) + 1
        msg = (pre + tm.cmd_cycles, tail) if op == SparseOp.SEND else None
        return end, msg
    if op == SparseOp.GSEND:
        head = pre
        tail = head + 2 + k + 1               # HEAD, HEAD_DONE, pairs, the j == count check
        return tail + 2, (head, tail)
    if op in (SparseOp.RECV, SparseOp.GRECV):
        if not inbox:
            return None
        head_at, tail_at = inbox[0]
        head = max(pre, head_at + flit_time)
        body = max(head + 1 + k, tail_at + flit_time)   # one flit a cycle, or as they come
        drain = tm.drain if op == SparseOp.RECV else 0
        return body + max(1, drain) + 1, "pop"
    return pre, None                          # END


def predict(program, timing: SparseTiming = SPARSE_RTL, *, detail: bool = False):
    """Cycles the sparse fabric takes to run ``program`` (START to the last END), and with
    ``detail`` the per-node cycles."""
    tm = timing
    rate = RTL.with_(credits=max(program.rx_flits, 1)).link_rate(tm.link_latency)
    flit_time = tm.link_latency + tm.rx_extra + (1 / rate - 1)
    peers = _peers(program)
    rows = [[unpack_row(w) for w in r] for r in program.rows]
    port_of = [[r.get("port", 0) for r in rr] for rr in rows]
    P = len(rows)
    pc, now = [0] * P, [float(tm.start_cycles)] * P
    inbox: dict[tuple[int, int], list] = {}
    end = [None] * P
    progress = True
    while progress:
        progress = False
        for u in range(P):
            while end[u] is None:
                row = rows[u][pc[u]]
                key = (u, port_of[u][pc[u]])
                r = _row(now[u], row, tm, flit_time, inbox.get(key, []))
                if r is None:
                    break
                nxt, msg = r
                if msg == "pop":
                    inbox[key].pop(0)
                elif msg is not None:
                    inbox.setdefault(peers[(u, row["port"])], []).append(msg)
                if row["op"] == SparseOp.END:
                    end[u] = nxt
                now[u], pc[u] = nxt, pc[u] + 1
                progress = True
    if any(e is None for e in end):
        raise RuntimeError("sparse program deadlocks in the model (a RECV never gets its message)")
    cycles = [int(math.ceil(e - tm.start_cycles + 1)) for e in end]
    return (max(cycles), cycles) if detail else max(cycles)


def program_for(run):
    """The compiled sparse program of an ``rtl_runs.RtlRun`` (the one compiler, as the
    Verilated fabric loads it)."""
    from treenic.schedule.sparse_table import compile_sparse
    from treenic.sparse.multitree_sparse import MultiTreeSparse
    from treenic.topology import parse
    P = parse(run.topology).n
    return compile_sparse(MultiTreeSparse(P, run.elements, run.density, seed=0,
                                          topology=run.topology))


def calibrate(run, record, base: SparseTiming = SparseTiming()) -> SparseTiming:
    """The ``row_extra`` (0..30) that best matches the calibration record's per-node cycles,
    every sample of it (least absolute error; the smallest such value)."""
    prog = program_for(run)
    want = [s["node_cycles"] for s in [record, *record.get("more_samples", ())]]
    best = None
    for extra in range(31):
        tm = base.with_(row_extra=extra, lanes=run.lanes, link_latency=run.latency)
        _, got = predict(prog, tm, detail=True)
        err = sum(abs(a - b) for w in want for a, b in zip(got, w))
        if best is None or err < best[0]:
            best = (err, tm)
    return best[1]
