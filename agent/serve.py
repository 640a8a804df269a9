"""`kernelbot optimize --engine sglang`: the loop over a model served by SGLang.

baseline server (no pack): serving rounds → greedy probe → /start_profile traces, one per rank (on a GPU from a
second server without CUDA graphs, so kernels map back to layers); stop it → rank rank 0's trace → tasks for the
layers the plugin can route → candidates verified and benchmarked here (no server holds the device meanwhile) →
pack → server with the plugin and the pack: the same rounds, probe and traces, plus each rank's counters →
engagement, fidelity, serving gain → report.

Records land in the run directory as in the in-process loop (hotspots.json, tasks/, pack/, report.json), with
the servers' logs, counters and per-rank traces under serve/<server>/.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from kernelbot import KernelbotError
from kernelbot.agent.generate import builtin_proposals, hotspot_fields, local_evaluator, try_candidates
from kernelbot.agent.measure import apply_counts, served_fidelity
from kernelbot.agent.options import OptimizeOptions
from kernelbot.agent.pack import Accepted, build_pack
from kernelbot.agent.plan import NoTask, Planned, plan_tasks
from kernelbot.agent.proposer import available_backends
from kernelbot.agent.report import write_served_report
from kernelbot.agent.run_state import annotated
from kernelbot.agent.stages import Stages
from kernelbot.agent.tasks import task_for
from kernelbot.engine import sglang_adapter as sg
from kernelbot.engine.sglang_plugin import TARGETS, read_counts
from kernelbot.profiler.hotspots import rank_hotspots
from kernelbot.profiler.trace import load_trace
from kernelbot.records import Device, Fidelity, Hotspot, KernelResult, ServedReport, ServingMetrics, Task
from kernelbot.rundir import new_run_dir, write_record


@dataclass
class ServeOptions:
    model_path: str
    run_dir: Path | None = None
    tp: int = 1
    port: int = 30000
    launch_cmd: list[str] | None = None  # default: python -m sglang.launch_server
    server_args: list[str] = field(default_factory=list)
    workload: sg.Workload = field(default_factory=sg.Workload)
    serving_rounds: int = 3  # workload runs per server; the median one is reported
    profile_prompts: int = 8  # requests in the profiled run (traces of whole workloads get large)
    probe_prompts: int = 4
    probe_tokens: int = 32
    ready_timeout: float = 900.0
    candidate: OptimizeOptions = field(default_factory=OptimizeOptions)  # seed, timeouts, rounds, families...


def _device() -> Device:
    import torch

    if not torch.cuda.is_available():
        from kernelbot.profiler.device import measure_cpu

        return measure_cpu()
    from kernelbot.profiler.peaks import lookup

    name = torch.cuda.get_device_name()
    peaks = lookup([{"name": name}])
    if peaks is None:
        raise KernelbotError(f"no peaks known for {name}: add it to profiler/peaks.py")
    return Device(kind="cuda", name=name, threads=torch.cuda.device_count(), peak_gflops=peaks.tflops_fp32 * 1e3,
                  peak_gbps=peaks.gbps, peaks_source=peaks.source)


def served_init_args(family: str, hotspot: Hotspot, config: dict, device_kind: str) -> list | str:
    """A layer's constructor arguments, from the profiled shapes and the served model's config; or why they
    cannot be known."""
    if family == "rmsnorm" and "rms_norm_eps" in config:
        return [hotspot.input_dims[0][-1], float(config["rms_norm_eps"]), hotspot.dtype]  # weights in the model's dtype
    if family == "silu_and_mul":
        return []
    if family == "rotary_embedding":
        if config.get("rope_scaling"):
            return "rope_scaling in config.json: SGLang builds a scaled RoPE subclass, which has no kernel here"
        args = _rope_args(hotspot, config, device_kind)
        if args is not None:
            return args
    return f"the model's config.json does not give the {family} layer's arguments"


def _rope_args(hotspot: Hotspot, config: dict, device_kind: str) -> list | None:
    """RotaryEmbedding as SGLang's Llama-family models build it (get_rope): NeoX style, rotary dims the head's
    (times partial_rotary_factor), one cache row per position up to max_position_embeddings, kept in fp32 on
    GPUs and in the model's dtype on the CPU. The plugin checks every one of these against the live layer."""
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config.get("hidden_size", 0) // heads if heads else 0)
    if not head_dim or "max_position_embeddings" not in config:
        return None
    return [int(head_dim), int(head_dim * config.get("partial_rotary_factor", 1.0)),
            int(config["max_position_embeddings"]), float(config.get("rope_theta", 10000)), True,
            "float32" if device_kind == "cuda" else hotspot.dtype]


@dataclass
class _Session:
    metrics: ServingMetrics | None  # the median round, when this server was measured
    probe: list[dict]
    traces: list[Path]
    command: list[str]


