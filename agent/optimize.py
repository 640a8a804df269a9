"""`kernelbot optimize`: profile → rank → tasks → candidates → verdicts → benches → pack → measure → report."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from kernelbot.agent.evaluate import evaluate, pick_best
from kernelbot.agent.integrate import count_calls, fidelity, median, time_end_to_end
from kernelbot.agent.llm.loop import LLMOptions, LLMSession, run_task
from kernelbot.agent.llm.prompt import PromptContext
from kernelbot.agent.pack import Accepted, build_pack
from kernelbot.agent.proposer import available_backends, propose, write_candidate
from kernelbot.agent.report import llm_line, write_report
from kernelbot.agent.tasks import make_task, skip_reason, write_task
from kernelbot.engine import TorchEngine, builtin_spec
from kernelbot.profiler.device import measure_cpu
from kernelbot.profiler.hotspots import op_breakdown, rank_hotspots
from kernelbot.profiler.trace import load_trace
from kernelbot.records import Device, Hotspot, KernelResult, LLMUsage, Report, Task
from kernelbot.rundir import new_run_dir, write_record


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
    max_tasks: int = 8
    timeout: float = 300.0
    bench_rounds: int = 15
    e2e_rounds: int = 7
    compile: bool = True
    families: list[str] | None = None  # only these kernel_library families (default: all)
    llm: LLMOptions | None = None  # generate with this LLM instead of the built-in proposer


class Stages:
    """Prints each stage as it starts and appends it to the run's log.txt (readable with tail -f)."""

    def __init__(self, console: Console, run_dir: Path) -> None:
        self.console, self.log_path, self.t0 = console, run_dir / "log.txt", time.perf_counter()

    def say(self, message: str, style: str = "") -> None:
        stamp = f"[{time.perf_counter() - self.t0:6.1f}s]"
        self.console.print(f"[dim]{stamp}[/dim] {message}", style=style, highlight=False)
        with open(self.log_path, "a") as log:
            log.write(f"{stamp} {message}\n")


def _profile(engine: TorchEngine, device, trace_path: Path) -> list[Hotspot]:
    engine.profile(trace_path)
    trace = load_trace(trace_path)
    op_breakdown(trace).to_csv(trace_path.with_name(trace_path.name.replace(".json.gz", "_ops.csv")), index=False)
    return rank_hotspots(trace, device)


def _try_candidates(task: Task, task_dir: Path, backends: list[str], device_kind: str, opts: OptimizeOptions,
                    stages: Stages) -> tuple[list[KernelResult], Accepted | None]:
    results: list[KernelResult] = []
    winners: list[Accepted] = []
    for cand, source in propose(task, backends):
        path = write_candidate(cand, source, task_dir)
        outcome = evaluate(task, task_dir, cand, path, device_kind, seed=opts.seed, timeout=opts.timeout,
                           bench_rounds=opts.bench_rounds)
        stages.say(f"  {task.id} {cand.id}: {outcome.row.reason}")
        results.append(outcome.row)
        if outcome.accepted:
            winners.append(outcome.accepted)
    return results, pick_best(task, results, winners)


def _generate(tasks: list[Task], hotspots: list[Hotspot], device: Device, run_dir: Path, opts: OptimizeOptions,
              stages: Stages, notes: list[str]) -> tuple[list[KernelResult], list[Accepted], LLMUsage | None]:
    """Candidates for every task, from the LLM when one is given (the built-in proposer once it is down or its
    budget is spent), verified and benchmarked."""
    backends = available_backends(device.kind)
    session = LLMSession(opts.llm, run_dir, stages.say) if opts.llm else None
    source = f"LLM {opts.llm.model}" if opts.llm else "built-in proposer"
    stages.say(f"[4/7] generate + verify + benchmark ({source}; candidates run in the sandbox)")
    by_id = {h.id: h for h in hotspots}
    kernels: list[KernelResult] = []
    accepted: list[Accepted] = []
    for task in tasks:
        task_dir = run_dir / "tasks" / task.id
        rows: list[KernelResult] = []
        best = None
        if session is not None and session.active:
            ctx = PromptContext(device, "cpp" if device.kind == "cpu" else "triton", by_id.get(task.hotspot_id))
            run = run_task(session, task, task_dir, ctx, functools.partial(
                evaluate, task, task_dir, device_kind=device.kind, seed=opts.seed, timeout=opts.timeout,
                bench_rounds=opts.bench_rounds))
            rows, best = run.rows, run.best
            if not session.active:
                why = (f"LLM endpoint {opts.llm.model} is down ({session.down})" if session.down
                       else f"LLM budget spent ({session.stopped})")
                stages.say(f"{why}: the built-in proposer takes over from {task.id} on", style="yellow")
                notes.append(f"{why}: built-in proposer from {task.id} on")
        if best is None and (session is None or not session.active):
            more, best = _try_candidates(task, task_dir, backends, device.kind, opts, stages)
            rows += more
        kernels += rows
        if best:
            accepted.append(best)
    if session is None:
        return kernels, accepted, None
    usage = session.finish()
    stages.say(f"      {llm_line(usage)}")
    return kernels, accepted, usage


