"""Golden executor: runs a schedule on N float32 buffers with the exact reduction order of
docs/architecture.md §5, plus an independent replay used to prove it bit-exact.

* :func:`execute` steps through the schedule in place (what hardware does).
* :func:`replay` first derives, symbolically, the expression tree each (node, chunk) ends up
  holding, then evaluates every distinct tree once with numpy over whole chunks. It shares
  nothing with :func:`execute` but the IR's rules, so agreement is a real cross-check.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Op, Schedule, ScheduleError

#: The one NaN of the numeric contract (docs/architecture.md §5): every NaN an addition
#: produces — a NaN operand, or inf + (-inf) — is the quiet NaN 0x7FC00000 (sign 0, payload
#: dropped), as the RTL adder emits it (``treenic.hdl.fp32.CANONICAL_NAN``; a test checks
#: they agree).
#: numpy keeps NaN payloads and gives 0xFFC00000 for inf - inf on x86, so results are
#: canonicalised after every addition here, and after the collective in other backends.
CANONICAL_NAN = 0x7FC00000


def canonicalize_nan(values: np.ndarray) -> np.ndarray:
    """Replace every NaN of the float32 array ``values`` by :data:`CANONICAL_NAN` (in place;
    returns ``values``)."""
    nan = np.isnan(values)
    if nan.any():
        values.view(np.uint32)[nan] = CANONICAL_NAN
    return values


def _add(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """binary32 ``left + right`` under the contract's NaN rule (a new array)."""
    return canonicalize_nan(np.add(left, right, dtype=np.float32))


def _check_buffers(schedule: Schedule, buffers) -> np.ndarray:
    buf = np.asarray(buffers)
    if buf.ndim != 2 or buf.shape[0] != schedule.n:
        raise ScheduleError(f"buffers must have shape ({schedule.n}, elements), got {buf.shape}")
    if buf.dtype != np.float32:
        raise ScheduleError(f"buffers must be float32 (binary32), got {buf.dtype}")
    return buf


def execute(schedule: Schedule, buffers: np.ndarray) -> np.ndarray:
    """Run ``schedule`` on ``buffers`` (N × E float32); returns the final buffers (a copy)."""
    state = _check_buffers(schedule, buffers).copy()
    bounds = schedule.chunk_bounds(state.shape[1])
    with np.errstate(over="ignore", invalid="ignore"):
        for _, transfers in sorted(schedule.by_step().items()):
            # Senders' values as of the end of the previous step.
            payload = [[state[t.src, bounds[c]:bounds[c + 1]].copy() for c in t.chunks]
                       for t in transfers]
            # transfers are sorted by (step, dst, rx_port): applying in list order honours §5.
            for t, data in zip(transfers, payload):
                for c, d in zip(t.chunks, data):
                    sl = slice(bounds[c], bounds[c + 1])
                    if t.op == Op.REDUCE:
                        state[t.dst, sl] = _add(state[t.dst, sl], d)   # local first operand
                    else:
                        state[t.dst, sl] = d
    return state


# ---- symbolic model -------------------------------------------------------------------
# An expression is an int (a node's own input) or a tuple (left, right) meaning left + right.

@dataclass
class SymbolicResult:
    exprs: list[list[object]]          # [node][chunk] -> expression
    contributors: list[list[frozenset]]


def symbolic(schedule: Schedule) -> SymbolicResult:
    """Expression tree and contributor set each (node, chunk) holds after the schedule.
    Raises ScheduleError on a double-counted contribution or a gather of a partial value."""
    n, c = schedule.n, schedule.num_chunks
    full = frozenset(range(n))
    exprs = [[v for _ in range(c)] for v in range(n)]
    contrib = [[frozenset([v]) for _ in range(c)] for v in range(n)]
    for step, transfers in sorted(schedule.by_step().items()):
        snap = [[(exprs[t.src][k], contrib[t.src][k]) for k in t.chunks] for t in transfers]
        for t, vals in zip(transfers, snap):
            for k, (e, s) in zip(t.chunks, vals):
                if t.op == Op.REDUCE:
                    overlap = contrib[t.dst][k] & s
                    if overlap:
                        raise ScheduleError(
                            f"step {step}: {t.src}->{t.dst} chunk {k} counts node(s) "
                            f"{sorted(overlap)[:4]} twice")
                    exprs[t.dst][k] = (exprs[t.dst][k], e)
                    contrib[t.dst][k] = contrib[t.dst][k] | s
                else:
                    if s != full:
                        raise ScheduleError(
                            f"step {step}: {t.src}->{t.dst} gathers chunk {k} holding only "
                            f"{len(s)}/{n} contributions")
                    exprs[t.dst][k] = e
                    contrib[t.dst][k] = s
    return SymbolicResult(exprs, contrib)


def replay(schedule: Schedule, buffers: np.ndarray, sym: SymbolicResult | None = None) -> np.ndarray:
    """Independent evaluation of the schedule's result (see module docstring)."""
    buf = _check_buffers(schedule, buffers)
    sym = sym or symbolic(schedule)
    bounds = schedule.chunk_bounds(buf.shape[1])
    out = np.empty_like(buf)
    for k in range(schedule.num_chunks):
        sl = slice(bounds[k], bounds[k + 1])
        memo: dict[int, np.ndarray] = {}

        def ev(root):
            # post-order walk with an explicit stack: reduce chains can be N levels deep
            stack = [root]
            while stack:
                e = stack[-1]
                if id(e) in memo:
                    stack.pop()
                elif isinstance(e, int):
                    memo[id(e)] = buf[e, sl]
                    stack.pop()
                elif id(e[0]) in memo and id(e[1]) in memo:
                    memo[id(e)] = _add(memo[id(e[0])], memo[id(e[1])])
                    stack.pop()
                else:
                    stack.extend(x for x in (e[1], e[0]) if id(x) not in memo)
            return memo[id(root)]

        with np.errstate(over="ignore", invalid="ignore"):
            for v in range(schedule.n):
                out[v, sl] = ev(sym.exprs[v][k])
    return out


@dataclass
class ExecutionReport:
    result: np.ndarray
    bit_exact: bool               # execute() == replay() bit for bit
    all_nodes_equal: bool         # every node holds the same bits
    max_abs_err_vs_fp64: float    # information only (docs/architecture.md §5)


def run_and_check(schedule: Schedule, buffers: np.ndarray) -> ExecutionReport:
    buf = _check_buffers(schedule, buffers)
    result = execute(schedule, buf)
    ref = replay(schedule, buf)
    bit_exact = bool(np.array_equal(result.view(np.uint32), ref.view(np.uint32)))
    equal = bool(np.all(result.view(np.uint32) == result[:1].view(np.uint32)))
    exact64 = buf.astype(np.float64).sum(axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(result.astype(np.float64) - exact64)
    finite = diff[np.isfinite(diff)]          # inf/NaN inputs: error is meaningless there
    err = float(finite.max()) if finite.size else 0.0
    return ExecutionReport(result, bit_exact, equal, err)
