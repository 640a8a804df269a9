"""What a model needs in memory, read from its config alone (nothing is built or loaded): its weights' bytes at the
run's dtype and its KV cache's bytes per token; and what the host (or a GPU) has free. Sizing decisions (an engine
server's limits, whether a run fits) start here, before anything large is allocated.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from kernelbot import KernelbotError
from kernelbot.dtypes import DTYPE_BYTES
from kernelbot.engine.models import int_attribute, spec_config, text_config
from kernelbot.records import ModelSpec

GIB = 1 << 30


class ModelFootprint(BaseModel):
    """A model's sizes that memory depends on."""

    model_config = ConfigDict(frozen=True)

    parameters: int  # distinct parameters (tied embeddings once)
    dtype_bytes: int  # of the run's dtype
    kv_bytes_per_token: int  # every layer's cached keys and values for one token, at the run's dtype
    activation_bytes_per_token: int  # one layer's widest fp32 activations for one token (MLP in and out, attention)
    max_positions: int | None  # the config's max_position_embeddings, where it gives one

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.dtype_bytes


def model_footprint(spec: ModelSpec) -> ModelFootprint:
    """The footprint of a spec's model at its dtype, from its config (a built-in's numbers or config.json)."""
    config = spec_config(spec)
    dtype_bytes = DTYPE_BYTES[spec.dtype]
    text = text_config(config)
    return ModelFootprint(parameters=sum(p.numel() for p in meta_model(spec).parameters()), dtype_bytes=dtype_bytes,
                          kv_bytes_per_token=kv_values_per_token(text) * dtype_bytes,
                          activation_bytes_per_token=activation_values_per_token(text) * 4,
                          max_positions=int_attribute(text, "max_position_embeddings"))


def meta_model(spec: ModelSpec) -> torch.nn.Module:
    """The spec's causal LM at its dtype on the meta device: its shapes, sizes and config, no memory taken
    (parameters() yields a tied tensor once)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(spec_config(spec), trust_remote_code=False)
    return model.to(getattr(torch, spec.dtype))


def kv_values_per_token(text: Any) -> int:
    """How many values one token leaves in the KV cache over all layers: keys and values of every KV head (one head
    for multi-query attention), or the compressed latent and rotary key of multi-head latent attention."""
    layers = int_attribute(text, "num_hidden_layers") or 0
    latent = int_attribute(text, "kv_lora_rank")
    if latent is not None:
        return layers * (latent + (int_attribute(text, "qk_rope_head_dim") or 0))
    heads = int_attribute(text, "num_attention_heads") or 1
    kv_heads = 1 if getattr(text, "multi_query", False) is True else (
        int_attribute(text, "num_key_value_heads") or heads)
    hidden = int_attribute(text, "hidden_size") or 0
    head_dim = int_attribute(text, "head_dim") or hidden // heads
    return layers * 2 * kv_heads * head_dim


def activation_values_per_token(text: Any) -> int:
    """The values one token's activations take at once in a layer: the MLP's gate and up outputs beside four
    hidden-size buffers (its input, the residual, attention's output and a norm's)."""
    hidden = int_attribute(text, "hidden_size") or 0
    intermediate = int_attribute(text, "intermediate_size") or 4 * hidden
    return 4 * hidden + 2 * intermediate


def host_available_bytes() -> int:
    """Memory the host can give a new process now: MemAvailable, or less where this process's cgroup caps it."""
    available = _meminfo_kib("MemAvailable") * 1024
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):  # no cgroup v2 memory controller here
        pass
    return max(available, 0)


def gpu_free_bytes(index: int = 0) -> tuple[int, int]:
    """(free, total) bytes of a GPU."""
    free, total = torch.cuda.mem_get_info(index)
    return int(free), int(total)


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def round_up(n: int, step: int) -> int:
    return math.ceil(n / step) * step


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise OSError(f"/proc/meminfo has no {field}")


def check_in_process_fits(spec: ModelSpec, footprint: ModelFootprint, available_bytes: int, gpu: bool) -> None:
    """One line before an in-process run builds its model, when its peak cannot fit in the free memory of the host
    (or the GPU): the model at its dtype, the pack's kernels' own copies of weights (at most one more copy), the
    float64 twin fidelity compares against (on the host: a GPU run moves it there when the GPU cannot hold it), the
    KV cache of the workload and one prefill's activations."""
    where = "GPU memory" if gpu else "host memory"
    weights = footprint.weight_bytes
    twin = 0 if gpu else footprint.parameters * DTYPE_BYTES["float64"]
    tokens = spec.batch * (spec.prompt_len + spec.decode_steps)
    kv = tokens * footprint.kv_bytes_per_token
    activations = spec.batch * spec.prompt_len * footprint.activation_bytes_per_token
    needed = 2 * weights + twin + kv + activations
    if needed <= available_bytes:
        return
    fix = ("lower --batch, --prompt-len or --decode-steps" if kv + activations > needed / 2 else
           "run a smaller model, or free memory")
    raise KernelbotError(f"{spec.name} in this process needs {gib(needed)} of {where} (weights {gib(weights)}, the "
                         f"pack's copies up to {gib(weights)}, the float64 twin {gib(twin)}, KV cache {gib(kv)}, "
                         f"activations {gib(activations)}) but {gib(available_bytes)} is available; {fix}")