class _Serving:
    """One server after another on the same port, each measured the same way.

    Serving rounds run the server as the fleet would (CUDA graphs on, unless the user's --server-arg turns them
    off). Under graphs a trace's kernels do not map back to the layers that launched them, so on a GPU the
    trace that is ranked comes from a second baseline server started with --disable-cuda-graph. With the pack,
    the graph server's own trace is what confirms replays (the pack's kernel names in each rank)."""

    def __init__(self, opts: ServeOptions, run_dir: Path, stages: Stages, vocab: int, graphs: bool) -> None:
        self.opts, self.stages, self.graphs = opts, stages, graphs
        self.dir = run_dir / "serve"
        self.prompts = sg.random_prompts(opts.probe_prompts, 16, vocab, seed=1)
        self.vocab = vocab

    def config(self, name: str, pack_dir: Path | None, disable_graphs: bool) -> sg.ServerConfig:
        o = self.opts
        config = sg.ServerConfig(model_path=o.model_path, tp=o.tp, port=o.port, extra_args=list(o.server_args),
                                 pack_dir=pack_dir, counts_dir=self.dir / name / "counts" if pack_dir else None,
                                 ready_timeout=o.ready_timeout, disable_cuda_graph=disable_graphs)
        if o.launch_cmd:
            config.launch_cmd = list(o.launch_cmd)
        return config

    def session(self, name: str, pack_dir: Path | None, serve: bool = True, disable_graphs: bool = False) -> _Session:
        """Start a server; measure it (serving rounds, greedy probe) when `serve`; trace it; stop it."""
        config = self.config(name, pack_dir, disable_graphs or not self.graphs)
        server = sg.SGLangServer(config, self.dir / name / "server.log")
        t0 = time.perf_counter()
        median, probe = None, []
        with server:
            self.stages.say(f"      {name}: server ready in {time.perf_counter() - t0:.0f} s "
                            f"({' '.join(server.command()[:4])} ...)")
            w = self.opts.workload
            sg.run_workload(config.url, replace(w, num_prompts=max(1, w.concurrency)), self.vocab)  # warm-up
            if serve:
                median = self._rounds(config, name)
                probe = sg.greedy_probe(config.url, self.prompts, self.opts.probe_tokens)
            traces = sg.profile(config, replace(w, num_prompts=self.opts.profile_prompts), self.dir / name / "traces",
                                vocab=self.vocab)
            return _Session(median, probe, traces, server.command())

    def _rounds(self, config: sg.ServerConfig, name: str) -> ServingMetrics:
        w = self.opts.workload
        rounds = [sg.run_workload(config.url, replace(w, seed=w.seed + i), self.vocab)
                  for i in range(self.opts.serving_rounds)]
        median = sorted(rounds, key=lambda m: m.output_throughput)[len(rounds) // 2]
        median.round_throughputs = [m.output_throughput for m in rounds]
        self.stages.say(f"      {name}: {median.output_throughput:.1f} tok/s, TTFT {median.mean_ttft_ms:.1f} ms, "
                        f"ITL {median.mean_itl_ms:.2f} ms (median of {len(rounds)} rounds: "
                        f"{', '.join(f'{m.output_throughput:.1f}' for m in rounds)} tok/s)")
        return median


@dataclass
class ServedTasks:
    """Tasks for the layers the SGLang plugin can route, each built from the served model's config (the model
    runs in another process)."""

    config: dict
    device_kind: str

    def refuse(self, hotspot: Hotspot) -> str | None:
        if hotspot.family not in TARGETS:
            return f"the SGLang plugin routes no layer to the {hotspot.family} family"
        init_args = served_init_args(hotspot.family or "", hotspot, self.config, self.device_kind)
        return init_args if isinstance(init_args, str) else None

    def build(self, hotspot: Hotspot, planned: list[Task]) -> Planned | NoTask:
        init_args = served_init_args(hotspot.family or "", hotspot, self.config, self.device_kind)
        return NoTask(init_args) if isinstance(init_args, str) else Planned(task_for(hotspot, init_args))


def _rank(traces: list[Path], device: Device, run_dir: Path, name: str) -> list[Hotspot]:
    hotspots = rank_hotspots(load_trace(traces[0]), device)  # TP ranks run the same layers at the same shapes
    write_record(run_dir / name, hotspots)
    return hotspots


def optimize_served(opts: ServeOptions, console: Console | None = None) -> ServedReport:
    """A new run against a served model; a SIGTERM stops the server it has up before the run ends."""
    if threading.current_thread() is not threading.main_thread():
        return _optimize_served(opts, console)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _optimize_served(opts, console)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through `with server:`, which stops the server's process group


def _optimize_served(opts: ServeOptions, console: Console | None) -> ServedReport:
    t_start = time.perf_counter()
    run_id, run_dir = new_run_dir(opts.run_dir)
    console = console or Console(soft_wrap=True)
    stages = Stages(console, run_dir)
    config = sg.model_config(opts.model_path)
    stages.say(f"[bold]kernelbot optimize --engine sglang[/bold] {opts.model_path} (tp {opts.tp}) → {run_dir}")
    device = _device()
    write_record(run_dir / "device.json", device)
    notes = sg.native_switches(sg.ServerConfig(model_path=opts.model_path, extra_args=opts.server_args))
    graphs = device.kind == "cuda" and "--disable-cuda-graph" not in opts.server_args  # SGLang's default on GPUs
    serving = _Serving(opts, run_dir, stages, int(config.get("vocab_size", 1000)), graphs)

    stages.say("[1/6] baseline: serving rounds, greedy probe and per-rank traces without the pack")
    base = serving.session("baseline", None)
    assert base.metrics is not None
    if graphs:
        base.traces = serving.session("baseline_eager", None, serve=False, disable_graphs=True).traces
    hotspots = _rank(base.traces, device, run_dir, "hotspots.json")
    stages.hotspots(hotspots)

    stages.say("[2/6] tasks: hotspots the plugin can route → KernelBench-format references")
    tasks = plan_tasks(hotspots, ServedTasks(config, device.kind), opts.candidate, run_dir, notes)
    stages.say(f"      {len(tasks)} tasks: {', '.join(t.id for t in tasks) or 'none'}")

    stages.say("[3/6] generate + verify + benchmark (built-in proposer; candidates run in the sandbox)")
    kernels: list[KernelResult] = []
    accepted: list[Accepted] = []
    backends = available_backends(device.kind)
    by_id = {h.id: h for h in hotspots}
    for task in tasks:
        task_dir = run_dir / "tasks" / task.id
        evaluate = annotated(local_evaluator(task, task_dir, device.kind, opts.candidate),
                             hotspot_fields(task, by_id.get(task.hotspot_id), 0))
        rows, best = try_candidates(task, task_dir, builtin_proposals(task, task_dir, backends, device.kind, stages),
                                    evaluate, stages, opts.candidate.max_task_minutes)
        kernels += rows
        if best is not None:
            accepted.append(best)
    pack = build_pack(accepted, run_id, device.name, run_dir / "pack")
    stages.say(f"[4/6] pack: {len(pack.entries)} kernels ({pack.version})")

    after, command = None, base.command
    fid: Fidelity | None = None
    engaged = sg.Engagement(engaged=False, per_rank={}, notes=["no kernel was accepted: nothing to serve"])
    hits: dict[str, int] = {}
    hotspots_after: list[Hotspot] = []
    if pack.entries:
        stages.say("[5/6] with the pack: the plugin in every rank, the same rounds, probe and traces")
        with_pack = serving.session("with_pack", run_dir / "pack")
        after, command = with_pack.metrics, with_pack.command
        try:
            hotspots_after = _rank(with_pack.traces, device, run_dir, "hotspots_after.json")
        except KernelbotError as exc:  # the serving numbers and counters stand without it
            notes.append(f"the profile with the pack could not be ranked: {exc}")
        counts = read_counts(serving.dir / "with_pack" / "counts")
        names = sorted({n for c in counts for ns in c.get("device_kernels", {}).values() for n in ns})
        hits = sg.trace_kernel_hits(with_pack.traces, names) if names else {}
        engaged = sg.engagement(counts, opts.tp, hits)
        fid = served_fidelity(base.probe, with_pack.probe)
        _count_calls(kernels, counts)
    stages.say("[6/6] report")
    gains = sg.compare(base.metrics, after, engaged, []) if after is not None else {}
    notes += gains.get("notes", engaged.notes)
    if fid is not None and not fid.passed:
        notes.append("fidelity: the served model's greedy outputs changed with the pack; do not ship it")
    report = ServedReport(
        run_id=run_id, engine="sglang", model_path=opts.model_path, tp=opts.tp, device=device,
        server_command=command, before=base.metrics, after=after, throughput_gain=gains.get("throughput_gain"),
        itl_gain=gains.get("itl_gain"), beyond_noise=gains.get("beyond_noise", False), engaged=engaged.engaged,
        per_rank={str(k): v for k, v in engaged.per_rank.items()}, trace_hits=hits, fidelity=fid, kernels=kernels,
        hotspots_before=hotspots, hotspots_after=hotspots_after, pack_version=pack.version, notes=notes,
        seconds=round(time.perf_counter() - t_start, 1))
    write_served_report(report, run_dir, console)
    return report


def _count_calls(kernels: list[KernelResult], counts: list[dict]) -> None:
    """Calls into each accepted kernel and fallbacks on its layer class, summed over ranks, from the plugin."""
    calls: dict[str, int] = {}
    fallbacks: dict[str, int] = {}
    for c in counts:
        for cid, n in c["custom"].items():
            calls[cid] = calls.get(cid, 0) + n["calls"] + n["captured"]
        for cls, reasons in c["fallback"].items():
            fallbacks[cls] = fallbacks.get(cls, 0) + sum(reasons.values())
    apply_counts(kernels, calls, fallbacks)
