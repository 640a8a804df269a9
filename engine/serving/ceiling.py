"""What kernels can gain at most in a served model: the model's forward in a decode step, timed with the engine in one
process (vLLM's in-process executor, the same model, dtype, limits and load), against the served decode step (the
stock server's inter-token latency). No kernel can beat the step with the whole forward taking no time at all.

Run under the engine's own Python, which has vLLM (kernelbot is installed there for its plugin):

    python -m kernelbot.engine.serving.ceiling MODEL_DIR DTYPE BATCH PROMPT_LEN OUTPUT_LEN CONTEXT_LEN KV_BYTES

prints the median decode step's forward in ms as JSON. The served run (engine/serving/served_engine.py) and
benchmarks/served_ceiling.py call it so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.engine.serving.load import random_prompts
from kernelbot.engine.serving.sizing import ServerLimits
from kernelbot.records import ServedCeiling


def forward_ms(model_dir: Path, dtype: str, batch: int, prompt_len: int, output_len: int, limits: ServerLimits,
               vocab: int) -> float:
    """The median decode step of vLLM's model.forward over one wave of the load, the engine in this process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
              max_model_len=limits.context_len, kv_cache_memory_bytes=limits.kv_cache_bytes, disable_log_stats=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in random_prompts(batch, prompt_len, vocab, seed=0)]
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    llm.generate(prompts, params, use_tqdm=False)  # warm
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    steps: list[float] = []
    forward = model.forward

    def timed(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        steps.append(time.perf_counter() - start)
        return out

    model.forward = timed
    llm.generate(prompts, params, use_tqdm=False)
    decode = steps[1:] if len(steps) > 1 else steps  # steps[0] is the prefill (one chunk at these sizes)
    return statistics.median(decode) * 1e3


def measure_ceiling(python: list[str], model_dir: Path, dtype: str, batch: int, prompt_len: int, output_len: int,
                    limits: ServerLimits, vocab: int, step_ms: float, timeout: float = 1800.0) -> ServedCeiling:
    """The forward's share of the served step (`step_ms`, the stock server's ITL p50) and the gain with the forward
    free, the forward timed by `python` (the engine's) running this module."""
    argv = [*python, "-m", __name__, str(model_dir), dtype, str(batch), str(prompt_len), str(output_len),
            str(limits.context_len), str(limits.kv_cache_bytes), str(vocab)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise KernelbotError(f"the forward could not be timed in the engine's process ({last})")
    forward = float(json.loads(done.stdout.strip().splitlines()[-1])["forward_ms"])
    free = step_ms / max(step_ms - forward, 1e-9) if forward < step_ms else None
    return ServedCeiling(step_ms=round(step_ms, 2), forward_ms=round(forward, 2), share=round(forward / step_ms, 3),
                         max_gain=None if free is None else round(free, 2))


def main(argv: list[str]) -> None:
    model_dir, dtype, batch, prompt_len, output_len, context_len, kv_bytes, vocab = argv
    limits = ServerLimits(context_len=int(context_len), kv_cache_bytes=int(kv_bytes), kv_tokens=0)
    ms = forward_ms(Path(model_dir), dtype, int(batch), int(prompt_len), int(output_len), limits, int(vocab))
    print(json.dumps({"forward_ms": ms}))


if __name__ == "__main__":
    main(sys.argv[1:])
