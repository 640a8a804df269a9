"""On a GPU node: the cross-program race and bounds checks of Triton kernels, in the interpreter on the node's CPU.

compute-sanitizer's racecheck and synccheck see shared memory and barriers inside one block; a race between programs
in global memory (every program storing its partial sum to out[0]) is invisible to them, and the GPU may well give
right results most of the time. The interpreter's instrumentation (triton_check) sees every program's loads, stores
and atomics, so a GPU verdict gets a second job: the same `verify`, on the node's CPU with Triton's interpreter at
small sizes (cases.SMALL), whose `race` and `out_of_bounds` findings are merged into the GPU's checks. Correctness
and everything else stay the GPU job's.

What the candidate launched decides, as on a CPU: the CPU job's Triton launches. A candidate that built CUDA code
(its ptxas report) cannot run on a CPU and is left to compute-sanitizer; a GPU node without Triton, or a CPU job that
did not get to its judge, leaves `race` not_run (unless something already failed it), never a silent pass.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from kernelbot import KernelbotError
from kernelbot.agent.verify import cases as casemod
from kernelbot.agent.verify.judge import excerpt, merge, not_run
from kernelbot.agent.verify.messages import Result, VerifyResult
from kernelbot.records import Check, KernelBuild, Verdict
from kernelbot.records import InterpreterCoverage as Coverage

CHECKED_IDS = ("race", "out_of_bounds")
WHERE = "Triton interpreter on the node's CPU at small sizes"


class InterpreterRace(BaseModel):
    """The plan of the extra CPU job, or what it found."""
    coverage: Coverage
    why: str = ""  # what it covered, or why not
    budget: casemod.SizeBudget = casemod.SMALL  # the sizes it runs at
    launches: int = 0  # the Triton launches it saw (the GPU verdict's triton_launches)
    findings: list[Check] = Field(default_factory=list)  # CHECKED: its race and out_of_bounds checks
    builds: list[KernelBuild] = Field(default_factory=list)  # its Triton kernels compiled for the GPU's target


def plan_for(device: str, report: Result | None, triton_installed: bool) -> InterpreterRace | None:
    """The extra CPU job for a GPU job's `report` (None where that job did not finish: nothing to add to)."""
    if device != "cuda" or not isinstance(report, VerifyResult):
        return None
    if report.ptxas:
        return InterpreterRace(coverage=Coverage.NOT_TRITON, why=f"no {WHERE}: the candidate builds CUDA code (nvcc), "
                                                                  "which cannot run there")
    if not triton_installed:
        return InterpreterRace(coverage=Coverage.NOT_RUN, why=f"no {WHERE}: Triton is not installed for the node's "
                                                               "CPU side, so races between Triton programs in global "
                                                               "memory are unchecked (pip install triton)")
    return InterpreterRace(coverage=Coverage.RUN)


def run(planned: InterpreterRace, verify_on_cpu: Callable[[casemod.SizeBudget], Verdict]) -> InterpreterRace:
    """Run a planned job (`verify_on_cpu`: verify with device="cpu" at a budget's sizes) and read its verdict."""
    if planned.coverage is not Coverage.RUN:
        return planned
    try:
        verdict = verify_on_cpu(planned.budget)
    except Exception as exc:  # the GPU's verdict stands; a job that could not run leaves `race` not_run, saying why
        why = str(exc) if isinstance(exc, KernelbotError) else f"{type(exc).__name__}: {exc}"
        return InterpreterRace(coverage=Coverage.NOT_RUN, why=f"no {WHERE}: {excerpt(why, 300)}")
    return outcome(verdict)


def outcome(verdict: Verdict) -> InterpreterRace:
    """What the CPU job's verdict says about the candidate's Triton kernels."""
    if verdict.triton_launches:
        scope = f"{WHERE} ({verdict.triton_launches} launches, {len(verdict.cases)} input sets)"
        return InterpreterRace(coverage=Coverage.CHECKED, why=scope, launches=verdict.triton_launches, findings=[
            Check(id=c.id, status=c.status, detail=f"{scope}: {c.detail}"[:1500])
            for c in verdict.checks if c.id in CHECKED_IDS], builds=verdict.builds)
    judged = next((c for c in verdict.checks if c.id == "correctness" and c.status != "not_run"), None)
    if judged is not None:
        return InterpreterRace(coverage=Coverage.NOT_TRITON, why=f"{WHERE}: the candidate launched no Triton kernel "
                                                                  f"on {len(verdict.cases)} input sets")
    stopped = next((c for c in verdict.checks if c.status == "fail"), None) or \
        next((c for c in verdict.checks if c.status == "not_run"), None)
    why = f"{stopped.id}: {excerpt(stopped.detail, 300)}" if stopped else "no verdict"
    return InterpreterRace(coverage=Coverage.NOT_RUN, why=f"{WHERE}: the job did not reach its judge ({why})")


def merged(checks: list[Check], found: InterpreterRace) -> list[Check]:
    """The GPU's checks with the CPU job's findings merged in: a fail on either fails a check."""
    return [_merged(c, found) if c.id in CHECKED_IDS else c for c in checks]


def _merged(check: Check, found: InterpreterRace) -> Check:
    if found.coverage is Coverage.CHECKED:
        return next((merge(check, f) for f in found.findings if f.id == check.id), check)
    if found.coverage is Coverage.NOT_RUN and check.id == "race" and check.status != "fail":
        return not_run(check.id, f"{check.detail}; {found.why}"[:1500])
    return Check(id=check.id, status=check.status, detail=f"{check.detail}; {found.why}"[:1500])
