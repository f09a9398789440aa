#!/usr/bin/env bash
# The CUDA checks (tests/test_cuda_paths.py) on a GPU machine, in one command from the
# repository root, without network:
#
#     bash tools/gpu_check.sh
#
# Needs python3 with torch (CUDA build), numpy, networkx, pytest and hypothesis installed.
# The project's other imports (amaranth and what it imports: jschon, rfc3986, pyvcd) come as
# pure-Python wheels in .whl/ (git-ignored; fetched on a machine with network by
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform any -d .whl \
#       amaranth==0.5.10 jschon==0.11.1 rfc3986==2.0.0 pyvcd==0.4.2
# ). They and the project go into a private folder on PYTHONPATH; nothing is installed
# into the system's Python. The log is tee'd to $OUT/gpu_check.log when $OUT is set.
#
# Environment: TREENIC_GPU_REQUIRED=0 lets the run pass without a CUDA device (the CUDA
# variants are then skipped: a dry run of this script on a CPU machine);
# TREENIC_GPU_TIMEOUT (seconds, default 270) bounds the test run; TREENIC_GPU_K, a pytest -k
# expression (e.g. "not cpu" for the CUDA variants only; default: every test); TREENIC_GPU_SITE
# the private folder (default /tmp/treenic-gpu-site).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
site=${TREENIC_GPU_SITE:-/tmp/treenic-gpu-site}
limit=${TREENIC_GPU_TIMEOUT:-270}
log=/dev/null
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    log=$OUT/gpu_check.log
fi

check() {
    echo "== gpu_check: $(date -u +%FT%TZ) in $root (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    nvidia-smi -L || echo "nvidia-smi: not available"
    rm -rf "$site"
    mkdir -p "$site"
    shopt -s nullglob
    wheels=(.whl/*.whl)
    if [ ${#wheels[@]} -gt 0 ]; then
        echo "== installing ${#wheels[@]} wheels from .whl/ into $site"
        if ! python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
                "${wheels[@]}"; then
            echo "== pip could not install them: unpacking instead (pure-Python wheels are zips)"
            for w in "${wheels[@]}"; do python3 -m zipfile -e "$w" "$site"; done
        fi
    else
        echo "== no wheels in .whl/: amaranth & co. must already be importable"
    fi
    # the project, laid out as pyproject.toml's package-dir maps it (symlinks: the work tree)
    python3 - "$root" "$site" <<'EOF'
import os, sys, tomllib
root, site = sys.argv[1:]
with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
for pkg, src in sorted(dirs.items(), key=lambda kv: kv[0].count(".")):
    src, dst = os.path.join(root, src), os.path.join(site, *pkg.split("."))
    if "." in pkg:
        os.symlink(src, dst)                 # a sub-package that lives elsewhere
    else:                                    # the top package: its entries, linked one by one
        os.makedirs(dst)
        for name in os.listdir(src):
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
EOF
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
    python3 - <<'EOF'
import sys, torch, numpy, amaranth, treenic.driver
print(f"python {sys.version.split()[0]}; torch {torch.__version__}; CUDA build "
      f"{torch.version.cuda}; cuda available {torch.cuda.is_available()}; "
      f"numpy {numpy.__version__}; amaranth {amaranth.__version__}")
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i} {torch.cuda.get_device_name(i)} "
          f"capability {torch.cuda.get_device_capability(i)}")
print(f"treenic from {treenic.driver.__file__}")
EOF
    if [ "${TREENIC_GPU_REQUIRED:-1}" != 0 ] &&
            ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
        echo "gpu_check: no CUDA device visible to torch: the CUDA variants would only be" \
             "skipped (TREENIC_GPU_REQUIRED=0 allows that)"
        return 2
    fi
    # no -x: one run on the device should report every check that fails
    timeout -k 10 "$limit" python3 -m pytest -q tests/test_cuda_paths.py -p no:cacheprovider \
        -rs --durations=8 ${TREENIC_GPU_K:+-k "$TREENIC_GPU_K"}
}

set +e
check 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "gpu_check: exit status $rc" | tee -a "$log"
exit "$rc"