def optimize(opts: OptimizeOptions, console: Console | None = None) -> Report:
    console = console or Console(soft_wrap=True)
    t_start = time.perf_counter()
    spec, notes = builtin_spec(opts.model, opts.dtype, opts.batch, opts.prompt_len, opts.decode_steps, opts.seed)
    run_id, run_dir = new_run_dir(opts.run_dir)
    stages = Stages(console, run_dir)
    stages.say(f"[bold]kernelbot optimize[/bold] {spec.name} ({spec.dtype}, batch {spec.batch}, "
               f"{spec.prompt_len}-token prompts, {spec.decode_steps} decode steps) → {run_dir}")
    for note in notes:
        stages.say(f"note: {note}", style="yellow")

    stages.say("[1/7] engine: building the model and measuring the device's peaks")
    engine = TorchEngine(spec)
    device = measure_cpu()
    device.notes.extend(notes)
    write_record(run_dir / "model.json", spec)
    write_record(run_dir / "device.json", device)
    stages.say(f"      {device.name}, {device.threads} threads: {device.peak_gflops} GFLOP/s, {device.peak_gbps} GB/s")

    stages.say("[2/7] profile + rank: torch.profiler over the workload")
    hotspots = _profile(engine, device, run_dir / "trace.json.gz")
    write_record(run_dir / "hotspots.json", hotspots)
    for h in hotspots[:6]:
        stages.say(f"      {h.id} {h.module_class:28s} {h.share:6.1%}  headroom {h.score_us / 1e3:8.1f} ms")

    stages.say("[3/7] tasks: hotspots → KernelBench-format references")
    tasks: list[Task] = []
    report_notes = list(notes)
    for h in hotspots:
        reason = skip_reason(h, opts.min_share)
        if reason is None and opts.families is not None and h.family not in opts.families:
            reason = f"family {h.family} not selected (--families)"
        if reason is None and len(tasks) >= opts.max_tasks:
            reason = f"over the --max-tasks {opts.max_tasks} budget"
        if reason:
            if h.share >= opts.min_share:
                report_notes.append(f"{h.id} {h.module_class} {h.input_dims} ({h.share:.1%}): no task, {reason}")
            continue
        task = make_task(h, engine.model)
        write_task(task, run_dir / "tasks" / task.id)
        tasks.append(task)
    stages.say(f"      {len(tasks)} tasks: {', '.join(t.id for t in tasks)}")

    kernels, accepted, usage = _generate(tasks, hotspots, device, run_dir, opts, stages, report_notes)

    stages.say(f"[5/7] integrate: {len(accepted)} kernels into pack/")
    pack = build_pack(accepted, run_id, device.name, run_dir / "pack")
    calls, fallbacks = count_calls(engine, pack, run_dir / "pack")
    for row in kernels:
        cid = row.candidate_id.replace("/", "__")
        row.calls = calls.get(cid, 0)
        if row.status == "accepted":
            row.fallback_calls = fallbacks.get(row.module, 0)
            if row.calls == 0:
                report_notes.append(f"{row.candidate_id} is in the pack but never ran")
    fid = fidelity(engine, pack, run_dir / "pack")
    stages.say(f"      fidelity: max |Δlogit| {fid.max_abs_logit_diff:.2e}, greedy match {fid.greedy_match}")

    stages.say(f"[6/7] measure: eager vs kernelbot vs torch.compile, {opts.e2e_rounds} interleaved rounds")
    compiled = None
    if opts.compile:
        t0 = time.perf_counter()
        compiled = engine.compiled()
        compiled.run_workload()
        compiled.run_workload()
        stages.say(f"      torch.compile warm-up took {time.perf_counter() - t0:.0f} s")
    engine.apply_pack(pack, run_dir / "pack")
    engine.run_workload()  # warm the kernels (weights packed on first call)
    engine.remove_pack()
    times = time_end_to_end(engine, pack, run_dir / "pack", opts.e2e_rounds, compiled)
    (run_dir / "timings.json").write_text(json.dumps(times, indent=2))

    stages.say("[7/7] re-profile with the pack applied, and report")
    engine.apply_pack(pack, run_dir / "pack")
    try:
        hotspots_after = _profile(engine, device, run_dir / "trace_after.json.gz")
    finally:
        engine.remove_pack()
    write_record(run_dir / "hotspots_after.json", hotspots_after)

    baseline, optimized, comp = median(times["eager"]), median(times["kernelbot"]), median(times["compiled"])
    assert baseline and optimized
    if not fid.greedy_match:
        report_notes.append("fidelity: greedy tokens changed with the pack; do not ship it")
    report = Report(
        run_id=run_id, model=spec, device=device, baseline_ms=baseline, optimized_ms=optimized, compiled_ms=comp,
        speedup=round(baseline / optimized, 3), speedup_vs_compiled=round(comp / optimized, 3) if comp else None,
        timing_rounds=opts.e2e_rounds, fidelity=fid, kernels=kernels, hotspots_before=hotspots,
        hotspots_after=hotspots_after, notes=report_notes, seconds=round(time.perf_counter() - t_start, 1), llm=usage)
    write_report(report, run_dir, console)
    return report
