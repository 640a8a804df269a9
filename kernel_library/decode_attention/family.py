"""What the Family definitions of the attentions over a KV cache (decode, neox, fused and alibi attention) share:
the structural test's run against the reference, the fields of inputs that end in the past keys and values, and the
cost of a step in which every head has its own keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from kernelbot.kernel_library.base import same_output


class Probe(NamedTuple):
    """What `attends_as_reference` runs an attention on: hidden states x [1, 3, hidden], no past (keys and
    values [1, heads, 0, D]) and an additive causal mask [1, 1, 3, 3], which eager and sdpa attention both take."""

    x: torch.Tensor
    past: torch.Tensor
    mask: torch.Tensor


def attends_as_reference(module: nn.Module, reference: Callable[[], nn.Module], weight: torch.Tensor, hidden: int,
                         kv_heads: int, head_dim: int, run: Callable[[nn.Module, Probe], tuple[Any, torch.Tensor]],
                         ) -> bool:
    """Does the attention `module` give what the reference (`reference()`, given the module's weights) gives on a
    Probe in the dtype and on the device of `weight`, one of its projections'? `run(reference, probe)`: the module's
    output and the reference's, each called with its own arguments on the probe."""
    try:
        dtype, device, tokens = weight.dtype, weight.device, 3
        model = reference().to(device)
        model.load_state_dict(module.state_dict())
        x = torch.randn(1, tokens, hidden, dtype=dtype, device=device)
        mask = torch.full((tokens, tokens), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
        with torch.no_grad():
            got, want = run(model, Probe(x, x.new_zeros(1, kv_heads, 0, head_dim), mask[None, None]))
    except Exception:  # another signature or state layout: not this op
        return False
    return same_output(got, want)


def kv_cache_inputs(inputs: int) -> dict[str, Any]:
    """The Family fields of a call with `inputs` inputs whose last two are the past keys and values [B, heads, P, D]:
    batch and tokens vary in every input before them ([B, T, ...]), batch and the length P in the caches, and calls
    that differ only in P (successive decode steps) are one hotspot."""
    caches = (inputs - 2, inputs - 1)

    def free_dims(shapes: list[list[int]]) -> list[list[int]]:
        return [[0, 2] if i in caches else [0, 1] for i in range(min(len(shapes), inputs))]

    def group_dims(dims: list[list[int]]) -> list[list[int]]:
        return [[*x[:2], *x[3:]] if i in caches and len(x) == 4 else x for i, x in enumerate(dims)]

    return {"inputs": inputs, "free_dims": free_dims, "group_dims": group_dims, "state_inputs": caches}


def mha_step_cost(x: list[int], heads: int, past: int, d: int) -> tuple[float, int]:
    """(flops, elements moved) of one step of an attention whose every head has its own keys: q, k and v projected
    from x [B, T, hidden] and the output projected back; each new token t attending over past + t + 1 keys, a q.k and
    a p.v of 2 * d flops each per key and head; the weights, x, the output and both caches' P + T positions moved."""
    batch, tokens, hidden = x
    width, m = heads * d, batch * tokens
    weights = hidden * 3 * width + width * hidden
    seen = tokens * past + tokens * (tokens + 1) // 2
    flops = 2.0 * m * weights + 4.0 * batch * heads * d * seen
    return flops, weights + 2 * m * hidden + 2 * batch * heads * (past + tokens) * d
