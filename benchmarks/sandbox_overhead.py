"""What the sandbox costs per candidate: an empty job (start the child, confine it, import torch, report back)
through `run_job`, against starting a bare Python that imports torch, measured side by side in one run.

    python benchmarks/sandbox_overhead.py [--jobs 10] [--runner process] [--runner docker]

`--runner` (repeatable; default: what run_job picks, $KERNELBOT_SANDBOX or auto) measures the named runners in
the same interleaved rounds; the docker runner needs a daemon (DOCKER_HOST or /var/run/docker.sock).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelbot.sandbox.runner import namespaces_available, run_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--runner", action="append", choices=["auto", "process", "docker"])
    args = parser.parse_args()
    runners = args.runner or [None]
    sandboxed: dict[str | None, list[float]] = {r: [] for r in runners}
    bare: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.jobs):  # interleaved, so drift in the machine's load hits all alike
            for runner in runners:
                t0 = time.perf_counter()
                result = run_job({"kind": "noop"}, Path(tmp) / f"job{i}", timeout=120, runner=runner)
                sandboxed[runner].append(time.perf_counter() - t0)
                if result.status != "ok":
                    raise SystemExit(f"noop job {result.status}: {result.detail[-500:]}")
                if i == 0:
                    print(f"protections ({runner or 'default'} runner): {'; '.join(result.protections)}")
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], check=True)
            bare.append(time.perf_counter() - t0)
    print(f"namespaces: {namespaces_available()}")
    rows = [(f"empty job, {r} runner" if r else "sandboxed empty job", xs) for r, xs in sandboxed.items()]
    print(f"{'':28s}{'median s':>10s}{'min s':>8s}{'max s':>8s}")
    for name, xs in (*rows, ("bare python + torch", bare)):
        print(f"{name:28s}{statistics.median(xs):10.2f}{min(xs):8.2f}{max(xs):8.2f}")
    for name, xs in rows:
        print(f"overhead per candidate beyond starting Python with torch ({name}): "
              f"{statistics.median(xs) - statistics.median(bare):.2f} s")


if __name__ == "__main__":
    main()
