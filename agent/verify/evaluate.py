"""One candidate through the sandbox: verify, then (where it can be timed here) benchmark; the verdict,
benchmark and a plain-text report (what an LLM is shown in its repair round) come back, never an exception."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

from kernelbot.agent.verify.bench import bench
from kernelbot.agent.verify.run import verify
from kernelbot.records import Bench, Candidate, KernelOutcome, KernelResult, Task, Verdict
from kernelbot.rundir import write_record

DETAIL_CHARS = 1500  # per failed check, in the report


@dataclass
class Accepted:
    """A candidate that passed verification and won its benchmark: what the pack is built from."""
    task: Task
    candidate: Candidate
    source: Path
    verdict: Verdict
    bench: Bench


@dataclass
class Outcome:
    row: KernelResult
    verdict: Verdict | None = None
    bench: Bench | None = None
    accepted: Accepted | None = None
    report: str = ""


def new_row(task: Task, cand: Candidate, outcome: KernelOutcome = KernelOutcome.NO_CANDIDATE) -> KernelResult:
    """A rejected row for a candidate; until something runs it, there was no candidate to run."""
    return KernelResult(op=task.family, module=task.module_class, backend=cand.backend, shapes=task.input_shapes,
                        reason="", speedup=None, outcome=outcome,
                        candidate_id=f"{task.id}/{cand.id}")


SEVERITY = ("sandbox_violation", "harness_tamper", "timing_tamper", "crash", "timeout", "compile")


def _failure_report(verdict: Verdict) -> str:
    lines = [f"verdict: fail ({', '.join(verdict.failed)})"]
    for c in verdict.checks:
        if c.status == "fail":
            lines.append(f"- {c.id}: {c.detail[:DETAIL_CHARS]}")
    passed = [c.id for c in verdict.checks if c.status == "pass"]
    if passed:
        lines.append(f"passed: {', '.join(passed)}")
    return "\n".join(lines)


def evaluate(task: Task, task_dir: Path, cand: Candidate, path: Path, device_kind: str, *, seed: int,
             timeout: float, bench_rounds: int) -> Outcome:
    out = Outcome(new_row(task, cand))
    row = out.row
    try:
        # no seed: each verification draws a fresh secret one (recorded in the verdict), so no candidate can
        # predict its inputs; verify itself runs Triton in the interpreter on a CPU (run.interpreted_triton)
        verdict = verify(task, task_dir / "reference.py", path, path.parent / "verify", timeout=timeout,
                         device=device_kind)
        out.verdict = verdict
        if verdict.triton_launches:  # what it launched, whatever the proposer took it for
            row.backend = "triton"
        write_record(path.parent / "verdict.json", verdict)
        if verdict.verdict == "fail":
            # the gravest failure explains the verdict best: what it tried, then whether it ran, then the rest
            failing = sorted((c for c in verdict.checks if c.status == "fail"),
                             key=lambda c: SEVERITY.index(c.id) if c.id in SEVERITY else len(SEVERITY))
            failed = failing[0] if failing else None
            row.outcome = KernelOutcome.FAILED if failed else KernelOutcome.NOT_VERIFIED
            row.reason = (f"failed {', '.join(c.id for c in failing)}: {failed.detail[:300]}" if failed else
                          "not verified: correctness could not run here (" +
                          next(c.detail for c in verdict.checks if c.id == "correctness")[:200] + ")")
            # the sandbox's long paths say nothing to a model and cost tokens
            out.report = _failure_report(verdict).replace(str(path.parent.resolve()), "<candidate>")
        elif (why := untimed_here(cand, verdict, device_kind)) is not None:
            row.outcome = KernelOutcome.NOT_TIMED
            how = "Triton interpreter" if verdict.triton_launches else "compiled"
            row.reason = f"verified ({how}); not timed: {why}"
            out.report = f"verdict: pass on {len(verdict.shapes)} input sets; not timed on this {device_kind}"
        else:
            result = bench(task, task_dir / "reference.py", path, path.parent / "bench", rounds=bench_rounds,
                           seed=seed, timeout=timeout, device=device_kind)
            out.bench = result
            write_record(path.parent / "bench.json", result)
            row.speedup, row.reference_us, row.time_us = result.speedup, result.reference_us, result.candidate_us
            row.floor_us = round(task.floor_us, 2)
            busy = f"; timed on a busy host ({result.host.summary()})" if result.host and result.host.contended else ""
            if result.significant:
                out.accepted = Accepted(task, cand, path, verdict, result)
                row.outcome = KernelOutcome.FASTER
                row.reason = f"verified; {result.speedup:.2f}x beyond noise{busy}"
            else:
                row.outcome = KernelOutcome.NOT_FASTER
                row.reason = (f"verified but not faster beyond noise: {result.speedup:.2f}x "
                              f"(spread {result.reference_spread:.0%}/{result.candidate_spread:.0%}){busy}")
            speed = "faster beyond noise" if result.significant else "not faster beyond noise"
            out.report = (f"verdict: pass on {len(verdict.shapes)} input sets\n"
                          f"benchmark ({result.rounds} interleaved rounds, medians): reference "
                          f"{result.reference_us:.2f} µs, yours {result.candidate_us:.2f} µs per call, "
                          f"{result.speedup:.2f}x; {speed}"
                          f"; roofline floor {task.floor_us:.2f} µs")
    except Exception as exc:  # a broken candidate or harness error is this candidate's verdict, not the run's
        row.outcome = KernelOutcome.HARNESS_ERROR
        row.reason = f"harness error: {type(exc).__name__}: {exc}"[:400]
        (path.parent / "error.txt").write_text(traceback.format_exc())
        out.report = row.reason
    return out


def untimed_here(cand: Candidate, verdict: Verdict, device_kind: str) -> str | None:
    """Why a verified candidate cannot be timed on this device, or None. On a CPU, what it launched decides: Triton
    ran in the interpreter (a timing of that says nothing), whatever its source spells; C++ is timed. On a GPU, C++
    is no GPU kernel."""
    if device_kind == "cpu":
        if verdict.triton_launches:
            return "its Triton kernels ran in the interpreter (no GPU here), so it cannot join this cpu pack"
        return "a cuda kernel does not run on this cpu device" if cand.backend == "cuda" else None
    return f"a cpp kernel does not run on this {device_kind} device" if cand.backend == "cpp" else None


DUEL = """

