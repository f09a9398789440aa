"""Layout rule of the gateware: no function under ``hdl/`` is longer than 150 lines, so
every component's ``elaborate`` can be read in one sitting (checked with ``ast``)."""
import ast
from pathlib import Path

import pytest

HDL = Path(__file__).resolve().parents[1] / "hdl"
MAX_LINES = 150


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``file:line name (N lines)`` for every function or method longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                               f"({n} lines)")
    return out


def test_no_function_in_hdl_longer_than_150_lines():
    bad = long_functions(HDL)
    assert not bad, "functions over 150 lines:\n" + "\n".join(bad)


def test_checker_finds_a_long_function(tmp_path):
    (tmp_path / "hdl").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "hdl" / "long.py").write_text(f"def f():\n{body}\n\ndef g():\n    pass\n")
    assert long_functions(tmp_path / "hdl") == ["hdl/long.py:1 f (151 lines)"]
