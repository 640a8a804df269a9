"""kernelbot's CPU attention backend for vLLM: vLLM's own CPU backend (its KV-cache layout, metadata builder and cache
writes), with each attention call routed through engine/router.py — to the pack's paged attention kernel
where it was verified for the call, to vLLM's kernel otherwise. Registered over CPU_ATTN through vLLM's attention
backend registry (`register_backend`) by engine/vllm_plugin.py; imported only inside vLLM's processes."""

from __future__ import annotations

import math
from typing import Any

import torch
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends import cpu_attn

from kernelbot.engine.router import LayerSpec

PARAMS = ("layer", "query", "key", "value", "kv_cache", "attn_metadata", "output", "output_scale",
          "output_block_scale")


def _inputs(call: dict[str, Any]) -> list[torch.Tensor]:
    """What the kernel reads: the step's query rows, the cache, and each request's blocks in use, context lengths and
    query rows (the block table sliced to the blocks the longest context fills)."""
    m = call["attn_metadata"]
    requests = int(m.seq_lens.shape[0])
    blocks = math.ceil(int(m.max_seq_len) / call["kv_cache"].shape[2])
    return [call["query"][:m.num_actual_tokens], call["kv_cache"], m.block_table[:requests, :blocks],
            m.seq_lens[:requests], m.query_start_loc[:requests + 1]]


def _variant(impl: Any, call: dict[str, Any], dtype: str) -> str:
    m = call["attn_metadata"]
    if m is None:
        return "warm-up call"
    if impl.attn_type != AttentionType.DECODER:
        return f"{impl.attn_type} attention"
    if impl.sliding_window != -1 or impl.logits_soft_cap or impl.alibi_slopes is not None or impl.sinks is not None:
        return "sliding window, soft cap, ALiBi or sinks"
    if impl.is_fp8_kv_cache or call.get("output_scale") is not None:
        return "quantised cache or output"
    if m.causal is not True or m.dynamic_causal is not None:
        return "not causal"
    if getattr(call["layer"], "isa", None) != "vec":
        return f"cache layout of ISA {getattr(call['layer'], 'isa', None)} (the kernel reads the 'vec' layout)"
    if any(t.dtype != torch.int32 for t in (m.block_table, m.seq_lens, m.query_start_loc)):
        return "metadata not int32"
    return ""


def _run(kernel: Any, call: dict[str, Any]) -> torch.Tensor:
    inputs = _inputs(call)
    output = call["output"]
    rows = output[:inputs[0].shape[0]]
    rows.copy_(kernel(*inputs).reshape(rows.shape))
    return output


def _outputs(result: torch.Tensor, call: dict[str, Any]) -> list[torch.Tensor]:
    query = _inputs(call)[0]
    return [result[:query.shape[0]].reshape(query.shape)]


ATTENTION = [LayerSpec(
    "paged_attention", PARAMS, inputs=_inputs, run=_run, variant=_variant, outputs=_outputs,
    accepts=lambda call: call.get("attn_metadata") is not None, state=lambda impl: {},
    traced_as=lambda impl, call: type(call["layer"]).__name__, written=("output",), settles=False,
    init_args=lambda impl: [int(impl.num_heads), int(impl.num_kv_heads), int(impl.head_size), float(impl.scale)])]


class CPUAttentionBackendImpl(cpu_attn.CPUAttentionBackendImpl):
    """vLLM's CPU attention implementation, each call through kernelbot's router (same class name: the router keys
    pack entries by it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from kernelbot.engine import vllm_plugin

        super().__init__(*args, **kwargs)
        if vllm_plugin.ROUTER is not None:
            vllm_plugin.note_step_rows(vllm_plugin.ROUTER)  # a pack of attention alone builds no other hooked class

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        from kernelbot.engine import vllm_plugin

        router = vllm_plugin.ROUTER
        if router is None:
            return super().forward(*args, **kwargs)
        return router.handle(ATTENTION, self, lambda *a, **k: super(CPUAttentionBackendImpl, self).forward(*a, **k),
                             args, kwargs)


class KernelbotCPUAttentionBackend(cpu_attn.CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[CPUAttentionBackendImpl]:
        return CPUAttentionBackendImpl
