"""NIC watchdog: a run that stops making progress raises an error naming what it waits for.

While the NIC is RUNNING, a down-counter is reloaded with the host's WATCHDOG limit on
every sign of progress -- a flit received or sent on any link, the head entry retiring,
the timestep advancing, the lockstep counter running.  When it reaches zero the watchdog
*fires* (once per run): it latches what the NIC was waiting for into ``info`` and raises
``fire`` for one cycle (the core makes it the sticky ``ErrBit.WATCHDOG``).  A limit of 0
disables it.  The cause, in priority order:

* ``CREDIT``: a TX unit holds a message it cannot send (its data are local, so it lacks
  link credits): that unit's port, and the message's flow and step;
* ``CONTRIB`` / ``GATHER``: the head table entry waits for a contribution (REDUCE, or a
  root's GATHER) or for its parent's data (GATHER): the lowest port that still owes it,
  the entry's flow and step;
* otherwise every entry is issued and the NIC waits for receives: the lowest flow and
  port that still owe one (``CONTRIB`` or ``GATHER``), at the current timestep.

``info`` word (also :func:`decode_info`): bit 31 fired, [30:28] cause, [27:24] port,
[23:16] flow, [15:0] step.

The state it names comes from across the core (the issue unit's dependency logic, every
RX unit's done bits), so the watchdog registers it once before choosing the cause: ``info``
describes the state of the cycle before it fired -- the same state, since nothing moved
for ``limit`` cycles.
"""
from __future__ import annotations

import enum

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .params import NicParams

__all__ = ["Watchdog", "WdCause", "decode_info", "describe_info", "golden_info"]


class WdCause(enum.IntEnum):
    NONE = 0
    CONTRIB = 1      # a REDUCE contribution (child -> this NIC) did not arrive
    GATHER = 2       # the parent's GATHER data did not arrive
    CREDIT = 3       # a TX unit could not send: no credit came back from the link


def decode_info(word: int) -> dict:
    """WD_INFO register -> {fired, cause, port, flow, step}."""
    word = int(word)
    return {"fired": bool(word >> 31), "cause": WdCause((word >> 28) & 7).name,
            "port": (word >> 24) & 0xF, "flow": (word >> 16) & 0xFF, "step": word & 0xFFFF}


def describe_info(word: int) -> str:
    d = decode_info(word)
    what = {"CONTRIB": "contribution", "GATHER": "gather data",
            "CREDIT": "credit"}.get(d["cause"], "progress")
    return f"watchdog: no {what} on port {d['port']} for flow {d['flow']} step {d['step']}"


def _low(bits: int) -> int:
    return (bits & -bits).bit_length() - 1


def golden_info(*, tx_busy=0, tx_flow=(), tx_step=(), head_valid=False, head_gather=False,
                head_flow=0, head_step=0, head_owed=0, owed_red=(), owed_gat=(),
                timestep=0) -> int:
    """The WD_INFO word the watchdog latches for these inputs (same priority rules)."""
    if tx_busy:
        i = _low(tx_busy)
        cause, port, flow, step = WdCause.CREDIT, i, tx_flow[i], tx_step[i]
    elif head_valid and head_owed:
        cause = WdCause.GATHER if head_gather else WdCause.CONTRIB
        port, flow, step = _low(head_owed), head_flow, head_step
    else:
        cause, port, flow, step = WdCause.CONTRIB, 0, 0, timestep
        for f, (r, g) in enumerate(zip(owed_red, owed_gat)):
            if r or g:
                cause = WdCause.CONTRIB if r else WdCause.GATHER
                port, flow = _low(r or g), f
                break
    return 1 << 31 | int(cause) << 28 | (port & 0xF) << 24 | (flow & 0xFF) << 16 | step & 0xFFFF


def _lowest(m, bits, width, name):
    """(any, index of the lowest set bit) of ``bits``."""
    idx = Signal(range(max(2, width)), name=f"{name}_idx")
    for k in reversed(range(width)):
        with m.If(bits[k]):
            m.d.comb += idx.eq(k)
    return bits.any(), idx


