"""SGLang as a kernelbot engine on a GPU node: launch the server, drive a serving workload, capture
per-rank traces through /start_profile, shut down, report serving numbers and whether a pack engaged."""

from __future__ import annotations

import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError
from kernelbot.engine.sglang_plugin import COUNTS_ENV, PACK_ENV, PLUGIN_NAME
from kernelbot.records import ServingMetrics


@dataclass
class Workload:
    num_prompts: int = 64
    input_len: int = 512
    output_len: int = 128
    concurrency: int = 16
    seed: int = 0


@dataclass
class ServerConfig:
    model_path: str
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    disable_cuda_graph: bool = False  # set when kernels must map back to source in the traces
    extra_args: list[str] = field(default_factory=list)
    pack_dir: Path | None = None  # activates the kernelbot plugin with this pack
    counts_dir: Path | None = None
    profile_dir: Path | None = None
    launch_cmd: list[str] = field(default_factory=lambda: [sys.executable, "-m", "sglang.launch_server"])
    ready_timeout: float = 900.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def native_switches(config: ServerConfig, env: dict[str, str] | None = None) -> list[str]:
    """What makes SGLang's layers run forward_native instead of their optimised kernels: measured against
    those, a pack's gain is not a gain over what the fleet serves."""
    env = os.environ if env is None else env
    notes = []
    if "--enable-torch-compile" in config.extra_args:
        notes.append("--enable-torch-compile: compiled batch sizes run forward_native (the plugin falls back "
                     "there), so baseline and pack both measure SGLang's native path for them")
    if env.get("SGLANG_FORCE_FUSED_OP_BACKEND"):
        notes.append(f"SGLANG_FORCE_FUSED_OP_BACKEND={env['SGLANG_FORCE_FUSED_OP_BACKEND']}: the baseline runs "
                     "that backend, not SGLang's default kernels")
    return notes


class SGLangServer:
    """`python -m sglang.launch_server` in its own process group; stopped (group and all) on exit."""

    def __init__(self, config: ServerConfig, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        c = self.config
        cmd = [*c.launch_cmd, "--model-path", c.model_path, "--tp", str(c.tp), "--host", c.host,
               "--port", str(c.port)]
        if c.disable_cuda_graph:
            cmd.append("--disable-cuda-graph")
        return cmd + c.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        c = self.config
        if c.pack_dir is not None:
            env.update({"SGLANG_PLUGINS": PLUGIN_NAME, PACK_ENV: str(c.pack_dir.resolve())})
            if c.counts_dir is not None:
                env[COUNTS_ENV] = str(c.counts_dir.resolve())
        else:
            env.pop(PACK_ENV, None)
        if c.profile_dir is not None:
            env["SGLANG_TORCH_PROFILER_DIR"] = str(c.profile_dir.resolve())
        return env

    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.ready_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise KernelbotError(f"sglang server exited with code {self.proc.returncode} before it was ready; "
                                     f"see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.config.url}/health_generate", timeout=30) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise KernelbotError(f"sglang server not ready after {self.config.ready_timeout:.0f} s; see {self.log_path}")

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to the server's process group (schedulers, detokenizer), SIGKILL what is left after grace."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own group
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=grace)


