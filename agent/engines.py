"""The engine a run optimises, behind one interface: the model in this process (transformers), or the model served
by vLLM or SGLang. The run's steps (agent/run.py) are the same whatever the engine; what differs is here: how a
profile is taken, where tasks come from, and how the pack's effect is measured.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from kernelbot import KernelbotError
from kernelbot.agent.measure.end_to_end import (
    Measured,
    count_calls,
    fidelity,
    layer_routes_note,
    router_report,
    time_end_to_end,
)
from kernelbot.agent.stages import Stages
from kernelbot.agent.tasks.plan import ModelTasks, ServedTasks, TaskSource
from kernelbot.engine.memory import (
    check_in_process_fits,
    gpu_free_bytes,
    host_available_bytes,
    meta_model,
    model_footprint,
)
from kernelbot.engine.serving.load import Workload
from kernelbot.engine.serving.serve_options import ServeOptions
from kernelbot.engine.serving.served_engine import (
    Profiled,
    ServedEngine,
    merge_captures,
    merge_generic,
    round_ms,
)
from kernelbot.engine.torch_engine import TorchEngine, without_grouped_experts
from kernelbot.hardware.device import DeviceChoice
from kernelbot.hardware.peaks import PeakOverride, on_worker_cores, with_attained
from kernelbot.kernel_library import classes_covered
from kernelbot.profiler.hotspots import op_breakdown, rank_hotspots
from kernelbot.profiler.row_split import as_traced, split_hotspots
from kernelbot.profiler.trace import load_trace
from kernelbot.profiler.workload_floor import with_shares, workload_floor
from kernelbot.records import (
    IN_PROCESS,
    Device,
    EndToEndTimes,
    ModelSpec,
    Pack,
)


class RunEngine(Protocol):
    kind: str  # "in-process", "vllm", "sglang"
    graph_decode_baseline: bool

    def profile(self, trace: Path, pack: Pack, pack_dir: Path) -> Profiled:
        """The workload profiled (with the pack when it has kernels) and ranked."""
        ...

    def tasks(self, profiled: Profiled, generic_refused: str | None) -> TaskSource: ...

    def measure(self, pack: Pack, pack_dir: Path, rounds: int, compile_: bool, stages: Stages) -> Measured:
        """Calls into each kernel, fidelity, and the interleaved rounds."""
        ...


class InProcessEngine:
    """The model in this process: TorchEngine runs the workload as a server would (agent/measure/end_to_end.py
    measures)."""

    kind = IN_PROCESS

    def __init__(self, torch_engine: TorchEngine, device: Device) -> None:
        self.engine, self.device = torch_engine, device

    @property
    def graph_decode_baseline(self) -> bool:
        return self.engine.graph_decode_baseline

    def profile(self, trace: Path, pack: Pack, pack_dir: Path) -> Profiled:
        if pack.entries:
            self.engine.apply_pack(pack, pack_dir)
        try:
            self.engine.profile(trace)
            loaded = load_trace(trace)
            op_breakdown(loaded).to_csv(trace.with_name(trace.name.replace(".json.gz", "_ops.csv")), index=False)
            covered = classes_covered(self.engine.model)
            return rank_at_attained_peaks(
                lambda device: Profiled(hotspots=rank_hotspots(loaded, device, covered), captures=[]), self)
        finally:
            self.engine.remove_pack()

    def tasks(self, profiled: Profiled, generic_refused: str | None) -> TaskSource:
        return ModelTasks(self.engine, generic_refused)

    def measure(self, pack: Pack, pack_dir: Path, rounds: int, compile_: bool, stages: Stages) -> Measured:
        notes: list[str] = []
        calls, fallbacks = count_calls(self.engine, pack, pack_dir)
        routes = layer_routes_note(self.engine, pack, pack_dir)
        if routes is not None:
            notes.append(routes)
        with stages.working("fidelity: the pack's outputs against eager's and float64's"):
            fid = fidelity(self.engine, pack, pack_dir)
        times = self._time(pack, pack_dir, rounds, compile_, stages, notes)
        if times.kernelbot and not times.eager_rounds_differ:
            fid = fid.model_copy(update={"rounds_agree": not times.pack_rounds_differ})
        spec = self.engine.spec
        floor = with_shares(workload_floor(self.engine.model, self.device, spec.batch, spec.prompt_len,
                                           spec.decode_steps),
                            {"eager": _median(times.eager), "kernelbot": _median(times.kernelbot),
                             "torch.compile": _median(times.compiled)})
        return Measured(calls=calls, fallbacks=fallbacks, fidelity=fid, times=times, floor=floor,
                        router=router_report(self.engine, pack), notes=notes)

    def _time(self, pack: Pack, pack_dir: Path, rounds: int, compile_: bool, stages: Stages,
              notes: list[str]) -> EndToEndTimes:
        compiled = None
        if compile_:
            t0 = time.perf_counter()
            compiled = self.engine.compiled()
            with stages.working("torch.compile warm-up (compiling the model for prefill and decode)"):
                compiled.run_workload()
                compiled.run_workload()
            stages.say(f"      torch.compile warm-up took {time.perf_counter() - t0:.0f} s")
        graphed = None
        if self.engine.graph_decode_baseline:  # how serving engines run decode
            try:
                graphed = self.engine.static_decode(graphs=True)
            except KernelbotError as exc:
                notes.append(f"CUDA-graph decode not timed: {exc}")
        self.engine.apply_pack(pack, pack_dir)
        self.engine.run_workload()  # warm the kernels (weights packed on first call)
        self.engine.remove_pack()
        with stages.working(f"timing {rounds} interleaved rounds"):
            return time_end_to_end(self.engine, pack, pack_dir, rounds, compiled, graphed)


class ServedRunEngine:
    """A model served by vLLM or SGLang (engine/serving/served_engine.py), as the run drives it."""

    graph_decode_baseline = False

    def __init__(self, served: ServedEngine, device: Device, spec: ModelSpec, say: Callable[[str], None],
                 override: PeakOverride | None = None) -> None:
        self.served, self.device, self.spec, self.say = served, device, spec, say
        self.override = override  # the command line's peaks, which win over the worker's measured ones
        self.kind = served.opts.engine.value
        self._profiles = 0

    def profile(self, trace: Path, pack: Pack, pack_dir: Path) -> Profiled:
        self._profiles += 1
        name = "profile" if not pack.entries else f"profile_with_pack_{self._profiles}"
        traces, reports = self.served.profile(name, trace, pack, pack_dir)
        # the floors at the peaks of the cores the engine's kernels run on, not the whole host's
        self.device = on_worker_cores(self.device, self.served.worker_cores, self.spec.dtype, self.override)
        captures = as_traced(merge_captures(reports))
        loaded = load_trace(traces[0])  # TP ranks run the same layers at the same shapes
        op_breakdown(loaded).to_csv(trace.with_name(trace.name.replace(".json.gz", "_ops.csv")), index=False)
        covered = {c.module_class or c.engine_class: c.family for c in captures if not c.kernel}
        generic = merge_generic(reports)
        step_rows = max((r.step_rows for r in reports if r.step_rows), default=None)
        profiled = rank_at_attained_peaks(lambda device: Profiled(hotspots=split_hotspots(
            rank_hotspots(loaded, device, covered, by_name=False), captures, device, self.served.decode_scale,
            step_rows),
            captures=captures, generic=generic), self)
        return profiled.model_copy(update={"device": self.device})

    def tasks(self, profiled: Profiled, generic_refused: str | None) -> TaskSource:
        return ServedTasks(self.kind, profiled.captures, profiled.generic, generic_refused)

    def measure(self, pack: Pack, pack_dir: Path, rounds: int, compile_: bool, stages: Stages) -> Measured:
        with stages.working(f"{rounds} interleaved rounds on the stock and the packed server, then fidelity"):
            serving, fid = self.served.measure(pack, pack_dir, rounds, functools.partial(_twin_logprobs, self.spec,
                                                                                     self.served.model_dir))
        calls: dict[str, int] = {}
        fallbacks: dict[str, int] = {}
        for report in serving.processes:
            for cid, n in report.custom.items():
                calls[cid] = calls.get(cid, 0) + n.calls + n.captured
            for cls, reasons in report.fallback.items():
                fallbacks[cls] = fallbacks.get(cls, 0) + sum(reasons.values())
        times = EndToEndTimes(eager=round_ms(serving.stock_rounds), kernelbot=round_ms(serving.pack_rounds),
                              host=serving.host)
        w = self.served.workload
        floor = with_shares(workload_floor(meta_model(self.spec), self.device, w.concurrency, w.input_len, w.output_len,
                                           waves=-(-w.num_prompts // w.concurrency)),
                            {"stock": _median(times.eager), "kernelbot": _median(times.kernelbot)})
        return Measured(calls=calls, fallbacks=fallbacks, fidelity=fid, times=times, floor=floor, serving=serving,
                        notes=list(serving.notes))


def rank_at_attained_peaks(rank: Callable[[Device], Profiled], engine: InProcessEngine | ServedRunEngine) -> Profiled:
    """The profile ranked against the engine's device; again, with the device's peaks raised, where the profiled work
    attained more than the measured peaks (then the engine keeps the raised device, and the profile carries it)."""
    profiled = rank(engine.device)
    raised = with_attained(engine.device, profiled.hotspots)
    if raised is engine.device:
        return profiled
    engine.device = raised
    return rank(raised).model_copy(update={"device": raised})


def _median(xs: list[float]) -> float | None:
    return sorted(xs)[len(xs) // 2] if xs else None


_TWINS: dict[tuple[str, str, torch.dtype], torch.nn.Module] = {}


def _twin_model(spec: ModelSpec, model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The served model in transformers, in this process (the same weights: the served directory's), built once."""
    from kernelbot.engine.models import build_model

    key = (spec.model_dump_json(), str(model_dir), dtype)
    if key not in _TWINS:
        served = spec.model_copy(update={"path": str(model_dir) if spec.path is not None else None,
                                         "dtype": "float32"})
        _TWINS.clear()  # one model at a time: they can be large
        _TWINS[key] = without_grouped_experts(build_model(served).to(dtype))
    return _TWINS[key]


