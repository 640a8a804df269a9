"""A resumable run's state, carried between its stages and sessions: the journal, the wall-clock budget across
sessions, the kernel store, and the replay of candidates already evaluated (so a resumed run loses no verified
candidate)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbot.agent.journal.db import Journal
from kernelbot.kernel_library.store import KernelStore
from kernelbot.outcomes import Accepted, Outcome
from kernelbot.records import Bench, Candidate, KernelResult, Task, Verdict
from kernelbot.rundir import write_record

FIRST_CANDIDATE_GUESS_S = 10.0  # before any candidate has been timed in this run


@dataclasses.dataclass(frozen=True)
class BudgetSpent:
    """The time budget refusing work: what had been used of it at that moment and what was kept back for the finish.
    Steps return it; the run's loop takes the first as the reason its work stopped early (the report's stop_reason)."""

    elapsed_s: float
    limit_s: float
    reserve_s: float

    def __str__(self) -> str:
        return (f"time budget: {self.elapsed_s / 3600:.3f} h of {self.limit_s / 3600:.3f} h used, "
                f"{self.reserve_s:.0f} s kept to integrate, measure and report")


class Clock:
    """--budget-hours over every session of one run: earlier sessions' time is read back from the journal."""

    def __init__(self, journal: Journal, budget_hours: float | None) -> None:
        self.journal = journal
        self.before = float(journal.meta("elapsed_s", 0.0))
        self.t0 = time.perf_counter()
        self.limit = budget_hours * 3600 if budget_hours else None
        self.reserve = 0.0  # what finishing (integrate, measure, re-profile, report) is expected to take
        self.longest_candidate = 0.0

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.t0

    def left(self) -> float:
        return math.inf if self.limit is None else self.limit - self.elapsed()

    def affords(self, seconds: float) -> bool:
        """Can work expected to take `seconds` still be done with the finish's reserve kept back?"""
        return self.left() - self.reserve >= seconds

    def affords_candidate(self) -> bool:
        return self.affords(self.longest_candidate or FIRST_CANDIDATE_GUESS_S)

    def spent(self) -> BudgetSpent | None:
        """The budget as used now when it leaves no room for another candidate; None while one still fits."""
        if self.limit is None or self.affords_candidate():
            return None
        return BudgetSpent(self.elapsed(), self.limit, self.reserve)

    def save(self) -> None:
        self.journal.set_meta("elapsed_s", round(self.elapsed(), 2))


Evaluator = Callable[[Candidate, Path], Outcome]


@dataclasses.dataclass
class RunState:
    """What the steps of a resumable run share: its journal, clock and kernel store, and how far it got."""

    journal: Journal
    clock: Clock
    store: KernelStore | None
    device_name: str
    session: Any = None  # the run's LLMSession, shared by every iteration
    iteration: int = 0

    def memo(self, key: str, kind: str, compute: Callable[[], Any]) -> Any:
        """The recorded result for `key`, or compute it and record it before returning it."""
        found = self.journal.get(key)
        if found is not None:
            return found
        value = compute()
        self.journal.put(key, kind, value)
        return value

    def recorded(self, task_id: str, cand: Candidate | None = None) -> bool:
        """Has this task (this candidate of it) a recorded outcome, which replaying costs nothing?"""
        key = f"cand:{task_id}:{cand.id}:{cand.source_hash}" if cand else f"cand:{task_id}:%"
        return self.journal.has(key)

    def out_of_time(self, task_id: str, cand: Candidate | None = None) -> BudgetSpent | None:
        """The spent budget when this work would overrun it, else None (recorded work replays at no cost)."""
        spent = self.clock.spent()
        return None if spent is None or self.recorded(task_id, cand) else spent

    def stage(self, name: str, **progress: Any) -> None:
        self.journal.set_meta("stage", {"stage": name, "iteration": self.iteration, **progress})
        self.clock.save()

    def journaled(self, evaluate: Evaluator, task: Task, hotspot_fields: dict[str, Any]) -> Evaluator:
        """An evaluator that replays candidates recorded in the journal and records each new outcome (with its
        source, so the candidate file can be rewritten) as soon as it exists."""
        annotated_evaluate = annotated(evaluate, hotspot_fields)

        def run(cand: Candidate, path: Path) -> Outcome:
            key = f"cand:{task.id}:{cand.id}:{cand.source_hash}"
            found = self.journal.get(key)
            if found is not None:
                return _replay(found, task, cand, path)
            t0 = time.perf_counter()
            out = annotated_evaluate(cand, path)
            self.clock.longest_candidate = max(self.clock.longest_candidate, time.perf_counter() - t0)
            self.journal.put(key, "candidate", {**_outcome_data(out), "task_id": task.id,
                                                "source": path.read_text() if path.exists() else ""})
            self.clock.save()
            return out

        return run


def annotated(evaluate: Evaluator, hotspot_fields: dict[str, Any]) -> Evaluator:
    """An evaluator whose rows carry the hotspot's fields and the candidate's proposer."""

    def run(cand: Candidate, path: Path) -> Outcome:
        out = evaluate(cand, path)
        return dataclasses.replace(out, row=out.row.model_copy(update={**hotspot_fields, "proposer": cand.proposer}))

    return run


def _outcome_data(out: Outcome) -> dict[str, Any]:
    return {"row": out.row.model_dump(), "verdict": out.verdict and out.verdict.model_dump(),
            "bench": out.bench and out.bench.model_dump(), "accepted": out.accepted is not None, "report": out.report}


def _replay(data: dict[str, Any], task: Task, cand: Candidate, path: Path) -> Outcome:
    verdict = Verdict.model_validate(data["verdict"]) if data["verdict"] else None
    bench = Bench.model_validate(data["bench"]) if data["bench"] else None
    if verdict is not None and not (path.parent / "verdict.json").exists():
        write_record(path.parent / "verdict.json", verdict)
    if bench is not None and not (path.parent / "bench.json").exists():
        write_record(path.parent / "bench.json", bench)
    won = data["accepted"] and verdict is not None and bench is not None
    return Outcome(KernelResult.model_validate(data["row"]), verdict, bench,
                   Accepted(task, cand, path, verdict, bench) if won else None, data["report"])
