"""`kernelbot optimize`: profile → rank → tasks → candidates → verdicts → benches → pack, iterated on the new
bottlenecks while budget and headroom last, then measure → report.

Every stage result, candidate outcome and LLM answer goes into the run's journal (agent/journal.py) as it happens;
`resume` replays them and continues from the first thing not recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from kernelbot import KernelbotError
from kernelbot.agent.compile_baseline import RegionCompile, time_region_compile
from kernelbot.agent.evaluate import Outcome, duel, evaluate, pick_best
from kernelbot.agent.extract import NotExtractable
from kernelbot.agent.integrate import count_calls, fidelity, median, time_end_to_end
from kernelbot.agent.journal import Journal
from kernelbot.agent.llm.budget import Budget
from kernelbot.agent.llm.loop import LLMOptions, LLMSession, run_task
from kernelbot.agent.llm.prompt import PromptContext
from kernelbot.agent.night import Clock, Night, journaled
from kernelbot.agent.pack import Accepted, build_pack
from kernelbot.agent.proposer import available_backends, propose, write_candidate
from kernelbot.agent.report import llm_line, write_report
from kernelbot.agent.tasks import make_generic_task, make_task, module_labels, skip_reason, write_task
from kernelbot.engine import TorchEngine
from kernelbot.engine.device import DeviceChoice, device_record, pick_device
from kernelbot.engine.models import resolve_spec
from kernelbot.kernel_library import classes_covered
from kernelbot.kernel_library.base import GENERIC
from kernelbot.kernel_library.base import rows as call_rows
from kernelbot.kernel_library.cpp_build import cache_root, prebuild_library, unbuilt_library
from kernelbot.kernel_library.store import KernelStore
from kernelbot.profiler.hotspots import op_breakdown, rank_hotspots
from kernelbot.profiler.trace import load_trace
from kernelbot.records import (
    Bench,
    Candidate,
    Device,
    EndToEndTimes,
    Fidelity,
    Hotspot,
    KernelOutcome,
    KernelResult,
    LLMUsage,
    ModelSpec,
    Pack,
    Report,
    Task,
)
from kernelbot.rundir import new_run_dir, write_record

if TYPE_CHECKING:
    from kernelbot.agent.cluster import ClusterExecutor

INTERPRETED_ROWS = 64  # on a CPU, Triton candidates of bigger calls are not run through the interpreter
COMPILE_GUESS_S = 90.0  # torch.compile's warm-up, when a budget must decide whether it fits


@dataclass
class OptimizeOptions:
    model: str = "llama-tiny"
    dtype: str = "auto"
    batch: int = 8
    prompt_len: int = 32
    decode_steps: int = 32
    seed: int = 0
    run_dir: Path | None = None
    min_share: float = 0.005
    max_tasks: int = 8  # per iteration
    timeout: float = 300.0
    bench_rounds: int = 15
    e2e_rounds: int = 7
    compile: bool = True
    families: list[str] | None = None  # only these kernel_library families (default: all)
    llm: LLMOptions | None = None  # generate with this LLM instead of the built-in proposer
    budget_hours: float | None = None  # wall time of the whole run, every resumed session included
    iterations: int = 3  # profile → generate → integrate rounds at most
    max_task_minutes: float | None = None  # per task, built-in and stored candidates
    store: Path | None = None  # kernel store to reuse from and add to (None: none)
    device: str = "auto"  # auto: a GPU when one is visible, else the CPU (engine/device.py)
    cluster: str | None = None  # a Ray cluster's address: candidates are evaluated there (agent/cluster.py)


def options_to_json(opts: OptimizeOptions) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(opts), default=str))


def options_from_json(data: dict[str, Any]) -> OptimizeOptions:
    data = dict(data)
    for key in ("run_dir", "store"):
        data[key] = Path(data[key]) if data.get(key) else None
    if data.get("llm"):
        llm = dict(data["llm"])
        llm["budget"] = Budget(**llm["budget"])
        llm["price"] = tuple(llm["price"]) if llm.get("price") else None
        data["llm"] = LLMOptions(**llm)
    known = {f.name for f in dataclasses.fields(OptimizeOptions)}
    return OptimizeOptions(**{k: v for k, v in data.items() if k in known})


class Stages:
    """Prints each stage as it starts and appends it to the run's log.txt (readable with tail -f)."""

    def __init__(self, console: Console, run_dir: Path, t0: float = 0.0) -> None:
        self.console, self.log_path, self.t0 = console, run_dir / "log.txt", time.perf_counter() - t0

    def say(self, message: str, style: str = "") -> None:
        stamp = f"[{time.perf_counter() - self.t0:6.1f}s]"
        self.console.print(f"[dim]{stamp}[/dim] {message}", style=style, highlight=False)
        with open(self.log_path, "a") as log:
            log.write(f"{stamp} {message}\n")
            log.flush()


def _build_library(stages: Stages) -> None:
    """The library's C++ extensions, built before the first candidate needs them, with a spinner: the first run on a
    machine compiles them for a minute or more and would otherwise sit silent."""
    unbuilt = unbuilt_library()
    if not unbuilt:
        return
    t0 = time.perf_counter()
    with stages.console.status(f"building {len(unbuilt)} C++ kernel extensions (first run here; cached afterwards)"):
        prebuild_library()
    stages.say(f"      built {len(unbuilt)} C++ kernel extensions in {time.perf_counter() - t0:.0f} s (cached in "
               f"{cache_root()})")


