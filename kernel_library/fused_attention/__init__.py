"""GPT-2-style self-attention with a KV cache (GPT2Attention and look-alikes, found by structure): one fused QKV
projection `c_attn` and an output projection `c_proj`, both Conv1D with biases, no rotary embedding, every head its
own keys; three inputs, hidden_states [B,T,hidden], past key and value [B,heads,P,D]; B, T and P vary between calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernelbot.dtypes import DTYPE_NAMES
from kernelbot.kernel_library.base import OpCall, cpp_family, dtype_name
from kernelbot.kernel_library.decode_attention.cache import step_dynamic_layer, steppable_layer
from kernelbot.kernel_library.decode_attention.family import attends_as_reference, kv_cache_inputs, mha_step_cost
from kernelbot.kernel_library.fused_attention.reference import Model
from kernelbot.kernel_library.registry import register


def _conv1d(m: Any, n_in: int, n_out: int) -> bool:
    """transformers' Conv1D layout: weight [in, out], bias [out]."""
    weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
    return (isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor) and type(m).__name__ == "Conv1D"
            and list(weight.shape) == [n_in, n_out] and list(bias.shape) == [n_out])


def _is_fused_attention(m: nn.Module) -> bool:
    heads, d = getattr(m, "num_heads", None), getattr(m, "head_dim", None)
    if not isinstance(heads, int) or not isinstance(d, int) or not hasattr(m, "c_attn") or not hasattr(m, "c_proj"):
        return False
    hidden = m.c_attn.weight.shape[0] if isinstance(getattr(m.c_attn, "weight", None), torch.Tensor) else -1
    return (_conv1d(m.c_attn, hidden, 3 * heads * d) and _conv1d(m.c_proj, heads * d, hidden)
            and not getattr(m, "is_cross_attention", False) and getattr(m, "is_causal", True)
            and isinstance(getattr(m, "scaling", None), float) and getattr(m, "layer_idx", None) is not None)


def _init_args(m: nn.Module) -> list[Any]:
    return [int(m.c_attn.weight.shape[0]), int(m.num_heads), int(m.head_dim), float(m.scaling),
            dtype_name(m.c_attn.weight.dtype)]


def _covers(m: nn.Module) -> bool:
    """A module of any class with the structure above that computes the reference: run once on 3 tokens with no cache
    and an additive causal mask (which eager and sdpa attention both take), against the reference with the module's
    weights."""
    if not _is_fused_attention(m):
        return False
    weight = m.c_attn.weight
    return attends_as_reference(
        m, lambda: Model(*_init_args(m)), weight, weight.shape[0], m.num_heads, m.head_dim,
        lambda reference, probe: (m(probe.x, attention_mask=probe.mask), reference(probe.x, probe.past, probe.past)[0]))


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    _, heads, past, d = dims[1]
    if len(dims[0]) != 3 or len(dims[1]) != 4:
        raise ValueError("not a fused_attention call")
    flops, moved = mha_step_cost(dims[0], heads, past, d)
    return flops, float((moved + 4 * heads * d) * itemsize)  # + the biases


def _engine_call(kernel: nn.Module, module: nn.Module, args: tuple, kwargs: dict,
                 verified: list[list[int]]) -> Callable[[], Any] | None:
    """A transformers GPT2Attention call (hidden_states, a DynamicCache, no attention mask) on the kernel, appending to
    the cache layer in place; routed only without a mask (no padding), cross-attention or attention weights asked
    for, with a plain DynamicLayer, at the batch, tokens and dtype the kernel was verified and timed at (the cache's
    length is free)."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    layer = steppable_layer(kwargs.get("cache", kwargs.get("past_key_values")), module.layer_idx)
    if (not isinstance(hidden, torch.Tensor) or len(args) > 1 or kwargs.get("attention_mask") is not None
            or kwargs.get("encoder_hidden_states") is not None or kwargs.get("output_attentions")
            or layer is None or hidden.dtype != module.c_attn.weight.dtype or hidden.shape != tuple(verified[0])):
        return None
    return lambda: (step_dynamic_layer(kernel, layer, hidden, None, None), None)


def _matches(m: nn.Module, dims: list[list[int]]) -> bool:
    if not _is_fused_attention(m) or len(dims) < 3:
        return False
    return (len(dims[0]) == 3 and dims[0][-1] == m.c_attn.weight.shape[0]
            and all(len(x) == 4 and x[1] == m.num_heads and x[3] == m.head_dim for x in dims[1:3]))


def _call_dims(ops: list[OpCall]) -> tuple[list[list[int]], list[str]] | None:
    """From GPT2Attention's ops: hidden_states from the first 3-D floating input, c_attn's weight from the first addmm,
    and the heads, head_dim and keys' length P+T from the attention op (sdpa's query and key, or eager's q @ k^T)."""
    x = next((op for op in ops if op.dims and len(op.dims[0]) == 3 and op.types and op.types[0] in DTYPE_NAMES), None)
    addmm = next((op for op in ops if op.name == "aten::addmm" and len(op.dims) >= 3 and len(op.dims[2]) == 2), None)
    if x is None or addmm is None:
        return None
    (batch, tokens, hidden), weight = x.dims[0], addmm.dims[2]
    attention = next((op for op in ops if op.name in ("aten::scaled_dot_product_attention", "aten::matmul")
                      and len(op.dims) > 1 and len(op.dims[0]) == 4 and len(op.dims[1]) == 4
                      and op.dims[0][2] == tokens), None)
    if attention is None or weight[0] != hidden:
        return None
    (_, heads, _, d), k = attention.dims[0], attention.dims[1]
    keys = k[2] if attention.name == "aten::scaled_dot_product_attention" else k[3]  # eager multiplies by k^T
    if keys < tokens or weight[1] != 3 * heads * d:
        return None
    past = [batch, heads, keys - tokens, d]
    return [x.dims[0], past, past, weight], [x.types[0]] * 4


FAMILY = cpp_family(
    "fused_attention", "cpp:FusedAttentionCpp",  # found by structure (covers), whatever an attention's class is called
    init_args=_init_args, cost=_cost, matches=_matches, call_dims=_call_dims, covers=_covers, engine_call=_engine_call,
    **kv_cache_inputs(3),
)
register(FAMILY)
