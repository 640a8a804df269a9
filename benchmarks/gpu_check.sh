#!/usr/bin/env bash
# The prepared GPU check: on one GPU node, in at most 8.5 minutes of steps (after a preflight of seconds), with the
# node's own torch and Triton and nothing downloaded, verify a correct and a racy Triton kernel under
# compute-sanitizer and run
# `kernelbot optimize --device cuda --dtype bfloat16` on the built-in model; write report.json, the verdicts,
# the logs and summary.json into OUTDIR. Exit 0: every expectation met; 1: not; 2: this node cannot run it.
#
#   benchmarks/gpu_check.sh [--dry-run] [--wheels DIR] OUTDIR
#
# --dry-run checks the CPU-side parts (paths, imports, options) and prints the plan; it needs no GPU.
# The steps, timeouts and expectations are in benchmarks/gpu_check/driver.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null; then
    echo "gpu_check: no $python here; set PYTHON to the node's Python (the one with torch)" >&2
    exit 2
fi
exec "$python" "$here/gpu_check/driver.py" --python "$python" "$@"