def _profile(engine: TorchEngine, device, trace_path: Path) -> list[Hotspot]:
    engine.profile(trace_path)
    trace = load_trace(trace_path)
    op_breakdown(trace).to_csv(trace_path.with_name(trace_path.name.replace(".json.gz", "_ops.csv")), index=False)
    return rank_hotspots(trace, device, classes_covered(engine.model))


def _hotspot_fields(task: Task, hotspot: Hotspot | None, iteration: int) -> dict[str, Any]:
    return {"hotspot_id": task.hotspot_id, "share": round(task.share, 5), "iteration": iteration,  # cost per call:
            "flops": hotspot.flops if hotspot and hotspot.flops else None,
            "bytes": hotspot.bytes if hotspot and hotspot.bytes else None}


def _evaluator(task: Task, task_dir: Path, device_kind: str, opts: OptimizeOptions,
               executor: ClusterExecutor | None) -> Callable[[Candidate, Path], Outcome]:
    """Where a candidate is verified and benchmarked: here, or on the cluster (--cluster), one at a time."""
    if executor is not None:
        return executor.evaluator(task, task_dir)
    return functools.partial(evaluate, task, task_dir, device_kind=device_kind, seed=opts.seed, timeout=opts.timeout,
                             bench_rounds=opts.bench_rounds)


def _builtin_proposals(task: Task, task_dir: Path, backends: list[str], device_kind: str,
                       stages: Stages) -> list[KernelResult | tuple[Candidate, str]]:
    """The built-in proposer's candidates for a task, in order, as (candidate, source) to run, or as the row of one
    that cannot run here (or of the generator's failure)."""
    items: list[KernelResult | tuple[Candidate, str]] = []
    try:
        proposed = propose(task, backends, task_dir / "reference.py")
    except Exception as exc:  # a graph the generator cannot translate, or a generator bug: this task's row, not the run
        why = str(exc) if isinstance(exc, KernelbotError) else f"generator error ({type(exc).__name__}: {exc})"
        stages.say(f"  {task.id}: built-in generator: {why}", style="yellow")
        items.append(KernelResult(op=task.family, module=task.module_class, backend="cpp", shapes=task.input_shapes,
                                  status="rejected", reason=f"no built-in candidate: {why}"[:300], speedup=None,
                                  outcome=KernelOutcome.NO_CANDIDATE,
                                  candidate_id=f"{task.id}/builtin"))
        proposed = []
    for cand, source in proposed:
        n_rows = call_rows(task.input_shapes[0])
        if cand.backend == "triton" and device_kind == "cpu" and n_rows > INTERPRETED_ROWS:
            items.append(KernelResult(
                op=task.family, module=task.module_class, backend="triton", shapes=task.input_shapes,
                status="rejected", speedup=None, candidate_id=f"{task.id}/{cand.id}",
                outcome=KernelOutcome.NOT_VERIFIED,
                reason=f"not verified here: Triton's CPU interpreter takes minutes at {n_rows} rows, and no GPU here "
                       "could time it (a GPU run verifies and times it)"))
            continue
        items.append((cand, source))
    return items


def try_candidates(task: Task, task_dir: Path, backends: list[str], device_kind: str, opts: OptimizeOptions,
                    stages: Stages, night: Night | None = None, hotspot: Hotspot | None = None,
                    executor: ClusterExecutor | None = None) -> tuple[list[KernelResult], Accepted | None]:
    results: list[KernelResult] = []
    winners: list[Accepted] = []
    run = journaled(night, _evaluator(task, task_dir, device_kind, opts, executor),
                    task, _hotspot_fields(task, hotspot, night.iteration if night else 0))
    t0 = time.perf_counter()
    for item in _builtin_proposals(task, task_dir, backends, device_kind, stages):
        if isinstance(item, KernelResult):  # no candidate to run: the row says why
            results.append(item)
            continue
        cand, source = item
        if night is not None and not night.clock.affords_candidate() and not night.recorded(task.id, cand):
            night.stop_reason = night.stop_reason or night.clock.spent_reason()
            break
        if opts.max_task_minutes is not None and time.perf_counter() - t0 > opts.max_task_minutes * 60:
            stages.say(f"  {task.id}: per-task cap of {opts.max_task_minutes} min reached", style="yellow")
            break
        path = write_candidate(cand, source, task_dir)
        outcome = run(cand, path)
        stages.say(f"  {task.id} {cand.id}: {outcome.row.reason}")
        results.append(outcome.row)
        if outcome.accepted:
            winners.append(outcome.accepted)
    return results, pick_best(task, results, winners)


def _stored(task: Task, backends: list[str], night: Night) -> list[tuple[Candidate, str, dict[str, Any]]]:
    """The kernels the store holds for this op, backend and device, as candidates (with source and entry)."""
    if night.store is None:
        return []
    # what the store held when this task was first planned: a resumed run must see the same (the run itself may
    # have added this op's kernel since)
    found_all = night.memo(f"store:{task.id}", "stage", lambda: [
        [backend, *found] for backend in backends
        if (found := night.store.lookup(task, backend, night.device_name)) is not None])
    return [(Candidate(id=f"store-{backend}", task_id=task.id, backend=backend,
                       proposer=f"store:{entry.get('proposer', '?')}",
                       config={"from_run": entry.get("run_id"), **entry.get("config", {})},
                       source_hash=entry.get("source_hash", "")), source, entry)
            for backend, source, entry in found_all]


