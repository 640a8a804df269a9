"""A model served by an engine (vLLM, SGLang) as the optimisation loop's engine.

- The model: a directory with weights is served as it is; the built-in models and directories without weights are
  written once into the run (`model/`: config.json and the seeded weights the in-process engine builds), so the
  served model, its float64 twin and an in-process run are the same model.
- Profile: a server started with the plugin capturing (and routing the pack, after the first iteration) and with its
  own profiler on; a warm-up load, then `/start_profile`, the load, `/stop_profile`. The worker's trace is ranked;
  each captured layer variant becomes a hotspot of its own with the time its calls took.
- Measure: a stock server and a server with the pack, both up, started the same way; interleaved rounds of the same
  seeded load (the order alternating), then the fidelity probe on both, then the pack server's plugin counters.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from pydantic import BaseModel

from kernelbot import KernelbotError
from kernelbot.engine.memory import gpu_free_bytes, host_available_bytes, model_footprint
from kernelbot.engine.router import FLUSH_S, PROBE_CALLS, fixed_dims, read_reports, widest
from kernelbot.engine.serving import fidelity as fid
from kernelbot.engine.serving.apis import APIS, ServerSetup, engine_version
from kernelbot.engine.serving.ceiling import measure_ceiling
from kernelbot.engine.serving.load import Workload, generate, post, random_prompts, run_load
from kernelbot.engine.serving.serve_options import EngineKind, ServeOptions
from kernelbot.engine.serving.server import Launch, ServerProcess, last_error
from kernelbot.engine.serving.sizing import MemoryPlan, check_fits, plan_memory, user_sized
from kernelbot.hardware import host
from kernelbot.records import (
    Device,
    Fidelity,
    GenericCapture,
    Hotspot,
    LayerCapture,
    ModelSpec,
    Pack,
    PluginReport,
    ServedComparison,
    ServingMetrics,
)

Say = Callable[[str], None]
# the float64 twin: per context and position asked for, the log-probabilities of the token ids asked for there
TwinLogprobs = Callable[[list[list[int]], list[dict[int, set[int]]]], list[dict[int, dict[int, float]]]]
PROFILED_DECODE_STEPS = 16
MAX_WARM_WAVES = 4  # warm-up waves before the timed rounds, at most (a prefill kernel's timing ends within 3 here)


class Profiled(BaseModel):
    hotspots: list[Hotspot]
    captures: list[LayerCapture]
    generic: list[GenericCapture] = []  # calls of served layers no family covers (engine/generic_layers.py)
    device: Device | None = None  # the device with peaks raised to what the profile attained (profiler.device)


def served_model_dir(spec: ModelSpec, run_dir: Path) -> Path:
    """The directory the servers load: the user's when it holds weights, else the run's copy with the seeded
    weights the in-process engine builds (written once; a resumed run finds it)."""
    from kernelbot.engine.models import build_model, find_checkpoint

    if spec.path is not None and find_checkpoint(Path(spec.path)) is not None:
        return Path(spec.path)
    target = run_dir / "model"
    if (target / "config.json").is_file() and find_checkpoint(target) is not None:
        return target
    model = build_model(spec)
    model.config.architectures = [spec.architecture]
    tmp = run_dir / "model.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(target)
    return target


def merge_captures(reports: list[PluginReport]) -> list[LayerCapture]:
    """The variants every process captured, summed (TP ranks and processes run the same layers)."""
    merged: dict[str, LayerCapture] = {}
    for report in reports:
        for c in report.captures:
            key = json.dumps([c.engine_class, c.family, c.init_args, c.dtype,
                              fixed_dims(c.family, c.input_shapes), c.why, c.kernel, c.within], default=str)
            have = merged.get(key)
            if have is None:
                merged[key] = c.model_copy(deep=True)
                continue
            have.calls += c.calls
            for r, n in c.rows.items():
                have.rows[r] = have.rows.get(r, 0) + n
                have.shapes[r] = widest(have.shapes.get(r, c.shapes[r]), c.shapes[r])
            have.input_shapes = have.shapes[max(have.shapes, key=int)]
            if c.agrees is not None:
                have.agrees = c.agrees if have.agrees is None else have.agrees and c.agrees
                have.why = have.why or c.why
    return list(merged.values())


def captured_since(before: list[PluginReport], after: list[PluginReport]) -> list[PluginReport]:
    """What each process captured between two readings of its counters (the profiled load's window: its trace's
    calls, not the warm-up's or the engine's start-up runs): every variant's calls and rows less those read before
    (a process's variants only ever grow, in order); variants with no call in between are left out."""
    earlier = {r.pid: r.captures for r in before}
    out = []
    for report in after:
        old = earlier.get(report.pid, [])
        captures = []
        for i, c in enumerate(report.captures):
            prior = old[i] if i < len(old) else None
            calls = c.calls - (prior.calls if prior else 0)
            if calls <= 0:
                continue
            rows = {r: n - (prior.rows.get(r, 0) if prior else 0) for r, n in c.rows.items()}
            rows = {r: n for r, n in rows.items() if n > 0}
            shapes = {r: s for r, s in c.shapes.items() if r in rows}
            most = {"input_shapes": shapes[max(shapes, key=int)]} if shapes else {}
            captures.append(c.model_copy(update={"calls": calls, "rows": rows, "shapes": shapes, **most}))
        out.append(report.model_copy(update={"captures": captures}))
    return out


def merge_generic(reports: list[PluginReport]) -> list[GenericCapture]:
    """The generic calls every process captured, summed; a call one process extracted keeps its reference."""
    merged: dict[str, GenericCapture] = {}
    for report in reports:
        for c in report.generic:
            key = json.dumps([c.engine_class, c.variant, [[t.shape, t.dtype] for t in c.signature.tensors],
                              c.signature.spec])
            have = merged.get(key)
            if have is None:
                merged[key] = c.model_copy(deep=True)
            elif c.reference and not have.reference:
                merged[key] = c.model_copy(deep=True, update={"calls": have.calls + c.calls})
            else:
                have.calls += c.calls
    return list(merged.values())


def served_memory(spec: ModelSpec, workload: Workload, tp: int = 1) -> MemoryPlan:
    """The servers' limits for this model and load, and the A/B's peak memory against what is free (the GPU's
    where the engine will use one, else the host's)."""
    footprint = model_footprint(spec)
    shape = dict(longest_prompt=workload.input_len, longest_output=workload.output_len,
                 in_flight=workload.concurrency)
    if torch.cuda.is_available():
        free, total = gpu_free_bytes(0)
        return plan_memory(footprint, **shape, device_kind="cuda", available_bytes=free, device_total_bytes=total,
                           tp=tp)
    return plan_memory(footprint, **shape, device_kind="cpu", available_bytes=host_available_bytes())


class ServedEngine:
    """The optimisation loop's engine for a served model (see the module's docstring)."""

    def __init__(self, opts: ServeOptions, spec: ModelSpec, workload: Workload, run_dir: Path, say: Say) -> None:
        self.opts, self.spec, self.workload, self.say = opts, spec, workload, say
        self.api = APIS[opts.engine]
        self.version = engine_version(opts.engine, opts.python)
        self.dir = run_dir / "serve"
        memory = served_memory(spec, workload, opts.tp)  # before the model is written or any server starts
        self.limits = None if user_sized(opts.server_args) else memory.limits  # the user's own flags win
        if self.limits is None:
            say(f"      the servers' memory limits are the ones given with --server-arg ({memory.summary()})")
        else:
            check_fits(memory, opts.engine.value)
            say(f"      {memory.summary()}")
        self.model_dir = served_model_dir(spec, run_dir)
        self.vocab = spec.vocab
        self.worker_cores: list[int] = []  # where the profiled server bound its worker (empty: not narrower)
        self.program = opts.launch or [*opts.python, "-m", self.api.module]

    def _launch(self, setup: ServerSetup) -> Launch:
        return Launch(name=self.opts.engine.value, env=self.api.environment(setup),
                      command=lambda port: self.api.command(self.program, setup, port),
                      health_path=self.api.health_path, ready_timeout=self.opts.ready_timeout)

    def _setup(self, name: str, pack: Pack | None, pack_dir: Path, *, capture: bool = False,
               profile: bool = False) -> ServerSetup:
        work = self.dir / name
        if work.exists():
            shutil.rmtree(work)  # a rerun (resume) starts this server's records afresh
        return ServerSetup(model_dir=self.model_dir, dtype=self.spec.dtype, extra_args=tuple(self.opts.server_args),
                           pack_dir=pack_dir if pack is not None and pack.entries else None,
                           counts_dir=work / "counts", capture=capture,
                           profile_dir=work / "traces" if profile else None, tp=self.opts.tp,
                           limits=self.limits)

    def _server(self, name: str, setup: ServerSetup) -> ServerProcess:
        return ServerProcess(self._launch(setup), self.dir / name / "server.log", self.opts.port)

    def _one_wave(self) -> Workload:
        """The load, one request per slot: every request's prefill and decode at the run's batch."""
        return self.workload.model_copy(update={"num_prompts": self.workload.concurrency})

    def profiled_wave(self) -> Workload:
        """The profiled load: one wave with at most PROFILED_DECODE_STEPS decode steps (a trace with Python stacks
        grows by tens of MB an engine step: a Qwen2.5-0.5B shape's 128 steps at batch 8 took vLLM's worker past 20 GB
        and the OOM killer); `decode_scale` counts the steps left out."""
        return self._one_wave().model_copy(update={"output_len": min(self.workload.output_len,
                                                                     PROFILED_DECODE_STEPS)})

    @property
    def decode_scale(self) -> float:
        """The load's decode steps per profiled decode step."""
        return max(self.workload.output_len - 1, 1) / max(self.profiled_wave().output_len - 1, 1)

    def _warm(self, server: ServerProcess) -> None:
        self._load(server, self._one_wave())

    def _warm_past_timing(self, stock: ServerProcess, packed: ServerProcess, counts_dir: Path | None) -> int:
        """Warm-up waves on both servers alike until the packed one's kernels are past their in-engine timing (those
        calls run both paths: 32 of a kernel's first few hundred), at most MAX_WARM_WAVES: the rounds then time what a
        long-running server runs, not a fresh process's probes. Returns the waves run."""
        for waves in range(1, MAX_WARM_WAVES + 1):
            for server in (stock, packed):
                self._warm(server)
            if counts_dir is None:
                return waves
            time.sleep(2 * FLUSH_S)  # the plugin's counters reach their files
            if not any(still_timed(r) for r in read_reports(counts_dir)):
                return waves
        return MAX_WARM_WAVES

    def _load(self, server: ServerProcess, workload: Workload) -> ServingMetrics:
        """The load against one server; a failure says what the server logged last."""
        try:
            return run_load(self.api, server.url, workload, self.vocab)
        except KernelbotError as exc:
            raise KernelbotError(f"{exc}; the {self.opts.engine.value} server's log says: {last_error(server.log_path)}"
                                 f" ({server.log_path})") from None

    # -- profile ----------------------------------------------------------------------------------------------
    def profile(self, name: str, trace: Path, pack: Pack, pack_dir: Path) -> tuple[list[Path], list[PluginReport]]:
        """The worker traces of one profiled load (with the pack when it has kernels) and what every process's plugin
        captured; `trace` gets the first worker's trace."""
        setup = self._setup(name, pack, pack_dir, capture=True, profile=True)
        assert setup.profile_dir is not None
        setup.profile_dir.mkdir(parents=True)  # vLLM makes it; SGLang writes into it as given
        t0 = time.perf_counter()
        with self._server(name, setup) as server:
            server.wait_ready()
            self.say(f"      {name}: {self.opts.engine.value} {self.version} ready in {time.perf_counter() - t0:.0f} s "
                     f"on port {server.port}")
            self._warm(server)
            assert setup.counts_dir is not None
            time.sleep(2 * FLUSH_S)  # the plugin's counters reach their files
            before = read_reports(setup.counts_dir)
            path, body = self.api.start_profile(setup.profile_dir)
            post(server.url + path, body)
            self._load(server, self.profiled_wave())
            post(server.url + "/stop_profile", {})
            traces = _collected(setup.profile_dir, self.opts.tp)
            time.sleep(2 * FLUSH_S)
            self.worker_cores = server.bound_cores()
        shutil.copyfile(traces[0], trace)
        # the traced window's calls: the trace's time is spread over them, and its floor counts them (the warm-up's
        # and the engine's start-up runs would inflate both)
        return traces, captured_since(before, read_reports(setup.counts_dir))

    # -- measure ----------------------------------------------------------------------------------------------
    def measure(self, pack: Pack, pack_dir: Path, rounds: int, twin: TwinLogprobs) -> tuple[ServedComparison, Fidelity]:
        """Stock and packed servers side by side: interleaved rounds of the same load, the fidelity probe, the
        pack server's counters."""
        where = f"measure_{pack.version.rsplit('+', 1)[-1]}"  # each pack measured has its own servers' records
        stock_setup, pack_setup = self._setup(f"{where}/stock", None, pack_dir), self._setup(
            f"{where}/with_pack", pack, pack_dir)
        with self._server(f"{where}/stock", stock_setup) as stock, \
                self._server(f"{where}/with_pack", pack_setup) as packed:
            stock.wait_ready()  # both started side by side
            packed.wait_ready()
            self.say(f"      stock and packed {self.opts.engine.value} servers up (ports {stock.port}, {packed.port})")
            waves = self._warm_past_timing(stock, packed, pack_setup.counts_dir)
            self.say(f"      both warmed with {waves} wave(s) of the load")
            since = host.sample()
            results: dict[str, list[ServingMetrics]] = {"stock": [], "with_pack": []}
            for i in range(rounds):
                order = [("stock", stock), ("with_pack", packed)]
                for name, server in order if i % 2 == 0 else order[::-1]:
                    for other in (stock, packed):  # each round starts with both engines idle
                        other.settle()
                    w = self.workload.model_copy(update={"seed": self.workload.seed + i})
                    results[name].append(self._load(server, w))
                s, p = results["stock"][-1], results["with_pack"][-1]
                self.say(f"      round {i + 1}/{rounds}: stock {s.output_throughput:.1f} tok/s, with the pack "
                         f"{p.output_throughput:.1f} tok/s")
            load = host.host_load(since)
            fidelity = self._fidelity(stock, packed, twin)
            command, cores = packed.reproduce(), stock.bound_cores()
            time.sleep(2 * FLUSH_S)  # the plugin's counters reach their files
        assert pack_setup.counts_dir is not None
        reports = read_reports(pack_setup.counts_dir)
        comparison = _comparison(self.opts.engine.value, self.version, command, results, reports, load)
        return comparison.model_copy(update=self._ceiling(comparison, cores)), fidelity

    def _ceiling(self, comparison: ServedComparison, cores: list[int]) -> dict[str, object]:
        """The ceiling measured now, the servers stopped (vLLM: its in-process executor on the stock worker's
        `cores`); else a note why not."""
        if self.opts.engine is not EngineKind.VLLM:
            return {"notes": [*comparison.notes, "the served ceiling is measured on vLLM only"]}
        self.say("      the ceiling: the model's forward timed in one vLLM process under the same load")
        try:
            ceiling = measure_ceiling(self.opts.python, self.model_dir, self.spec.dtype, self.workload.concurrency,
                                      self.workload.input_len, self.workload.output_len,
                                      self.limits or served_memory(self.spec, self.workload, self.opts.tp).limits,
                                      self.vocab, comparison.stock, cores)
        except KernelbotError as exc:
            return {"notes": [*comparison.notes, f"no served ceiling: {exc}"]}
        self.say(f"      {ceiling.summary()}")
        return {"ceiling": ceiling}

    def _fidelity(self, stock: ServerProcess, packed: ServerProcess,
                  twin: TwinLogprobs) -> Fidelity:
        # at least as many prompts as the load has in flight, all at once: the probe's decode steps run at the rows
        # the load's do, which the pack's kernels were made for (a generic kernel takes only its captured shapes)
        prompts = random_prompts(max(self.opts.probe_prompts, self.workload.concurrency), self.workload.input_len,
                                 self.vocab, seed=10_001)
        tokens = self.workload.output_len
        with ThreadPoolExecutor(max_workers=self.workload.concurrency) as pool:
            stock_out = list(pool.map(lambda p: generate(self.api, stock.url, p, tokens, top_logprobs=fid.TOP_K),
                                      prompts))
            pack_out = list(pool.map(lambda p: generate(self.api, packed.url, p, tokens, top_logprobs=fid.TOP_K),
                                     prompts))
        contexts = [p + g.tokens for p, g in zip(prompts, stock_out, strict=True)]
        stock_top = [t for c in contexts for t in generate(self.api, stock.url, c, 1,
                                                           prompt_logprobs=fid.TOP_K).prompt_top]
        pack_top = [t for c in contexts for t in generate(self.api, packed.url, c, 1,
                                                          prompt_logprobs=fid.TOP_K).prompt_top]
        # the decode steps too, where a pack's decode-sized kernels run (a prompt's logprobs come from one prefill):
        # each prompt's steps up to the first token the servers chose apart, whose contexts are still the same
        steps = [fid.same_context_steps(s, p) for s, p in zip(stock_out, pack_out, strict=True)]
        exact = None
        expected = sum(len(c) - 1 for c in contexts)
        if len(stock_top) != expected or len(pack_top) != expected:
            self.say("      the servers returned no prompt logprobs for every position: fidelity judges greedy parity "
                     "and repetition only")
            stock_top = pack_top = []
        else:
            stock_top += [t for g, n in zip(stock_out, steps, strict=True) for t in g.top[:n]]
            pack_top += [t for g, n in zip(pack_out, steps, strict=True) for t in g.top[:n]]
            # each row's (context, position): every prompt position, then each compared decode step (row j of a
            # context predicts its token j + 1); the twin is asked for the tokens either server ranked there only
            where = [(ci, pos) for ci, c in enumerate(contexts) for pos in range(len(c) - 1)]
            where += [(ci, len(p) - 1 + k) for ci, (p, n) in enumerate(zip(prompts, steps, strict=True))
                      for k in range(n)]
            wanted: list[dict[int, set[int]]] = [{} for _ in contexts]
            for (ci, pos), s, q in zip(where, stock_top, pack_top, strict=True):
                wanted[ci].setdefault(pos, set()).update(s, q)
            try:
                values = twin(contexts, wanted)
            except KernelbotError as exc:
                self.say(f"      no float64 twin ({exc}): fidelity judges greedy parity and repetition only")
            else:
                exact = [values[ci][pos] for ci, pos in where]
        return fid.served_fidelity([g.tokens for g in stock_out], [g.tokens for g in pack_out], stock_top, pack_top,
                                   exact)


WORKER_TRACE = re.compile(r"(^|_)rank\d+\.|-TP-\d+")  # a worker's trace, not the API server's


def _collected(out_dir: Path, ranks: int, timeout: float = 300.0) -> list[Path]:
    """The workers' traces, once every rank's file exists and none grew since the last look (ranks write after
    /stop_profile returns, each at its own pace). vLLM names them rank<N>.* (dp0_pp0_tp0_dcp0_ep0_rank<N>.* for a
    MoE model), SGLang *-TP-<N>.*."""
    deadline = time.monotonic() + timeout
    sizes: dict[Path, int] = {}
    while time.monotonic() < deadline:
        traces = sorted(p for p in out_dir.glob("*.trace.json.gz") if WORKER_TRACE.search(p.name))
        now = {t: t.stat().st_size for t in traces}
        if len(traces) >= ranks and now == sizes and all(_whole_gzip(t) for t in traces):
            return traces
        sizes = now
        time.sleep(1.0)
    raise KernelbotError(f"the server's profiler wrote {len(sizes)} complete worker trace(s) of {ranks} in {out_dir}")


def _whole_gzip(path: Path) -> bool:
    """Whether the file is a gzip stream to its end (its trailer written): a profiler still compressing its trace
    can pause longer than a look apart, and a size that held still for one look is no proof the file is done."""
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 24):
                pass
        return True
    except (EOFError, OSError):
        return False