def _post(url: str, body: dict[str, Any], timeout: float = 600.0) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def _one_request(url: str, prompt: list[int], output_len: int) -> tuple[float, list[float], int]:
    """Stream one /generate request; (TTFT s, inter-token gaps s, output tokens)."""
    body = {"input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0.0}}
    req = urllib.request.Request(f"{url}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = last = time.perf_counter()
    ttft, gaps, tokens = None, [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            done = json.loads(line[5:]).get("meta_info", {}).get("completion_tokens", tokens + 1)
            new = max(done - tokens, 0)
            if new == 0:
                continue
            if ttft is None:
                ttft = now - start
                new -= 1
            if new:
                gaps.extend([(now - last) / new] * new)
            tokens, last = done, now
    return (ttft or 0.0), gaps, tokens


def run_workload(url: str, workload: Workload, vocab: int = 1000) -> ServingMetrics:
    """The built-in request generator: random prompts of input_len tokens, output_len greedy tokens each,
    `concurrency` requests in flight."""
    from kernelbot.engine.telemetry import snapshot

    prompts = random_prompts(workload.num_prompts, workload.input_len, vocab, workload.seed)
    results: list[tuple[float, list[float], int]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not prompts:
                    return
                prompt = prompts.pop()
            try:
                res = _one_request(url, prompt, workload.output_len)
            except (OSError, ValueError) as exc:
                with lock:
                    errors.append(repr(exc))
                continue
            with lock:
                results.append(res)

    before = snapshot()
    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(max(1, workload.concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    if errors or not results:
        raise KernelbotError(f"{len(errors)} of {workload.num_prompts} requests failed: {errors[:1]}")
    ttfts = [r[0] * 1e3 for r in results]
    itls = [g * 1e3 for r in results for g in r[1]] or [0.0]
    tokens = sum(r[2] for r in results)
    return ServingMetrics(source="kernelbot generator", requests=len(results), output_tokens=tokens,
                          duration_s=duration, output_throughput=tokens / duration,
                          mean_ttft_ms=statistics.fmean(ttfts), median_ttft_ms=statistics.median(ttfts),
                          mean_itl_ms=statistics.fmean(itls), median_itl_ms=statistics.median(itls),
                          telemetry={"before": before, "after": snapshot()})


def bench_serving(config: ServerConfig, workload: Workload, out_file: Path) -> ServingMetrics:
    """SGLang's own `bench_serving` (random dataset) against the running server."""
    from kernelbot.engine.telemetry import snapshot

    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", config.host,
           "--port", str(config.port), "--dataset-name", "random", "--random-input-len", str(workload.input_len),
           "--random-output-len", str(workload.output_len), "--random-range-ratio", "1.0",
           "--num-prompts", str(workload.num_prompts), "--max-concurrency", str(workload.concurrency),
           "--seed", str(workload.seed), "--output-file", str(out_file)]
    before = snapshot()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelbotError(f"sglang.bench_serving failed: {proc.stderr.strip().splitlines()[-1:]}")
    row = json.loads(out_file.read_text().strip().splitlines()[-1])
    return ServingMetrics(source="sglang.bench_serving", requests=row["completed"],
                          output_tokens=row["total_output_tokens"], duration_s=row["duration"],
                          output_throughput=row["output_throughput"], mean_ttft_ms=row["mean_ttft_ms"],
                          median_ttft_ms=row["median_ttft_ms"], mean_itl_ms=row["mean_itl_ms"],
                          median_itl_ms=row["median_itl_ms"], telemetry={"before": before, "after": snapshot()})


def profile(config: ServerConfig, workload: Workload, out_dir: Path, timeout: float = 300.0,
            vocab: int = 1000) -> list[Path]:
    """Profile the workload through /start_profile (shapes and stacks), then collect one trace per rank."""
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.trace.json.gz"))
    _post(f"{config.url}/start_profile", {"output_dir": str(out_dir.resolve()), "activities": ["CPU", "GPU"],
                                          "record_shapes": True, "with_stack": True, "profile_id": "kernelbot"})
    run_workload(config.url, workload, vocab)
    _post(f"{config.url}/stop_profile", {})
    deadline = time.monotonic() + timeout
    sizes: dict[Path, int] = {}
    while time.monotonic() < deadline:  # ranks write their traces after stop returns, each at its own pace
        traces = sorted(set(out_dir.glob("*.trace.json.gz")) - before)
        now = {t: t.stat().st_size for t in traces}
        if len(traces) >= config.tp and now == sizes:  # and no file grew since the last look
            return traces
        sizes = now
        time.sleep(1.0)
    raise KernelbotError(f"/start_profile wrote {len(sizes)} complete trace(s) for {config.tp} rank(s) in {out_dir}")


def greedy_probe(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict[str, list]]:
    """Greedy outputs with the chosen tokens' logprobs, one request per prompt (what fidelity compares)."""
    out = []
    for prompt in prompts:
        body = {"input_ids": prompt, "return_logprob": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}}
        reply = json.loads(_post(f"{url}/generate", body))
        logprobs = reply["meta_info"]["output_token_logprobs"]
        out.append({"ids": [int(t[1]) for t in logprobs], "logprobs": [float(t[0]) for t in logprobs]})
    return out


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts of `length` token ids, seeded (ids below 10 are left out: special tokens in most vocabularies)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def model_config(model_path: str) -> dict[str, Any]:
    """The served model's config.json (hidden size, norm epsilon...), or {} when the path is not local."""
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KernelbotError(f"{path}: not a readable model config ({exc}); fix it or pass another --model") from None


def trace_kernel_hits(traces: list[Path], names: list[str]) -> dict[str, int]:
    """Per trace (rank), how many GPU kernel launches carry one of `names`: the proof that a pack kernel ran
    on CUDA-graph replays, where the plugin's Python wrapper does not run."""
    hits = {}
    for path in traces:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        hits[path.name] = sum(1 for e in events if e.get("cat") == "kernel" and any(n in e.get("name", "")
                                                                                     for n in names))
    return hits


@dataclass
class Engagement:
    engaged: bool
    per_rank: dict[int | None, dict[str, Any]]
    notes: list[str]


def engagement(counts: list[dict[str, Any]], expected_ranks: int,
               trace_hits: dict[str, int] | None = None) -> Engagement:
    """Did the pack run in every rank? Counts from the plugin in each process (custom path, graph-capture
    runs, fallbacks by reason); under CUDA graphs, replays are confirmed by trace_hits instead."""
    per_rank: dict[int | None, dict[str, Any]] = {}
    for c in counts:
        custom = sum(v["calls"] for v in c["custom"].values())
        captured = sum(v["captured"] for v in c["custom"].values())
        fallback = sum(n for reasons in c["fallback"].values() for n in reasons.values())
        per_rank[c["rank"]] = {"custom_calls": custom, "captured_calls": captured, "fallback_calls": fallback,
                               "fallback_reasons": c["fallback"], "unrouted": c["unrouted"]}
    notes = []
    if len(per_rank) < expected_ranks:
        notes.append(f"counters from {len(per_rank)} of {expected_ranks} ranks: the plugin did not load everywhere")
    for rank, r in per_rank.items():
        if r["custom_calls"] == 0 and r["captured_calls"] == 0:
            notes.append(f"rank {rank}: the pack's kernels ran zero times ({r['fallback_calls']} fallbacks: "
                         f"{r['fallback_reasons']})")
        elif r["custom_calls"] == 0:
            hits = sum((trace_hits or {}).values())
            if hits == 0:
                notes.append(f"rank {rank}: pack kernels ran only at CUDA-graph capture and no trace shows "
                             "them replayed")
    return Engagement(engaged=not notes, per_rank=per_rank, notes=notes)


def compare(before: ServingMetrics, after: ServingMetrics, engaged: Engagement,
            switches: list[str]) -> dict[str, Any]:
    """Serving numbers before and after; a gain is claimed only when the pack engaged in every rank."""
    result: dict[str, Any] = {"notes": [*engaged.notes, *switches]}
    if engaged.engaged:
        result["throughput_gain"] = after.output_throughput / before.output_throughput
        result["itl_gain"] = before.mean_itl_ms / after.mean_itl_ms if after.mean_itl_ms else None
        result["beyond_noise"] = separated(before.round_throughputs, after.round_throughputs)
        if not result["beyond_noise"]:
            result["notes"].append(f"throughput {result['throughput_gain']:.2f}x is within the rounds' noise (the "
                                   "two servers' rounds overlap); run more --serving-rounds to tell")
    else:
        result["throughput_gain"] = None
        result["notes"].append("the pack did not engage: no gain is claimed")
    return result


def separated(before: list[float], after: list[float]) -> bool:
    """Does every round of one server beat every round of the other? With 5 rounds each, chance alone
    separates them 2 times in 252."""
    return bool(before and after) and (min(after) > max(before) or max(after) < min(before))


def require_gpu_node() -> None:
    """`optimize --engine sglang` profiles a served model on CUDA GPUs; say so in one line when absent."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover
        raise KernelbotError("--engine sglang needs torch") from exc
    if not torch.cuda.is_available():
        raise KernelbotError("--engine sglang needs a CUDA GPU (none visible here); run it on a GPU node "
                             "with sglang installed, or use the default in-process engine")
    try:
        import sglang  # noqa: F401
    except ImportError as exc:
        raise KernelbotError("--engine sglang needs the sglang package: pip install 'kernelbot[sglang]'") from exc
