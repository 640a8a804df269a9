"""Self-attention with a KV cache (LlamaAttention and its plain-RoPE relatives): five inputs, hidden_states
[B,T,hidden], cos and sin [1 or B,T,D], past key and value [B,KVH,P,D]; B and T vary between calls, and P."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernelbot.dtypes import DTYPE_NAMES
from kernelbot.kernel_library.attention_reference import rope_cos_sin
from kernelbot.kernel_library.base import Family, OpCall, dtype_name, rows
from kernelbot.kernel_library.decode_attention.cache import cached_positions, step_dynamic_layer, steppable_layer
from kernelbot.kernel_library.decode_attention.family import Probe, attends_as_reference, kv_cache_inputs
from kernelbot.kernel_library.decode_attention.reference import Model
from kernelbot.kernel_library.registry import register


def _head_dim(m: nn.Module) -> int:
    return int(m.head_dim)


def _init_args(m: nn.Module) -> list[Any]:
    """Llama's six; then, where the module scales by another factor, soft-caps its scores or slides a window
    (Gemma-2), those three."""
    d = _head_dim(m)
    args = [int(m.q_proj.in_features), int(m.q_proj.out_features) // d, int(m.k_proj.out_features) // d, d,
            m.q_proj.bias is not None, dtype_name(m.q_proj.weight.dtype)]
    scaling, softcap, window = float(m.scaling), _softcap(m), _window(m)
    if abs(scaling - d**-0.5) > 1e-9 or softcap is not None or window is not None:
        args += [scaling, softcap, window]
    return args


def _softcap(m: nn.Module) -> float | None:
    """The cap on the module's attention scores (Gemma-2's attn_logit_softcapping), None without one."""
    cap = getattr(m, "attn_logit_softcapping", getattr(getattr(m, "config", None), "attn_logit_softcapping", None))
    return float(cap) if cap else None


def _q_width(dims: list[list[int]]) -> int:
    """heads * head_dim: from q_proj's weight where the call's dims carry it (after the five inputs), else hidden."""
    return dims[5][0] if len(dims) > 5 and len(dims[5]) == 2 else dims[0][-1]


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    (batch, tokens, hidden), (cos_batch, _, d) = dims[0], dims[1]
    _, kv_heads, past, _ = dims[3]
    q_width, kv_width, m = _q_width(dims), dims[3][1] * dims[3][3], rows(dims[0])
    if q_width % d or not (len(dims[0]) == 3 and len(dims[3]) == 4):
        raise ValueError("not a decode_attention call")
    heads = q_width // d
    weights = hidden * (q_width + 2 * kv_width) + q_width * hidden
    # each new token t sees past + t + 1 keys: a q.k and a p.v of 2 * d flops each per key and head
    seen = tokens * past + tokens * (tokens + 1) // 2
    flops = 2.0 * m * weights + 4.0 * batch * heads * d * seen + 6.0 * m * (q_width + kv_width)
    moved = weights + 2 * m * hidden + 2 * cos_batch * tokens * d + 2 * batch * kv_heads * (past + tokens) * d
    return flops, float(moved * itemsize)


def _window(m: nn.Module) -> int | None:
    """The sliding window the module attends with: its own attribute (Qwen2, Gemma-2's sliding layers), else its
    config's (Mistral); None without one."""
    window = m.sliding_window if hasattr(m, "sliding_window") else getattr(getattr(m, "config", None),
                                                                         "sliding_window", None)
    return int(window) if window else None


def _is_plain_rope_attention(m: nn.Module) -> bool:
    projections = [getattr(m, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    if not all(isinstance(p, nn.Linear) for p in projections) or not isinstance(getattr(m, "head_dim", None), int):
        return False
    q, k, v, o = projections
    d = m.head_dim
    config = getattr(m, "config", None)
    return (q.out_features % d == 0 and k.out_features % d == 0 and k.out_features == v.out_features
            and (q.out_features // d) % (k.out_features // d) == 0 and o.in_features == q.out_features
            and o.out_features == q.in_features == k.in_features == v.in_features
            and (q.bias is None) == (k.bias is None) == (v.bias is None) and o.bias is None
            and getattr(m, "q_norm", None) is None and getattr(m, "k_norm", None) is None
            and getattr(m, "is_causal", True) and isinstance(getattr(m, "scaling", None), float)
            and getattr(config, "use_bidirectional_attention", False) is not True)


def _covers(m: nn.Module) -> bool:
    """A module of any class that is a plain RoPE attention and computes the reference: run once on 3 tokens with
    no cache and an additive causal mask (which eager and sdpa attention both take), against the reference with
    the module's weights. Catches look-alikes that rotate differently (Cohere's interleaved RoPE)."""
    if not _is_plain_rope_attention(m):
        return False
    d = m.head_dim

    def run(reference: nn.Module, probe: Probe) -> tuple[Any, torch.Tensor]:
        cos, sin = (t.to(probe.x) for t in rope_cos_sin(torch.arange(probe.x.shape[1])[None], d, 1e4))
        return (m(probe.x, position_embeddings=(cos, sin), attention_mask=probe.mask),
                reference(probe.x, cos, sin, probe.past, probe.past)[0])
    return attends_as_reference(m, lambda: Model(*_init_args(m)), m.q_proj.weight, m.q_proj.in_features,
                                m.k_proj.out_features // d, d, run)


def _engine_call(kernel: nn.Module, module: nn.Module, args: tuple, kwargs: dict,
                 verified: list[list[int]]) -> Callable[[], Any] | None:
    """A transformers attention call (hidden_states, position_embeddings=(cos, sin), attention_mask, a
    DynamicCache) on the kernel, appending to the cache layer in place; routed with a layer `steppable_layer`
    accepts (a sliding layer for a module with a window), at the batch, tokens and dtype the kernel was verified and
    timed at (the cache's length is free). A mask is taken only where it masks nothing the kernel does not (eager
    attention, Gemma-2's, always passes one): causal, no padding, the module's window."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    cos_sin = kwargs.get("position_embeddings")
    window = _window(module)
    layer = steppable_layer(kwargs.get("cache", kwargs.get("past_key_values")), module.layer_idx, window)
    if (not isinstance(hidden, torch.Tensor) or len(args) > 1 or not isinstance(cos_sin, tuple) or layer is None
            or hidden.dtype != module.q_proj.weight.dtype):
        return None
    cos, sin = cos_sin
    if hidden.shape != tuple(verified[0]) or cos.shape != tuple(verified[1]) or sin.shape != tuple(verified[2]):
        return None
    if not plain_causal(kwargs.get("attention_mask"), hidden.shape[1], cached_positions(layer), window):
        return None
    return lambda: (step_dynamic_layer(kernel, layer, hidden, cos, sin), None)


def plain_causal(mask: torch.Tensor | None, tokens: int, past: int, window: int | None) -> bool:
    """Does `mask` ([B, 1, T, >= P+T] additive, or bool where True attends; None) let each new token see exactly the
    keys up to its own position (the last `window` of them with a window), as the kernel attends?"""
    if mask is None:
        return window is None or past + tokens <= window
    if mask.dim() != 4 or mask.shape[2] != tokens or mask.shape[3] < past + tokens:
        return False
    key = torch.arange(mask.shape[3], device=mask.device)
    query = past + torch.arange(tokens, device=mask.device)[:, None]
    seen = (key <= query) & ((key > query - window) if window is not None else True)
    open_ = mask if mask.dtype == torch.bool else mask == 0
    shut = ~mask if mask.dtype == torch.bool else mask <= torch.finfo(mask.dtype).min / 2
    return bool(open_[..., seen].all() and shut[..., ~seen].all())


def _matches(m: nn.Module, dims: list[list[int]]) -> bool:
    if not _is_plain_rope_attention(m) or len(dims) < 5:
        return False
    d = m.head_dim
    kv_heads = m.k_proj.out_features // d
    return (len(dims[0]) == 3 and dims[0][-1] == m.q_proj.in_features and dims[1][-1] == dims[2][-1] == d
            and all(len(x) == 4 and x[1] == kv_heads and x[3] == d for x in dims[3:5])
            and (len(dims) == 5 or dims[5] == list(m.q_proj.weight.shape)))


def _call_dims(ops: list[OpCall]) -> tuple[list[list[int]], list[str]] | None:
    """From LlamaAttention's ops: hidden_states and q_proj's weight from the first linear, k_proj's width from the
    second, cos from the first 3-D unsqueeze after them (apply_rotary_pos_emb), and the keys' length P+T from the
    attention op (sdpa's key, or eager's q @ k^T)."""
    linears = [op for op in ops if op.name == "aten::linear" and len(op.dims) >= 2 and len(op.dims[0]) == 3][:2]
    if len(linears) < 2 or not linears[0].types or linears[0].types[0] not in DTYPE_NAMES:
        return None
    (batch, tokens, _), q_weight, kv_width = linears[0].dims[0], linears[0].dims[1], linears[1].dims[1][0]
    after = ops[ops.index(linears[1]) + 1:]
    cos = next((op.dims[0] for op in after if op.name == "aten::unsqueeze" and op.dims and len(op.dims[0]) == 3), None)
    keys = next((op.dims[1][2] for op in after if op.name == "aten::scaled_dot_product_attention"
                 and len(op.dims) > 1 and len(op.dims[1]) == 4), None)
    if keys is None:  # eager attention: matmul(q [B,H,T,D], k^T [B,H,D,L])
        keys = next((op.dims[1][3] for op in after if op.name == "aten::matmul" and len(op.dims) > 1
                     and len(op.dims[1]) == 4 and op.dims[1][2] == (cos or [0])[-1]), None)
    if cos is None or keys is None or kv_width % cos[-1] or keys < tokens:
        return None
    past = [batch, kv_width // cos[-1], keys - tokens, cos[-1]]
    dtype = linears[0].types[0]
    return [linears[0].dims[0], cos, cos, past, past, q_weight], [dtype] * 6


FAMILY = Family(
    name="decode_attention",
    module_classes=(),  # found by structure (covers), whatever an attention's class is called
    wrappers={"cpp": "cpp:DecodeAttentionCpp", "triton": "triton_kernel:DecodeAttentionTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 4}, {"grain": 16}],
             "triton": [{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "ATTN_BLOCK_M": 16, "ATTN_BLOCK_N": 32,
                         "num_warps": 4}]},
    dtypes={"cpp": ("float32", "bfloat16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=_init_args, cost=_cost, matches=_matches, call_dims=_call_dims, covers=_covers, engine_call=_engine_call,
    **kv_cache_inputs(5),
)
register(FAMILY)