def _from_store(task: Task, task_dir: Path, backends: list[str], device_kind: str, opts: OptimizeOptions,
                stages: Stages, night: Night, hotspot: Hotspot | None,
                executor: ClusterExecutor | None = None) -> tuple[list[KernelResult], Accepted | None]:
    """A kernel the store holds for this op, backend and device, verified and benchmarked again here."""
    if night.store is None:
        return [], None
    rows: list[KernelResult] = []
    winners: list[Accepted] = []
    run = journaled(night, _evaluator(task, task_dir, device_kind, opts, executor),
                    task, _hotspot_fields(task, hotspot, night.iteration))
    for cand, source, entry in _stored(task, backends, night):
        outcome = run(cand, write_candidate(cand, source, task_dir))
        stages.say(f"  {task.id} {cand.id} (from the kernel store, run {entry.get('run_id')}): {outcome.row.reason}")
        rows.append(outcome.row)
        if outcome.accepted:
            winners.append(outcome.accepted)
            night.reused.append(outcome.row.candidate_id)
    return rows, pick_best(task, rows, winners)


def _session(opts: OptimizeOptions, run_dir: Path, stages: Stages, night: Night | None) -> LLMSession:
    if night is None:
        return LLMSession(opts.llm, run_dir, stages.say)
    if night.session is None:
        from kernelbot.agent.llm.client import LLMClient
        from kernelbot.agent.replay import JournaledClient

        o = opts.llm
        inner = LLMClient(o.model, o.api_base, timeout=o.timeout, max_retries=o.max_retries, backoff=o.backoff,
                          temperature=o.temperature, price=o.price)
        # calls.jsonl is rebuilt by the replay: recorded answers come back in the same order under the same ids
        (run_dir / "llm" / "calls.jsonl").unlink(missing_ok=True)
        night.session = LLMSession(o, run_dir, stages.say, client=JournaledClient(inner, night.journal))
    return night.session


def _generate(tasks: list[Task], hotspots: list[Hotspot], device: Device, run_dir: Path, opts: OptimizeOptions,
              stages: Stages, notes: list[str], night: Night | None = None,
              incumbents: dict[str, Accepted] | None = None,
              executor: ClusterExecutor | None = None) -> tuple[list[KernelResult], list[Accepted], LLMUsage | None]:
    """Candidates for every task, most headroom first: the incumbent (an accepted kernel being challenged, or a
    stored kernel for the op), then the LLM when one is given (the built-in proposer once it is down or its budget
    is spent, for tasks without an incumbent), every candidate verified and benchmarked."""
    backends = available_backends(device.kind)
    session = _session(opts, run_dir, stages, night) if opts.llm else None
    source = f"LLM {opts.llm.model}" if opts.llm else "built-in proposer"
    where = f"on the Ray cluster {opts.cluster}" if executor is not None else ""
    stages.say(f"[4/7] generate + verify + benchmark ({source}; candidates run in the sandbox{' ' + where})")
    _build_library(stages)
    if executor is not None:
        executor.target_device = f"{device.kind}:{device.name}"
        if session is None:
            return _generate_on_cluster(tasks, hotspots, device, run_dir, opts, stages, notes, night, executor)
    by_id = {h.id: h for h in hotspots}
    kernels: list[KernelResult] = []
    accepted: list[Accepted] = []
    for i, task in enumerate(tasks):
        if night is not None:
            night.stage("generate", task=task.id, done=i, planned=len(tasks))
            if not night.clock.affords_candidate() and not night.recorded(task.id):
                night.stop_reason = night.stop_reason or night.clock.spent_reason()
            if night.stop_reason and not night.recorded(task.id):
                notes.append(f"{task.id} and later tasks not tried: {night.stop_reason}")
                break
        task_dir = run_dir / "tasks" / task.id
        hotspot = by_id.get(task.hotspot_id)
        if incumbents and task.id in incumbents:
            rows, best = [], incumbents[task.id]
        else:
            rows, best = (_from_store(task, task_dir, backends, device.kind, opts, stages, night, hotspot, executor)
                          if night is not None else ([], None))
        if session is not None and session.active:  # a stored kernel is the incumbent, not the end of the search
            more, challenger = _llm_task(session, task, task_dir, device, opts, night, hotspot, executor)
            rows += more
            best = _crown(task, task_dir, best, challenger, rows, opts, stages, night)
            if not session.active:
                why = (f"LLM endpoint {opts.llm.model} is down ({session.down})" if session.down
                       else f"LLM budget spent ({session.stopped})")
                stages.say(f"{why}: the built-in proposer takes over from {task.id} on", style="yellow")
                notes.append(f"{why}: built-in proposer from {task.id} on")
        if best is None and (session is None or not session.active):
            more, best = try_candidates(task, task_dir, backends, device.kind, opts, stages, night, hotspot,
                                        executor)
            rows += more
        kernels += rows
        if best:
            accepted.append(best)
    if session is None:
        return kernels, accepted, None
    usage = session.finish()
    stages.say(f"      {llm_line(usage)}")
    return kernels, accepted, usage


