"""A mixture of experts' expert half, the router's choices given (vLLM's FusedMoE method: x [T,H], topk_weights
[T,k], topk_ids [T,k], stacked w13 [E,2I,H] and w2 [E,H,I]); the tokens vary between calls. Found in a served engine
by its MoE method's calls (engine/vllm_plugin.py); in-process, the whole block, router included, is sparse_moe's."""

from __future__ import annotations

import torch

from kernelbot.kernel_library.base import cpp_family, dtype_name
from kernelbot.kernel_library.registry import register


def _init_args(layer: torch.nn.Module) -> list:
    """[hidden, intermediate, experts, top_k, dtype] of a module holding w13_weight and w2_weight as vLLM's do."""
    w13, w2 = layer.w13_weight, layer.w2_weight
    return [int(w2.shape[1]), int(w2.shape[2]), int(w13.shape[0]), int(layer.top_k), dtype_name(w13.dtype)]


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    """Each token's k experts: three H×I projections a pair; bytes: the input and output, and the weights of every
    expert the call can hit (at most all of them, at most one per pair) streamed once."""
    (tokens, hidden), (_, top_k), (experts, inter2, _) = dims[0], dims[1], dims[3]
    pairs, hit = tokens * top_k, min(experts, tokens * top_k)
    moved = (2 * tokens * hidden + hit * 3 * hidden * inter2 // 2) * itemsize + pairs * 8
    return 3.0 * pairs * hidden * inter2, float(moved)


FAMILY = cpp_family(
    "moe_experts", "cpp:MoeExpertsCpp",  # no transformers module computes it alone: the block is sparse_moe's
    init_args=_init_args,
    cost=_cost,
    matches=lambda m, dims: len(dims) >= 4,
    inputs=3,
    free_dims=lambda shapes: [[0]] * len(shapes),
    weight_dims=lambda args: [[int(args[2]), 2 * int(args[1]), int(args[0])]],
)
register(FAMILY)
