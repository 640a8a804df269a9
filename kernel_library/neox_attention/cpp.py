"""GPT-NeoX-style attention on decode_attention's C++ step (kernel_library/decode_attention/attention.cpp, which
rotates the first R dims of a head when cos/sin are R wide): query_key_value's rows, laid out per head as q, k, v,
are reordered once into the q-heads, k-heads, v-heads order the step's GEMM writes (with its bias), so the step's
cache rows and outputs are the module's own; dense and its bias go into the output GEMM."""

from __future__ import annotations

import functools

import torch

from kernelbot.kernel_library.cpp_wrapper import Pack
from kernelbot.kernel_library.decode_attention.cache import RotaryForward
from kernelbot.kernel_library.decode_attention.cpp import StepAttentionCpp, StepWeights
from kernelbot.kernel_library.linear.cpp import pack_panels, pack_panels_bf16
from kernelbot.kernel_library.neox_attention.reference import Model


def heads_grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [heads, 3, head_dim, ...] (NeoX's per-head q, k, v) -> [3, heads, head_dim, ...] (all q, all k, all v)."""
    return t.detach().reshape(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


@functools.cache
def grouped_packing(heads: int) -> dict[bool, Pack]:
    """bf16 or not -> the packing of per-head q, k, v rows (heads_grouped first). Cached: one packing per head count,
    so PackedWeights sees the same packing and keeps its panels."""
    return {bf16: (lambda weights, pack=pack_panels_bf16 if bf16 else pack_panels:
                   pack([heads_grouped(w, heads) for w in weights])) for bf16 in (False, True)}


def per_head_qkv_weights(attention: StepAttentionCpp, bf16: bool) -> StepWeights:
    """The step's weights of a module with NeoX's layout (GPT-NeoX, BLOOM): `query_key_value`, its rows per head q, k
    and v, and `dense`, each with or without a bias."""
    qkv, dense, heads = attention.query_key_value, attention.dense, attention.num_heads
    return StepWeights(attention.packed("qkv", [qkv.weight], grouped_packing(heads)[bf16]),
                       None if qkv.bias is None else heads_grouped(qkv.bias, heads),
                       attention.packed("o", [dense.weight], pack_panels_bf16 if bf16 else pack_panels),
                       None if dense.bias is None else dense.bias.detach())


class NeoxAttentionCpp(RotaryForward, StepAttentionCpp, Model):
    FAMILY = "neox_attention"

    def step_weights(self, bf16: bool) -> StepWeights:
        return per_head_qkv_weights(self, bf16)
