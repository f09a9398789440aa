"""NIC and link timing parameters of the network model, in NIC clock cycles.

The constants describe the treenic NIC RTL (``hdl/nic/core.py``, ``hdl/link/``) as a few
pipeline latencies; :data:`RTL` holds the values the model is validated with against the
Verilated fabric (``treenic.netsim.rtl_runs``). Where each one comes from:

* ``entry_cycles`` (4): the issue logic sees a table row four cycles after the head pointer
  moves (``hp`` → table RAM read → ``e_q`` row register → registered issue terms
  ``hd_*`` → ``head_ok2``), so every entry — NOPs included — takes at least four cycles.
* ``run_start`` (3): the first row's terms are ready three cycles into RUN.
* ``due_cycles`` (2): after the timestep advances, ``head_ok2`` is cleared and the head's
  terms are recomputed with the new timestep.
* ``dep_cycles`` (1): an arrival bit is seen by the registered issue terms a cycle later.
* ``idle_cycles`` (2): a TX unit's idle flag is registered (``tx_idle_q``) and then in
  ``hd_idle``.
* ``tx_start``: issue (``tx_go``) to the head flit on the link: ``tx_go_q``, the unit load,
  the banked buffer read (5), the TX FIFO and the packetiser header load.
* ``cut_tx_start`` (6): ``tx_start`` of a cut-through build (``forward="cut-through"``,
  ``NicParams.forward``): a paced TX unit tests its first beat from the descriptor at
  ``tx_go`` (one cycle less), and the head flit leaves while the first read is in flight,
  which saves two more link cycles only where the link bounds the send.  On ring:8 it does
  (89-cycle steps in ring8_1000_cut's log, 4 would fit them); on torus:4x4 the TX units'
  reads lose bank arbitration to up to four RX streams and the read rate bounds the send,
  so the head flit saves nothing (the leaf steps stay at 49 cycles as with store).  The
  model has no bank conflicts: 6 sits between (ring8_1000_cut +2.1 %,
  torus4x4_1000_cut -3.4 %).
* ``tx_tail``: last flit on the link to the TX unit reporting idle.
* ``rx_done``: last flit out of the link's register stages to the receiver's arrival bit:
  the link FIFO, depacketiser (pop, check, commit), skid buffer, the three-stage header
  decision, buffer read (5), FP32 adder (7), write-back, per-flow arrival bit.
* ``gate_lag``: the receive order gate (docs/architecture.md §5): contributions to one flow are
  accumulated in (step, rx_port) order fragment by fragment, so when they arrive together
  each one is written back ``gate_lag`` cycles after the one before it (the previous
  fragment's write-back, then this fragment's header decision and adder pipeline).
* ``credit_return``: cycles a credit spends inside the receiver (depacketiser pop to the
  credit pulse) on top of the link's latency each way; a port sends at
  ``min(1, credits / (2·link latency + credit_return))`` flits per cycle.
* ``scan_overhead``: START register, INIT, the three-stage table scan (one row per cycle)
  and FINISH: RUN begins ``entries + scan_overhead`` cycles after START.
* ``done_cycles``: the last node's last event to the fabric's ``done``.

``tx_start``, ``rx_done``, ``credit_return`` and ``gate_lag`` span many registers and
handshakes; their values are fitted to node 0's per-step cycle log of two calibration runs
(Ring on ring:8 and MultiTree on mesh:2x2) by :mod:`treenic.netsim.calibrate`, and every other
recorded RTL run is held out (``docs/netsim.md`` has the table).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["NicTiming", "RTL", "PAPER", "message_flits"]

MESSAGE, PACKET = "message", "packet"


@dataclass(frozen=True)
class NicTiming:
    """Cycle-level parameters of one NIC and its links (see the module docstring).

    Parameters
    ----------
    flit_bytes:
        Link flit payload (8: 64-bit flits, two binary32 words).
    clock_hz:
        NIC clock; with ``flit_bytes`` it turns a link's bandwidth (bytes/s) into flits per
        cycle and its latency (s) into cycles. 2 GHz × 8 B = 16 GB/s, the paper's links.
    mode:
        ``"message"`` (one head flit per message, MultiTree's message-based flow control)
        or ``"packet"`` (a head flit every ``packet_words`` words).
    credits:
        Receive buffer per port in flits (= sender credits).
    forward:
        ``"store"`` — a dependent send waits until the whole incoming message is reduced
        (what the RTL does: arrival bits are per flow); ``"cut-through"`` — it may start
        once the first sub-packet is reduced and never overtakes the incoming stream.
    link_latency_cycles:
        Overrides every link's latency (the RTL fabric's register stages); None: from the
        topology (seconds × ``clock_hz``).
    """
    flit_bytes: int = 8
    clock_hz: float = 2e9
    mode: str = MESSAGE
    sub_words: int = 16
    packet_words: int = 64
    credits: int = 16
    forward: str = "store"
    link_latency_cycles: int | None = None
    entry_cycles: int = 4
    run_start: int = 3
    due_cycles: int = 2
    dep_cycles: int = 1
    idle_cycles: int = 2
    tx_start: int = 7
    cut_tx_start: int = 6
    tx_tail: int = 2
    rx_done: int = 36
    gate_lag: int = 25
    credit_return: int = 6
    #: link stall probability in 1/256 (the fabric's LFSR stall injection), 0: none
    stall: int = 0
    scan_overhead: int = 6
    done_cycles: int = 2
    #: lockstep down-counter load, cycles (None: the configuration image's estimate)
    lockstep_cycles: int | None = None

    def __post_init__(self):
        if self.mode not in (MESSAGE, PACKET):
            raise ValueError(f"mode must be {MESSAGE!r} or {PACKET!r}, not {self.mode!r}")
        if self.forward not in ("store", "cut-through"):
            raise ValueError(f"forward must be 'store' or 'cut-through', not {self.forward!r}")
        if self.flit_bytes < 4 or self.flit_bytes % 4:
            raise ValueError(f"flit_bytes must be a positive multiple of 4, not {self.flit_bytes}")
        if self.credits < 1 or self.sub_words < 1 or self.packet_words < 1:
            raise ValueError("credits, sub_words and packet_words must be >= 1")
        if not 0 <= self.stall < 256:
            raise ValueError(f"stall must be in 0..255 (1/256 units), not {self.stall}")
        if not self.clock_hz > 0:
            raise ValueError(f"clock_hz must be > 0, not {self.clock_hz}")

    @property
    def lanes(self) -> int:
        return self.flit_bytes // 4

    @property
    def start_cycles(self) -> int:
        """Issue to the message's first flit slot for this build's forwarding."""
        return self.cut_tx_start if self.forward == "cut-through" else self.tx_start

    def with_(self, **kw) -> "NicTiming":
        return replace(self, **kw)

    def link_rate(self, latency_cycles: float) -> float:
        """Flits per cycle a port sustains through the credit loop (bandwidth aside)."""
        rtt = 2 * latency_cycles + self.credit_return
        rate = min(1.0, self.credits / rtt) if rtt > 0 else 1.0
        # a stalled cycle holds the link's flit: it adds p cycles per flit on average to
        # the credit-limited flit time (of four simple forms -- product, min, this, a
        # blend -- this one fits the four recorded fabric benches with stalls best; the
        # credit loop hides part of each stall, so 1/(1-p) overstates it)
        return 1.0 / (1.0 / rate + self.stall / 256)


def message_flits(words: int, timing: NicTiming) -> tuple[int, int]:
    """(flits, head flits) of one message of ``words`` binary32 words — the link golden
    packetiser's counts (:func:`treenic.hdl.link.model.packetise`; a test checks they are
    equal): message mode one head flit then ``⌈words/lanes⌉`` payload flits; packet mode a
    head flit per ``packet_words``-word packet."""
    if words <= 0:
        return 0, 0
    lanes = timing.lanes
    if timing.mode == MESSAGE:
        return 1 + math.ceil(words / lanes), 1
    full, rest = divmod(words, timing.packet_words)
    per = 1 + math.ceil(timing.packet_words / lanes)
    flits = full * per + (1 + math.ceil(rest / lanes) if rest else 0)
    return flits, full + (1 if rest else 0)


#: the RTL's constants (validated against the Verilated fabric; see rtl_runs)
RTL = NicTiming()

#: the MultiTree paper's network (Table III: 16 GB/s, 150 ns links) on a 128-bit, 1 GHz NIC
#: with the RTL's pipeline latencies; credits cover the links' bandwidth-delay product (the
#: RTL's 8-16 credits assume 1-3 cycle links and would throttle a 150-cycle link)
PAPER = RTL.with_(flit_bytes=16, clock_hz=1e9, credits=4096)
