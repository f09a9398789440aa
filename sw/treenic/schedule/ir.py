"""Schedule IR: the one representation every consumer reads (docs/architecture.md §2, §4).

A :class:`Schedule` is a list of point-to-point :class:`Transfer` s grouped in global steps
(1-based). Steps ``1..reduce_steps`` form the reduce-scatter phase, the rest the all-gather
phase. The buffer of ``E`` elements is cut into ``num_chunks`` contiguous chunks
(:meth:`Schedule.chunk_bounds`); a transfer carries one or more chunks.

Semantics of one step (what the golden executor, the RTL and the driver all implement):

* every transfer of step ``t`` reads its sender's chunk values as they were at the *end of
  step t-1* (a transfer never forwards data that arrived in the same step);
* ``REDUCE``: the receiver adds the carried partial sums into its own chunk;
  ``GATHER``: the receiver overwrites its chunk with the carried (final) values;
* reduction order (docs/architecture.md §5): for each chunk element the receiver's local
  value is the first operand, contributions are added in ascending ``(step, rx_port)`` order, where
  ``rx_port`` is the receiver's local port of the link from the sender
  (:meth:`Schedule.rx_port`). A sender that is not a one-hop neighbour (DBTree or
  halving-doubling on a torus, any switch network) gets the virtual port
  ``max_ports + sender id``, so the order stays total and deterministic.

``flow`` is the tree id a transfer belongs to (MultiTree: the tree rooted at node ``flow``;
ring/2D-ring: the chunk id; DBTree: tree 0 or 1). NIC tables are keyed by it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .. import topology as topo_mod
from ..hdl.link.flit import Op   # the one op code (REDUCE/GATHER/NOP), shared with the RTL
from ..topology import Topology

FORMAT_VERSION = 1


class ScheduleError(ValueError):
    """A schedule that violates the IR's rules or fails a checker."""


@dataclass(frozen=True)
class Transfer:
    step: int
    src: int
    dst: int
    op: Op
    chunks: tuple[int, ...]
    flow: int
    #: vertices from src to dst (switches included) when the algorithm allocated the path
    #: itself (MultiTree on switch networks); None: the topology's deterministic route.
    route: tuple | None = None

    def to_json(self) -> dict:
        d = {"step": self.step, "src": self.src, "dst": self.dst, "op": self.op.name,
             "chunks": list(self.chunks), "flow": self.flow}
        if self.route is not None:
            d["route"] = [v if isinstance(v, int) else list(v) for v in self.route]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Transfer":
        try:
            route = d.get("route")
            route = tuple(v if isinstance(v, int) else tuple(v) for v in route) if route else None
            return cls(int(d["step"]), int(d["src"]), int(d["dst"]), Op[d["op"]],
                       tuple(int(c) for c in d["chunks"]), int(d["flow"]), route)
        except (KeyError, TypeError, ValueError) as e:
            raise ScheduleError(f"malformed transfer {d!r}: {e}") from None


