"""BLOOM-style self-attention with ALiBi and a KV cache (BloomAttention and look-alikes, found by structure): one fused
projection `query_key_value` whose output holds each head's q, k and v side by side, no rotary, each head's scores
biased by its ALiBi slope times the key's position, a `dense` output projection, the residual added inside the module;
four inputs, hidden_states and residual [B,T,hidden], past key and value [B,heads,P,D]; B, T and P vary between
calls."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernelbot.dtypes import DTYPE_NAMES
from kernelbot.kernel_library.alibi_attention.reference import Model, alibi_slopes
from kernelbot.kernel_library.base import OpCall, cpp_family, dtype_name, rows
from kernelbot.kernel_library.decode_attention import plain_causal
from kernelbot.kernel_library.decode_attention.cache import cached_positions, step_dynamic_layer, steppable_layer
from kernelbot.kernel_library.decode_attention.family import Probe, attends_as_reference, kv_cache_inputs, mha_step_cost
from kernelbot.kernel_library.registry import register


def _is_alibi_attention(m: nn.Module) -> bool:
    qkv, dense = getattr(m, "query_key_value", None), getattr(m, "dense", None)
    heads, d = getattr(m, "num_heads", None), getattr(m, "head_dim", None)
    if not (isinstance(qkv, nn.Linear) and isinstance(dense, nn.Linear) and isinstance(heads, int)
            and isinstance(d, int) and qkv.bias is not None and dense.bias is not None):
        return False
    try:
        params = inspect.signature(m.forward).parameters
    except (TypeError, ValueError):
        return False
    return (qkv.in_features == dense.out_features == dense.in_features == heads * d
            and qkv.out_features == 3 * heads * d and "alibi" in params and "residual" in params
            and abs(float(getattr(m, "inv_norm_factor", 0.0)) - d**-0.5) < 1e-9
            and float(getattr(m, "beta", 0.0)) == 1.0 and getattr(m, "layer_idx", None) is not None)


def _init_args(m: nn.Module) -> list[Any]:
    return [int(m.query_key_value.in_features), int(m.num_heads), dtype_name(m.query_key_value.weight.dtype)]


def _covers(m: nn.Module) -> bool:
    """A module of any class with the structure above that computes the reference: run once on 3 tokens with no cache,
    the alibi its model would build and an additive causal mask, against the reference with the module's weights."""
    if not _is_alibi_attention(m):
        return False
    weight = m.query_key_value.weight

    def run(reference: nn.Module, probe: Probe) -> tuple[Any, torch.Tensor]:
        residual, device = torch.randn_like(probe.x), probe.x.device
        alibi = (alibi_slopes(m.num_heads).to(device)[:, None, None] * torch.arange(probe.x.shape[1], device=device))
        return (m(probe.x, residual, alibi=alibi.to(probe.x.dtype), attention_mask=probe.mask),
                reference(probe.x, residual, probe.past, probe.past)[0])
    return attends_as_reference(m, lambda: Model(*_init_args(m)), weight, weight.shape[1], m.num_heads, m.head_dim,
                                run)


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    if len(dims[0]) != 3 or len(dims[2]) != 4:
        raise ValueError("not an alibi_attention call")
    (_, _, hidden), (_, heads, past, d) = dims[0], dims[2]
    flops, moved = mha_step_cost(dims[0], heads, past, d)
    return flops, float((moved + 4 * heads * d + rows(dims[0]) * hidden) * itemsize)  # + the biases, the residual


def _engine_call(kernel: nn.Module, module: nn.Module, args: tuple, kwargs: dict,
                 verified: list[list[int]]) -> Callable[[], Any] | None:
    """A transformers BloomAttention call (hidden_states, residual, alibi, attention_mask, layer_past a DynamicCache)
    on the kernel, appending to the cache layer in place; routed only where the mask hides nothing the kernel does not
    (causal, no padding: the alibi's positions are then the keys' own), without attention weights asked for, with a
    plain DynamicLayer, at the batch, tokens and dtype the kernel was verified and timed at (the cache's length is
    free)."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    residual = kwargs.get("residual", args[1] if len(args) > 1 else None)
    layer = steppable_layer(kwargs.get("layer_past", kwargs.get("past_key_values")), module.layer_idx)
    alibi = kwargs.get("alibi")
    if (len(args) > 2 or not isinstance(hidden, torch.Tensor) or not isinstance(residual, torch.Tensor)
            or not isinstance(alibi, torch.Tensor) or layer is None or kwargs.get("output_attentions")
            or hidden.dtype != module.query_key_value.weight.dtype
            or hidden.shape != tuple(verified[0]) or residual.shape != tuple(verified[1])):
        return None
    batch, tokens, _ = hidden.shape
    past = cached_positions(layer)
    if alibi.shape != (batch * module.num_heads, 1, past + tokens):
        return None
    if not plain_causal(kwargs.get("attention_mask"), tokens, past, None):
        return None
    return lambda: (step_dynamic_layer(kernel, layer, hidden, None, None).add_(residual), None)


def _matches(m: nn.Module, dims: list[list[int]]) -> bool:
    if not _is_alibi_attention(m) or len(dims) < 4:
        return False
    return (len(dims[0]) == 3 and dims[0][-1] == m.query_key_value.in_features and dims[1] == dims[0]
            and all(len(x) == 4 and x[1] == m.num_heads and x[3] == m.head_dim for x in dims[2:4]))


def _call_dims(ops: list[OpCall]) -> tuple[list[list[int]], list[str]] | None:
    """From BloomAttention's ops: hidden_states (and the residual, its shape) from the first linear, the heads,
    head_dim and keys' length P+T from the baddbmm that adds the alibi to q k^T."""
    linear = next((op for op in ops if op.name == "aten::linear" and len(op.dims) >= 2 and len(op.dims[0]) == 3
                   and len(op.dims[1]) == 2), None)
    if linear is None or not linear.types or linear.types[0] not in DTYPE_NAMES:
        return None
    (batch, tokens, hidden), weight = linear.dims[0], linear.dims[1]
    scores = next((op for op in ops[ops.index(linear) + 1:] if op.name == "aten::baddbmm" and len(op.dims) > 1
                   and len(op.dims[0]) == 3 and len(op.dims[1]) == 3 and op.dims[1][1] == tokens), None)
    if scores is None or weight != [3 * hidden, hidden] or batch == 0 or scores.dims[1][0] % batch:
        return None
    heads, d, keys = scores.dims[1][0] // batch, scores.dims[1][2], scores.dims[0][2]
    if heads * d != hidden or keys < tokens:
        return None
    past = [batch, heads, keys - tokens, d]
    return [linear.dims[0], linear.dims[0], past, past], [linear.types[0]] * 4


FAMILY = cpp_family(
    "alibi_attention", "cpp:AlibiAttentionCpp",  # found by structure (covers), whatever an attention's class is called
    init_args=_init_args, cost=_cost, matches=_matches, call_dims=_call_dims, covers=_covers, engine_call=_engine_call,
    **kv_cache_inputs(4),
)
register(FAMILY)
