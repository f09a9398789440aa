"""2D-Ring all-reduce (Ying et al., "Image classification at supercomputer scale", TPU pods;
MultiTree paper §I/§II-C, Table I).

On a ``torus:XxY`` or ``mesh:XxY`` (node ``(x, y)`` = id ``y*X + x``) with N = X·Y chunks.
Chunk ``k = a*Y + b`` (``a`` in 0..X-1, ``b`` in 0..Y-1); *super-chunk* ``a`` is the Y chunks
``a*Y .. a*Y+Y-1``. Four ring phases, each the ring algorithm of :mod:`.ring` on a row or a
column ring (position = coordinate, ring direction +x / +y):

1. reduce-scatter along every row (X−1 steps, REDUCE, one super-chunk per transfer):
   node ``(x, y)`` ends holding super-chunk ``x`` summed over its row;
2. reduce-scatter along every column on that super-chunk (Y−1 steps, one chunk per transfer):
   node ``(x, y)`` ends holding chunk ``x*Y + y`` summed over the whole grid;
3. all-gather along every column (Y−1 steps, GATHER): every node of column ``x`` holds the
   complete super-chunk ``x``;
4. all-gather along every row (X−1 steps, GATHER, one super-chunk per transfer).

Steps: 2(X−1) + 2(Y−1); reduce-scatter = phases 1–2. Per node the bytes sent are
``2(X−1)/X·M + 2(Y−1)/(XY)·M = 2(N−1)/N·M`` — the same as Ring, in far fewer steps. ``flow``
is the first chunk id a transfer carries.

Note on the paper's variant: MultiTree §I/§VI-A describe 2D-Ring as "two ring all-reduce
phases in the two dimensions", i.e. a full all-reduce along rows followed by a full
all-reduce along columns, sending ``2(X−1)/X·M + 2(Y−1)/Y·M`` (≈ twice Ring's data). That
order (all-gather, then reduce-scatter again) cannot be written in the Schedule IR, whose
reduce-scatter steps all precede the all-gather steps; this module builds the
reduce-scatter-first form above (Ying et al.'s structure), which is the stronger baseline.

Rings follow coordinate order. On a torus every hop is one link (row/column rings are the
wrap-around rings; for a side of 2 both directions share the single pair of links). On a
mesh the closing hop of each row/column ring (coordinate X−1 → 0) crosses X−1 (Y−1) links,
which the contention model charges — the paper's "no perfect ring in a mesh dimension".
This is the single-direction variant (one ring direction per dimension, rows first).
Any other topology raises :class:`ScheduleError`.
"""
from __future__ import annotations

from ..schedule.ir import Schedule, ScheduleError
from ..topology import Topology
from .ring import ring_transfers


def build(topo: Topology) -> Schedule:
    if not isinstance(topo, Topology) or topo.kind not in ("torus", "mesh") or topo.dims is None:
        spec = getattr(topo, "spec", topo)
        raise ScheduleError(f"ring2d: needs a torus:XxY or mesh:XxY topology, got {spec}")
    X, Y = topo.dims
    n = X * Y
    rs_row_steps, rs_col_steps = X - 1, Y - 1
    reduce_steps = rs_row_steps + rs_col_steps
    transfers = []

    def super_chunk(a):
        return tuple(range(a * Y, a * Y + Y))

    # phase 1 (rows, RS) and phase 4 (rows, AG)
    for y in range(Y):
        row = [y * X + x for x in range(X)]
        rs, ag = ring_transfers(row, super_chunk, rs_step0=0,
                                ag_step0=reduce_steps + rs_col_steps)
        transfers += rs + ag
    # phases 2 and 3 (columns, on super-chunk x)
    for x in range(X):
        col = [y * X + x for y in range(Y)]
        rs, ag = ring_transfers(col, lambda b, x=x: (x * Y + b,), rs_step0=rs_row_steps,
                                ag_step0=reduce_steps)
        transfers += rs + ag
    return Schedule("ring2d", topo, n, transfers, reduce_steps=reduce_steps,
                    gather_steps=rs_col_steps + rs_row_steps,
                    meta={"dims": [X, Y]})
