"""Ring all-reduce (Baidu / Patarasuk & Yuan; MultiTree paper §II-B, Fig. 1).

The buffer is cut into N chunks. Nodes are arranged in a logical ring ``order[0..N-1]``
(position ``p`` sends to position ``p+1 mod N``); position ``p`` owns chunk ``p``.

* reduce-scatter, steps ``s = 1..N-1``: position ``p`` sends (REDUCE) chunk ``(p - s) mod N``
  to ``p+1``. Chunk ``c`` starts at position ``c+1`` and is accumulated along the ring until
  it reaches position ``c`` at step ``N-1`` holding all N contributions;
* all-gather, steps ``N-1+s`` for ``s = 1..N-1``: position ``p`` forwards (GATHER) chunk
  ``(p - s + 1) mod N`` — its own chunk first, then the one it received in the previous step.

That is 2(N−1) steps; every node sends one chunk (M/N bytes) per step, so the α–β cost is
``2(N−1)·α + 2(N−1)/N·M·β`` (bandwidth-optimal). ``flow`` is the chunk id.

Ring order (documented choice, :func:`ring_order`):

* ``ring:N`` — node-id order, which is the physical ring;
* ``torus:XxY`` / ``mesh:XxY`` — a Hamiltonian cycle in which every hop is one physical link,
  when one exists: a boustrophedon (snake) over rows 1..Y-1 restricted to columns 1..X-1,
  closed through column 0 (needs an even row count; otherwise the transposed construction
  with an even column count). A torus with both sides odd (no such cycle on the mesh, which is
  bipartite with an odd node count) snakes the first Y-1 rows and splices the last row in via
  its wrap-around link. 1×N and N×1 grids are a line/ring in node-id order. An odd×odd mesh
  has no Hamiltonian cycle: node-id (row-major) order is used and the contention model
  charges the multi-hop wrap hops;
* every other topology (fat-tree, BiGraph, switch, DGX-2, graph files) — node-id order; the
  contention model charges each hop's route. On the built-in switch networks node ids are
  grouped by leaf switch, so consecutive positions share a switch except at leaf boundaries.

Every constructed order is verified hop by hop; if a construction does not give one-link
hops (it cannot happen for the shapes above, but the check is cheap) node-id order is used.
"""
from __future__ import annotations

from ..schedule.ir import Op, Schedule, ScheduleError, Transfer
from ..topology import Topology


def _grid_cycle(X: int, Y: int, wrap: bool) -> list[tuple[int, int]] | None:
    """Hamiltonian cycle of the X×Y grid (torus if ``wrap``) as (x, y) coordinates, or None."""
    if X < 2 or Y < 2:
        return None
    if Y % 2 == 0:
        cyc = [(x, 0) for x in range(X)]
        for j in range(1, Y):
            xs = range(X - 1, 0, -1) if j % 2 == 1 else range(1, X)
            cyc += [(x, j) for x in xs]
        cyc += [(0, j) for j in range(Y - 1, 0, -1)]
        return cyc
    if X % 2 == 0:
        t = _grid_cycle(Y, X, wrap)
        return [(x, y) for (y, x) in t]
    if not wrap or X < 3 or Y < 3:
        return None
    # odd x odd torus: snake the X x (Y-1) sub-mesh (Y-1 even), then replace its edge
    # (X-1, Y-2) -> (X-2, Y-2) by a detour through the whole last row, going the long way
    # round the row ring: (X-1,Y-2) -> (X-1,Y-1) -> (0,Y-1) -> ... -> (X-2,Y-1) -> (X-2,Y-2).
    base = _grid_cycle(X, Y - 1, False)
    i = base.index((X - 1, Y - 2))
    assert base[i + 1] == (X - 2, Y - 2)
    detour = [(X - 1, Y - 1)] + [(x, Y - 1) for x in range(0, X - 1)]
    return base[: i + 1] + detour + base[i + 1:]


def _is_one_hop_cycle(topo: Topology, order: list[int]) -> bool:
    return all(topo.port_to(a, b) is not None for a, b in zip(order, order[1:] + order[:1]))


def ring_order(topo: Topology) -> list[int]:
    """The logical ring used by :func:`build` (see module docstring)."""
    ident = list(topo.nodes)
    if topo.kind in ("torus", "mesh") and topo.dims is not None:
        X, Y = topo.dims
        cyc = _grid_cycle(X, Y, topo.kind == "torus")
        if cyc is not None:
            order = [y * X + x for x, y in cyc]
            if sorted(order) == ident and _is_one_hop_cycle(topo, order):
                return order
    return ident


def ring_transfers(order: list[int], chunk_of_position, rs_step0: int, ag_step0: int,
                   flow_of=None) -> tuple[list[Transfer], list[Transfer]]:
    """Reduce-scatter and all-gather transfers of a ring over ``order`` (positions 0..n-1).

    ``chunk_of_position(p)`` is the tuple of chunk ids that position ``p`` ends up owning
    after reduce-scatter; reduce-scatter runs in global steps ``rs_step0+1 .. rs_step0+n-1``
    and all-gather in ``ag_step0+1 .. ag_step0+n-1``. ``flow_of(chunks)`` gives the flow id
    (default: the first chunk id). Shared with :mod:`treenic.algorithms.ring2d`.
    """
    n = len(order)
    rs, ag = [], []
    flow_of = flow_of or (lambda chunks: chunks[0])
    for s in range(1, n):
        for p in range(n):
            src, dst = order[p], order[(p + 1) % n]
            ch = tuple(chunk_of_position((p - s) % n))
            rs.append(Transfer(rs_step0 + s, src, dst, Op.REDUCE, ch, flow_of(ch)))
            ch = tuple(chunk_of_position((p - s + 1) % n))
            ag.append(Transfer(ag_step0 + s, src, dst, Op.GATHER, ch, flow_of(ch)))
    return rs, ag


def build(topo: Topology) -> Schedule:
    if not isinstance(topo, Topology):
        raise ScheduleError(f"ring: expected a Topology, got {type(topo).__name__}")
    order = ring_order(topo)
    n = len(order)
    rs, ag = ring_transfers(order, lambda p: (p,), 0, n - 1)
    # position p owns chunk p; the schedule's chunk c therefore ends reduced at order[c]
    return Schedule("ring", topo, n, rs + ag, reduce_steps=n - 1, gather_steps=n - 1,
                    meta={"order": order, "one_hop": _is_one_hop_cycle(topo, order)})
