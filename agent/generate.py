"""The generate step: candidates for every task, verified and benchmarked in the sandbox (here or on the Ray
cluster), each outcome recorded in the run's journal as it arrives.

Per task, most headroom first: the incumbent (an accepted kernel being challenged, or a kernel the store holds for
the op), then the LLM when one is given, else (or once it is down or its budget spent) the built-in proposer.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelbot import KernelbotError
from kernelbot.agent.journal.run_state import BudgetSpent, Evaluator, RunState
from kernelbot.agent.llm.loop import LLMSession, run_task
from kernelbot.agent.llm.prompt import PromptContext
from kernelbot.agent.propose.proposer import available_backends, propose, write_candidate
from kernelbot.agent.report.markdown import llm_line
from kernelbot.agent.run_options import OptimizeOptions
from kernelbot.agent.stages import Stages
from kernelbot.agent.verify.evaluate import duel, evaluate
from kernelbot.kernel_library.cpp_build import (
    BUILD_ERRORS,
    build_problem,
    cache_root,
    prebuild_library,
    unbuilt_library,
)
from kernelbot.kernel_library.identity import source_identity
from kernelbot.outcomes import Accepted, Outcome, pick_best
from kernelbot.records import Bench, Candidate, Device, Hotspot, KernelOutcome, KernelResult, LLMUsage, Origin, Task

if TYPE_CHECKING:
    from kernelbot.agent.cluster import ClusterExecutor, Job
    from kernelbot.agent.journal.progress import ClusterProgress


Proposal = KernelResult | tuple[Candidate, str]  # a candidate to run with its source, or the row of one that cannot


def hotspot_fields(task: Task, hotspot: Hotspot | None, iteration: int) -> dict[str, Any]:
    """What every row of a task's candidates carries about the hotspot it came from."""
    return {"hotspot_id": task.hotspot_id, "share": round(task.share, 5), "iteration": iteration,  # cost per call:
            "flops": hotspot.flops if hotspot and hotspot.flops else None,
            "bytes": hotspot.bytes if hotspot and hotspot.bytes else None}


def local_evaluator(task: Task, task_dir: Path, device: str, opts: OptimizeOptions) -> Evaluator:
    """Candidates of a task verified and benchmarked in this machine's sandbox."""
    return functools.partial(evaluate, task, task_dir, device=device, target=opts.target, seed=opts.seed,
                             timeout=opts.timeout, bench_rounds=opts.bench_rounds)


def builtin_proposals(task: Task, task_dir: Path, backends: list[str], stages: Stages) -> list[Proposal]:
    """The built-in proposer's candidates for a task, in order, as (candidate, source) to run, or as the row of one
    that cannot run here (or of the generator's failure)."""
    items: list[Proposal] = []
    try:
        proposed = propose(task, backends, task_dir / "reference.py")
    except Exception as exc:  # a graph the generator cannot translate, or a generator bug: this task's row, not the run
        why = str(exc) if isinstance(exc, KernelbotError) else f"generator error ({type(exc).__name__}: {exc})"
        stages.say(f"  {task.id}: built-in generator: {why}", style="yellow")
        items.append(KernelResult(op=task.family, module=task.module_class, backend="cpp", shapes=task.input_shapes,
                                  reason=f"no built-in candidate: {why}"[:300], speedup=None,
                                  outcome=KernelOutcome.NO_CANDIDATE,
                                  candidate_id=f"{task.id}/builtin"))
        proposed = []
    items += proposed
    return items


@dataclasses.dataclass(frozen=True)
class Tried:
    """One task's candidates as tried: their rows (the winner's standing decided), its best accepted candidate, and
    what the generate step reports of it."""

    rows: list[KernelResult]
    best: Accepted | None
    stopped: BudgetSpent | None = None  # the time budget, when it left candidates of the task untried
    reused: list[str] = dataclasses.field(default_factory=list)  # kernel-store candidates that won their benchmark
    outpaced: dict[str, str] = dataclasses.field(default_factory=dict)  # duel losers: candidate id → why
    notes: list[str] = dataclasses.field(default_factory=list)


