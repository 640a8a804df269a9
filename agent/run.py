"""One session of an in-process `kernelbot optimize` run, as an object whose methods are the run's steps:
profile → plan → generate → integrate, iterated on the new bottlenecks while budget and headroom last, then
measure → report. What the steps share (options, run directory, run state, engine, device, pack, rows so far) are
its attributes; every result a step computes goes through the run state's journal, so a resumed session replays it.
"""

from __future__ import annotations

import functools
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from kernelbot.agent.engines import engine_for
from kernelbot.agent.generate import Generation
from kernelbot.agent.journal.db import Journal
from kernelbot.agent.journal.run_state import BudgetSpent, Clock, RunState
from kernelbot.agent.measure.alone_vs_model import alone_vs_engine, alone_vs_model, alone_vs_profiles
from kernelbot.agent.measure.compile_baseline import RegionCompile, time_region_compile
from kernelbot.agent.measure.end_to_end import Measured, final_rows, median
from kernelbot.agent.measure.gate import (
    TAKE_APART_S,
    engine_losers,
    faster,
    leave_one_out_s,
    never_slower,
    ratio,
    with_baselines_of,
)
from kernelbot.agent.pack import build_pack
from kernelbot.agent.report.markdown import write_report
from kernelbot.agent.run_options import OptimizeOptions
from kernelbot.agent.stages import Stages
from kernelbot.agent.tasks.plan import plan_tasks, signature
from kernelbot.engine.models import resolve_spec
from kernelbot.engine.serving.load import Workload
from kernelbot.engine.serving.serve_options import Lengths
from kernelbot.engine.serving.served_engine import Profiled
from kernelbot.hardware.device import DeviceChoice, pick_device
from kernelbot.hardware.peaks import PeakOverride, device_record
from kernelbot.kernel_library.store import KernelStore
from kernelbot.outcomes import Accepted
from kernelbot.records import (
    Device,
    EndToEndTimes,
    Fidelity,
    Hotspot,
    KernelResult,
    LLMUsage,
    Origin,
    Pack,
    Report,
    Task,
)
from kernelbot.rundir import write_record

if TYPE_CHECKING:
    from kernelbot.agent.cluster import ClusterExecutor

COMPILE_GUESS_S = 90.0  # torch.compile's warm-up, when a budget must decide whether it fits
FAR_FROM_FLOOR = 2.0  # an incumbent slower than this many times its roofline floor is worth a challenger


@dataclass(frozen=True)
class Finish:
    """How the end-to-end measurement fits the time budget: its rounds, and whether torch.compile is timed."""

    rounds: int
    compile: bool


@dataclass(frozen=True)
class Iterated:
    """How an iteration ended: whether another may change more, and the time budget when it refused work."""

    go_on: bool
    stopped: BudgetSpent | None = None


