"""Up/down counters whose step decisions arrive late in the cycle."""
from __future__ import annotations

from amaranth import Mux

__all__ = ["step_count"]


def step_count(count, up, down):
    """``count + up - down`` (``up`` and ``down`` one bit each) as a mux over ``count + 1``,
    ``count - 1`` and ``count``: both sums come from the register, so a late ``up`` or
    ``down`` is a mux select (a LUT level) rather than the carry-in of the counter's chain.
    The value wraps as the sum does when assigned back to ``count``."""
    return Mux(up == down, count, Mux(up, count + 1, count - 1))