def _generate_on_cluster(tasks: list[Task], hotspots: list[Hotspot], device: Device, run_dir: Path,
                         opts: OptimizeOptions, stages: Stages, notes: list[str], night: Night | None,
                         executor: ClusterExecutor) -> tuple[list[KernelResult], list[Accepted], None]:
    """The built-in proposer's candidates of every task at once, as many as the cluster holds: first the kernels
    the store holds, then the proposer's for the tasks no stored kernel won; each recorded as it arrives."""
    backends = available_backends(device.kind)
    by_id = {h.id: h for h in hotspots}
    rows: dict[str, list[KernelResult]] = {t.id: [] for t in tasks}
    winners: dict[str, list[Accepted]] = {t.id: [] for t in tasks}
    if night is not None:
        night.stage("generate", done=0, planned=len(tasks))
    stored = [(t, cand, source) for t in tasks if night is not None for cand, source, _ in _stored(t, backends, night)]
    for task, out in _on_cluster(stored, by_id, run_dir, opts, stages, notes, night, executor):
        rows[task.id].append(out.row)
        if out.accepted:
            winners[task.id].append(out.accepted)
            night.reused.append(out.row.candidate_id)
    best = {t.id: pick_best(t, rows[t.id], winners[t.id]) for t in tasks}
    proposed: list[tuple[Task, Candidate, str]] = []
    for task in (t for t in tasks if best[t.id] is None):
        for item in _builtin_proposals(task, run_dir / "tasks" / task.id, backends, device.kind, stages):
            if isinstance(item, KernelResult):
                rows[task.id].append(item)
            else:
                proposed.append((task, *item))
    for task, out in _on_cluster(proposed, by_id, run_dir, opts, stages, notes, night, executor):
        rows[task.id].append(out.row)
        if out.accepted:
            winners[task.id].append(out.accepted)
    kernels: list[KernelResult] = []
    accepted: list[Accepted] = []
    for task in tasks:
        chosen = best[task.id] or pick_best(task, rows[task.id], winners[task.id])
        kernels += rows[task.id]
        if chosen:
            accepted.append(chosen)
    if night is not None:
        night.stage("generate", done=len(tasks), planned=len(tasks))
    return kernels, accepted, None


def _on_cluster(items: list[tuple[Task, Candidate, str]], by_id: dict[str, Hotspot], run_dir: Path,
                opts: OptimizeOptions, stages: Stages, notes: list[str], night: Night | None,
                executor: ClusterExecutor) -> list[tuple[Task, Outcome]]:
    """Candidates evaluated concurrently on the cluster (recorded ones replayed from the journal), their outcomes
    in the order given; a candidate the time budget or the per-task cap leaves unstarted has none."""
    from kernelbot.agent.cluster import ClusterProgress, Job

    outcomes: dict[str, Outcome] = {}
    jobs: list[Job] = []
    sources: dict[str, str] = {}
    started: dict[str, float] = {}  # job key → when it was shipped
    task_start: dict[str, float] = {}  # task id → when its first candidate was shipped

    def journal_for(task: Task, evaluated: Outcome | None) -> Callable[[Candidate, Path], Outcome]:
        return journaled(night, lambda cand, path: evaluated, task,
                         _hotspot_fields(task, by_id.get(task.hotspot_id), night.iteration if night else 0))

    for task, cand, source in items:
        task_dir = run_dir / "tasks" / task.id
        job = Job(task, task_dir, cand, task_dir / "candidates" / cand.id / "candidate.py")
        if night is not None and night.recorded(task.id, cand):
            outcomes[job.key] = journal_for(task, None)(cand, write_candidate(cand, source, task_dir))
            stages.say(f"  {job.key} (recorded): {outcomes[job.key].row.reason}")
        else:
            jobs.append(job)
            sources[job.key] = source

    def may_start(job: Job) -> bool:
        now = time.perf_counter()
        if night is not None and not night.clock.affords_candidate():
            night.stop_reason = night.stop_reason or night.clock.spent_reason()
            return False
        first = task_start.setdefault(job.task.id, now)
        if opts.max_task_minutes is not None and now - first > opts.max_task_minutes * 60:
            return False
        write_candidate(job.candidate, sources[job.key], job.task_dir)
        started[job.key] = now
        return True

    def done(job: Job, out: Outcome) -> None:
        outcomes[job.key] = journal_for(job.task, out)(job.candidate, job.path)
        if night is not None:
            took = time.perf_counter() - started[job.key]
            night.clock.longest_candidate = max(night.clock.longest_candidate, took)
        where = out.row.placement
        stages.say(f"  {job.key}: {out.row.reason}" + (f" [node {where.node[:8]}, worker {where.worker[:8]}, "
                                                        f"{where.device}, try {where.attempts}]" if where else ""))

    shown: list[Any] = [None]

    def report(progress: ClusterProgress) -> None:
        if night is not None:
            night.journal.set_meta("cluster", progress.model_dump())
        if progress.signature() != shown[0]:  # the same work as last time, only older: said already
            shown[0] = progress.signature()
            for line in progress.lines():
                stages.say(f"      {line}")

    refused = executor.run(jobs, done, may_start, report)
    if refused:
        why = night.stop_reason if night is not None and night.stop_reason else \
            f"the per-task cap of {opts.max_task_minutes} min"
        notes.append(f"{len(refused)} candidates not tried ({', '.join(j.key for j in refused[:4])}"
                     f"{', ...' if len(refused) > 4 else ''}): {why}")
    return [(task, outcomes[f"{task.id}/{cand.id}"]) for task, cand, _ in items if f"{task.id}/{cand.id}" in outcomes]


