"""In-NIC reduction engine honouring the §5 reduction order, and its golden model.

ARCHITECTURE §5: for every flow and element, the local value is the first operand and
contributions are added in ascending ``(step, port)`` order -- whatever the arrival
timing.  IEEE addition is not associative, so the engine must fold
``((local + c0) + c1) + ...`` exactly in that order even when several children's
messages arrive at once or skewed.

Architecture (one binary32 adder, one element per cycle)::

    contrib[0] ─► FIFO ─┐
    contrib[1] ─► FIFO ─┤  in-order consumer: reads ONLY the FIFO of order[j],
       ...              ├─► `size` elements, then drains the adder, j += 1
    contrib[P-1]► FIFO ─┘            │ (index, value)
                                     ▼
    local ──► acc[index] = value   acc memory ──read──► reg ──► FP32Adder ─► acc[index]
                                     │
                                     └──► result (index 0..size-1, after the last pass)

* A chunk starts with a command ``cmd = (size, count, order[0..P-1])``: ``order[:count]``
  lists the contributing ports in the reduction order the schedule fixes (sorted by
  ``(step, port)``; see :func:`reduction_order`).  A port may appear more than once
  (parallel links to the same neighbour) -- it then supplies one message per appearance.
* Pass 0 writes the local values (``local`` stream) into the accumulator memory; pass
  *j* >= 1 consumes exactly ``size`` elements of ``contrib[order[j-1]]``, reading
  ``acc[index]`` and writing ``acc[index] + value`` back (accumulator = left operand).
  Between passes the engine waits until the read/add/write-back path is empty, so a
  pass never reads an element the previous pass has not written yet (costs
  ``ADDER_LATENCY + 3`` = 9 cycles per pass).
* Cost per chunk of ``size`` elements with ``k`` contributions, no stalls:
  ``(k + 2) * size + 9 * k + small`` cycles (local pass, k contribution passes, output
  pass), i.e. one adder doing one element per cycle.
* Early arrivals on other ports wait in their per-port FIFO (``fifo_depth`` elements);
  when it is full the port is backpressured (``ready`` low) -- the link layer's flow
  control stops the sender; nothing is dropped or reordered.
* After the last pass the chunk streams out on ``result`` in index order 0..size-1.
* Messages carry a chunk-relative element ``index``; within one message every index
  in ``0..size-1`` must appear exactly once, in any order.  Violations are reported:
  an index ``>= size`` sets ``error`` (sticky until reset) and the element is
  discarded; a command with ``size == 0`` or ``size > depth`` or ``count > ports`` sets
  ``error`` and is dropped without consuming data.

Golden: :func:`reduce_engine_golden` has the same semantics (command list + per-port
message streams -> result chunks); :func:`reduce_golden` is the per-chunk fold.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
from amaranth import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .fp32 import FP32Adder, LATENCY as ADDER_LATENCY, fp32_add_golden

__all__ = ["ReduceEngine", "reduce_golden", "reduce_engine_golden", "reduction_order",
           "element_layout", "command_layout", "random_reduce_traffic"]


def element_layout(depth: int) -> data.StructLayout:
    return data.StructLayout({"index": range(depth), "value": 32})


def command_layout(ports: int, depth: int) -> data.StructLayout:
    return data.StructLayout({
        "size": range(depth + 1),
        "count": range(ports + 1),
        "order": data.ArrayLayout(range(ports), ports),
    })


# ----------------------------------------------------------------------------------
# golden models

def reduction_order(arrivals: Iterable[tuple[int, int]]) -> list[int]:
    """Ports in §5 reduction order from ``(step, port)`` pairs (ascending step, then
    port)."""
    return [p for _, p in sorted(arrivals)]


def reduce_golden(local, contributions: Sequence) -> np.ndarray:
    """Left fold ``((local + c0) + c1) + ...`` of binary32 bit arrays, with
    *contributions* already in reduction order."""
    acc = np.asarray(local, dtype=np.uint32).copy()
    for c in contributions:
        acc = fp32_add_golden(acc, np.asarray(c, dtype=np.uint32))
    return acc


def reduce_engine_golden(commands: Sequence[tuple[int, Sequence[int]]],
                         local: Sequence[tuple[int, int]],
                         port_streams: Mapping[int, Sequence[tuple[int, int]]]
                         ) -> list[np.ndarray]:
    """What :class:`ReduceEngine` outputs, element for element.

    Args:
        commands: ``(size, order)`` per chunk (order = contributing ports, in order).
        local: the ``local`` stream, ``(index, value_bits)`` items, ``size`` per chunk.
        port_streams: per port its ``(index, value_bits)`` items, ``size`` per
            appearance of the port in a command's order.
    Returns the result chunks (uint32 arrays, index order)."""
    pos = {p: 0 for p in port_streams}
    lpos = 0
    out = []
    for size, order in commands:
        acc = np.zeros(size, dtype=np.uint32)
        for idx, v in local[lpos:lpos + size]:
            acc[idx] = v
        lpos += size
        for p in order:
            items = port_streams[p][pos[p]:pos[p] + size]
            if len(items) != size:
                raise ValueError(f"port {p} has too few elements for a chunk of {size}")
            pos[p] += size
            idx = np.array([i for i, _ in items], dtype=np.int64)
            val = np.array([v for _, v in items], dtype=np.uint32)
            if sorted(idx.tolist()) != list(range(size)):
                raise ValueError(f"port {p}: message indices are not a permutation of 0..{size - 1}")
            acc[idx] = fp32_add_golden(acc[idx], val)
        out.append(acc)
    return out


def random_reduce_traffic(rng: np.random.Generator, ports: int, depth: int, n_cmds: int, *,
                          allow_repeat: bool = True):
    """Random test traffic: ``(commands, local, port_streams)`` for
    :func:`reduce_engine_golden` and the benches.  Values are mostly N(0,1) float32
    (similar magnitudes, so the fold order changes the rounding) mixed with corner-case
    patterns; every message's indices are a random permutation of the chunk."""
    from .fp32 import random_operand_pairs

    def values(n):
        v = rng.standard_normal(n).astype(np.float32).view(np.uint32)
        a, _ = random_operand_pairs(n, seed=int(rng.integers(1 << 30)))
        pick = rng.random(n) < 0.15
        v[pick] = a[pick]
        return v

    commands, local, streams = [], [], {p: [] for p in range(ports)}
    for _ in range(n_cmds):
        size = int(rng.integers(1, depth + 1))
        k = int(rng.integers(0, ports + 1))
        order = [int(x) for x in rng.permutation(ports)[:k]]
        if allow_repeat and k > 1 and rng.random() < 0.3:
            order[-1] = order[0]          # parallel links: the same port twice
        commands.append((size, order))
        vals = values(size * (len(order) + 1))
        local += [(int(i), int(vals[n])) for n, i in enumerate(rng.permutation(size))]
        for q, p in enumerate(order):
            perm = rng.permutation(size)
            streams[p] += [(int(i), int(vals[size * (q + 1) + n])) for n, i in enumerate(perm)]
    return commands, local, streams


