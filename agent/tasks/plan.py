"""Hotspots → tasks, most headroom first: the one planner of both loops (in-process and served).

The planner decides which hotspots get a task (share, --families, --max-tasks, ops tried already) and notes why
the others get none; where a task comes from is the engine's: `ModelTasks` extracts it from the live model in this
process, `ServedTasks` builds it from the layer variants a served engine's plugin captured in its own processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kernelbot.agent.tasks.references import (
    OWN_OPS,
    make_generic_task,
    make_tasks,
    module_labels,
    served_generic_task,
    skip_reason,
    task_for,
    write_task,
)
from kernelbot.engine import TorchEngine
from kernelbot.engine.extract import NotExtractable
from kernelbot.kernel_library.base import GENERIC
from kernelbot.records import GenericCapture, Hotspot, LayerCapture, Task


@dataclass(frozen=True)
class Planned:
    """A hotspot's task, and its reference's source when it is not the family's."""

    task: Task
    reference: str | None = None


@dataclass(frozen=True)
class NoTask:
    """Why a hotspot gets no task; `note`, when given, is what the run's notes say, whatever the iteration."""

    reason: str
    note: str | None = None


class TaskSource(Protocol):
    """Where a loop's tasks come from."""

    def refuse(self, hotspot: Hotspot) -> str | None:
        """Why this loop can make no task for the hotspot, known before the task budget is counted; or None."""

    def build(self, hotspot: Hotspot, planned: list[Task]) -> list[Planned] | NoTask:
        """The hotspot's tasks (`planned`: the tasks planned before it): one, or one per variant of the layers
        that make its calls; or why it has none."""


class Selection(Protocol):
    """What the planner reads of the run's options (agent/run_options.py's OptimizeOptions has these)."""

    min_share: float
    max_tasks: int  # per iteration
    families: list[str] | None  # only these kernel_library families (None: all)


def signature(h: Hotspot) -> str:
    """What makes two hotspots the same op call: an op tried once is not planned again."""
    return json.dumps([h.family, h.module_class, h.dtype, h.input_dims])


def plan_tasks(hotspots: list[Hotspot], source: TaskSource, opts: Selection, run_dir: Path,
               *, iteration: int = 0, attempted: set[str] | None = None,
               deferred: dict[str, str] | None = None, threads: int | None = None) -> tuple[list[Task], list[str]]:
    """Tasks by expected gain (headroom over the roofline, as ranked), skipping ops already tried or replaced;
    each written under run_dir/tasks/; and the notes for the report on hotspots that got none. Hotspots over
    --max-tasks are deferred to a later iteration when `deferred` is given (op signature → note), else noted.
    `threads`: the CPU threads the model runs its ops on (Task.threads)."""
    tasks: list[Task] = []
    notes: list[str] = []
    for h in sorted(hotspots, key=lambda h: -h.score_us):
        reason = skip_reason(h, opts.min_share)
        if reason is None and h.kernel:
            continue  # runs a pack kernel already
        reason = reason or source.refuse(h)
        family = h.family or GENERIC
        if reason is None and opts.families is not None and family not in opts.families:
            reason = f"family {family} not selected (--families)"
        if reason is None and attempted is not None and signature(h) in attempted:
            continue  # tried in an earlier iteration
        over_budget = reason is None and len(tasks) >= opts.max_tasks
        if over_budget:
            reason = f"over the --max-tasks {opts.max_tasks} budget" + (
                f" of iteration {iteration + 1}" if deferred is not None else "")
        planned = source.build(h, tasks) if reason is None else NoTask(reason)
        if isinstance(planned, NoTask):
            _note(h, planned, opts, notes, iteration, deferred if over_budget else None)
            continue
        for p in planned[:max(opts.max_tasks - len(tasks), 1)]:  # a hotspot's variants share the budget
            task = p.task.model_copy(update={"threads": threads})
            write_task(task, run_dir / "tasks" / task.id, p.reference)
            tasks.append(task)
    return tasks, notes


def _note(h: Hotspot, why: NoTask, opts: Selection, notes: list[str], iteration: int,
          deferred: dict[str, str] | None) -> None:
    if why.note is not None:
        notes.append(why.note)
        return
    note = f"{h.id} {h.module_class} {h.input_dims} ({h.share:.1%}): no task, {why.reason}"
    if deferred is not None:
        deferred[signature(h)] = note  # a later iteration may take it
    elif h.share >= opts.min_share and note not in notes and iteration == 0:
        notes.append(note)


