"""Decoder layers that run their parts' pack kernels directly. A pre-norm residual layer (x + attention(norm(x)), then
+ mlp(norm(x))) whose attention runs a pack kernel is called part to part: each part's kernel is resolved and run
without nn.Module's call, the part's own forward or the layer's Python, which on a CPU cost as much as the kernels
of a small model's decode step. A layer gets this route only if, on probe calls at each shape its attention kernel
was verified at (random hidden states, a random cache), it gives exactly what the layer's own forward gives, with
the same cache after; any layer of another shape (parallel residual, extra norms, scaled residuals) keeps its
forward. A part without a kernel for a call runs its own forward (the router's fallback); under the profiler the layer
runs its own forward, so re-profiles see every module and kernel where they were."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelbot.engine.kv_cache import cache_kwarg

PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
# a part's route: what runs a call to `module` (its pack kernel, or its own forward where the kernel does not take it)
Resolve = Callable[[torch.nn.Module, tuple, dict], Callable[[], Any]]


def has_parts(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, p, None), torch.nn.Module) for p in PARTS)


class LeanLayer:
    """The layer's forward, part to part; `tuple_out` where the layer's forward returns (hidden_states,)."""

    def __init__(self, layer: torch.nn.Module, original: Callable[..., Any], resolvers: list[Resolve | None]) -> None:
        self.parts = [getattr(layer, p) for p in PARTS]
        self.resolvers = resolvers
        self.original = original
        self.tuple_out = False  # set by probe_agrees from the layer's own output

    def _part(self, i: int, args: tuple, kwargs: dict) -> Any:
        resolve = self.resolvers[i]
        return resolve(self.parts[i], args, kwargs)() if resolve is not None else self.parts[i](*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if len(args) > 1 or not isinstance(hidden, torch.Tensor) or torch.autograd._profiler_enabled():
            return self.original(*args, **kwargs)
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        attended = self._part(1, (), {**rest, "hidden_states": self._part(0, (hidden,), {})})
        x = hidden + attended[0]
        out = x + self._part(3, (self._part(2, (x,), {}),), {})
        return (out,) if self.tuple_out else out


def probe_agrees(layer: torch.nn.Module, lean: LeanLayer, shapes: list[list[int]], past: int = 3) -> bool:
    """Do the layer's own forward and `lean` give the same output and cache on a random call at these attention
    shapes ([hidden, cos, sin, past keys, past values]; decode calls probe with `past` cached positions)? Sets
    lean.tuple_out to the forward's output structure."""
    from transformers.cache_utils import DynamicCache

    weight = next(layer.parameters())
    gen = torch.Generator().manual_seed(0)

    def random(shape: list[int]) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device=weight.device, dtype=weight.dtype)

    (batch, tokens, _), kv = shapes[0], shapes[3]
    cached = past if tokens == 1 else 0
    hidden, cos, sin = random(shapes[0]), random(shapes[1]), random(shapes[2])
    keys, values = random([batch, kv[1], cached, kv[3]]), random([batch, kv[1], cached, kv[3]])
    name, index = cache_kwarg(lean.original), getattr(layer.self_attn, "layer_idx", None)
    if name is None or not isinstance(index, int):
        return False
    results = []
    for forward in (lean.original, lean):
        cache = DynamicCache()
        cache.update(keys.clone(), values.clone(), index)
        positions = torch.arange(cached, cached + tokens, device=weight.device)[None]
        with torch.inference_mode():
            out = forward(hidden, attention_mask=None, position_ids=positions, position_embeddings=(cos, sin),
                          use_cache=True, **{name: cache})
        results.append((out, cache.layers[index].keys, cache.layers[index].values))
    (want, want_k, want_v), (got, got_k, got_v) = results
    lean.tuple_out = isinstance(want, tuple)
    want = want[0] if lean.tuple_out and len(want) == 1 else want
    got = got[0] if isinstance(got, tuple) else got
    return (isinstance(want, torch.Tensor) and want.shape == got.shape and torch.equal(want, got)
            and torch.equal(want_k, got_k) and torch.equal(want_v, got_v))
