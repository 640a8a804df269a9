"""Rotary position embedding (SGLang's RotaryEmbedding): three inputs, positions [tokens] and query, key
[tokens, heads * head_size]; the tokens dim of all three varies between calls."""

from __future__ import annotations

from typing import Any

import torch

from kernelbot.dtypes import DTYPE_NAMES
from kernelbot.kernel_library.base import Family, OpCall, dtype_name
from kernelbot.kernel_library.registry import register


def _init_args(m: torch.nn.Module) -> list[Any]:
    return [int(m.head_size), int(m.rotary_dim), int(m.cos_sin_cache.shape[0]), float(m.base),
            bool(m.is_neox_style), dtype_name(m.cos_sin_cache.dtype)]


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    tokens, width = dims[0][0], dims[1][-1] + dims[2][-1]
    # two multiplies and an add per element; read and write query and key, read positions and cache rows
    return 3.0 * tokens * width, 2.0 * tokens * width * itemsize + 8.0 * tokens


def _matches(m: torch.nn.Module, dims: list[list[int]]) -> bool:
    return (len(dims) == 3 and hasattr(m, "cos_sin_cache") and isinstance(getattr(m, "head_size", None), int)
            and all(d[-1] % m.head_size == 0 for d in dims[1:]))


def _call_dims(ops: list[OpCall]) -> tuple[list[list[int]], list[str]] | None:
    """Query and key are the inputs of the first two views to [tokens, heads, head_size] (SGLang's native and
    CUDA paths both start that way); positions is one int64 per token."""
    views = [op for op in ops if op.name == "aten::view" and op.dims and len(op.dims[0]) == 2
             and op.types and op.types[0] in DTYPE_NAMES][:2]
    if len(views) < 2 or views[0].dims[0][0] != views[1].dims[0][0]:
        return None
    query, key = views[0].dims[0], views[1].dims[0]
    return [[query[0]], query, key], ["long int", views[0].types[0], views[1].types[0]]


FAMILY = Family(
    name="rotary_embedding",
    module_classes=("RotaryEmbedding",),
    wrappers={"cpp": "cpp:RotaryEmbeddingCpp", "triton": "triton_kernel:RotaryEmbeddingTriton"},
    configs={"cpp": [{"grain": 1}, {"grain": 8}], "triton": [{"num_warps": 1}, {"num_warps": 4}]},
    dtypes={"cpp": ("float32", "bfloat16", "float16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=_init_args,
    cost=_cost,
    matches=_matches,
    inputs=3,
    free_dims=lambda shapes: [[0] for _ in shapes],
    call_dims=_call_dims,
)
register(FAMILY)