def _llm_task(session: LLMSession, task: Task, task_dir: Path, device: Device, opts: OptimizeOptions,
              night: Night | None, hotspot: Hotspot | None,
              executor: ClusterExecutor | None = None) -> tuple[list[KernelResult], Accepted | None]:
    """The LLM's generate → verify → repair rounds for one task, within what the time budget leaves."""
    if night is not None and night.clock.limit is not None:
        left = max(1.0, night.clock.left() - night.clock.reserve)
        spent = session.ledger.elapsed()
        cap = opts.llm.budget.max_seconds
        session.ledger.budget = dataclasses.replace(
            opts.llm.budget, max_seconds=min(cap, spent + left) if cap else spent + left)
    ctx = PromptContext(device, "cpp" if device.kind == "cpu" else "triton", hotspot)
    fields = _hotspot_fields(task, hotspot, night.iteration if night else 0)
    run = run_task(session, task, task_dir, ctx, journaled(
        night, _evaluator(task, task_dir, device.kind, opts, executor), task, fields))
    return run.rows, run.best


def _crown(task: Task, task_dir: Path, incumbent: Accepted | None, challenger: Accepted | None,
           rows: list[KernelResult], opts: OptimizeOptions, stages: Stages, night: Night | None) -> Accepted | None:
    """The challenger replaces the incumbent only when it beats it in the same benchmark."""
    if incumbent is None or challenger is None:
        return incumbent or challenger

    def fight() -> dict:
        return duel(task, task_dir, incumbent, challenger, seed=opts.seed, timeout=opts.timeout,
                    rounds=opts.bench_rounds).model_dump()

    key = f"duel:{task.id}:{challenger.candidate.source_hash}:{incumbent.candidate.source_hash}"
    result = Bench.model_validate(night.memo(key, "stage", fight) if night is not None else fight())
    won = result.significant
    stages.say(f"  {task.id}: challenger {challenger.candidate.id} vs incumbent {incumbent.candidate.id}: "
               f"{result.speedup:.2f}x, {'replaces it' if won else 'incumbent stays'}")
    winner, loser = (challenger, incumbent) if won else (incumbent, challenger)
    for row in rows:
        if row.candidate_id == f"{task.id}/{loser.candidate.id}":
            row.status, row.outcome = "rejected", KernelOutcome.OUTPACED
            row.reason = (f"verified and faster than the op, but {result.speedup:.2f}x against "
                          f"{winner.candidate.id} in a duel, which {'replaced it' if won else 'stays'}")
    return winner


FAR_FROM_FLOOR = 2.0  # an incumbent slower than this many times its roofline floor is worth a challenger


def _challenges(accepted: list[Accepted], challenged: set[str], opts: OptimizeOptions,
                night: Night) -> dict[str, Accepted]:
    """When no new hotspot is left and an LLM can still be asked: the incumbents furthest above their roofline
    floor (estimated time above it: the task's share times the part of a call above the floor), once each."""
    if opts.llm is None or night.session is None or not night.session.active or not night.clock.affords_candidate():
        return {}
    # an incumbent the LLM wrote in this run had its rounds already
    far = [a for a in accepted if a.task.id not in challenged and a.task.floor_us > 0
           and not a.candidate.proposer.startswith("llm")
           and a.bench.candidate_us > FAR_FROM_FLOOR * a.task.floor_us]
    far.sort(key=lambda a: -a.task.share * (1 - a.task.floor_us / a.bench.candidate_us))
    return {a.task.id: a for a in far[:opts.max_tasks]}


def _signature(h: Hotspot) -> str:
    return json.dumps([h.family, h.module_class, h.dtype, h.input_dims])


def _plan(hotspots: list[Hotspot], attempted: set[str], opts: OptimizeOptions, engine: TorchEngine, run_dir: Path,
          notes: list[str], iteration: int, deferred: dict[str, str]) -> list[Task]:
    """Tasks by expected gain (headroom over the roofline, as ranked), skipping ops already tried or replaced.
    A hotspot a family covers gets the family's reference; any other gets a reference extracted from the model."""
    tasks: list[Task] = []
    labels: dict[str, str] | None = None
    covered: list[str] = []  # modules a generic task replaces whole: hotspots inside them get no task of their own
    for h in sorted(hotspots, key=lambda h: -h.score_us):
        reason = skip_reason(h, opts.min_share)
        if reason is None and h.kernel:
            continue  # runs a pack kernel already
        family = h.family or GENERIC
        if reason is None and opts.families is not None and family not in opts.families:
            reason = f"family {family} not selected (--families)"
        if reason is None and _signature(h) in attempted:
            continue  # tried in an earlier iteration
        over_budget = reason is None and len(tasks) >= opts.max_tasks  # deferred to a later iteration, not dropped
        if over_budget:
            reason = f"over the --max-tasks {opts.max_tasks} budget of iteration {iteration + 1}"
        task, reference = None, None
        if reason is None and h.family is None:
            if labels is None:
                labels = module_labels(engine.model, engine.run_workload)
            try:
                task, reference = make_generic_task(h, engine.model, labels, engine.run_workload)
            except NotExtractable as exc:
                reason = f"no generic task: {exc}"
            twin = next((t for t in tasks if task and t.signature == task.signature
                         and t.module_paths == task.module_paths), None)
            if twin is not None:
                reason, task = f"the same call as task {twin.id}", None
        if reason is None and task is None and _inside(h, labels or {}, covered):
            reason = "inside a module that a generic task replaces whole"
        if reason:
            note = f"{h.id} {h.module_class} {h.input_dims} ({h.share:.1%}): no task, {reason}"
            if over_budget:
                deferred[_signature(h)] = note  # a later iteration may take it
            elif h.share >= opts.min_share and note not in notes and iteration == 0:
                notes.append(note)
            continue
        if task is None:
            try:
                task = make_task(h, engine.model)
            except LookupError as exc:
                notes.append(f"{h.id} {h.module_class} ({h.share:.1%}): no task, {exc}")
                continue
        else:
            covered.extend(task.module_paths)
        write_task(task, run_dir / "tasks" / task.id, reference)
        tasks.append(task)
    return tasks


