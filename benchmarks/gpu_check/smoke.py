"""The GPU check's first step (under 50 s): before minutes go into verifying and optimizing, see that CUDA starts
inside the sandbox, in a job's own process and in the runners a harness forks, and that compute-sanitizer reaches
the job it launches there. One tiny pure-torch module is the candidate of all three jobs, run side by side.

  python smoke.py OUT.json [--budget SECONDS]

Writes a Smoke record to OUT.json; exit 0 when all three ran, 1 when one did not (`cuda_ok` false: CUDA does not
start in the sandbox, and the check's later steps cannot run either).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel

MODULE = '''import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


ModelNew = Model
'''


class SmokeRun(BaseModel):
    what: str
    ok: bool
    seconds: float
    detail: str


class Smoke(BaseModel):
    runs: list[SmokeRun]
    cuda_ok: bool  # CUDA started in a sandboxed job and in forked runners: the later steps can run


def _write_inputs(work: Path) -> dict[str, Path]:
    import torch

    from kernelbot.agent.verify.messages import SentCase, SentPlan

    files = {name: work / name for name in ("smoke_module.py", "plan.pt", "state.pt", "inputs.pt")}
    files["smoke_module.py"].write_text(MODULE)
    x = torch.randn(64, 64)
    torch.save(SentPlan(init_args=[[]], cases=[SentCase(label="main", model=0, inputs=[x])]).model_dump(),
               files["plan.pt"])
    torch.save({}, files["state.pt"])
    torch.save([[x], [x + 1.0]], files["inputs.pt"])
    return files


def _in_sandbox(files: dict[str, Path], work: Path, budget: float) -> tuple[bool, str]:
    from kernelbot.agent.verify.messages import Done, SanitizeJob, read_result
    from kernelbot.sandbox import run_job
    from kernelbot.sandbox.gpu import assigned_gpu

    job = SanitizeJob(candidate=str(files["smoke_module.py"]), plan=str(files["plan.pt"]),
                      state_dicts=[str(files["state.pt"])], init_seed=0)
    result = run_job(job.model_dump(mode="json"), work / "own_process", timeout=budget, gpu=assigned_gpu())
    ok = result.status == "ok" and isinstance(read_result(result.payload), Done)
    return ok, f"{result.status} in {result.seconds:.1f} s: {result.detail.strip()[-300:]}"


def _in_forked_runners(files: dict[str, Path], work: Path, budget: float) -> tuple[bool, str]:
    from kernelbot.agent.verify.messages import BenchJob, BenchResult, read_result
    from kernelbot.sandbox import run_job
    from kernelbot.sandbox.gpu import assigned_gpu

    module = str(files["smoke_module.py"])
    job = BenchJob(reference=module, candidate=module, init_args=[], state_dict=str(files["state.pt"]),
                   inputs=str(files["inputs.pt"]), rounds=2, device="cuda")
    result = run_job(job.model_dump(mode="json"), work / "forked_runners", timeout=budget, gpu=assigned_gpu())
    report = read_result(result.payload)
    ok = result.status == "ok" and isinstance(report, BenchResult)
    timed = f"; {report.candidate_us[0]:.1f} µs a call" if ok and isinstance(report, BenchResult) else ""
    return ok, f"{result.status} in {result.seconds:.1f} s{timed}: {result.detail.strip()[-300:]}"


def _under_sanitizer(files: dict[str, Path], work: Path, budget: float) -> tuple[bool, str]:
    from kernelbot.agent.verify.messages import SanitizeJob
    from kernelbot.agent.verify.sanitizer import run_tool
    from kernelbot.sandbox.gpu import assigned_gpu

    if shutil.which("compute-sanitizer") is None:
        return False, "compute-sanitizer is not on PATH"
    job = SanitizeJob(candidate=str(files["smoke_module.py"]), plan=str(files["plan.pt"]),
                      state_dicts=[str(files["state.pt"])], init_seed=0)
    run = run_tool(job, work / "sanitizer", 0, "memcheck", time.monotonic() + budget, {}, assigned_gpu())
    return run.errors == 0, f"memcheck: {run.errors} error(s) {run.text}" if run.errors is not None else run.text


def _timed(what: str, attempt: Callable[[], tuple[bool, str]]) -> SmokeRun:
    t0 = time.monotonic()
    try:
        ok, detail = attempt()
    except Exception as exc:  # the smoke reports; the driver decides
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return SmokeRun(what=what, ok=ok, seconds=round(time.monotonic() - t0, 1), detail=detail[:600])


def smoke(work: Path, budget: float) -> Smoke:
    files = _write_inputs(work)
    attempts = {"CUDA starts in a sandboxed job's own process": _in_sandbox,
                "CUDA starts in runners forked by the sandboxed harness (bench job)": _in_forked_runners,
                "compute-sanitizer reaches the sandboxed job it launches (memcheck)": _under_sanitizer}
    with ThreadPoolExecutor(max_workers=len(attempts)) as pool:
        futures = [pool.submit(_timed, what, lambda fn=fn: fn(files, work, budget)) for what, fn in attempts.items()]
        runs = [f.result() for f in futures]
    return Smoke(runs=runs, cuda_ok=runs[0].ok and runs[1].ok)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="where the Smoke record is written (JSON)")
    parser.add_argument("--budget", type=float, default=17.0, help="seconds each of the three jobs may take")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kb_smoke_") as tmp:
        record = smoke(Path(tmp), args.budget)
    args.out.write_text(record.model_dump_json(indent=2))
    for run in record.runs:
        print(f"{'ok  ' if run.ok else 'FAIL'} {run.what} ({run.seconds} s): {run.detail}")
    return 0 if all(r.ok for r in record.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
