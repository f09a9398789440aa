"""Schedule IR, golden executor, checkers, cost models and NIC table encoding."""
from .ir import Op, Schedule, ScheduleError, Transfer  # noqa: F401