def _twin_logprobs(spec: ModelSpec, model_dir: Path, contexts: list[list[int]],
                   wanted: list[dict[int, set[int]]]) -> list[dict[int, dict[int, float]]]:
    """Per context, the float64 twin's log-probabilities of the next token at the positions and for the token ids
    asked for (one context's logits at a time: a real vocabulary's whole log-softmax for every context would be GBs)."""
    out = []
    try:
        model = _twin_model(spec, model_dir, torch.float64)
        with torch.inference_mode():
            for ctx, asked in zip(contexts, wanted, strict=True):
                logits = model(input_ids=torch.tensor([ctx])).logits[0, :-1].double()
                norm = torch.logsumexp(logits, -1)
                out.append({pos: {i: float(logits[pos, i] - norm[pos]) for i in ids} for pos, ids in asked.items()})
                del logits
    except Exception as exc:  # an architecture this transformers cannot build or run in float64
        raise KernelbotError(f"{type(exc).__name__}: {exc}") from None
    return out


def engine_for(serve: ServeOptions | None, spec: ModelSpec, device: Device, choice: DeviceChoice, run_dir: Path,
               workload: Workload, say: Callable[[str], None], override: PeakOverride | None = None) -> RunEngine:
    """The run's engine: in this process when `serve` is None, else the served engine."""
    if serve is None:
        free = gpu_free_bytes(choice.index)[0] if choice.is_gpu else host_available_bytes()
        check_in_process_fits(spec, model_footprint(spec), free, choice.is_gpu)
        return InProcessEngine(TorchEngine(spec, device=choice), device)
    return ServedRunEngine(ServedEngine(serve, spec, workload, run_dir, say), device, spec, say, override)