@dataclass
class Schedule:
    algorithm: str
    topology: Topology
    num_chunks: int
    transfers: list[Transfer]
    reduce_steps: int
    gather_steps: int
    build_seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()
        self.transfers = sorted(self.transfers, key=self._order_key)

    # ---- structure -------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.topology.n

    @property
    def steps(self) -> int:
        return self.reduce_steps + self.gather_steps

    @cached_property
    def _max_ports(self) -> int:
        return self.topology.max_ports()

    def rx_port(self, t: Transfer) -> int:
        """Port of ``t.dst`` on which ``t`` arrives (virtual port for non-neighbours)."""
        p = self.topology.port_to(t.dst, t.src)
        return p if p is not None else self._max_ports + t.src

    def tx_port(self, t: Transfer) -> int | None:
        return self.topology.port_to(t.src, t.dst)

    def route(self, t: Transfer) -> tuple:
        """Vertices the transfer crosses, src first (allocated route or shortest path)."""
        return t.route if t.route is not None else tuple(self.topology.route(t.src, t.dst))

    def _order_key(self, t: Transfer):
        return (t.step, t.dst, self.rx_port(t), t.src, t.chunks)

    def by_step(self) -> dict[int, list[Transfer]]:
        out: dict[int, list[Transfer]] = {s: [] for s in range(1, self.steps + 1)}
        for t in self.transfers:
            out[t.step].append(t)
        return out

    def chunk_bounds(self, elements: int) -> np.ndarray:
        """Offsets (num_chunks+1) of the contiguous chunks of an ``elements``-long buffer:
        near-equal sizes, the first ``elements % num_chunks`` chunks one element longer."""
        if elements < 0:
            raise ScheduleError(f"element count must be >= 0, got {elements}")
        base, extra = divmod(elements, self.num_chunks)
        sizes = np.full(self.num_chunks, base, dtype=np.int64)
        sizes[:extra] += 1
        return np.concatenate([[0], np.cumsum(sizes)])

    def bytes_of(self, t: Transfer, elements: int, itemsize: int = 4) -> int:
        b = self.chunk_bounds(elements)
        return int(sum(b[c + 1] - b[c] for c in t.chunks)) * itemsize

    def validate(self) -> None:
        n, c = self.n, self.num_chunks
        if c < 1:
            raise ScheduleError(f"num_chunks must be >= 1, got {c}")
        if self.reduce_steps < 0 or self.gather_steps < 0:
            raise ScheduleError("negative step count")
        for t in self.transfers:
            if not (1 <= t.step <= self.steps):
                raise ScheduleError(f"{t}: step outside 1..{self.steps}")
            if not (0 <= t.src < n and 0 <= t.dst < n) or t.src == t.dst:
                raise ScheduleError(f"{t}: bad endpoints for {n} nodes")
            if not t.chunks or any(not (0 <= k < c) for k in t.chunks):
                raise ScheduleError(f"{t}: chunk ids outside 0..{c - 1}")
            if t.route is not None:
                r = t.route
                if r[0] != t.src or r[-1] != t.dst or any(
                        not self.topology.graph.has_edge(u, v) for u, v in zip(r, r[1:])):
                    raise ScheduleError(f"{t}: route is not a path of {self.topology.spec}")
            if t.op not in (Op.REDUCE, Op.GATHER):
                raise ScheduleError(f"{t}: op must be REDUCE or GATHER")
            phase_ok = (t.op == Op.REDUCE) == (t.step <= self.reduce_steps)
            if not phase_ok:
                raise ScheduleError(f"{t}: {t.op.name} outside its phase "
                                    f"(reduce steps 1..{self.reduce_steps})")

    # ---- JSON --------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Documented export format (README, 'Schedule JSON')."""
        return {
            "format": "treenic-schedule", "version": FORMAT_VERSION,
            "algorithm": self.algorithm, "topology": self.topology.spec,
            "nodes": self.n, "num_chunks": self.num_chunks,
            "steps": {"reduce_scatter": self.reduce_steps, "all_gather": self.gather_steps},
            "ports": {str(v): [p.peer if isinstance(p.peer, int) else list(p.peer)
                               for p in self.topology.ports(v)] for v in self.topology.nodes},
            "meta": self.meta,
            "transfers": [dict(t.to_json(), rx_port=self.rx_port(t)) for t in self.transfers],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, d: dict, topology: Topology | None = None) -> "Schedule":
        if d.get("format") != "treenic-schedule":
            raise ScheduleError("not a treenic schedule (missing format: treenic-schedule)")
        if d.get("version") != FORMAT_VERSION:
            raise ScheduleError(f"schedule format version {d.get('version')} unsupported "
                                f"(this treenic reads {FORMAT_VERSION})")
        try:
            topo = topology or topo_mod.parse(d["topology"])
            steps = d["steps"]
            return cls(d["algorithm"], topo, int(d["num_chunks"]),
                       [Transfer.from_json(t) for t in d["transfers"]],
                       int(steps["reduce_scatter"]), int(steps["all_gather"]),
                       meta=d.get("meta", {}))
        except KeyError as e:
            raise ScheduleError(f"schedule JSON lacks field {e}") from None

    @classmethod
    def loads(cls, text: str) -> "Schedule":
        try:
            return cls.from_json(json.loads(text))
        except json.JSONDecodeError as e:
            raise ScheduleError(f"schedule JSON does not parse: {e}") from None