@dataclass
class ModelTasks:
    """Tasks from the model running in this process: a hotspot a family covers gets the family's reference; any
    other gets a reference extracted from the model at its profiled call."""

    engine: TorchEngine
    # why no candidate could be made for a generic task here (the built-in generator writes C++, which runs on
    # CPUs only, and no LLM was given), or None: such hotspots are refused before they take a task's place
    generic_refused: str | None = None
    labels: dict[str, str] | None = None  # trace labels → module names, found when a generic task first needs them
    covered: list[str] = field(default_factory=list)  # modules a generic task replaces whole

    def refuse(self, hotspot: Hotspot) -> str | None:
        return self.generic_refused if hotspot.family is None else None

    def build(self, hotspot: Hotspot, planned: list[Task]) -> list[Planned] | NoTask:
        if hotspot.family is None:
            return self._generic(hotspot, planned)
        if _inside(hotspot, self.labels or {}, self.covered):
            return NoTask("inside a module that a generic task replaces whole")
        try:
            return [Planned(t) for t in make_tasks(hotspot, self.engine.model)]
        except LookupError as exc:
            return NoTask(str(exc), note=f"{hotspot.id} {hotspot.module_class} ({hotspot.share:.1%}): no task, {exc}")

    def _generic(self, hotspot: Hotspot, planned: list[Task]) -> list[Planned] | NoTask:
        if self.labels is None:
            self.labels = module_labels(self.engine.model, self.engine.run_workload)
        try:
            task, reference = make_generic_task(hotspot, self.engine.model, self.labels, self.engine.run_workload)
        except NotExtractable as exc:
            return NoTask(f"no generic task: {exc}")
        twin = next((t for t in planned if t.signature == task.signature and t.module_paths == task.module_paths),
                    None)
        if twin is not None:
            return NoTask(f"the same call as task {twin.id}")
        self.covered.extend(task.module_paths)
        return [Planned(task, reference)]


def _inside(h: Hotspot, labels: dict[str, str], covered: list[str]) -> bool:
    names = [labels.get(p.rsplit("/", 1)[-1], "") for p in h.module_paths]
    return bool(names) and all(any(n.startswith(c + ".") for c in covered) for n in names)


@dataclass
class ServedTasks:
    """Tasks for a served model: one per layer variant the engine's plugin captured (engine/router.py), with
    the arguments its layers were built with and the most rows the engine ran; only variants whose own outputs the
    family's reference reproduced on a live call. A layer no family covers gets generic tasks from its frequent
    captured calls whose native forward was extracted in the engine's process (engine/generic_layers.py). Anything
    else is reported as not integrable, with the reason."""

    engine: str
    captures: list[LayerCapture]
    generic: list[GenericCapture] = field(default_factory=list)
    generic_refused: str | None = None  # as ModelTasks'

    def _generic(self, hotspot: Hotspot) -> list[GenericCapture]:
        """The captured calls of the hotspot's layer class, the extracted ones first, then by calls."""
        found = [c for c in self.generic if c.engine_class == hotspot.module_class]
        return sorted(found, key=lambda c: (not c.reference, -c.calls))

    def _capture(self, hotspot: Hotspot) -> LayerCapture | None:
        """The captured variant this hotspot is a row bucket of: same class, family, dtype and fixed dims."""
        from kernelbot.engine.router import fixed_dims

        family = hotspot.family or ""
        want = (hotspot.module_class, family, hotspot.dtype)
        for c in self.captures:
            if c.kernel or (c.module_class or c.engine_class, c.family, c.dtype) != want:
                continue
            if fixed_dims(family, hotspot.input_dims[:len(c.input_shapes)]) == fixed_dims(family, c.input_shapes):
                return c
        return None

    def refuse(self, hotspot: Hotspot) -> str | None:
        if hotspot.family is None:
            return self._refuse_generic(hotspot)
        capture = self._capture(hotspot)
        if capture is None:
            return f"not integrable: the plugin captured no {hotspot.family} call of {hotspot.module_class}"
        if capture.why or not capture.agrees:
            return f"not integrable: {capture.why or 'the engine ran no call of this variant through its own path'}"
        return None

    def _refuse_generic(self, hotspot: Hotspot) -> str | None:
        if self.generic_refused is not None:
            return self.generic_refused
        found = self._generic(hotspot)
        if not found:
            return (f"not integrable: no seam of {self.engine} carries a kernel for {hotspot.module_class} into the "
                    f"server (kernelbot's plugin takes {self.engine}'s norms, activations, rotary embeddings, linear "
                    "layers, LM head, attention, MoE experts, and any other op of its own with a native forward; "
                    + ("a module's own ops are none of these)" if hotspot.module_class.endswith(OWN_OPS) else
                       "this layer is none of these)"))
        return None if found[0].reference else f"not integrable: no generic task, {found[0].why}"

    def build(self, hotspot: Hotspot, planned: list[Task]) -> list[Planned] | NoTask:
        if hotspot.family is None:
            return self._build_generic(hotspot, planned)
        capture = self._capture(hotspot)
        assert capture is not None  # refuse() said so otherwise
        task = task_for(hotspot, capture.init_args)  # routed by the engine's class (the hooked one)
        return [Planned(task.model_copy(update={"module_class": capture.engine_class}))]

    def _build_generic(self, hotspot: Hotspot, planned: list[Task]) -> list[Planned] | NoTask:
        """One task per extracted call signature of the layer class, most calls first, down to a tenth of the top's
        calls (a decode step's norm with and without its residual, a prefill's); none twice."""
        found = [c for c in self._generic(hotspot) if c.reference]
        out: list[Planned] = []
        for capture in found:
            if capture.calls * 10 < found[0].calls:
                break
            task = served_generic_task(hotspot, capture)
            if any(t.signature == task.signature and t.layer_variant == task.layer_variant
                   for t in [*planned, *(p.task for p in out)]):
                continue
            if out:
                task = task.model_copy(update={"id": f"{task.id}-v{len(out) + 1}"})
            out.append(Planned(task, capture.reference))
        return out or NoTask("its captured calls are planned as tasks already")
