"""Timing model of MultiTree-Sparse on the sparse NIC engine (``docs/sparse-nic.md``).

The sparse engine (``hdl/nic/sparse_sequencer.py``) runs its node's program row by row, one
row at a time: the program is the one :func:`treenic.schedule.sparse_table.compile_sparse`
emits, and this model consumes those rows (it derives no schedule of its own). Per row:

* selections (``hdl/nic/sparse_select.py``): a dispatcher walks the same rows ahead of the
  sequencer (``dispatch_cycles`` a row) and starts each SEND/ROOT row's exact top-k of
  ``part[lo:lo+n]``, in program order, on the first free of ``topk_units`` units once the
  RECV rows of that flow before it have drained; a selection takes the ``TopKUnit``'s
  documented contract (:func:`topk_exact_cycles`, from its own constants) with its emit
  pass slowed by the one-pair-a-cycle narrower (:func:`emit_pass_cycles`), and ends with
  the pairs in the flow's slot (each also zeroed through the scatter adder);
* ``SEND`` / ``ROOT``: wait for the flow's slot; SEND then streams it (head, one pair a
  cycle, tail);
* ``RECV`` / ``GRECV``: pop the port's head flit (waiting for it to arrive), one body flit a
  cycle into the scatter adder (RECV) or the final slot (GRECV), the tail, then drain;
* ``GSEND``: head, one final pair a cycle, tail;
* ``ACC`` / ``ZERO`` (TopkA's sum, its result region's clearing): one slot pair a cycle
  through the scatter unit, then drain; ``FIXUP`` (global residual): two cycles a pair;
  ``COPY`` (global residual's snapshot and restore): one word a cycle; slots are priced at
  their full budget ``kb`` of the row's flow;
* ``END``.

Codec-message rows (``*_BM``) are not priced: :func:`predict` refuses them.

Every row pays the sequencer's FETCH, LOAD, DISPATCH and NEXT states. A message's flits
travel over a link priced by the network model's flit model (:meth:`NicTiming.link_rate`
with the engine's credits = its receive FIFO, and the link's register stages); the receive
FIFO holds every flit a port receives in a run (the compiler sizes it so), so a sender never
waits for credits.

The per-row constants (:class:`SparseTiming`) are measured on one ``SparseEngine`` in the
Amaranth simulator running one-row programs (:mod:`.sparse_calibrate`, records in
:data:`CALIBRATION`, turned into :data:`SPARSE_RTL` by :func:`calibrate`); no Verilated
fabric run enters them, so every recorded sparse fabric run (``rtl_runs``) is held out.
The emit pass is priced as its expectation over uniformly placed selections
(:func:`emit_pass_cycles`): the RTL's varies a few cycles with where the top-k fall.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from treenic.hdl.sparse.topk import exact_cycles
from treenic.schedule.sparse_table import SparseOp, unpack_row

from .timing import RTL

__all__ = ["SparseTiming", "SPARSE_RTL", "topk_exact_cycles", "emit_pass_cycles", "predict", "calibrate"]

#: the slot and region rows (TopkA, global residual): barriers for the selection side
REGION_OPS = (SparseOp.ACC, SparseOp.ZERO, SparseOp.FIXUP, SparseOp.COPY)


def topk_exact_cycles(n: int, lanes: int, scan_bins: int) -> int:
    """The ``TopKUnit``'s EXACT-mode cycles for a chunk of ``n`` values at full input rate:
    the unit's own cycle contract (:func:`treenic.hdl.sparse.topk.exact_cycles`)."""
    return exact_cycles(n, lanes, scan_bins)


def _beat_widths(n: int, lanes: int) -> list[int]:
    full, rest = divmod(n, lanes)
    return [lanes] * full + ([rest] if rest else [])


def _p_empty(n: int, k: int, w: int) -> float:
    """P(none of k distinct uniform indices of n falls in a beat of w): C(n-w, k)/C(n, k)."""
    return math.prod((n - w - i) / (n - i) for i in range(k)) if k <= n - w else 0.0


