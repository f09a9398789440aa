"""pytest configuration for the cocotb benches under sim/ (run with ``make sim``).

Puts ``sim/`` on ``sys.path`` so bench entries can ``from harness import run_bench``.
"""
import sys
from pathlib import Path

_SIM = str(Path(__file__).resolve().parent)
if _SIM not in sys.path:
    sys.path.insert(0, _SIM)