def lost(bench: Bench) -> bool:
    """Slower than the op beyond the benchmark's own noise, on a host nobody else was loading: a loss worth
    remembering (a contended benchmark proves nothing either way)."""
    noise = max(bench.reference_spread, bench.candidate_spread)
    quiet = bench.host is None or not bench.host.contended
    return quiet and bench.speedup * (1.0 + noise) < 1.0


def _never_out_of_time(cand: Candidate) -> BudgetSpent | None:
    return None


def try_candidates(task: Task, task_dir: Path, proposals: list[Proposal], evaluate: Evaluator, stages: Stages,
                   max_task_minutes: float | None,
                   out_of_time: Callable[[Candidate], BudgetSpent | None] = _never_out_of_time) -> Tried:
    """The proposals of one task evaluated in order, until the time budget (`out_of_time`; then `stopped` says it)
    or the per-task cap stops them; the rows, and the best accepted candidate."""
    results: list[KernelResult] = []
    winners: list[Accepted] = []
    stopped: BudgetSpent | None = None
    t0 = time.perf_counter()
    runnable = [item for item in proposals if not isinstance(item, KernelResult)]
    for item in proposals:
        if isinstance(item, KernelResult):  # no candidate to run: the row says why
            results.append(item)
            continue
        cand, source = item
        if (stopped := out_of_time(cand)) is not None:
            break
        if max_task_minutes is not None and time.perf_counter() - t0 > max_task_minutes * 60:
            stages.say(f"  {task.id}: per-task cap of {max_task_minutes} min reached", style="yellow")
            break
        place = f"{runnable.index(item) + 1} of {len(runnable)}"
        with stages.working(f"{task.id}: candidate {place} ({cand.id}): verifying and benchmarking"):
            outcome = evaluate(cand, write_candidate(cand, source, task_dir))
        stages.say(f"  {task.id} {cand.id}: {outcome.row.reason}")
        results.append(outcome.row)
        if outcome.accepted:
            winners.append(outcome.accepted)
    rows, best = pick_best(task, results, winners)
    return Tried(rows, best, stopped)


@dataclasses.dataclass(frozen=True)
class Generated:
    """What one generate step made: every candidate's row, each task's winner, the LLM's spend, and the step's notes
    for the report; the duels' losers (candidate id → why another took its place: the run joins it into the
    report's rows), the kernel-store candidates that won, and the time budget when it stopped the step early."""

    rows: list[KernelResult]
    accepted: list[Accepted]
    usage: LLMUsage | None
    notes: list[str]
    outpaced: dict[str, str] = dataclasses.field(default_factory=dict)
    reused: list[str] = dataclasses.field(default_factory=list)
    stopped: BudgetSpent | None = None

    @classmethod
    def of(cls, tried: list[Tried], usage: LLMUsage | None, notes: list[str],
           stopped: BudgetSpent | None) -> Generated:
        """The step's record from its tasks', in task order; `notes` and `stopped`: the step's own."""
        return cls(rows=[r for t in tried for r in t.rows], accepted=[t.best for t in tried if t.best],
                   usage=usage, notes=[n for t in tried for n in t.notes] + notes,
                   outpaced={cid: why for t in tried for cid, why in t.outpaced.items()},
                   reused=[cid for t in tried for cid in t.reused], stopped=stopped)


@dataclasses.dataclass(frozen=True)
class OnCluster:
    """Candidates run on the cluster together: their outcomes (task, outcome) in the order given, the time budget
    when it refused some, and the notes for the report."""

    outcomes: list[tuple[Task, Outcome]]
    stopped: BudgetSpent | None
    notes: list[str]