def emit_pass_cycles(n: int, k: int, lanes: int, pair_cycles: float = 1.0) -> float:
    """Expected cycles of the emit pass when the selected pairs leave one by one: the unit
    streams one beat a cycle; a beat holding c >= 1 pairs costs 1 + pair_cycles * (c - 1)
    (the ``PairNarrower`` holds it while it serialises the pairs, and the unit's output
    register refills), an empty beat one cycle. With the k selected indices spread
    uniformly over the flow (random gradients): beats + pair_cycles * E[sum (c - 1)+],
    E[sum (c - 1)+] = k - sum over beats of P(c_b >= 1)."""
    widths = _beat_widths(n, lanes)
    extra = k - sum(1 - _p_empty(n, k, w) for w in widths)
    return len(widths) + pair_cycles * extra


@dataclass(frozen=True)
class SparseTiming:
    """Sparse engine and link constants, in NIC clock cycles.

    The per-row constants are one engine's cycles (``cycles`` output: ``busy`` set to
    cleared) for one-row programs in the Amaranth simulator, less the END row
    (:data:`CALIBRATION` records them, :func:`calibrate` derives these).

    Attributes
    ----------
    lanes, scan_bins, topk_units : int
        The engine's top-k lanes W, histogram bins scanned a cycle and top-k units
        (``SparseFabricSim`` defaults: 16, 16 and 2).
    link_latency : int
        Register stages of every link (``SparseFabric``'s ``latency``).
    end_cycles : int
        The END row (FETCH, LOAD, DISPATCH): the whole program's floor.
    dispatch_cycles : int
        The dispatcher's cycles per program row it walks (FETCH, ROW, LOOK).
    row_cycles : int
        A SEND/ROOT row's FETCH, LOAD, DISPATCH before it first looks at its slot.
    select_fixed : int
        A selection beyond the top-k unit's own cycles: dispatch to the unit's command,
        the feeder's address and beat registers, the narrower's end marker, the flag to the
        sequencer.
    pair_cycles : float
        Cycles each further pair of one output beat adds to the emit pass.
    root_tail, send_tail : int
        A ROOT / SEND row after its slot is ready (SEND: plus one cycle a pair; its head
        leaves one cycle after the slot is ready, its tail two cycles before the row ends).
    recv_fixed, grecv_fixed : int
        RECV / GRECV beyond one cycle per pair (head, tail, scatter drain for RECV).
    gsend_fixed : int
        GSEND beyond one cycle per pair.
    head_cycles : int
        Row start to the head flit of a GSEND on the link, plus two.
    rx_extra : int
        A flit out of the link's registers to readable at the head of its receive queue
        (the FIFO, then its skid buffer).
    slot_fixed, copy_fixed : int
        ACC / ZERO / FIXUP beyond one (FIXUP: two) cycles per slot pair and the row's
        FETCH, LOAD, DISPATCH; COPY likewise per word (one engine in the Amaranth
        simulator, a ROOT of 50 pairs then the row, ``python -m
        treenic.netsim.sparse_calibrate --regions``: ACC 71, ZERO 71, FIXUP 121, COPY of
        256 words 277 cycles; the slot rows one more since the 16th wave (the first pair's
        register: SLOT's ``slot_q``, FIX_ADDR), and 4 more each than before
        the scatter unit's input skid and operand register, which the wait for an empty
        adder before the row and its drain after it each pass).
    """
    lanes: int = 16
    scan_bins: int = 16
    topk_units: int = 2
    link_latency: int = 1
    end_cycles: int = 3
    dispatch_cycles: int = 3
    row_cycles: int = 3
    select_fixed: int = 11
    pair_cycles: float = 2.0
    root_tail: int = 2
    send_tail: int = 6
    recv_fixed: int = 14
    grecv_fixed: int = 7
    gsend_fixed: int = 8
    head_cycles: int = 5
    rx_extra: int = 2
    slot_fixed: int = 18
    copy_fixed: int = 18

    def with_(self, **kw) -> "SparseTiming":
        return replace(self, **kw)


#: the calibration measurements: one engine (W = 16, 16 scan bins, 2 top-k units: a one-row
#: program uses one), one row then END, in the
#: Amaranth simulator; (row, n, k) -> engine cycles. :func:`calibrate` derives the per-row
#: constants from them (a test holds :data:`SPARSE_RTL` equal to that).
CALIBRATION = {
    ("END", 0, 0): 3,
    ("ROOT", 500, 50): 324, ("ROOT", 250, 12): 204, ("ROOT", 256, 1): 200,
    ("SEND", 500, 50): 378, ("SEND", 250, 12): 220, ("SEND", 256, 1): 205,
    ("RECV", 500, 50): 69, ("RECV", 500, 12): 31,
    ("GRECV", 500, 50): 60, ("GRECV", 500, 12): 22,
    ("ROOT+GSEND", 500, 50): 382,
}


