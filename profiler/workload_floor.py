"""The roofline floor of a whole serving workload (batch × prompt tokens of prefill, then decode steps over the KV
cache) on a device with measured peaks: what no kernel, however good, can beat.

Prefill runs 2 FLOPs per weight per prompt token (the embedding's lookup aside; the LM head's only for each
sequence's last token, the one logits are asked of: transformers' `logits_to_keep=1` in process, vLLM's and SGLang's
own logits) plus causal attention's 2 × 2 × layers × hidden × tokens²/2 per sequence, and reads every weight once.
Each decode step reads every weight (the embedding's rows aside; a tied LM head reads it whole) and each sequence's KV
cache so far, and runs 2 FLOPs per weight per sequence. Each part costs the larger of its FLOPs at the peak FLOP rate
and its bytes at the peak bandwidth.
"""

from __future__ import annotations

import torch

from kernelbot.records import Device, WorkloadFloor


def _sizes(model: torch.nn.Module) -> tuple[float, float, int, int, int]:
    """(weight bytes streamed per step, KV bytes per token, layers, hidden, the LM head's weights) of a transformers
    causal LM."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = {id(embedding.weight)} if embedding is not None and (head is None or head.weight is not embedding.weight) \
        else set()
    weight_bytes = float(sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip))
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(config, "head_dim", 0) or (hidden // heads if heads else 0))
    itemsize = next(model.parameters()).element_size()
    head_weights = head.weight.numel() if head is not None else 0
    return weight_bytes, float(2 * layers * kv_heads * head_dim * itemsize), layers, hidden, head_weights


def workload_floor(model: torch.nn.Module, device: Device, batch: int, prompt_len: int, decode_steps: int,
                   waves: int = 1) -> WorkloadFloor:
    """The floor of `waves` rounds of `batch` sequences, each `prompt_len` tokens then `decode_steps` steps."""
    weight_bytes, kv_per_token, layers, hidden, head = _sizes(model)
    itemsize = next(model.parameters()).element_size()
    weights = weight_bytes / itemsize
    prefill_flops = (2 * (weights - head) * batch * prompt_len + 2 * head * batch
                     + 2 * layers * hidden * prompt_len ** 2 * batch)
    floor_us = device.floor_us(prefill_flops, weight_bytes)
    decode_bytes = 0.0
    for step in range(decode_steps):
        step_bytes = weight_bytes + batch * (prompt_len + step) * kv_per_token
        decode_bytes += step_bytes
        floor_us += device.floor_us(2 * weights * batch, step_bytes)
    return WorkloadFloor(weight_bytes=weight_bytes, kv_bytes_per_token=kv_per_token,
                         prefill_gflop=waves * prefill_flops / 1e9, decode_gb=waves * decode_bytes / 1e9,
                         floor_ms=round(waves * floor_us / 1e3, 3))


def with_shares(floor: WorkloadFloor, times_ms: dict[str, float | None]) -> WorkloadFloor:
    """The floor with each variant's share of it (floor / its median time)."""
    return floor.model_copy(update={"shares": {k: round(floor.floor_ms / v, 4) for k, v in times_ms.items() if v}})
