"""GPT-NeoX-style self-attention with a KV cache (GPTNeoXAttention and look-alikes, found by structure): one fused
projection `query_key_value` whose output holds each head's q, k and v side by side, RoPE over the first `rotary_ndims`
dims of each head (partial rotary), a `dense` output projection, every head its own keys; five inputs, hidden_states
[B,T,hidden], cos and sin [1 or B,T,rotary_dim], past key and value [B,heads,P,D]; B, T and P vary between calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernelbot.dtypes import DTYPE_NAMES
from kernelbot.kernel_library.attention_reference import rope_cos_sin
from kernelbot.kernel_library.base import OpCall, cpp_family, dtype_name, rows
from kernelbot.kernel_library.decode_attention.cache import step_dynamic_layer, steppable_layer
from kernelbot.kernel_library.decode_attention.family import Probe, attends_as_reference, kv_cache_inputs, mha_step_cost
from kernelbot.kernel_library.neox_attention.reference import Model
from kernelbot.kernel_library.registry import register


def _is_neox_attention(m: nn.Module) -> bool:
    qkv, dense = getattr(m, "query_key_value", None), getattr(m, "dense", None)
    d, rotary = getattr(m, "head_size", None), getattr(m, "rotary_ndims", None)
    if not (isinstance(qkv, nn.Linear) and isinstance(dense, nn.Linear) and isinstance(d, int)
            and isinstance(rotary, int)):
        return False
    config = getattr(m, "config", None)
    return (qkv.out_features % (3 * d) == 0 and dense.in_features == qkv.out_features // 3
            and dense.out_features == qkv.in_features and 0 < rotary <= d and rotary % 2 == 0
            and (qkv.bias is None) == (dense.bias is None) and getattr(m, "is_causal", True)
            and abs(float(getattr(m, "scaling", 0.0)) - d**-0.5) < 1e-9 and getattr(m, "layer_idx", None) is not None
            and getattr(config, "sliding_window", None) is None
            and getattr(config, "attn_logit_softcapping", None) is None)


def _init_args(m: nn.Module) -> list[Any]:
    qkv, d = m.query_key_value, int(m.head_size)
    return [int(qkv.in_features), int(qkv.out_features) // (3 * d), d, int(m.rotary_ndims), qkv.bias is not None,
            dtype_name(qkv.weight.dtype)]


def _covers(m: nn.Module) -> bool:
    """A module of any class with the structure above that computes the reference: run once on 3 tokens with no cache
    and an additive causal mask (which eager and sdpa attention both take), against the reference with the module's
    weights."""
    if not _is_neox_attention(m):
        return False
    weight, d = m.query_key_value.weight, m.head_size

    def run(reference: nn.Module, probe: Probe) -> tuple[Any, torch.Tensor]:
        cos, sin = (t.to(probe.x) for t in rope_cos_sin(torch.arange(probe.x.shape[1])[None], m.rotary_ndims, 1e4))
        return (m(probe.x, attention_mask=probe.mask, position_embeddings=(cos, sin)),
                reference(probe.x, cos, sin, probe.past, probe.past)[0])
    return attends_as_reference(m, lambda: Model(*_init_args(m)), weight, weight.shape[1], weight.shape[0] // (3 * d),
                                d, run)


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    (_, tokens, _), (cos_batch, _, rotary) = dims[0], dims[1]
    if len(dims[0]) != 3 or len(dims[3]) != 4:
        raise ValueError("not a neox_attention call")
    _, heads, past, d = dims[3]
    flops, moved = mha_step_cost(dims[0], heads, past, d)
    rope = 12.0 * rows(dims[0]) * heads * rotary  # q and k's first `rotary` dims of every head
    moved += 4 * heads * d + 4 * cos_batch * tokens * rotary  # the biases, cos and sin
    return flops + rope, float(moved * itemsize)


def _engine_call(kernel: nn.Module, module: nn.Module, args: tuple, kwargs: dict,
                 verified: list[list[int]]) -> Callable[[], Any] | None:
    """A transformers GPTNeoXAttention call (hidden_states, attention_mask, layer_past a DynamicCache,
    position_embeddings=(cos, sin)) on the kernel, appending to the cache layer in place; routed only without a mask
    (no padding) or attention weights asked for, with a plain DynamicLayer, at the batch, tokens and dtype the kernel
    was verified and timed at (the cache's length is free)."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    cos_sin = kwargs.get("position_embeddings")
    layer = steppable_layer(kwargs.get("layer_past", kwargs.get("past_key_values")), module.layer_idx)
    if (not isinstance(hidden, torch.Tensor) or len(args) > 1 or kwargs.get("attention_mask") is not None
            or kwargs.get("output_attentions") or not isinstance(cos_sin, tuple) or layer is None
            or hidden.dtype != module.query_key_value.weight.dtype):
        return None
    cos, sin = cos_sin
    if hidden.shape != tuple(verified[0]) or cos.shape != tuple(verified[1]) or sin.shape != tuple(verified[2]):
        return None
    return lambda: (step_dynamic_layer(kernel, layer, hidden, cos, sin), None)


def _matches(m: nn.Module, dims: list[list[int]]) -> bool:
    if not _is_neox_attention(m) or len(dims) < 5:
        return False
    d, heads = m.head_size, m.query_key_value.out_features // (3 * m.head_size)
    return (len(dims[0]) == 3 and dims[0][-1] == m.query_key_value.in_features
            and dims[1][-1] == dims[2][-1] == m.rotary_ndims
            and all(len(x) == 4 and x[1] == heads and x[3] == d for x in dims[3:5]))


def _call_dims(ops: list[OpCall]) -> tuple[list[list[int]], list[str]] | None:
    """From GPTNeoXAttention's ops: hidden_states and query_key_value's weight from the first linear, cos from the
    first 3-D unsqueeze after it (apply_rotary_pos_emb), and the heads, head_dim and keys' length P+T from the
    attention op (sdpa's query and key, or eager's q @ k^T)."""
    linear = next((op for op in ops if op.name == "aten::linear" and len(op.dims) >= 2 and len(op.dims[0]) == 3
                   and len(op.dims[1]) == 2), None)
    if linear is None or not linear.types or linear.types[0] not in DTYPE_NAMES:
        return None
    (batch, tokens, hidden), weight = linear.dims[0], linear.dims[1]
    after = ops[ops.index(linear) + 1:]
    cos = next((op.dims[0] for op in after if op.name == "aten::unsqueeze" and op.dims and len(op.dims[0]) == 3), None)
    attention = next((op for op in after if op.name in ("aten::scaled_dot_product_attention", "aten::matmul")
                      and len(op.dims) > 1 and len(op.dims[0]) == 4 and len(op.dims[1]) == 4
                      and op.dims[0][2] == tokens), None)
    if cos is None or attention is None or weight[1] != hidden:
        return None
    (_, heads, _, d), k = attention.dims[0], attention.dims[1]
    keys = k[2] if attention.name == "aten::scaled_dot_product_attention" else k[3]  # eager multiplies by k^T
    if keys < tokens or weight[0] != 3 * heads * d or cos[-1] > d:
        return None
    past = [batch, heads, keys - tokens, d]
    return [linear.dims[0], cos, cos, past, past], [linear.types[0]] * 5


FAMILY = cpp_family(
    "neox_attention", "cpp:NeoxAttentionCpp",  # found by structure (covers), whatever an attention's class is called
    init_args=_init_args, cost=_cost, matches=_matches, call_dims=_call_dims, covers=_covers, engine_call=_engine_call,
    **kv_cache_inputs(5),
)
register(FAMILY)
