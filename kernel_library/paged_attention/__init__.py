"""Paged attention over a serving engine's KV cache (vLLM's CPU attention backend and its "vec" cache layout):
five inputs, query [T,H,D], the cache [B,KVH,BS,2D], block_table [R,blocks per request], seq_lens [R],
query_start_loc [R+1]; the tokens, requests, blocks per request and the cache's blocks vary between calls. Found in a
served engine by its attention backend's calls (engine/vllm_attention.py); no transformers module computes it."""

from __future__ import annotations

from kernelbot.kernel_library.base import Family
from kernelbot.kernel_library.registry import register


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    """At most every context token of a request per query token (the shapes do not carry the contexts' lengths:
    a request's blocks bound them): q·k and p·v, 2 × 2 × head_size FLOPs per key and head; its blocks' keys and
    values read once per kv head, the query read and the output written once."""
    (tokens, heads, d), (_, kv_heads, bs, _), (requests, per_request) = dims[0], dims[1], dims[2]
    keys = per_request * bs
    return 4.0 * tokens * heads * d * keys, float((requests * keys * kv_heads * 2 * d + 2 * tokens * heads * d)
                                                  * itemsize)


FAMILY = Family(
    name="paged_attention",
    module_classes=(),
    wrappers={"cpp": "cpp:PagedAttentionCpp", "triton": "triton_kernel:PagedAttentionTriton"},
    configs={"cpp": [{}], "triton": [{"num_warps": 4}]},
    dtypes={"cpp": ("float32", "bfloat16", "float16"), "triton": ("float32", "bfloat16", "float16")},
    init_args=lambda impl: [int(impl.num_heads), int(impl.num_kv_heads), int(impl.head_size), float(impl.scale)],
    cost=_cost,
    matches=lambda m, dims: len(dims) >= 5,
    inputs=5,
    state_inputs=(1,),  # the KV cache
    free_dims=lambda shapes: [[0], [0], [0, 1], [0], [0]][:len(shapes)],
)
register(FAMILY)
