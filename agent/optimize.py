"""`kernelbot optimize`: profile → rank → tasks → candidates → verdicts → benches → pack, iterated on the new
bottlenecks while budget and headroom last, then measure → report (the steps: agent/run.py).

Every stage result, candidate outcome and LLM answer goes into the run's journal (agent/journal/db.py) as it
happens; `resume` replays them and continues from the first thing not recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from kernelbot import KernelbotError
from kernelbot.agent.journal.db import Journal
from kernelbot.agent.llm.budget import Budget
from kernelbot.agent.run import OptimizeRun
from kernelbot.agent.run_options import OptimizeOptions
from kernelbot.flags import options
from kernelbot.hardware.device import pick_device
from kernelbot.records import Report
from kernelbot.rundir import new_run_dir

if TYPE_CHECKING:
    from kernelbot.agent.cluster import ClusterExecutor

__all__ = ["OptimizeOptions", "optimize", "resume"]


def optimize(opts: OptimizeOptions, console: Console | None = None) -> Report:
    """A new run (its run directory must not hold one already)."""
    _, run_dir = new_run_dir(opts.run_dir)
    opts = opts.model_copy(update={"run_dir": run_dir})
    with Journal(run_dir) as journal:
        if journal.meta("options") is not None:
            raise KernelbotError(f"{run_dir} already holds a run; continue it with `kernelbot optimize --resume "
                                 f"{run_dir}` or pass another --run-dir")
        journal.set_meta("options", opts.model_dump(mode="json"))
        return _session(opts, journal, console)


def resume(run_dir: Path, console: Console | None = None, *, budget_hours: float | None = None,
           max_cost: float | None = None, max_tokens: int | None = None) -> Report:
    """Continue a killed (or finished) run where its journal stops; budgets given here replace the recorded ones."""
    run_dir = Path(run_dir)
    if not (run_dir / "journal.sqlite").exists():
        raise KernelbotError(f"{run_dir}: no journal.sqlite, so nothing to resume (start a run with --run-dir)")
    with Journal(run_dir) as journal:
        data = journal.meta("options")
        if data is None:
            raise KernelbotError(f"{run_dir}: the journal has no options recorded; start a new run instead")
        opts = _with_budgets(OptimizeOptions.model_validate(data), budget_hours, max_cost, max_tokens)
        journal.set_meta("options", opts.model_dump(mode="json"))
        return _session(opts, journal, console)


def _with_budgets(opts: OptimizeOptions, budget_hours: float | None, max_cost: float | None,
                  max_tokens: int | None) -> OptimizeOptions:
    """The recorded options with the budgets given on resuming in place of theirs (checked as the flags are)."""
    given = {"budget_hours": budget_hours} if budget_hours is not None else {}
    if opts.llm is not None and (max_cost is not None or max_tokens is not None):
        b = opts.llm.budget
        budget = options(Budget, **{**b.model_dump(), "max_cost": max_cost if max_cost is not None else b.max_cost,
                                    "max_tokens": max_tokens if max_tokens is not None else b.max_tokens})
        given["llm"] = opts.llm.model_copy(update={"budget": budget})
    return options(OptimizeOptions, **{**dict(opts), **given}) if given else opts


def _session(opts: OptimizeOptions, journal: Journal, console: Console | None) -> Report:
    with _cluster(opts) as executor:
        return OptimizeRun(opts, journal, console or Console(soft_wrap=True), executor).run()


@contextlib.contextmanager
def _cluster(opts: OptimizeOptions) -> Iterator[ClusterExecutor | None]:
    """The Ray cluster the candidates run on (--cluster), connected for this session; None without one (and then
    nothing of Ray is imported)."""
    if not opts.cluster:
        yield None
        return
    from kernelbot.agent.cluster import connected

    with connected(opts.cluster, pick_device(opts.device).kind, seed=opts.seed, timeout=opts.timeout,
                   bench_rounds=opts.bench_rounds) as executor:
        yield executor