# ----------------------------------------------------------------------------------
# RTL

class ReduceEngine(wiring.Component):
    """Order-preserving fp32 reduction engine (see module docstring).

    Parameters
    ----------
    ports : int
        Number of contribution ports (children links).
    depth : int
        Largest chunk (elements); size of the accumulator memory.
    fifo_depth : int
        Per-port buffer for early arrivals (elements).

    Members: ``cmd`` (In stream of :func:`command_layout`), ``local`` and
    ``contrib[p]`` (In streams of :func:`element_layout`), ``result`` (Out stream of
    :func:`element_layout`), ``busy`` and ``error`` (Out, 1 bit).
    """

    def __init__(self, ports: int = 4, depth: int = 256, fifo_depth: int = 16):
        if ports < 1 or depth < 2 or fifo_depth < 1:
            raise ValueError("need ports >= 1, depth >= 2, fifo_depth >= 1")
        self.ports, self.depth, self.fifo_depth = ports, depth, fifo_depth
        el = element_layout(depth)
        super().__init__({
            "cmd": In(stream.Signature(command_layout(ports, depth))),
            "local": In(stream.Signature(el)),
            "contrib": In(stream.Signature(el)).array(ports),
            "result": Out(stream.Signature(el)),
            "busy": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, D = self.ports, self.depth
        el = element_layout(D)

        m.submodules.adder = adder = FP32Adder(tag_width=el.size - 32)
        m.submodules.mem = mem = Memory(shape=32, depth=D, init=[])
        rd = mem.read_port()
        wr = mem.write_port()

        size = Signal(range(D + 1))
        count = Signal(range(P + 1))
        order = Signal(data.ArrayLayout(range(P), P))
        j = Signal(range(P + 1))            # contribution pass being consumed
        n = Signal(range(D + 1))            # elements consumed in this pass
        inflight = Signal(range(ADDER_LATENCY + 4))   # pop -> write-back: p0, p1, adder
        out_ptr = Signal(range(D + 1))
        sel = Signal(range(P))
        # the port of the current pass, registered when the pass starts (keeps the
        # order[j] lookup out of the FIFO-select -> read-address path)
        sel_next = order[j[:max(1, (P - 1).bit_length())]] if P > 1 else 0

        # ---- per-port FIFOs
        fifos = []
        for p in range(P):
            f = fifo.SyncFIFOBuffered(width=el.size, depth=self.fifo_depth)
            m.submodules[f"fifo{p}"] = f
            m.d.comb += [
                f.w_data.eq(self.contrib[p].payload),
                f.w_en.eq(self.contrib[p].valid),
                self.contrib[p].ready.eq(f.w_rdy),
            ]
            fifos.append(f)
        head = data.View(el, Signal(el.size))
        head_valid = Signal()
        m.d.comb += [head.as_value().eq(fifos[0].r_data), head_valid.eq(fifos[0].r_rdy)]
        for p in range(1, P):
            with m.If(sel == p):
                m.d.comb += [head.as_value().eq(fifos[p].r_data),
                             head_valid.eq(fifos[p].r_rdy)]

        # ---- read -> adder stage (1-cycle sync read)
        p0_valid = Signal()
        p0_index = Signal(range(D))
        p0_value = Signal(32)
        # p1: register the block RAM output before the adder (timing: the ECP5 DP16KD
        # output is slow; feeding it straight into the adder's compare limited Fmax)
        p1_valid = Signal()
        p1_index = Signal(range(D))
        p1_value = Signal(32)
        p1_acc = Signal(32)
        m.d.sync += [p1_valid.eq(p0_valid), p1_index.eq(p0_index), p1_value.eq(p0_value),
                     p1_acc.eq(rd.data)]
        m.d.comb += [
            adder.i.valid.eq(p1_valid),
            adder.i.payload.a.eq(p1_acc),           # accumulator: left operand
            adder.i.payload.b.eq(p1_value),
            adder.i.payload.tag.eq(p1_index),
            adder.o.ready.eq(1),                    # never stalls: the adder always accepts
        ]
        m.d.sync += p0_valid.eq(0)

        # ---- write port: local values or adder results
        with m.If(adder.o.valid):
            m.d.comb += [wr.addr.eq(adder.o.payload.tag), wr.data.eq(adder.o.payload.sum),
                         wr.en.eq(1)]

        # in-flight count (elements between FIFO pop and accumulator write-back)
        issue = Signal()      # an element enters the read -> add -> write-back path
        inc = issue
        dec = adder.o.valid
        m.d.sync += inflight.eq(inflight + inc - dec)

        res_valid = Signal()
        m.d.comb += [self.result.valid.eq(res_valid),
                     self.result.payload.value.eq(rd.data)]
        res_index = Signal(range(D))
        m.d.comb += self.result.payload.index.eq(res_index)

        err = Signal()
        m.d.comb += self.error.eq(err)

        with m.FSM(name="reduce_fsm") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    c = self.cmd.payload
                    with m.If((c.size == 0) | (c.size > D) | (c.count > P)):
                        m.d.sync += err.eq(1)
                    with m.Else():
                        m.d.sync += [size.eq(c.size), count.eq(c.count), order.eq(c.order),
                                     n.eq(0), j.eq(0)]
                        m.next = "LOCAL"
            with m.State("LOCAL"):
                m.d.comb += self.local.ready.eq(1)
                with m.If(self.local.valid):
                    with m.If(self.local.payload.index < size):
                        m.d.comb += [wr.addr.eq(self.local.payload.index),
                                     wr.data.eq(self.local.payload.value), wr.en.eq(1)]
                    with m.Else():
                        m.d.sync += err.eq(1)
                    m.d.sync += n.eq(n + 1)
                    with m.If(n + 1 == size):
                        m.d.sync += n.eq(0)
                        m.next = "NEXT"
            with m.State("NEXT"):
                # pass boundary: wait for all write-backs of the previous pass
                with m.If(inflight == 0):
                    with m.If(j == count):
                        m.d.sync += out_ptr.eq(0)
                        m.next = "OUTPUT"
                    with m.Else():
                        m.d.sync += sel.eq(sel_next)
                        m.next = "CONTRIB"
            with m.State("CONTRIB"):
                for p in range(P):
                    with m.If(sel == p):
                        m.d.comb += fifos[p].r_en.eq(1)
                with m.If(head_valid):
                    with m.If(head.index < size):
                        m.d.comb += [rd.addr.eq(head.index), issue.eq(1)]
                        m.d.sync += [p0_valid.eq(1), p0_index.eq(head.index),
                                     p0_value.eq(head.value)]
                    with m.Else():
                        m.d.sync += err.eq(1)
                    m.d.sync += n.eq(n + 1)
                    with m.If(n + 1 == size):
                        m.d.sync += [n.eq(0), j.eq(j + 1)]
                        m.next = "NEXT"
            with m.State("OUTPUT"):
                adv = ~res_valid | self.result.ready
                m.d.comb += [rd.addr.eq(out_ptr), rd.en.eq(adv)]
                with m.If(adv):
                    m.d.sync += [res_valid.eq(out_ptr < size), res_index.eq(out_ptr)]
                    with m.If(out_ptr < size):
                        m.d.sync += out_ptr.eq(out_ptr + 1)
                    with m.Else():
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m
