#!/usr/bin/env bash
# The prepared GPU check: on one GPU node, in at most 6 minutes of device time in the worst case (every step's limit,
# the preflight's included; each step killed at its limit with every process it started), with the node's own torch
# and Triton and nothing downloaded: a preflight (imports, the GPU, compute-sanitizer, Triton's interpreter), a smoke
# step (CUDA inside the sandbox, and under compute-sanitizer), then a correct and a racy Triton kernel verified under
# compute-sanitizer and in the interpreter on the node's CPU, then `kernelbot optimize --device cuda --dtype bfloat16`
# on the built-in model; smoke.json, report.json, the verdicts, the logs and summary.json (rewritten after every step
# and when the check is stopped) go into OUTDIR. Exit 0: every expectation met; 1: not; 2: this node cannot run it (no
# GPU, or modules missing: the one line says how to fetch their wheels). Needs no compiler: ninja and a C++ compiler
# only where C++ candidates run (CPU runs).
#
#   benchmarks/gpu_check.sh [--dry-run] [--wheels DIR] OUTDIR
#   python3 benchmarks/gpu_check/fetch_wheels.py DIR --python-version 3.12   (where an index is reachable)
#
# --dry-run walks every step on a CPU, each GPU step through its stub, prints each stage's worst-case limit and their
# sum, and writes the same summary.json.
# The steps, limits and expectations are in benchmarks/gpu_check/driver.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null; then
    echo "gpu_check: no $python here; set PYTHON to the node's Python (the one with torch)" >&2
    exit 2
fi
exec "$python" "$here/gpu_check/driver.py" --python "$python" "$@"
