"""What kernels can gain at most in a served model: the model's forward and LM head in a decode step, timed with the
engine in one process (vLLM's in-process executor; the same model, dtype, limits and load) on the cores the server
binds its worker to, against the served decode step (the stock server's inter-token latency). Two bounds:

- the whole forward free: no kernel can beat the step without it;
- the forward at a plain read's speed: a decode step at these rows streams the model's weights, and nothing reads
  them faster than a plain read of the same bytes on the same cores (the roofline of the step). Over the load, the
  decode steps at that speed and the rest (prefill, scheduling) as measured bound the throughput gain.

Run under the engine's own Python, which has vLLM (kernelbot is installed there for its plugin):

    python -m kernelbot.engine.serving.ceiling MODEL_DIR DTYPE BATCH PROMPT_LEN OUTPUT_LEN CONTEXT_LEN KV_BYTES VOCAB

prints the median decode step's forward and the read, in ms, as JSON. The served run (engine/serving/served_engine.py)
and benchmarks/served_ceiling.py call it so, bound to the worker's cores.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from kernelbot import KernelbotError
from kernelbot.engine.serving.load import random_prompts
from kernelbot.engine.serving.sizing import ServerLimits
from kernelbot.records import ServedCeiling, ServingMetrics

READS = 3  # plain reads of the weights; the fastest is the bound


class StepTiming(BaseModel):
    """A decode step's forward and LM head (median over one wave of the load), and a plain read of the weights."""

    forward_ms: float
    read_ms: float
    read_gb: float


def step_timing(model_dir: Path, dtype: str, batch: int, prompt_len: int, output_len: int, limits: ServerLimits,
                vocab: int) -> StepTiming:
    """The engine in this process: the median decode step's model.forward plus its compute_logits over one wave of
    `batch` prompts (warmed on other prompts, so the wave's prefill is not a prefix-cache hit), then the fastest of
    READS plain reads of as many bytes as the weights a decode step streams."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
              max_model_len=limits.context_len, kv_cache_memory_bytes=limits.kv_cache_bytes, disable_log_stats=True)
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)

    def wave(seed: int) -> list[TokensPrompt]:
        return [TokensPrompt(prompt_token_ids=p) for p in random_prompts(batch, prompt_len, vocab, seed=seed)]

    llm.generate(wave(1), params, use_tqdm=False)  # warm
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    steps: list[list[float]] = []  # per forward: [rows, forward s, logits s]
    forward, logits = model.forward, model.compute_logits

    def timed_forward(*args: object, **kwargs: object) -> object:
        ids = kwargs.get("input_ids", args[0] if args else None)
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        steps.append([getattr(ids, "shape", [0])[0], time.perf_counter() - start, 0.0])
        return out

    def timed_logits(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        out = logits(*args, **kwargs)
        if steps:
            steps[-1][2] += time.perf_counter() - start
        return out

    model.forward, model.compute_logits = timed_forward, timed_logits
    llm.generate(wave(0), params, use_tqdm=False)
    model.forward, model.compute_logits = forward, logits
    decode = [f + g for rows, f, g in steps if 0 < rows <= batch] or [f + g for _, f, g in steps[1:]]
    del llm, model
    nbytes = streamed_elements(model_dir) * getattr(torch, dtype).itemsize
    return StepTiming(forward_ms=statistics.median(decode) * 1e3, read_ms=_plain_read(nbytes) * 1e3,
                      read_gb=nbytes / 1e9)


def streamed_elements(model_dir: Path) -> int:
    """The weights a decode step reads whole, counted from the checkpoint's safetensors headers (the engine may keep
    them repacked, off its modules' parameters): every tensor but an input embedding, which gives only the step's
    rows, unless no separate LM head shares its reading (tied embeddings)."""
    index = model_dir / "model.safetensors.index.json"
    files = (sorted({model_dir / f for f in json.loads(index.read_text())["weight_map"].values()}) if index.is_file()
             else [model_dir / "model.safetensors"])
    shapes: dict[str, list[int]] = {}
    for f in files:
        with open(f, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    untied = any("lm_head" in k for k in shapes)
    return sum(math.prod(shape) for k, shape in shapes.items() if not (untied and "embed" in k))


def _plain_read(nbytes: int) -> float:
    """Seconds of the fastest of READS sums over `nbytes` of fp32 words (the least work a read of them can do)."""
    import torch

    words = torch.ones(max(1, nbytes // 4))
    best = float("inf")
    for _ in range(READS):
        start = time.perf_counter()
        words.sum()
        best = min(best, time.perf_counter() - start)
    return best


def measure_ceiling(python: list[str], model_dir: Path, dtype: str, batch: int, prompt_len: int, output_len: int,
                    limits: ServerLimits, vocab: int, stock: ServingMetrics, cores: list[int],
                    timeout: float = 1800.0) -> ServedCeiling:
    """The ceiling of a served load whose stock median round is `stock`: the step timed by `python` (the engine's)
    running this module on `cores` (the server's worker's; all of them when empty)."""
    argv = [*python, "-m", __name__, str(model_dir), dtype, str(batch), str(prompt_len), str(output_len),
            str(limits.context_len), str(limits.kv_cache_bytes), str(vocab)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise KernelbotError(f"the forward could not be timed in the engine's process ({last})")
    timing = StepTiming.model_validate_json(done.stdout.strip().splitlines()[-1])
    return ceiling_of(timing, stock, batch, cores)


def ceiling_of(timing: StepTiming, stock: ServingMetrics, concurrency: int, cores: list[int]) -> ServedCeiling:
    """The bounds `timing` puts on the stock load: a step is the ITL p50; a round's decode steps are its tokens after
    each request's first, `concurrency` at a time; the rest of the round (prefill, scheduling) stays as measured."""
    step, forward = stock.median_itl_ms, timing.forward_ms
    rest = max(step - forward, 0.0)  # a forward timed at or over the step (one process's noise) leaves nothing else
    free = step / rest if rest > 0 else None
    at_read = step / (rest + timing.read_ms) if timing.read_ms < min(forward, step) else None
    load = None
    if at_read is not None and stock.duration_s > 0:
        decode_s = (stock.output_tokens - stock.requests) / concurrency * step / 1e3
        saved = min(decode_s, stock.duration_s) * (1 - 1 / at_read)
        load = stock.duration_s / (stock.duration_s - saved)
    return ServedCeiling(step_ms=round(step, 2), forward_ms=round(forward, 2), share=round(forward / step, 3),
                         max_gain=None if free is None else round(free, 2), cores=cores,
                         read_ms=round(timing.read_ms, 2), read_gbps=round(timing.read_gb / timing.read_ms * 1e3, 1),
                         read_gain=None if at_read is None else round(at_read, 2),
                         load_read_gain=None if load is None else round(load, 2))


def main(argv: list[str]) -> None:
    model_dir, dtype, batch, prompt_len, output_len, context_len, kv_bytes, vocab = argv
    limits = ServerLimits(context_len=int(context_len), kv_cache_bytes=int(kv_bytes), kv_tokens=0)
    timing = step_timing(Path(model_dir), dtype, int(batch), int(prompt_len), int(output_len), limits, int(vocab))
    print(timing.model_dump_json())


if __name__ == "__main__":
    main(sys.argv[1:])
