"""Network timing model of schedules on treenic NICs (``docs/netsim.md``).

:func:`~treenic.netsim.sim.simulate` runs a Schedule IR through the NIC tables on the
topology's links; :data:`~treenic.netsim.timing.RTL` are the RTL's measured latencies,
:data:`~treenic.netsim.timing.PAPER` the MultiTree paper's network. Bench sections:
``netsim`` (validation against the Verilated fabric, scale) and ``paper``.
"""
from .sim import NetsimError, SimResult, simulate
from .timing import PAPER, RTL, NicTiming

__all__ = ["simulate", "SimResult", "NetsimError", "NicTiming", "RTL", "PAPER"]