def _median(rounds: list[ServingMetrics]) -> ServingMetrics:
    median = sorted(rounds, key=lambda m: m.output_throughput)[len(rounds) // 2].model_copy()
    median.round_throughputs = [m.output_throughput for m in rounds]
    return median


def still_timed(report: PluginReport) -> bool:
    """Whether a kernel that took calls in this process is still being timed beside the engine's own path."""
    return any(c.calls and c.timed < PROBE_CALLS and not c.disabled for c in report.custom.values())


def ran_layers(report: PluginReport) -> bool:
    """Whether the engine process ran any layer kernelbot hooks: routed, fallen back or captured."""
    return bool(report.fallback or report.captures or any(c.calls + c.captured for c in report.custom.values()))


def _comparison(engine: str, version: str, command: str, results: dict[str, list[ServingMetrics]],
                reports: list[PluginReport], load: host.HostLoad) -> ServedComparison:
    stock, packed = _median(results["stock"]), _median(results["with_pack"])
    workers = [r for r in reports if ran_layers(r)]  # (an API server loads the pack too, and runs no layer)
    engaged = bool(workers) and all(sum(c.calls + c.captured for c in r.custom.values()) > 0 for r in workers)
    notes = [] if engaged else ["the pack's kernels did not run in every engine process that ran layers: no gain is "
                                "claimed"]
    gain = packed.output_throughput / stock.output_throughput if engaged else None
    separated = min(packed.round_throughputs) > max(stock.round_throughputs) or \
        max(packed.round_throughputs) < min(stock.round_throughputs)
    if gain is not None and not separated:
        notes.append(f"throughput {gain:.2f}x is within the rounds' noise (the two servers' rounds overlap)")
    return ServedComparison(engine=engine, version=version, command=command, stock=stock, with_pack=packed,
                            stock_rounds=results["stock"], pack_rounds=results["with_pack"], throughput_gain=gain,
                            beyond_noise=separated, engaged=engaged, processes=reports, notes=notes, host=load)


def round_ms(rounds: list[ServingMetrics]) -> list[float]:
    """Each round's wall time in ms (the same tokens every round: the ratio of times is that of throughputs)."""
    return [round(m.duration_s * 1e3, 2) for m in rounds]