def _inside(h: Hotspot, labels: dict[str, str], covered: list[str]) -> bool:
    names = [labels.get(p.rsplit("/", 1)[-1], "") for p in h.module_paths]
    return bool(names) and all(any(n.startswith(c + ".") for c in covered) for n in names)


def _finish_plan(night: Night, opts: OptimizeOptions, profile_s: float, stages: Stages,
                 notes: list[str]) -> tuple[int, bool]:
    """The end-to-end rounds and whether to time torch.compile, within what the time budget leaves."""
    rounds, compile_ = opts.e2e_rounds, opts.compile
    if night.clock.limit is None:
        return rounds, compile_
    workload = profile_s / 2  # a profile is a warm-up plus a traced run
    left = night.clock.left() - profile_s - 4 * workload - 10
    if compile_ and left < COMPILE_GUESS_S + 2 * rounds * workload:
        compile_ = False
        notes.append("torch.compile comparison skipped: the time budget had no room for it")
    fit = max(1, int(left // max(2 * workload, 1e-3)))
    if fit < rounds:
        notes.append(f"end-to-end timing cut to {fit} rounds by the time budget (asked {rounds})")
        rounds = fit
    return rounds, compile_


def optimize(opts: OptimizeOptions, console: Console | None = None) -> Report:
    """A new run (its run directory must not hold one already)."""
    _, run_dir = new_run_dir(opts.run_dir)
    opts = dataclasses.replace(opts, run_dir=run_dir)
    with Journal(run_dir) as journal:
        if journal.meta("options") is not None:
            raise KernelbotError(f"{run_dir} already holds a run; continue it with `kernelbot optimize --resume "
                                 f"{run_dir}` or pass another --run-dir")
        journal.set_meta("options", options_to_json(opts))
        with _cluster(opts) as executor:
            return _run(opts, journal, console or Console(soft_wrap=True), executor)


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
        opts = options_from_json(data)
        if budget_hours is not None:
            opts.budget_hours = budget_hours
        if opts.llm is not None and (max_cost is not None or max_tokens is not None):
            b = opts.llm.budget
            opts.llm.budget = dataclasses.replace(b, max_cost=max_cost if max_cost is not None else b.max_cost,
                                                  max_tokens=max_tokens if max_tokens is not None else b.max_tokens)
        journal.set_meta("options", options_to_json(opts))
        with _cluster(opts) as executor:
            return _run(opts, journal, console or Console(soft_wrap=True), executor)


def _run(opts: OptimizeOptions, journal: Journal, console: Console,
         executor: ClusterExecutor | None = None) -> Report:
    t_start = time.perf_counter()
    run_dir = Path(opts.run_dir or ".")
    run_id = run_dir.name
    sessions = int(journal.meta("sessions", 0)) + 1
    journal.set_meta("sessions", sessions)
    journal.set_meta("state", "running")
    clock = Clock(journal, opts.budget_hours)
    choice = pick_device(opts.device)
    dtype = "bfloat16" if choice.is_gpu and opts.dtype == "auto" else opts.dtype  # auto's CPU rule asks the CPU
    spec, notes = resolve_spec(opts.model, dtype, opts.batch, opts.prompt_len, opts.decode_steps, opts.seed)
    stages = Stages(console, run_dir, clock.before)
    if sessions > 1:
        stages.say(f"resuming {run_dir} (session {sessions}); recorded results are replayed, not recomputed",
                   style="yellow")
    stages.say(f"[bold]kernelbot optimize[/bold] {spec.name} ({spec.dtype}, batch {spec.batch}, "
               f"{spec.prompt_len}-token prompts, {spec.decode_steps} decode steps) → {run_dir}")
    for note in notes:
        stages.say(f"note: {note}", style="yellow")

    stages.say("[1/7] engine: building the model and measuring the device's peaks")
    engine = TorchEngine(spec, device=choice)
    night = Night(journal, clock, KernelStore(opts.store) if opts.store else None, "")
    night.stage("engine")
    device = Device.model_validate(night.memo("device", "stage",
                                              lambda: device_record(choice, spec.dtype).model_dump()))
    device.notes.extend(n for n in notes if n not in device.notes)
    night.device_name = f"{device.kind}:{device.name}"
    write_record(run_dir / "model.json", spec)
    write_record(run_dir / "device.json", device)
    stages.say(f"      {device.name}, {device.threads} threads: {device.peak_gflops} GFLOP/s, {device.peak_gbps} GB/s")

    report_notes = list(notes)
    kernels: list[KernelResult] = []
    accepted: list[Accepted] = []
    attempted: set[str] = set()
    challenged: set[str] = set()  # task ids whose incumbent was challenged once already
    deferred: dict[str, str] = {}  # op signature → why no task yet (--max-tasks), until an iteration takes it
    usage: LLMUsage | None = None
    pack = Pack(version="empty", run_id=run_id, device=device.name, entries=[])
    pack_dir = run_dir / "pack"
    hotspots_before: list[Hotspot] = []
    hotspots_now: list[Hotspot] = []
    profile_s = 0.0
    iterations_done = 0
    for it in range(opts.iterations + 1):
        night.iteration = it
        night.stage("profile")
        trace = run_dir / ("trace.json.gz" if it == 0 else "trace_after.json.gz")
        stages.say(f"[2/7] profile + rank{f' (iteration {it + 1}, pack applied)' if it else ''}: torch.profiler "
                   "over the workload")

        t0 = time.perf_counter()
        hotspots_now = [Hotspot.model_validate(h) for h in night.memo(
            f"hotspots:{it}", "stage", functools.partial(_profile_with, engine, device, pack, pack_dir, trace))]
        if it == 0:  # a profile's length prices the finish (a resumed run reads the first session's)
            took = time.perf_counter() - t0
            profile_s = float(night.memo("profile_seconds", "stage", functools.partial(float, took)))
        # torch.compile is not reserved for: it is dropped at the end when the budget has no room for it
        clock.reserve = profile_s * (3 + opts.e2e_rounds) + 10
        write_record(run_dir / ("hotspots.json" if it == 0 else f"hotspots_iter{it + 1}.json"), hotspots_now)
        if it == 0:
            hotspots_before = hotspots_now
        for h in hotspots_now[:6]:
            stages.say(f"      {h.id} {h.module_class:28s} {h.share:6.1%}  headroom {h.score_us / 1e3:8.1f} ms"
                       + (f"  (pack kernel {h.kernel})" if h.kernel else ""))
        if it == opts.iterations:
            break
        if night.stop_reason:
            break

        stages.say("[3/7] tasks: hotspots → KernelBench-format references, most headroom first")
        tasks = _plan(hotspots_now, attempted, opts, engine, run_dir, report_notes, it, deferred)
        stages.say(f"      {len(tasks)} tasks: {', '.join(t.id for t in tasks)}")
        incumbents = {} if tasks else _challenges(accepted, challenged, opts, night)
        if incumbents:
            tasks = [a.task for a in incumbents.values()]
            challenged.update(incumbents)
            stages.say(f"      no new hotspot: challenging the incumbents furthest above their floor: "
                       f"{', '.join(incumbents)}")
        if not tasks:
            if it:
                report_notes.append(f"iteration {it + 1}: no hotspot left with headroom a task could take")
            break
        attempted.update(_signature(h) for h in hotspots_now if h.id in {t.hotspot_id for t in tasks})
        if not clock.affords_candidate() and not any(night.recorded(t.id) for t in tasks):
            night.stop_reason = night.stop_reason or clock.spent_reason()
            report_notes.append(f"iteration {it + 1}'s tasks not tried: {night.stop_reason}")
            break
        new_rows, new_accepted, usage = _generate(tasks, hotspots_now, device, run_dir, opts, stages, report_notes,
                                                  night, incumbents, executor)
        kernels += new_rows
        if incumbents and all(a is incumbents.get(a.task.id) for a in new_accepted):
            break  # every incumbent stayed: the pack is what it was
        replaced = {a.task.id for a in new_accepted}
        accepted = [a for a in accepted if a.task.id not in replaced] + new_accepted
        iterations_done = it + 1
        stages.say(f"[5/7] integrate: {len(accepted)} kernels into pack/")
        pack = build_pack(accepted, run_id, device.name, pack_dir)
        if not new_accepted:
            break  # nothing changed: profiling again would find the same hotspots
    report_notes.extend(note for sig, note in deferred.items() if sig not in attempted)
    if opts.llm is not None and usage is None and night.session is not None:
        usage = night.session.finish()

    hotspots_after = _final_profile(engine, device, pack, pack_dir, run_dir, hotspots_now, night, accepted)
    rounds, compile_ = _finish_plan(night, opts, profile_s, stages, report_notes)
    if compile_:
        _compile_regions(accepted, kernels, run_dir, choice, night, stages)
    report = _measure_and_report(engine, spec, device, pack, pack_dir, run_dir, kernels, accepted, night, stages,
                                 report_notes, rounds, compile_, usage, hotspots_before, hotspots_after,
                                 iterations_done, sessions, t_start, opts, console)
    journal.set_meta("state", "done")
    clock.save()
    return report


def _compile_regions(accepted: list[Accepted], kernels: list[KernelResult], run_dir: Path, choice: DeviceChoice,
                     night: Night, stages: Stages) -> None:
    """torch.compile of each accepted kernel's own region, timed beside eager (agent/compile_baseline.py): the rows
    of its task get compile's gain over eager there, so the report can set each kernel beside compile."""
    for a in accepted:
        task_dir = run_dir / "tasks" / a.task.id
        stages.say(f"      torch.compile of {a.task.id}'s region: compiling and timing it beside eager")
        region = RegionCompile.model_validate(night.memo(
            f"region_compile:{a.task.id}", "stage",
            functools.partial(_region_compile, a.task, task_dir / "reference.py", choice)))
        write_record(task_dir / "compile.json", region)
        if region.error:
            stages.say(f"      {a.task.id}: torch.compile not timed: {region.error}", style="yellow")
        for row in kernels:
            if row.candidate_id.startswith(f"{a.task.id}/"):
                row.region_compile_speedup = region.speedup


def _region_compile(task: Task, reference: Path, choice: DeviceChoice) -> dict[str, Any]:
    return time_region_compile(task, reference, choice).model_dump()


def _profile_with(engine: TorchEngine, device: Device, pack: Pack, pack_dir: Path, trace: Path) -> list[dict]:
    if pack.entries:
        engine.apply_pack(pack, pack_dir)
    try:
        return [h.model_dump() for h in _profile(engine, device, trace)]
    finally:
        engine.remove_pack()


def _final_profile(engine: TorchEngine, device: Device, pack: Pack, pack_dir: Path, run_dir: Path,
                   last: list[Hotspot], night: Night, accepted: list[Accepted]) -> list[Hotspot]:
    """The profile with the final pack: the last iteration's when it had that pack, else a new one."""
    if not accepted or any(h.kernel for h in last):
        if not (run_dir / "trace_after.json.gz").exists() and (run_dir / "trace.json.gz").exists():
            shutil.copyfile(run_dir / "trace.json.gz", run_dir / "trace_after.json.gz")
        write_record(run_dir / "hotspots_after.json", last)
        return last

    after = [Hotspot.model_validate(h) for h in night.memo(
        f"hotspots:final:{pack.version}", "stage",
        functools.partial(_profile_with, engine, device, pack, pack_dir, run_dir / "trace_after.json.gz"))]
    write_record(run_dir / "hotspots_after.json", after)
    return after


def _measure_and_report(engine: TorchEngine, spec: ModelSpec, device: Device, pack: Pack, pack_dir: Path,
                        run_dir: Path, kernels: list[KernelResult], accepted: list[Accepted], night: Night,
                        stages: Stages, report_notes: list[str], rounds: int, compile_: bool,
                        usage: LLMUsage | None, hotspots_before: list[Hotspot], hotspots_after: list[Hotspot],
                        iterations: int, sessions: int, t_start: float, opts: OptimizeOptions,
                        console: Console) -> Report:
    night.stage("integrate")
    calls, fallbacks = night.memo(f"calls:{pack.version}", "stage",
                                  lambda: list(count_calls(engine, pack, pack_dir)))
    for row in kernels:
        cid = row.candidate_id.replace("/", "__")
        row.calls = calls.get(cid, 0)
        if row.status == "accepted":
            row.fallback_calls = fallbacks.get(row.module, 0)
            if row.calls == 0:
                report_notes.append(f"{row.candidate_id} is in the pack but never ran")
    fid = Fidelity.model_validate(night.memo(f"fidelity:{pack.version}", "stage",
                                             lambda: fidelity(engine, pack, pack_dir).model_dump()))
    stages.say(f"      fidelity: {fid.summary()}")

    night.stage("measure")
    stages.say(f"[6/7] measure: eager vs kernelbot vs torch.compile, {rounds} interleaved rounds")

    def measure() -> dict[str, Any]:
        compiled = None
        if compile_:
            t0 = time.perf_counter()
            compiled = engine.compiled()
            compiled.run_workload()
            compiled.run_workload()
            stages.say(f"      torch.compile warm-up took {time.perf_counter() - t0:.0f} s")
        engine.apply_pack(pack, pack_dir)
        engine.run_workload()  # warm the kernels (weights packed on first call)
        engine.remove_pack()
        return time_end_to_end(engine, pack, pack_dir, rounds, compiled).model_dump()

    times = EndToEndTimes.model_validate(night.memo(f"timings:{pack.version}", "stage", measure))
    write_record(run_dir / "timings.json", times)
    if times.host is not None and times.host.contended:
        stages.say(f"      the host was busy while timing ({times.host.summary()}): the ratios are doubtful",
                   style="yellow")

    night.stage("report")
    stages.say("[7/7] report")
    baseline, optimized, comp = median(times.eager), median(times.kernelbot), median(times.compiled)
    assert baseline and optimized
    if not fid.passed:
        report_notes.append("fidelity: the pack changed the model's outputs beyond its dtype's own error; "
                            "do not ship it")
    elif not fid.greedy_match:
        report_notes.append("fidelity: some greedy tokens changed, at near ties: on eager's tokens the pack is within "
                            "twice eager's own distance from float64")
    if night.stop_reason:
        stages.say(f"stopped early by the {night.stop_reason}", style="yellow")
        report_notes.append(f"stopped early by the {night.stop_reason}")
    budget = {"budget_hours": opts.budget_hours, "iterations": opts.iterations, "max_tasks": opts.max_tasks,
              "max_task_minutes": opts.max_task_minutes}
    if opts.llm is not None:
        b = opts.llm.budget
        budget.update(max_cost=b.max_cost, max_tokens=b.max_tokens, max_llm_seconds=b.max_seconds,
                      max_calls_per_task=b.max_calls_per_task)
    report = Report(
        run_id=run_dir.name, model=spec, device=device, baseline_ms=baseline, optimized_ms=optimized,
        compiled_ms=comp, speedup=round(baseline / optimized, 3),
        speedup_vs_compiled=round(comp / optimized, 3) if comp else None, timing_rounds=rounds, fidelity=fid,
        kernels=kernels, hotspots_before=hotspots_before, hotspots_after=hotspots_after, notes=report_notes,
        seconds=round(night.clock.elapsed(), 1), llm=usage, iterations=max(iterations, 1),
        stop_reason=night.stop_reason, budget=budget, reused=night.reused, sessions=sessions, host=times.host)
    write_report(report, run_dir, console)
    if night.store is not None and fid.passed:
        for a in accepted:
            night.store.add(a.task, a.candidate.backend, night.device_name, a.source.read_text(), {
                "run_id": run_dir.name, "proposer": a.candidate.proposer, "config": a.candidate.config,
                "source_hash": a.candidate.source_hash, "speedup": a.bench.speedup,
                "verdict": a.verdict.verdict, "checks": [c.id for c in a.verdict.checks if c.status == "pass"]})
        if accepted:
            stages.say(f"      {len(accepted)} kernels stored in {night.store.root} for later runs")
    return report