class Watchdog(wiring.Component):
    """Progress watchdog of one NIC.

    Parameters
    ----------
    params : NicParams
        The NIC's build parameters (ports, flows, field widths).

    Members
    -------
    running, progress, clear : In(1)
        The NIC runs; something moved this cycle; CTRL CLEAR (re-arms, forgets ``info``).
    limit : In(32)
        Cycles without progress before firing (0: off).
    tx_busy : In(ports)
        TX units holding a message; ``tx_flow`` / ``tx_step`` (per port) its fields.
    head_valid : In(1)
        A table entry waits at the head; ``head_gather`` its op is GATHER, ``head_flow`` /
        ``head_step`` its fields, ``head_owed`` the ports that still owe it data.
    owed_red, owed_gat : In(ArrayLayout(ports, flows))
        Per flow, the ports that still owe a REDUCE contribution / the GATHER data.
    timestep : In(step bits)
    fire : Out(1)
        One cycle when the watchdog fires.
    info : Out(32)
        What it waited for (see the module docstring); 0 until it fires.
    """

    def __init__(self, *, params: NicParams):
        if not isinstance(params, NicParams):
            raise TypeError(f"params must be NicParams, not {type(params).__name__}")
        self.p = p = params
        P, F = p.ports, p.max_nodes
        super().__init__({
            "running": In(1), "progress": In(1), "clear": In(1), "limit": In(32),
            "tx_busy": In(P), "tx_flow": In(data.ArrayLayout(p.flow_bits, P)),
            "tx_step": In(data.ArrayLayout(p.step_bits, P)),
            "head_valid": In(1), "head_gather": In(1), "head_flow": In(p.flow_bits),
            "head_step": In(p.step_bits), "head_owed": In(P),
            "owed_red": In(data.ArrayLayout(P, F)), "owed_gat": In(data.ArrayLayout(P, F)),
            "timestep": In(p.step_bits),
            "fire": Out(1), "info": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.p
        P, F = p.ports, p.max_nodes
        count = Signal(32)
        armed = Signal(init=1)            # not yet fired in this run
        with m.If(~self.running | self.progress | (self.limit == 0)):
            m.d.sync += count.eq(self.limit)
        with m.Elif(count != 0):
            m.d.sync += count.eq(count - 1)
        expired = self.running & armed & (self.limit != 0) & (count == 0)
        with m.If(~self.running & ~expired):
            m.d.sync += armed.eq(1)

        st = self._registered_state(m)
        cause, port, flow, step = (Signal(3), Signal(4), Signal(8), Signal(16))
        tx_any, tx_i = _lowest(m, st["tx_busy"], P, "tx")
        hd_any, hd_i = _lowest(m, st["head_owed"], P, "head")
        # receives still owed once every entry is issued: the lowest flow with one
        rx_flow = Signal(range(max(2, F)))
        rx_port = Signal(range(max(2, P)))
        rx_gat = Signal()
        for f in reversed(range(F)):
            r_any, r_i = _lowest(m, st["owed_red"][f], P, f"red{f}")
            g_any, g_i = _lowest(m, st["owed_gat"][f], P, f"gat{f}")
            with m.If(r_any | g_any):
                m.d.comb += [rx_flow.eq(f), rx_port.eq(Mux(r_any, r_i, g_i)),
                             rx_gat.eq(~r_any)]
        with m.If(tx_any):
            m.d.comb += [cause.eq(3), port.eq(tx_i),
                         flow.eq(st["tx_flow"].as_value().word_select(tx_i, p.flow_bits)),
                         step.eq(st["tx_step"].as_value().word_select(tx_i, p.step_bits))]
        with m.Elif(st["head_valid"] & hd_any):
            m.d.comb += [cause.eq(Mux(st["head_gather"], 2, 1)), port.eq(hd_i),
                         flow.eq(st["head_flow"]), step.eq(st["head_step"])]
        with m.Else():
            m.d.comb += [cause.eq(Mux(rx_gat, 2, 1)), port.eq(rx_port), flow.eq(rx_flow),
                         step.eq(st["timestep"])]
        m.d.comb += self.fire.eq(expired)
        with m.If(expired):
            m.d.sync += [armed.eq(0),
                         self.info.eq(Cat(step, flow, port, cause, Const(1, 1)))]
        with m.If(self.clear):
            m.d.sync += [self.info.eq(0), armed.eq(1), count.eq(self.limit)]
        return m

    _STATE = ("tx_busy", "tx_flow", "tx_step", "head_valid", "head_gather", "head_flow",
              "head_step", "head_owed", "owed_red", "owed_gat", "timestep")

    def _registered_state(self, m):
        """The inputs naming what the NIC waits for, a cycle late (by name)."""
        state = {}
        for name in self._STATE:
            port = getattr(self, name)
            state[name] = q = Signal.like(port, name=f"{name}_q")
            m.d.sync += q.eq(port)
        return state