@dataclasses.dataclass
class Generation:
    """The generate step of one resumable run: what its candidates need to be made, evaluated and recorded."""

    opts: OptimizeOptions
    run_dir: Path
    state: RunState
    stages: Stages
    device: Device
    executor: ClusterExecutor | None = None  # --cluster: candidates are evaluated there

    @property
    def backends(self) -> list[str]:
        """The backends whose kernels can join this run's pack."""
        return available_backends(self.device.kind)

    @property
    def target(self) -> str:
        """Where this run's candidates are verified and timed, as verify and bench take it: "cpu", "cuda" (the
        assigned GPU, KERNELBOT_GPU) or "cuda:N" where the run named its GPU (--device cuda:N)."""
        _, _, index = self.opts.device.partition(":")
        return f"cuda:{index}" if self.device.kind == "cuda" and index else self.device.kind

    def task_dir(self, task: Task) -> Path:
        return self.run_dir / "tasks" / task.id

    def journaled(self, task: Task, hotspot: Hotspot | None, evaluate: Evaluator | None = None) -> Evaluator:
        """The task's evaluator, its outcomes recorded in (and replayed from) the journal: `evaluate`, else the
        sandbox here or on the cluster (--cluster), one candidate at a time."""
        if evaluate is None and self.executor is not None:
            evaluate = self.executor.evaluator(task, self.task_dir(task))
        elif evaluate is None:
            evaluate = local_evaluator(task, self.task_dir(task), self.target, self.opts)
        return self._remembering_losses(task, self.state.journaled(evaluate, task, hotspot_fields(
            task, hotspot, self.state.iteration)))

    def _remembering_losses(self, task: Task, evaluate: Evaluator) -> Evaluator:
        """`evaluate`, with each candidate that lost to the op (store.lost) remembered in the kernel store."""
        store = self.state.store
        if store is None:
            return evaluate

        def run(cand: Candidate, path: Path) -> Outcome:
            out = evaluate(cand, path)
            if out.bench is not None and lost(out.bench) and out.row.outcome is KernelOutcome.NOT_FASTER:
                store.record_loss(task, out.row.backend, self.state.device_name, cand.source_hash,
                                  out.bench.speedup, self.run_dir.name)
            return out

        return run

    def _not_lost_before(self, task: Task, proposals: list[Proposal]) -> list[Proposal]:
        """The built-in proposals, those that lost to this op on this device before (the store remembers) as rows
        that say so instead of candidates to run again."""
        store = self.state.store
        if store is None:
            return proposals
        out: list[Proposal] = []
        for item in proposals:
            past = None if isinstance(item, KernelResult) else store.losses(
                task, item[0].backend, self.state.device_name).get(item[0].source_hash)
            if past is None:
                out.append(item)
                continue
            cand = item[0]
            why = (f"not proposed again: it lost to the op on this device in run {past['run_id']} "
                   f"({past['speedup']:.2f}x; the kernel store remembers)")
            out.append(KernelResult(
                op=task.family, module=task.module_class, backend=cand.backend, shapes=task.input_shapes,
                outcome=KernelOutcome.NOT_FASTER, speedup=past["speedup"], candidate_id=f"{task.id}/{cand.id}",
                proposer=cand.proposer, reason=why))
        return out

    def generate(self, tasks: list[Task], hotspots: list[Hotspot], incumbents: dict[str, Accepted]) -> Generated:
        """Candidates for every task, most headroom first, every candidate verified and benchmarked."""
        session = self._session() if self.opts.llm else None
        source = f"LLM {self.opts.llm.model}" if self.opts.llm else "built-in proposer"
        where = f"on the Ray cluster {self.opts.cluster}" if self.executor is not None else ""
        self.stages.say(f"[4/7] generate + verify + benchmark ({source}; candidates run in the sandbox"
                        f"{' ' + where})")
        if "cpp" in self.backends:  # C++ candidates run on CPUs only
            build_library(self.stages)
        if self.executor is not None:
            self.executor.target_device = f"{self.device.kind}:{self.device.name}"
            if session is None:
                return self._on_cluster_all(tasks, hotspots)
        by_id = {h.id: h for h in hotspots}
        tried: list[Tried] = []
        stopped: BudgetSpent | None = None
        notes: list[str] = []
        for i, task in enumerate(tasks):
            self.state.stage("generate", task=task.id, done=i, planned=len(tasks))
            stopped = stopped or self.state.out_of_time(task.id)
            if stopped and not self.state.recorded(task.id):
                notes.append(f"{task.id} and later tasks not tried: {stopped}")
                break
            tried.append(self._one_task(task, by_id.get(task.hotspot_id), incumbents, session))
            stopped = stopped or tried[-1].stopped
        usage = None if session is None else session.finish()
        if usage is not None:
            self.stages.say(f"      {llm_line(usage)}")
        return Generated.of(tried, usage, notes, stopped)

    def _one_task(self, task: Task, hotspot: Hotspot | None, incumbents: dict[str, Accepted],
                  session: LLMSession | None) -> Tried:
        stored = Tried([], incumbents[task.id]) if task.id in incumbents else self._from_store(task, hotspot)
        rows, best, outpaced, notes = stored.rows, stored.best, {}, []
        if session is not None and session.active:  # a stored kernel is the incumbent, not the end of the search
            more, challenger = self._llm_task(session, task, hotspot)
            rows = [*rows, *more]
            best, outpaced = self._crown(task, best, challenger)
            if not session.active:
                why = (f"LLM endpoint {self.opts.llm.model} is down ({session.down})" if session.down
                       else f"LLM budget spent ({session.stopped})")
                self.stages.say(f"{why}: the built-in proposer takes over from {task.id} on", style="yellow")
                notes.append(f"{why}: built-in proposer from {task.id} on")
        if best is None and (session is None or not session.active):
            builtin = try_candidates(
                task, self.task_dir(task), self._not_lost_before(task, builtin_proposals(
                    task, self.task_dir(task), self.backends, self.stages)),
                self.journaled(task, hotspot), self.stages, self.opts.max_task_minutes,
                functools.partial(self.state.out_of_time, task.id))
            return Tried([*rows, *builtin.rows], builtin.best, builtin.stopped, stored.reused, outpaced, notes)
        return Tried(rows, best, None, stored.reused, outpaced, notes)

    def _session(self) -> LLMSession:
        """The run's LLM session, its answers recorded in (and replayed from) the journal."""
        if self.state.session is None:
            from kernelbot.agent.llm.client import LLMClient
            from kernelbot.agent.llm.replay import JournaledClient

            o = self.opts.llm
            inner = LLMClient(o.model, o.api_base, timeout=o.timeout, max_retries=o.max_retries, backoff=o.backoff,
                              temperature=o.temperature, price=o.price)
            # calls.jsonl is rebuilt by the replay: recorded answers come back in the same order under the same ids
            (self.run_dir / "llm" / "calls.jsonl").unlink(missing_ok=True)
            self.state.session = LLMSession(o, self.run_dir, self.stages.say,
                                            client=JournaledClient(inner, self.state.journal))
        return self.state.session

    def _stored(self, task: Task) -> list[tuple[Candidate, str, dict[str, Any]]]:
        """The kernels the store holds for this op, backend and device, as candidates (with source and entry)."""
        store = self.state.store
        if store is None:
            return []
        # what the store held when this task was first planned: a resumed run must see the same (the run itself may
        # have added this op's kernel since)
        found_all = self.state.memo(f"store:{task.id}", "stage", lambda: [
            [backend, *found] for backend in self.backends
            if (found := store.lookup(task, backend, self.state.device_name)) is not None])
        return [(Candidate(id=f"store-{backend}", task_id=task.id, backend=backend,
                           proposer=f"store:{entry.get('proposer', '?')}", origin=Origin.STORE,
                           config={"from_run": entry.get("run_id"), **entry.get("config", {})},
                           source_hash=source_identity(source)), source, entry)
                for backend, source, entry in found_all]

    def _from_store(self, task: Task, hotspot: Hotspot | None) -> Tried:
        """A kernel the store holds for this op, backend and device, verified and benchmarked again here."""
        if self.state.store is None:
            return Tried([], None)
        rows: list[KernelResult] = []
        winners: list[Accepted] = []
        run = self.journaled(task, hotspot)
        for cand, source, entry in self._stored(task):
            outcome = run(cand, write_candidate(cand, source, self.task_dir(task)))
            self.stages.say(f"  {task.id} {cand.id} (from the kernel store, run {entry.get('run_id')}): "
                            f"{outcome.row.reason}")
            rows.append(outcome.row)
            if outcome.accepted:
                winners.append(outcome.accepted)
        ranked, best = pick_best(task, rows, winners)
        return Tried(ranked, best, reused=[f"{task.id}/{a.candidate.id}" for a in winners])

    def _llm_task(self, session: LLMSession, task: Task,
                  hotspot: Hotspot | None) -> tuple[list[KernelResult], Accepted | None]:
        """The LLM's generate → verify → repair rounds for one task, within what the time budget leaves."""
        clock = self.state.clock
        if clock.limit is not None:
            left = max(1.0, clock.left() - clock.reserve)
            spent = session.ledger.elapsed()
            cap = self.opts.llm.budget.max_seconds
            session.ledger.budget = self.opts.llm.budget.model_copy(
                update={"max_seconds": min(cap, spent + left) if cap else spent + left})
        ctx = PromptContext(self.device, "cpp" if self.device.kind == "cpu" else "triton", hotspot)
        run = run_task(session, task, self.task_dir(task), ctx, self.journaled(task, hotspot))
        return run.rows, run.best

    def _crown(self, task: Task, incumbent: Accepted | None,
               challenger: Accepted | None) -> tuple[Accepted | None, dict[str, str]]:
        """The challenger replaces the incumbent only when it beats it in the same benchmark: the winner, and the
        duel's record of the loser (its candidate id → why), whichever step made the loser's row."""
        if incumbent is None or challenger is None:
            return incumbent or challenger, {}

        def fight() -> dict:
            return duel(task, self.task_dir(task), incumbent, challenger, seed=self.opts.seed,
                        timeout=self.opts.timeout, rounds=self.opts.bench_rounds, device=self.target).model_dump()

        key = f"duel:{task.id}:{challenger.candidate.source_hash}:{incumbent.candidate.source_hash}"
        result = Bench.model_validate(self.state.memo(key, "stage", fight))
        won = result.significant
        self.stages.say(f"  {task.id}: challenger {challenger.candidate.id} vs incumbent {incumbent.candidate.id}: "
                        f"{result.speedup:.2f}x, {'replaces it' if won else 'incumbent stays'}")
        winner, loser = (challenger, incumbent) if won else (incumbent, challenger)
        return winner, {f"{task.id}/{loser.candidate.id}": (
            f"verified and faster than the op, but {result.speedup:.2f}x against {winner.candidate.id} in a duel, "
            f"which {'replaced it' if won else 'stays'}")}

    def _on_cluster_all(self, tasks: list[Task], hotspots: list[Hotspot]) -> Generated:
        """The built-in proposer's candidates of every task at once, as many as the cluster holds: first the
        kernels the store holds, then the proposer's for the tasks no stored kernel won; each recorded as it
        arrives."""
        by_id = {h.id: h for h in hotspots}
        rows: dict[str, list[KernelResult]] = {t.id: [] for t in tasks}
        winners: dict[str, list[Accepted]] = {t.id: [] for t in tasks}
        self.state.stage("generate", done=0, planned=len(tasks))
        stored = self._on_cluster([(t, cand, source) for t in tasks for cand, source, _ in self._stored(t)], by_id)
        for task, out in stored.outcomes:
            rows[task.id].append(out.row)
            if out.accepted:
                winners[task.id].append(out.accepted)
        reused = {t.id: [f"{t.id}/{a.candidate.id}" for a in winners[t.id]] for t in tasks}
        proposed: list[tuple[Task, Candidate, str]] = []
        for task in (t for t in tasks if not winners[t.id]):  # no stored kernel won its benchmark
            for item in self._not_lost_before(task, builtin_proposals(task, self.task_dir(task), self.backends,
                                                                      self.stages)):
                if isinstance(item, KernelResult):
                    rows[task.id].append(item)
                else:
                    proposed.append((task, *item))
        built = self._on_cluster(proposed, by_id, stored.stopped)
        for task, out in built.outcomes:
            rows[task.id].append(out.row)
            if out.accepted:
                winners[task.id].append(out.accepted)
        tried = []
        for task in tasks:
            ranked, best = pick_best(task, rows[task.id], winners[task.id])
            tried.append(Tried(ranked, best, reused=reused[task.id]))
        self.state.stage("generate", done=len(tasks), planned=len(tasks))
        return Generated.of(tried, None, stored.notes + built.notes, built.stopped)

    def _on_cluster(self, items: list[tuple[Task, Candidate, str]], by_id: dict[str, Hotspot],
                    stopped: BudgetSpent | None = None) -> OnCluster:
        """Candidates evaluated concurrently on the cluster (recorded ones replayed from the journal), their
        outcomes in the order given; a candidate the time budget (`stopped` already, or now) or the per-task cap
        leaves unstarted has none."""
        from kernelbot.agent.cluster import Job

        assert self.executor is not None
        outcomes: dict[str, Outcome] = {}
        jobs: list[Job] = []
        sources: dict[str, str] = {}
        for task, cand, source in items:
            task_dir = self.task_dir(task)
            job = Job(task, task_dir, cand, task_dir / "candidates" / cand.id / "candidate.py")
            if self.state.recorded(task.id, cand):
                replay = self.journaled(task, by_id.get(task.hotspot_id), _recorded_already)
                outcomes[job.key] = replay(cand, write_candidate(cand, source, task_dir))
                self.stages.say(f"  {job.key} (recorded): {outcomes[job.key].row.reason}")
            else:
                jobs.append(job)
                sources[job.key] = source
        watch = _ClusterWatch(self, sources, outcomes, by_id, stopped=stopped)
        refused = self.executor.run(jobs, watch.done, watch.may_start, watch.report)
        notes = []
        if refused:
            why = watch.stopped or f"the per-task cap of {self.opts.max_task_minutes} min"
            notes.append(f"{len(refused)} candidates not tried ({', '.join(j.key for j in refused[:4])}"
                         f"{', ...' if len(refused) > 4 else ''}): {why}")
        return OnCluster([(task, outcomes[f"{task.id}/{cand.id}"]) for task, cand, _ in items
                          if f"{task.id}/{cand.id}" in outcomes], watch.stopped, notes)


