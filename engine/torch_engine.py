"""In-process PyTorch/transformers engine; the built-in default model lives here."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch

from kernelbot import KernelbotError
from kernelbot.engine.patching import PackPatcher
from kernelbot.records import ModelSpec, Pack

BUILTIN_MODELS = {
    # The default stays exactly this so numbers compare across versions.
    "llama-tiny": dict(layers=4, hidden=512, heads=8, intermediate=1376, vocab=4000),
    "llama-micro": dict(layers=2, hidden=128, heads=4, intermediate=344, vocab=512),
}


@functools.cache
def cache_kwarg() -> str:
    """transformers 5 renamed `past_key_values` to `cache` (the old name still works, with a warning)."""
    import inspect

    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


def cpu_has_fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def builtin_spec(
    name: str = "llama-tiny",
    dtype: str = "auto",
    batch: int = 8,
    prompt_len: int = 32,
    decode_steps: int = 32,
    seed: int = 0,
) -> tuple[ModelSpec, list[str]]:
    """The spec for a built-in model; dtype 'auto' is bf16 where the CPU has native bf16, else fp32."""
    if name not in BUILTIN_MODELS:
        raise KernelbotError(f"unknown model {name!r}: choose one of {', '.join(BUILTIN_MODELS)}")
    notes = []
    if dtype == "auto":
        if cpu_has_fast_bf16():
            dtype = "bfloat16"
        else:
            dtype = "float32"
            notes.append("this CPU lacks avx512_bf16/amx_bf16, so bf16 runs emulated; the workload runs in fp32")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise KernelbotError(f"unsupported dtype {dtype!r}: use float32, bfloat16 or float16")
    if min(batch, prompt_len) < 1 or decode_steps < 0:
        raise KernelbotError("batch and prompt length must be at least 1 and decode steps not negative")
    return ModelSpec(name=name, dtype=dtype, batch=batch, prompt_len=prompt_len,
                     decode_steps=decode_steps, seed=seed, **BUILTIN_MODELS[name]), notes


def build_llama(spec: ModelSpec) -> torch.nn.Module:
    """A Llama-architecture decoder from a transformers LlamaConfig with seeded random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=spec.hidden, intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.heads, vocab_size=spec.vocab,
        max_position_embeddings=max(256, spec.prompt_len + spec.decode_steps),
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    return model.to(getattr(torch, spec.dtype)).eval()


class TorchEngine:
    """Runs a transformers causal LM in this process, the way a serving engine would:
    a batch of prompts through prefill, then greedy decode steps over the KV cache."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.model = build_llama(spec)
        gen = torch.Generator().manual_seed(spec.seed + 1)
        self.prompts = torch.randint(0, spec.vocab, (spec.batch, spec.prompt_len), generator=gen)
        self.patcher = PackPatcher(self.model)

    @torch.inference_mode()
    def generate(self, record_logits: bool = False,
                 forced: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Greedy decoding; with `forced` ([batch, decode_steps + 1] tokens), each step is fed the forced token
        instead of its own choice (teacher forcing), so logits compare in the same contexts."""
        out = self.model(input_ids=self.prompts, use_cache=True)
        cache = out[cache_kwarg()]
        logits = [out.logits[:, -1].double()] if record_logits else []
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for step in range(self.spec.decode_steps):
            fed = tokens[-1] if forced is None else forced[:, step:step + 1]
            out = self.model(input_ids=fed, use_cache=True, **{cache_kwarg(): cache})
            cache = out[cache_kwarg()]
            if record_logits:
                logits.append(out.logits[:, -1].double())
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(tokens, dim=1), logits

    def run_workload(self) -> torch.Tensor:
        return self.generate()[0]

    def profile(self, trace_path: Path) -> None:
        from kernelbot.profiler.capture import profile_callable

        self.run_workload()  # warm-up outside the trace
        profile_callable(self.run_workload, trace_path)

    def apply_pack(self, pack: Pack, pack_dir: Path) -> None:
        self.patcher.apply(pack, pack_dir)

    def remove_pack(self) -> None:
        self.patcher.remove()

    def in_float64(self) -> TorchEngine:
        """The same model and prompts in float64: how far the model's own dtype is from exact arithmetic."""
        twin = object.__new__(TorchEngine)
        twin.spec, twin.prompts = self.spec, self.prompts
        twin.model = copy.deepcopy(self.model).to(torch.float64)
        twin.patcher = PackPatcher(twin.model)
        return twin

    def compiled(self) -> TorchEngine:
        """The same engine with the model under torch.compile (dynamic shapes: decode grows the cache)."""
        twin = object.__new__(TorchEngine)
        twin.spec, twin.prompts, twin.patcher = self.spec, self.prompts, self.patcher
        twin.model = torch.compile(self.model, dynamic=True)
        return twin