class OptimizeRun:
    """One session of a run: built from its options and journal (which starts it: the engine and the device's
    peaks), then `run()` takes it to its report."""

    def __init__(self, opts: OptimizeOptions, journal: Journal, console: Console,
                 executor: ClusterExecutor | None = None) -> None:
        self.t_start = time.perf_counter()
        self.opts, self.console = opts, console
        self.run_dir = Path(opts.run_dir or ".")
        self.sessions = int(journal.meta("sessions", 0)) + 1
        journal.set_meta("sessions", self.sessions)
        journal.set_meta("state", "running")
        clock = Clock(journal, opts.budget_hours)
        self.choice = pick_device(opts.device)
        # auto's CPU rule asks the CPU
        dtype = "bfloat16" if self.choice.is_gpu and opts.dtype == "auto" else opts.dtype
        self.spec, spec_notes = resolve_spec(opts.model, dtype, opts.batch, opts.prompt_len, opts.decode_steps,
                                             opts.seed)
        if opts.lengths is not Lengths.FIXED:
            spec_notes.append(f"request lengths drawn {opts.lengths.value} (seed {opts.seed}): prompts of up to "
                              f"{opts.prompt_len} tokens, outputs of up to {opts.decode_steps}")
        self.stages = Stages(console, self.run_dir, clock.before)
        self._say_start(spec_notes)
        self.state = RunState(journal, clock, KernelStore(opts.store) if opts.store else None, "")
        serve = opts.serve
        self.stages.say("[1/7] engine: " + ("building the model" if serve is None else
                                           f"the model for {serve.engine.value} to serve") + " and the device's peaks")
        self.peaks_given = PeakOverride(tflops=opts.peak_tflops, gbps=opts.peak_gbps)
        self.device = self._device(spec_notes)
        self.engine = engine_for(serve, self.spec, self.device, self.choice, self.run_dir, self.workload,
                                 self.stages.say, self.peaks_given)
        self.notes = list(spec_notes)  # the report's
        self.generation = Generation(opts, self.run_dir, self.state, self.stages, self.device, executor)
        self.kernels: list[KernelResult] = []  # every candidate's row as its generate step made it (frozen)
        # what is learnt of candidates later, kept beside their rows (measure/end_to_end.py's final_rows joins them)
        self.region_speedups: dict[str, float | None] = {}  # task id → torch.compile's gain on its region
        self.outpaced: dict[str, str] = {}  # candidate id → why another won the duel against it
        self.dropped: dict[str, str] = {}  # candidate id → why the gate took its kernel out of the pack
        self.counted: Measured | None = None  # the measurement whose calls each kernel's row reports
        self.accepted: list[Accepted] = []
        self.reused: list[str] = []  # kernel-store candidates that won their benchmark
        self.stopped: BudgetSpent | None = None  # the time budget, when it ended the run's work early
        self.attempted: set[str] = set()  # op signatures planned in an iteration
        self.challenged: set[str] = set()  # task ids whose incumbent was challenged once already
        self.deferred: dict[str, str] = {}  # op signature → why no task yet (--max-tasks), until an iteration takes it
        self.usage: LLMUsage | None = None
        self.pack = Pack(version="empty", run_id=self.run_dir.name, device=self.device.name, entries=[])
        self.pack_dir = self.run_dir / "pack"
        self.hotspots_before: list[Hotspot] = []
        self.hotspots_now: list[Hotspot] = []
        self.trials: dict[str, tuple[EndToEndTimes, EndToEndTimes]] = {}  # the gate's leave-one-out, by candidate
        self.profiled = Profiled(hotspots=[], captures=[])
        self.profiled_pack = ""  # the pack version the last profile ran with
        self.profile_s = 0.0
        self.iterations_done = 0

    @property
    def workload(self) -> Workload:
        """A served run's load: the run's batch as requests in flight, its prompt length and decode steps, and
        requests enough for several batches per round."""
        o = self.opts
        return Workload(concurrency=o.batch, input_len=o.prompt_len, output_len=max(o.decode_steps, 1),
                        num_prompts=max(o.batch, o.serve.requests_per_round if o.serve else o.batch), seed=o.seed,
                        lengths=o.lengths)

    def _say_start(self, spec_notes: list[str]) -> None:
        spec = self.spec
        if self.sessions > 1:
            self.stages.say(f"resuming {self.run_dir} (session {self.sessions}); recorded results are replayed, not "
                            "recomputed", style="yellow")
        where = "in-process" if self.opts.serve is None else f"served by {self.opts.serve.engine.value}"
        self.stages.say(f"[bold]kernelbot optimize[/bold] {spec.name} {where} ({spec.dtype}, batch {spec.batch}, "
                        f"{spec.prompt_len}-token prompts, {spec.decode_steps} decode steps) → {self.run_dir}")
        for note in spec_notes:
            self.stages.say(f"note: {note}", style="yellow")

    def _device(self, spec_notes: list[str]) -> Device:
        self.state.stage("engine")
        device = Device.model_validate(self.state.memo(
            "device", "stage", lambda: device_record(self.choice, self.spec.dtype, self.peaks_given).model_dump()))
        device.notes.extend(n for n in spec_notes if n not in device.notes)
        self.state.device_name = f"{device.kind}:{device.name}"
        write_record(self.run_dir / "model.json", self.spec)
        write_record(self.run_dir / "device.json", device)
        self.stages.say(f"      {device.name}, {device.threads} threads: {device.peak_gflops} GFLOP/s, "
                        f"{device.peak_gbps} GB/s")
        return device

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> Report:
        for it in range(self.opts.iterations + 1):
            self.state.iteration = it
            self.hotspots_now = self.profile(it)
            if it == self.opts.iterations or self.stopped is not None:
                break
            iterated = self.iterate(it)
            self.stopped = iterated.stopped  # the one place the run's stop is decided: from what its step returned
            if not iterated.go_on:
                break
        self.notes.extend(note for sig, note in self.deferred.items() if sig not in self.attempted)
        if self.opts.llm is not None and self.usage is None and self.state.session is not None:
            self.usage = self.state.session.finish()
        hotspots_after = self.final_profile()
        finish = self.finish_plan()
        if finish.compile:
            self.compile_regions()
        measured = self.measure(finish)
        gated = self.gate(measured, finish)
        if gated is not measured and self.pack.entries:  # the pack changed: profile what ships
            hotspots_after = self._profiled(f"hotspots:final:{self.pack.version}", self.run_dir / "trace_after.json.gz")
            write_record(self.run_dir / "hotspots_after.json", hotspots_after)
        report = self.report(gated, finish, hotspots_after)
        self.state.journal.set_meta("state", "done")
        self.state.clock.save()
        return report

    def iterate(self, it: int) -> Iterated:
        """Plan, generate and integrate on this iteration's hotspots; whether another iteration may change more, and
        the time budget when it refused the iteration's work (the run's loop stops on it)."""
        tasks, incumbents = self.plan(it)
        if not tasks:
            if it:
                self.notes.append(f"iteration {it + 1}: no hotspot left with headroom a task could take")
            return Iterated(go_on=False)
        self.attempted.update(signature(h) for h in self.hotspots_now if h.id in {t.hotspot_id for t in tasks})
        spent = self.state.clock.spent()
        if spent is not None and not any(self.state.recorded(t.id) for t in tasks):
            self.notes.append(f"iteration {it + 1}'s tasks not tried: {spent}")
            return Iterated(go_on=False, stopped=spent)
        generated = self.generation.generate(tasks, self.hotspots_now, incumbents)
        new_accepted, self.usage = generated.accepted, generated.usage
        self.kernels += generated.rows
        self.notes += generated.notes
        self.outpaced.update(generated.outpaced)
        self.reused += generated.reused
        if incumbents and all(a is incumbents.get(a.task.id) for a in new_accepted):
            return Iterated(go_on=False, stopped=generated.stopped)  # every incumbent stayed: the pack is as it was
        self.integrate(new_accepted)
        self.iterations_done = it + 1
        # nothing changed: profiling again would find the same hotspots
        return Iterated(go_on=bool(new_accepted), stopped=generated.stopped)

    # -- the steps ------------------------------------------------------------------------------------------------
    def profile(self, it: int) -> list[Hotspot]:
        """The workload profiled with the pack so far, ranked (iteration 0: without a pack)."""
        self.state.stage("profile")
        trace = self.run_dir / ("trace.json.gz" if it == 0 else "trace_after.json.gz")
        self.stages.say(f"[2/7] profile + rank{f' (iteration {it + 1}, pack applied)' if it else ''}: "
                        + ("torch.profiler over the workload" if self.opts.serve is None else
                           "the server's own profiler under load, the plugin capturing its layers' calls"))
        t0 = time.perf_counter()
        hotspots = self._profiled(f"hotspots:{it}", trace)
        if it == 0:  # a profile's length prices the finish (a resumed run reads the first session's)
            took = time.perf_counter() - t0
            self.profile_s = float(self.state.memo("profile_seconds", "stage", functools.partial(float, took)))
        # torch.compile is not reserved for: it is dropped at the end when the budget has no room for it
        self.state.clock.reserve = self.profile_s * (3 + self.opts.e2e_rounds) + 10
        write_record(self.run_dir / ("hotspots.json" if it == 0 else f"hotspots_iter{it + 1}.json"), hotspots)
        if it == 0:
            self.hotspots_before = hotspots
        self.stages.hotspots(hotspots)
        return hotspots

    def plan(self, it: int) -> tuple[list[Task], dict[str, Accepted]]:
        """This iteration's tasks (hotspots → KernelBench-format references); when none is new, the incumbents an
        LLM may challenge, as tasks (task id → incumbent)."""
        self.stages.say("[3/7] tasks: hotspots → KernelBench-format references, most headroom first")
        generic_refused = None if self.opts.llm or "cpp" in self.generation.backends else (
            "no generic task: the built-in generator writes C++ for CPUs, and no LLM (--llm) can write a kernel for "
            f"{self.device.kind}")
        source = self.engine.tasks(self.profiled, generic_refused)
        tasks, notes = plan_tasks(self.hotspots_now, source, self.opts, self.run_dir, iteration=it,
                                  attempted=self.attempted, deferred=self.deferred,
                                  threads=self.device.threads if self.device.kind == "cpu" else None)
        self.notes += notes
        self.stages.say(f"      {len(tasks)} tasks: {', '.join(t.id for t in tasks)}")
        incumbents = {} if tasks else self._challenges()
        if incumbents:
            tasks = [a.task for a in incumbents.values()]
            self.challenged.update(incumbents)
            self.stages.say(f"      no new hotspot: challenging the incumbents furthest above their floor: "
                            f"{', '.join(incumbents)}")
        return tasks, incumbents

    def _challenges(self) -> dict[str, Accepted]:
        """When no new hotspot is left and an LLM can still be asked: the incumbents furthest above their roofline
        floor (estimated time above it: the task's share times the part of a call above the floor), once each."""
        session = self.state.session
        if self.opts.llm is None or session is None or not session.active \
                or not self.state.clock.affords_candidate():
            return {}
        # an incumbent the LLM wrote in this run had its rounds already
        far = [a for a in self.accepted if a.task.id not in self.challenged and a.task.floor_us > 0
               and a.candidate.origin is not Origin.LLM
               and a.bench.candidate_us > FAR_FROM_FLOOR * a.task.floor_us]
        far.sort(key=lambda a: -a.task.share * (1 - a.task.floor_us / a.bench.candidate_us))
        return {a.task.id: a for a in far[:self.opts.max_tasks]}

    def integrate(self, new_accepted: list[Accepted]) -> None:
        """The new winners replace their tasks' kernels in the pack."""
        self.state.stage("integrate")
        replaced = {a.task.id for a in new_accepted}
        self.accepted = [a for a in self.accepted if a.task.id not in replaced] + new_accepted
        self.stages.say(f"[5/7] integrate: {len(self.accepted)} kernels into pack/")
        self.pack = build_pack(self.accepted, self.run_dir.name, self.device.name, self.pack_dir)

    def final_profile(self) -> list[Hotspot]:
        """The profile with the final pack: the last iteration's when it had that pack, else a new one."""
        last = self.hotspots_now
        if not self.accepted or self.profiled_pack == self.pack.version:
            if not (self.run_dir / "trace_after.json.gz").exists() and (self.run_dir / "trace.json.gz").exists():
                shutil.copyfile(self.run_dir / "trace.json.gz", self.run_dir / "trace_after.json.gz")
            write_record(self.run_dir / "hotspots_after.json", last)
            return last
        after = self._profiled(f"hotspots:final:{self.pack.version}", self.run_dir / "trace_after.json.gz")
        write_record(self.run_dir / "hotspots_after.json", after)
        return after

    def _profiled(self, key: str, trace: Path) -> list[Hotspot]:
        with self.stages.working("profiling the workload and ranking its modules against the roofline"):
            self.profiled = Profiled.model_validate(self.state.memo(key, "stage", lambda: self.engine.profile(
                trace, self.pack, self.pack_dir).model_dump()))
        self.profiled_pack = self.pack.version
        if self.profiled.device is not None and self.profiled.device != self.device:
            self.device = self.profiled.device  # peaks raised to what the profile attained
            self.engine.device = self.device
            self.generation.device = self.device
            write_record(self.run_dir / "device.json", self.device)
            self.stages.say(f"      {self.device.notes[-1]}", style="yellow")
        return self.profiled.hotspots

    def finish_plan(self) -> Finish:
        """The end-to-end rounds and whether to time torch.compile, within what the time budget leaves."""
        rounds, compile_ = self.opts.e2e_rounds, self.opts.compile
        clock = self.state.clock
        if clock.limit is None:
            return Finish(rounds, compile_)
        workload = self.profile_s / 2  # a profile is a warm-up plus a traced run
        left = clock.left() - self.profile_s - 4 * workload - 10
        if compile_ and left < COMPILE_GUESS_S + 2 * rounds * workload:
            compile_ = False
            self.notes.append("torch.compile comparison skipped: the time budget had no room for it")
        fit = max(1, int(left // max(2 * workload, 1e-3)))
        if fit < rounds:
            self.notes.append(f"end-to-end timing cut to {fit} rounds by the time budget (asked {rounds})")
            rounds = fit
        return Finish(rounds, compile_)

    def compile_regions(self) -> None:
        """torch.compile of each accepted kernel's own region, timed beside eager (agent/measure/compile_baseline.py):
        the rows of its task get compile's gain over eager there, so the report can set each kernel beside compile."""
        for a in self.accepted:
            task_dir = self.run_dir / "tasks" / a.task.id
            self.stages.say(f"      torch.compile of {a.task.id}'s region: compiling and timing it beside eager")
            region = RegionCompile.model_validate(self.state.memo(
                f"region_compile:{a.task.id}", "stage",
                functools.partial(_region_compile, a.task, task_dir / "reference.py", self.choice)))
            write_record(task_dir / "compile.json", region)
            if region.error:
                self.stages.say(f"      {a.task.id}: torch.compile not timed: {region.error}", style="yellow")
            self.region_speedups[a.task.id] = region.speedup

    def measure(self, finish: Finish) -> Measured:
        """Calls into each kernel of the pack, the model's outputs with it, and the workload's time: eager (or the
        stock engine) vs kernelbot (vs torch.compile in-process), interleaved."""
        self.state.stage("measure")
        baselines = ("torch.compile" + (" vs CUDA-graph decode" if self.engine.graph_decode_baseline else "")
                     if self.opts.serve is None else f"the stock {self.engine.kind} server")
        self.stages.say(f"[6/7] measure: fidelity, then {'eager vs kernelbot vs ' if self.opts.serve is None else ''}"
                        f"{baselines}{' vs the packed server' if self.opts.serve else ''}, {finish.rounds} interleaved "
                        "rounds")
        measured = Measured.model_validate(self.state.memo(f"measured:{self.pack.version}", "stage", lambda: (
            self.engine.measure(self.pack, self.pack_dir, finish.rounds, finish.compile, self.stages).model_dump())))
        self.counted = measured
        standing = final_rows(self.kernels, measured, {}, {}, self.outpaced)  # the duels decided; before the gate
        self.notes.extend(f"{row.candidate_id} is in the pack but never ran" for row in standing
                          if row.accepted and row.calls == 0)
        self.notes.extend(measured.notes)
        self.stages.say(f"      fidelity: {measured.fidelity.summary()}")
        write_record(self.run_dir / "timings.json", measured.times)
        if measured.times.host is not None and measured.times.host.contended:
            self.stages.say(f"      the host was busy while timing ({measured.times.host.summary()}): the ratios are "
                            "doubtful", style="yellow")
        return measured

    def gate(self, measured: Measured, finish: Finish) -> Measured:
        """Never ship a slower model (agent/measure/gate.py); the kernels it drops leave the pack, with the reason."""
        return with_baselines_of(self._gate(measured, finish), measured)

    def _gate(self, measured: Measured, finish: Finish) -> Measured:
        in_process = self.opts.serve is None  # trials are a few workload rounds, not two servers started
        won = faster(measured.times)
        trials_s = leave_one_out_s(measured.times, len(self.accepted), finish.rounds)
        take_apart = in_process and len(self.accepted) > 1 and trials_s <= TAKE_APART_S
        if won and in_process and len(self.accepted) > 1 and not take_apart:
            self.notes.append(f"the pack is faster ({ratio(measured.times):.2f}x); its kernels were not taken apart "
                              f"one by one: the leave-one-out trials would take about {trials_s / 60:.0f} min, over "
                              f"the {TAKE_APART_S / 60:.0f}-min allowance (so no kernel's saving in the model is "
                              "measured)")
        if not self.accepted or (won and not take_apart):
            return measured
        losers = engine_losers(self.accepted, measured.routers) if not won else []
        if losers:
            self.stages.say(f"[6/7] gate: the pack is {ratio(measured.times):.2f}x of the baseline; {len(losers)} "
                            "kernel(s) timed in the model no faster than the op they replace leave it", style="yellow")
            for a, why in losers:
                self._drop(a, why)
            if self.accepted:
                measured = self._trial(self.accepted, finish, False)
                won = faster(measured.times)
        if self.accepted and won and not take_apart:
            self.pack = build_pack(self.accepted, self.run_dir.name, self.device.name, self.pack_dir)
            return measured
        if self.accepted:
            self.stages.say(f"[6/7] gate: the pack is {ratio(measured.times):.2f}x of the baseline"
                            + (": leaving each kernel out once, to find any that hurts the model" if won else
                               ", not faster: looking for the kernels that hurt the model (leave one out)"),
                            style="" if won else "yellow")
        result = never_slower(self.accepted, measured, lambda subset, again: self._trial(subset, finish, again),
                              take_apart_faster=take_apart)
        self.trials = {f"{a.task.id}/{a.candidate.id}": (whole, without) for a, whole, without in result.trials}
        for a, why in result.dropped:
            self._drop(a, why)
        self.pack = build_pack(self.accepted, self.run_dir.name, self.device.name, self.pack_dir)
        serving = result.measured.serving
        if not self.accepted and serving is not None:  # its rounds are those of the pack that does not ship
            serving = serving.model_copy(update={"throughput_gain": None, "notes": [
                *serving.notes, "no pack ships: the rounds with the pack are those of the kernels the gate dropped"]})
            return result.measured.model_copy(update={"serving": serving})
        return result.measured

    def _trial(self, accepted: list[Accepted], finish: Finish, again: bool) -> Measured:
        """The model measured with a subset of the pack (journaled under the subset's pack version; `again`, a
        second measurement of its own)."""
        pack_dir = self.run_dir / "gate" / "pack"
        pack = build_pack(accepted, self.run_dir.name, self.device.name, pack_dir)
        key = f"measured:{pack.version}" + (":again" if again else "")
        return Measured.model_validate(self.state.memo(key, "stage", lambda: (
            self.engine.measure(pack, pack_dir, finish.rounds, False, self.stages).model_dump())))

    def _drop(self, a: Accepted, why: str) -> None:
        self.accepted = [x for x in self.accepted if x is not a]
        self.dropped[f"{a.task.id}/{a.candidate.id}"] = why
        self.notes.append(f"{a.task.id}/{a.candidate.id} dropped from the pack: {why}")
        self.stages.say(f"      dropped {a.task.id}/{a.candidate.id}: {why}", style="yellow")

    def report(self, measured: Measured, finish: Finish, hotspots_after: list[Hotspot]) -> Report:
        """report.json and report.md; then, when the pack kept the model's outputs, its kernels into the store."""
        self.state.stage("report")
        self.stages.say("[7/7] report")
        times, fid = measured.times, measured.fidelity
        baseline, optimized, comp = median(times.eager), median(times.kernelbot), median(times.compiled)
        graphed = median(times.graph_decode)
        assert baseline and optimized
        self._fidelity_notes(fid)
        stop_reason = str(self.stopped or "")
        if stop_reason:
            self.stages.say(f"stopped early by the {stop_reason}", style="yellow")
            self.notes.append(f"stopped early by the {stop_reason}")
        rows = final_rows(self.kernels, self.counted, self.region_speedups, self.dropped, self.outpaced)
        compared = alone_vs_model(rows, self.trials, hotspots_after)
        in_engine = alone_vs_engine(rows, measured.routers)
        compared += in_engine
        if measured.serving is None:  # what the router did not time, from the profiles before and after
            timed = {c.candidate_id for c in in_engine}
            compared += [c for c in alone_vs_profiles(rows, self.hotspots_before, hotspots_after, set(self.trials))
                         if c.candidate_id not in timed]
        for c in compared:
            if c.disagrees:
                self.notes.append(f"{c.candidate_id}: {c.speedup_alone:.2f}x alone, but {c.cause}")
            elif c.judged and c.measured_ms < 0:
                self.notes.append(f"{c.candidate_id}: {c.speedup_alone:.2f}x alone, but slower in the model "
                                  f"({c.source.value}: {c.measured_ms:.1f} ms a run)")
        report = Report(
            run_id=self.run_dir.name, model=self.spec, device=self.device, baseline_ms=baseline,
            optimized_ms=optimized, compiled_ms=comp, speedup=round(baseline / optimized, 3),
            speedup_vs_compiled=round(comp / optimized, 3) if comp else None, graph_decode_ms=graphed,
            timing_rounds=finish.rounds, fidelity=fid,
            kernels=rows,
            hotspots_before=self.hotspots_before, hotspots_after=hotspots_after,
            notes=self.notes, seconds=round(self.state.clock.elapsed(), 1), llm=self.usage,
            iterations=max(self.iterations_done, 1), stop_reason=stop_reason, budget=self._budget(),
            reused=self.reused, sessions=self.sessions, host=times.host, engine=self.engine.kind,
            serving=measured.serving, floor=measured.floor, peak_rss_mib=peak_rss_mib(), alone_vs_model=compared)
        write_report(report, self.run_dir, self.console)
        if fid.passed:
            self._store_accepted()
        return report

    def _fidelity_notes(self, fid: Fidelity) -> None:
        if fid.rounds_agree is False:
            self.notes.append("fidelity: with the pack, later timed rounds decoded other tokens than the first (a "
                              "kernel's answers changed from call to call); do not ship it")
        elif not fid.passed:
            self.notes.append("fidelity: the pack changed the model's outputs beyond its dtype's own error; "
                              "do not ship it")
        elif not fid.greedy_match:
            self.notes.append("fidelity: some greedy tokens changed, at near ties: on eager's tokens the pack is "
                              "within twice eager's own distance from float64")

    def _budget(self) -> dict[str, Any]:
        opts = self.opts
        budget: dict[str, Any] = {"budget_hours": opts.budget_hours, "iterations": opts.iterations,
                                  "max_tasks": opts.max_tasks, "max_task_minutes": opts.max_task_minutes}
        if opts.llm is not None:
            b = opts.llm.budget
            budget.update(max_cost=b.max_cost, max_tokens=b.max_tokens, max_llm_seconds=b.max_seconds,
                          max_calls_per_task=b.max_calls_per_task)
        return budget

    def _store_accepted(self) -> None:
        store = self.state.store
        if store is None:
            return
        for a in self.accepted:
            store.add(a.task, a.candidate.backend, self.state.device_name, a.source.read_text(), {
                "run_id": self.run_dir.name, "proposer": a.candidate.proposer, "config": a.candidate.config,
                "source_hash": a.candidate.source_hash, "speedup": a.bench.speedup,
                "verdict": a.verdict.verdict, "checks": [c.id for c in a.verdict.checks if c.status == "pass"]})
        if self.accepted:
            self.stages.say(f"      {len(self.accepted)} kernels stored in {store.root} for later runs")


def peak_rss_mib() -> float:
    """This process's largest resident set so far, in MiB (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _region_compile(task: Task, reference: Path, choice: DeviceChoice) -> dict[str, Any]:
    return time_region_compile(task, reference, choice).model_dump()