def _recorded_already(cand: Candidate, path: Path) -> Outcome:
    raise AssertionError(f"{cand.id} has a recorded outcome, replayed rather than evaluated")


@dataclasses.dataclass
class _ClusterWatch:
    """The driver's side of the cluster's jobs: whether each may start, recording each outcome, showing progress."""

    generation: Generation
    sources: dict[str, str]  # job key → candidate source
    outcomes: dict[str, Outcome]  # job key → outcome, filled as they arrive
    by_id: dict[str, Hotspot]
    stopped: BudgetSpent | None = None  # the time budget, once it refused a job (or an earlier batch's)
    started: dict[str, float] = dataclasses.field(default_factory=dict)  # job key → when it was shipped
    task_start: dict[str, float] = dataclasses.field(default_factory=dict)  # task id → its first shipment
    shown: Any = None  # the progress last printed

    def may_start(self, job: Job) -> bool:
        g = self.generation
        now = time.perf_counter()
        if (spent := g.state.clock.spent()) is not None:
            self.stopped = self.stopped or spent
            return False
        first = self.task_start.setdefault(job.task.id, now)
        if g.opts.max_task_minutes is not None and now - first > g.opts.max_task_minutes * 60:
            return False
        write_candidate(job.candidate, self.sources[job.key], job.task_dir)
        self.started[job.key] = now
        return True

    def done(self, job: Job, out: Outcome) -> None:
        g = self.generation
        record = g.journaled(job.task, self.by_id.get(job.task.hotspot_id), lambda cand, path: out)
        self.outcomes[job.key] = record(job.candidate, job.path)
        took = time.perf_counter() - self.started[job.key]
        g.state.clock.longest_candidate = max(g.state.clock.longest_candidate, took)
        where = out.row.placement
        g.stages.say(f"  {job.key}: {out.row.reason}" + (f" [node {where.node[:8]}, worker {where.worker[:8]}, "
                                                          f"{where.device}, try {where.attempts}]" if where else ""))

    def report(self, progress: ClusterProgress) -> None:
        g = self.generation
        g.state.journal.set_meta("cluster", progress.model_dump())
        if progress.signature() != self.shown:  # the same work as last time, only older: said already
            self.shown = progress.signature()
            for line in progress.lines():
                g.stages.say(f"      {line}")


def build_library(stages: Stages) -> None:
    """The library's C++ extensions, built before the first candidate needs them, with a spinner: the first run on a
    machine compiles them for a minute or more and would otherwise sit silent. A build that fails is said, not
    raised: the C++ candidates that load the library then fail their compile check, and the rest of the run goes on."""
    unbuilt = unbuilt_library()
    if not unbuilt:
        return
    t0 = time.perf_counter()
    with stages.console.status(f"building {len(unbuilt)} C++ kernel extensions (first run here; cached afterwards)"):
        try:
            prebuild_library()
        except BUILD_ERRORS as exc:
            stages.say(f"      {build_problem(exc)}")
            return
    stages.say(f"      built {len(unbuilt)} C++ kernel extensions in {time.perf_counter() - t0:.0f} s (cached in "
               f"{cache_root()})")
