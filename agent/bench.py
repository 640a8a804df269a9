"""Candidate vs the op it replaces on the task's shapes: warm-up, interleaved rounds, medians, noise."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from kernelbot.agent.cases import inputs_at
from kernelbot.agent.verify import load_reference
from kernelbot.kernel_library.cpp_build import prebuild_library
from kernelbot.records import Bench, Task
from kernelbot.sandbox import run_job


def _quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q * 100) - 1] if len(xs) > 1 else xs[0]


def bench(task: Task, reference_path: Path, candidate_path: Path, workdir: Path, *, rounds: int = 15,
          seed: int = 0, timeout: float = 300.0) -> Bench:
    """Accept only what is faster beyond the noise: at least 3 in 4 paired rounds faster, median gain over 3%."""
    workdir.mkdir(parents=True, exist_ok=True)
    reference = load_reference(reference_path)
    torch.manual_seed(seed)
    torch.save(reference.Model(*task.init_args).state_dict(), workdir / "state_dict.pt")
    torch.save([inputs_at(reference, task, seed)], workdir / "inputs.pt")
    job = {"kind": "bench", "reference": str(reference_path.resolve()), "candidate": str(candidate_path.resolve()),
           "init_args": task.init_args, "state_dict": str((workdir / "state_dict.pt").resolve()),
           "inputs": str((workdir / "inputs.pt").resolve()), "rounds": rounds}
    result = run_job(job, workdir, timeout=timeout, env=prebuild_library())
    if result.status != "ok" or not result.payload:
        raise RuntimeError(f"benchmark {result.status}: {result.detail[-300:]}")
    if result.payload.get("timing_tamper"):
        raise RuntimeError(f"benchmark refused: {'; '.join(result.payload['timing_tamper'])}")
    ref, cand = result.payload["reference_us"], result.payload["candidate_us"]
    ratios = [r / c for r, c in zip(ref, cand, strict=True)]
    ref_med, cand_med = statistics.median(ref), statistics.median(cand)

    def spread(xs: list[float]) -> float:
        return (_quantile(xs, 0.75) - _quantile(xs, 0.25)) / statistics.median(xs)

    speedup = ref_med / cand_med
    return Bench(candidate_id=candidate_path.parent.name, rounds=rounds, reference_us=round(ref_med, 2),
                 candidate_us=round(cand_med, 2), reference_spread=round(spread(ref), 3),
                 candidate_spread=round(spread(cand), 3), speedup=round(speedup, 3),
                 significant=_quantile(ratios, 0.25) > 1.0 and speedup > 1.03)
