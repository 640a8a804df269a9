"""What becomes of a candidate, in the terms every stage after verification uses: its row (KernelResult), the
evaluation's whole outcome, the accepted winner a pack is built from, and the choice of the best among winners."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelbot.records import Bench, Candidate, KernelOutcome, KernelResult, Task, Verdict


@dataclass(frozen=True)
class Accepted:
    """A candidate that passed verification and won its benchmark: what the pack is built from."""
    task: Task
    candidate: Candidate
    source: Path
    verdict: Verdict
    bench: Bench

    @property
    def entry_id(self) -> str:
        """Its pack entry's id (PackEntry.candidate_id), which the engines' call counters are keyed by."""
        return f"{self.task.id}__{self.candidate.id}"


@dataclass(frozen=True)
class Outcome:
    """One candidate's evaluation, whole when made: its row, verdict and benchmark, whether it won, and the report an
    LLM is shown in its repair round."""
    row: KernelResult
    verdict: Verdict | None = None
    bench: Bench | None = None
    accepted: Accepted | None = None
    report: str = ""


def new_row(task: Task, cand: Candidate, outcome: KernelOutcome = KernelOutcome.NO_CANDIDATE, reason: str = "", *,
            verdict: Verdict | None = None, timed: Bench | None = None) -> KernelResult:
    """A candidate's row, complete: what became of it and why (until something runs it, there was no candidate to
    run); the backend it launched (Triton whenever its verdict saw Triton launches, whatever it declared), and its
    benchmark's numbers when it was timed."""
    timings = {"speedup": None} if timed is None else {
        "speedup": timed.speedup, "reference_us": timed.reference_us, "time_us": timed.candidate_us,
        "floor_us": round(task.floor_us, 2)}
    backend = "triton" if verdict is not None and verdict.triton_launches else cand.backend
    return KernelResult(op=task.family, module=task.module_class, backend=backend, shapes=task.input_shapes,
                        reason=reason, outcome=outcome, candidate_id=f"{task.id}/{cand.id}", **timings)


def pick_best(task: Task, rows: list[KernelResult],
              winners: list[Accepted]) -> tuple[list[KernelResult], Accepted | None]:
    """The fastest accepted candidate, and the rows as they stand once it is chosen: new rows say which won and why
    the other fast ones did not (the rows given stay as evaluation made them)."""
    best = max(winners, key=lambda a: a.bench.speedup, default=None)
    if best is None:
        return list(rows), None
    return [_ranked(row, f"{task.id}/{best.candidate.id}", best.candidate.id) for row in rows], best


def _ranked(row: KernelResult, best_id: str, best_name: str) -> KernelResult:
    if row.candidate_id == best_id:
        return row.model_copy(update={"outcome": KernelOutcome.ACCEPTED})
    if row.speedup and row.outcome is KernelOutcome.FASTER:
        return row.model_copy(update={"outcome": KernelOutcome.OUTPACED, "reason": (
            f"verified and faster ({row.speedup:.2f}x), but {best_name} was faster still")})
    return row