# --- the incumbent kernel, standing in as this duel's reference (same inputs, same weights, same rounds) ---
def _incumbent():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kb_incumbent", {path!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


Model = _incumbent()
"""


def duel(task: Task, task_dir: Path, incumbent: Accepted, challenger: Accepted, *, seed: int, timeout: float,
         rounds: int) -> Bench:
    """The challenger against the incumbent kernel in one benchmark: the incumbent takes the reference's place,
    so `significant` means the challenger beat it beyond the noise."""
    where = task_dir / "duels" / f"{challenger.candidate.id}-vs-{incumbent.candidate.id}"
    where.mkdir(parents=True, exist_ok=True)
    reference = where / "reference.py"
    reference.write_text((task_dir / "reference.py").read_text() + DUEL.format(path=str(incumbent.source.resolve())))
    result = bench(task, reference, challenger.source, where, rounds=rounds, seed=seed, timeout=timeout)
    write_record(where / "bench.json", result)
    return result


def pick_best(task: Task, rows: list[KernelResult], winners: list[Accepted]) -> Accepted | None:
    """The fastest accepted candidate; the rows say which won and why the other fast ones did not."""
    best = max(winners, key=lambda a: a.bench.speedup, default=None)
    for row in rows:
        if best and row.candidate_id == f"{task.id}/{best.candidate.id}":
            row.outcome = KernelOutcome.ACCEPTED
        elif best and row.speedup and row.outcome is KernelOutcome.FASTER:
            row.outcome = KernelOutcome.OUTPACED
            row.reason = f"verified and faster ({row.speedup:.2f}x), but {best.candidate.id} was faster still"
    return best
