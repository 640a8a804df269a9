"""`kernelbot rank` vs Holistic Trace Analysis on the same trace: wall time and peak memory, side by side.

Each measurement runs in a fresh interpreter (so imports and peak RSS are counted alike) and times
import + load + kernel breakdown from inside the child. HTA's dependencies are heavy (jupyterlab, plotly),
so it may live in another environment: pass its interpreter with --hta-python. kernelbot's compiled trace
scanner is built (once per machine, into ~/.cache/kernelbot) before timing starts; --pure-python times
the fallback scan instead. With --rounds N the two sides alternate N times and medians are printed.

  python benchmarks/rank_vs_hta.py [TRACE] [--hta-python PATH] [--scale 10] [--rounds N] [--pure-python]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/data/traces/a100x8_train_control.json.gz"

KERNELBOT = """
import sys, time
t0 = time.perf_counter()
from pathlib import Path
from kernelbot.profiler.rank import rank
report = rank(Path(sys.argv[1]))
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(time.perf_counter() - t0, hwm)
"""
HTA = """
import sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
breakdown = analyzer.get_gpu_kernel_breakdown(visualize=False)
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(time.perf_counter() - t0, hwm)
"""


def measure(python: str, code: str, arg: str, env: dict | None = None) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) as the child reports them: VmHWM of its own address space, which unlike
    ru_maxrss does not count the parent's memory inherited at fork."""
    proc = subprocess.run([python, "-c", code, arg], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed ({python}):\n{proc.stderr[-2000:]}")
    seconds, hwm_kib = proc.stdout.split()[-2:]
    return float(seconds), int(hwm_kib) / 1024


def replicate(src: Path, dst: Path, times: int) -> None:
    """A trace `times` steps long: every event repeated, shifted in time, with fresh correlation/External ids."""
    data = json.load(gzip.open(src))
    events = data["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    ids = max(int(e.get("args", {}).get("correlation", 0) or 0) for e in events) + 1
    out = []
    for i in range(times):
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + i * span
            if "args" in e2 and i:
                args = dict(e2["args"])
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += i * ids
                e2["args"] = args
            if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                e2["id"] += i * ids
            out.append(e2)
    data["traceEvents"] = out
    with gzip.open(dst, "wt") as f:
        json.dump(data, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, nargs="?", default=DEFAULT_TRACE)
    parser.add_argument("--hta-python", default=sys.executable, help="a Python with holistictraceanalysis")
    parser.add_argument("--scale", type=int, default=10, help="also measure a trace this many times longer")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the two sides this many times")
    parser.add_argument("--pure-python", action="store_true", help="time kernelbot's pure-Python scan")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.pure_python:
        env["KERNELBOT_PURE_PYTHON"] = "1"
    built = subprocess.run([sys.executable, "-c", "from kernelbot.profiler import cscan; print(cscan.library())"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    print(f"kernelbot scan: {'pure Python' if built == 'None' else 'compiled'}")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("1x", args.trace)]
        if args.scale > 1:
            big = Path(tmp) / f"x{args.scale}" / "trace.json.gz"
            big.parent.mkdir()
            replicate(args.trace, big, args.scale)
            cases.append((f"{args.scale}x", big))
        print(f"{'trace':6} {'kernelbot s':>12} {'HTA s':>8} {'speedup':>8} {'kernelbot MiB':>14} {'HTA MiB':>8}")
        for label, path in cases:
            hta_dir = Path(tmp) / f"hta-{label}"  # HTA reads a directory of rank traces
            hta_dir.mkdir()
            (hta_dir / path.name).symlink_to(path.resolve())
            kb, hta = [], []
            for _ in range(args.rounds):
                kb.append(measure(sys.executable, KERNELBOT, str(path), env))
                hta.append(measure(args.hta_python, HTA, str(hta_dir)))
            (kb_s, kb_mb), (hta_s, hta_mb) = ([statistics.median(v[i] for v in side) for i in (0, 1)]
                                              for side in (kb, hta))
            print(f"{label:6} {kb_s:12.2f} {hta_s:8.2f} {hta_s / kb_s:7.2f}x {kb_mb:14.0f} {hta_mb:8.0f}")


if __name__ == "__main__":
    main()
