"""A sparse mixture-of-experts block (Mixtral's shape: a router's top-k experts, each a gated SiLU MLP, weighted by
renormalised router probabilities), found by structure whatever its class is called: a `gate` with a 2-D [E, H]
weight, `experts` holding gate_up_proj [E, 2I, H] and down_proj [E, H, I], and a top_k, computing the reference."""

from __future__ import annotations

import torch

from kernelbot.dtypes import DTYPE_NAMES
from kernelbot.kernel_library.base import OpCall, computes_reference, cpp_family, dtype_name, rows
from kernelbot.kernel_library.registry import register


def _parts(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
    """(router weight [E,H], gate_up_proj [E,2I,H], down_proj [E,H,I], top_k) where the module has that shape."""
    router = getattr(getattr(m, "gate", None), "weight", None)
    experts = getattr(m, "experts", None)
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    top_k = getattr(m, "top_k", getattr(getattr(m, "gate", None), "top_k", None))
    if not all(isinstance(t, torch.Tensor) for t in (router, gate_up, down)) or not isinstance(top_k, int):
        return None
    if router.dim() != 2 or gate_up.dim() != 3 or down.dim() != 3:
        return None
    (e, h), (e2, i2, h2), (e3, h3, i) = router.shape, gate_up.shape, down.shape
    if not (e == e2 == e3 and h == h2 == h3 and i2 == 2 * i and 0 < top_k <= e):
        return None
    return router, gate_up, down, top_k


def _init_args(m: torch.nn.Module) -> list:
    router, gate_up, down, top_k = _parts(m)
    return [int(router.shape[1]), int(down.shape[2]), int(router.shape[0]), top_k, dtype_name(router.dtype)]


def _covers(m: torch.nn.Module) -> bool:
    parts = _parts(m)
    if parts is None:
        return False
    x = torch.randn(2, 3, parts[0].shape[1], dtype=parts[0].dtype, device=parts[0].device)
    return computes_reference(FAMILY, m, [x])


def _other(shape: list[int], hidden: int) -> int | None:
    """Of a weight's last two dims, the one that is not the hidden size (either may be, as it is stored or seen
    through a transpose)."""
    a, b = shape[-2:]
    return b if a == hidden else a if b == hidden else None


def _call_dims(ops: list[OpCall]) -> tuple[list[list[int]], list[str]] | None:
    """From the block's ops, whichever way its experts run (a linear per expert, or a grouped matmul over stacked
    weights): its input (the first 3-D operand), the router's weight (the first linear over H), one expert's gate_up
    weight [2I, H], and [experts hit, token-expert pairs] counted from the expert GEMMs whose output is 2I wide."""
    x = next((op for op in ops if op.dims and len(op.dims[0]) == 3 and op.types and op.types[0] in DTYPE_NAMES), None)
    if x is None:
        return None
    hidden = x.dims[0][-1]
    gemms = [op for op in ops if op.name in ("aten::linear", "aten::mm", "aten::_grouped_mm", "aten::bmm")
             and len(op.dims) > 1 and len(op.dims[0]) == 2 and op.dims[0][1] == hidden and len(op.dims[1]) >= 2
             and _other(op.dims[1], hidden) is not None]
    if not gemms or gemms[0].name != "aten::linear" or len(gemms[0].dims[1]) != 2:
        return None
    router = gemms[0].dims[1]
    experts = [op for op in gemms if sorted(op.dims[1][-2:]) != sorted(router)]  # not the router (nor its mm)
    if not experts:
        return None
    inter2 = _other(experts[0].dims[1], hidden)
    per_expert = [op for op in experts if len(op.dims[1]) == 2 and _other(op.dims[1], hidden) == inter2]
    if any(op.name == "aten::linear" for op in per_expert):
        per_expert = [op for op in per_expert if op.name == "aten::linear"]  # not their own mm again
    hits = [op.dims[0][0] for op in per_expert if op.dims[0][0] > 0]
    counted = [len(hits), sum(hits)]
    if not hits:  # one grouped matmul over every expert, its per-expert calls not traced: its rows are the pairs
        counted = [min(router[0], experts[0].dims[0][0]), experts[0].dims[0][0]]
    return [x.dims[0], router, [inter2, hidden], counted], [x.types[0]] * 4


def _cost(dims: list[list[int]], itemsize: int) -> tuple[float, float]:
    """The router over every token, then each hit expert's three projections over its tokens; bytes: the input and
    output, the router's weight, and every hit expert's weights streamed once."""
    (m, (experts, hidden), (inter2, _), (hit, pairs)) = rows(dims[0]), dims[1], dims[2], dims[3]
    if dims[0][-1] != hidden or not 0 <= hit <= experts:
        raise ValueError("not a sparse_moe call")
    flops = 2.0 * m * hidden * experts + 3.0 * pairs * hidden * inter2
    moved = (2 * m * hidden + experts * hidden + hit * 3 * hidden * inter2 // 2) * itemsize
    return flops, float(moved)


def _matches(m: torch.nn.Module, dims: list[list[int]]) -> bool:
    parts = _parts(m)
    return parts is not None and len(dims) == 4 and dims[1] == list(parts[0].shape) and \
        dims[2] == list(parts[1].shape[1:])


FAMILY = cpp_family(
    "sparse_moe", "cpp:SparseMoeCpp",  # found by structure (covers), whatever the block's class is called
    init_args=_init_args,
    cost=_cost,
    matches=_matches,
    call_dims=_call_dims,
    call_ops=8192,  # every expert's GEMMs: some 70 ops an expert where transformers runs them one by one
    covers=_covers,
    group_dims=lambda dims: dims[:3],  # which experts a call hit varies from call to call: one op all the same
)
register(FAMILY)