#: the slot / region rows' engine cycles after a ROOT of 50 pairs (``python -m
#: treenic.netsim.sparse_calibrate --regions``), whose changes ``slot_fixed`` and
#: ``copy_fixed`` follow (a test holds them equal to the engine's)
REGION_RECORDS = {"ACC": 71, "ZERO": 71, "FIXUP": 121, "COPY256": 277}


def _peers(program) -> dict[tuple[int, int], tuple[int, int]]:
    """(sender, its port) -> (receiver, its port), from the wiring the compiler used."""
    from treenic.hdl.nic.fabric import wiring_plan
    from treenic.topology import parse
    out = {}
    for u, pu, v, pv in wiring_plan(parse(program.topology)):
        out.setdefault((u, pu), (v, pv))
    return out


def select_cycles(n: int, k: int, tm: SparseTiming) -> float:
    """Expected cycles of one selection, dispatch to slot ready: the top-k unit's contract
    with its emit pass slowed by the one-pair-a-cycle consumer, plus the fixed cycles."""
    beats = -(-n // tm.lanes)
    return (tm.select_fixed + topk_exact_cycles(n, tm.lanes, tm.scan_bins) - beats
            + emit_pass_cycles(n, k, tm.lanes, tm.pair_cycles))


class _Selection:
    """One node's selection side (``hdl/nic/sparse_select.py``): a dispatcher that walks
    the program ``dispatch_cycles`` a row, starts each SEND/ROOT selection in program order
    on the first free of ``topk_units`` units once the receives of its flow before it are
    accumulated, and the time each selection's slot is ready."""

    def __init__(self, rows, tm):
        self.rows, self.tm = rows, tm
        self.free = [0.0] * tm.topk_units
        self.pc, self.t = 0, 0.0             # next row the dispatcher looks at, and when
        self.ready: dict[int, float] = {}     # SEND/ROOT row -> its flow's slot is ready
        self.recv_done: dict[int, float] = {}  # flow -> the last RECV seen so far drained
        self.barrier: dict[int, float] = {}   # slot / region row -> the sequencer ran it

    def run_to(self, row: int, recv_done: dict) -> float:
        """Dispatch up to program row ``row`` (the sequencer waits on it, so every RECV
        before it has drained: ``recv_done`` holds its flow's time) and return when its
        selection is in the slot."""
        tm = self.tm
        while self.pc <= row:
            r = self.rows[self.pc]
            self.t += tm.dispatch_cycles
            if r["op"] in REGION_OPS:        # a barrier: the sequencer has run it
                self.t = max(self.t, self.barrier[self.pc])
            if r["op"] in (SparseOp.SEND, SparseOp.ROOT):
                u = min(range(len(self.free)), key=self.free.__getitem__)
                self.t = max(self.t, self.free[u], recv_done.get(r["chunk"], 0.0))
                self.free[u] = self.ready[self.pc] = self.t + select_cycles(r["n"], r["k"], tm)
            self.pc += 1
        return self.ready[row]

    def idle_at(self) -> float:
        """When every selection dispatched so far is in its slot."""
        return max(self.free)


def _row(t, i, row, tm, flit_time, inbox, node, kb=()):
    """(cycle the next row starts, message sent / "pop" / None); None while a receive
    waits for a message no sender has produced yet. ``kb``: the program's budget per flow
    (the slot rows' pair counts)."""
    op, k = row["op"], row["k"]
    if op in REGION_OPS:            # waits for the selections in flight, then is a barrier
        t = max(t, node.sel.idle_at())
        if op == SparseOp.COPY:
            end = t + tm.copy_fixed + row["n"]
        else:
            end = t + tm.slot_fixed + kb[row["chunk"]] * (2 if op == SparseOp.FIXUP else 1)
        node.sel.barrier[i] = end
        return end, None
    if op >= SparseOp.SEND_BM:
        raise ValueError(f"the sparse timing model does not price codec-message rows ({op.name})")
    if op in (SparseOp.SEND, SparseOp.ROOT):
        ready = max(t + tm.row_cycles, node.sel.run_to(i, node.recv_done))
        if op == SparseOp.ROOT:
            return ready + tm.root_tail, None
        end = ready + tm.send_tail + k
        return end, (ready + 1, end - 2)
    if op == SparseOp.GSEND:
        end = t + tm.gsend_fixed + k
        return end, (t + tm.head_cycles - 2, end - 2)
    if op in (SparseOp.RECV, SparseOp.GRECV):
        if not inbox:
            return None
        head_at, tail_at = inbox[0]
        fixed = tm.recv_fixed if op == SparseOp.RECV else tm.grecv_fixed
        # the row pops the head three cycles in, then one flit a cycle as they arrive
        start = max(t, head_at + flit_time - 3, tail_at + flit_time - 3 - k - 1)
        if op == SparseOp.RECV:     # drained: the dispatcher may select this flow
            node.recv_done[row["chunk"]] = start + fixed + k
        return start + fixed + k, "pop"
    return t + tm.end_cycles, None            # END


class _Node:
    def __init__(self, rows, tm):
        self.sel = _Selection(rows, tm)
        self.recv_done: dict[int, float] = {}


def predict(program, timing: SparseTiming | None = None, *, detail: bool = False):
    """Cycles the sparse fabric takes to run ``program`` (START to the last END), and with
    ``detail`` the per-node cycles."""
    tm = SPARSE_RTL if timing is None else timing
    rate = RTL.with_(credits=max(program.rx_flits, 1)).link_rate(tm.link_latency)
    flit_time = tm.link_latency + tm.rx_extra + (1 / rate - 1)
    peers = _peers(program)
    rows = [[unpack_row(w) for w in r] for r in program.rows]
    port_of = [[r.get("port", 0) for r in rr] for rr in rows]
    P = len(rows)
    nodes = [_Node(r, tm) for r in rows]
    pc, now = [0] * P, [0.0] * P
    inbox: dict[tuple[int, int], list] = {}
    end = [None] * P
    progress = True
    while progress:
        progress = False
        for u in range(P):
            while end[u] is None:
                row = rows[u][pc[u]]
                key = (u, port_of[u][pc[u]])
                r = _row(now[u], pc[u], row, tm, flit_time, inbox.get(key, []), nodes[u],
                         program.kb)
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
    cycles = [int(round(e)) for e in end]
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


def calibrate(records: dict = CALIBRATION, base: SparseTiming = SparseTiming()
              ) -> SparseTiming:
    """The per-row constants from the one-engine calibration records: ``select_fixed`` is
    what the one-pair ROOT program takes beyond the model's other parts (the dispatcher's
    first row, the unit's contract, the ROOT row's tail, END); ``pair_cycles`` is the
    least-squares slope of the extra emit cycles over E[sum (c - 1)+] (k > 1 rows);
    ``send_tail`` is a SEND's excess over the ROOT of the same flow, less a cycle a pair."""
    end = records[("END", 0, 0)]
    sel = {(n, k): c - end - base.root_tail - base.dispatch_cycles
           for (op, n, k), c in records.items() if op == "ROOT"}
    n0, k0 = min(sel, key=lambda nk: nk[1])
    unit = {nk: topk_exact_cycles(nk[0], base.lanes, base.scan_bins) for nk in sel}
    fixed = sel[(n0, k0)] - unit[(n0, k0)]
    xs, ys = [], []
    for (n, k), c in sel.items():
        if (n, k) != (n0, k0):
            xs.append(emit_pass_cycles(n, k, base.lanes, 1.0) - -(-n // base.lanes))
            ys.append(c - unit[(n, k)] - fixed)
    slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    send = [c - records[("ROOT", n, k)] - k + base.root_tail
            for (op, n, k), c in records.items() if op == "SEND"]
    rx = {op: [c - end - k for (o, _, k), c in records.items() if o == op]
          for op in ("RECV", "GRECV")}
    n, k = max(sel, key=lambda nk: nk[1])
    gsend = records[("ROOT+GSEND", n, k)] - records[("ROOT", n, k)] - k
    return base.with_(end_cycles=end, gsend_fixed=gsend, select_fixed=fixed,
                      pair_cycles=round(slope, 2), send_tail=round(sum(send) / len(send)),
                      recv_fixed=round(sum(rx["RECV"]) / len(rx["RECV"])),
                      grecv_fixed=round(sum(rx["GRECV"]) / len(rx["GRECV"])))


#: the values validated against the Verilated sparse fabric: :func:`calibrate` of
#: :data:`CALIBRATION` (no fabric run enters them)
SPARSE_RTL = calibrate()
