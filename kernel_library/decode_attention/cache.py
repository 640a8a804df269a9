"""Appending to a transformers DynamicLayer without concatenating: its keys and values become prefix views of
buffers with spare room, which the kernels' `step` writes the new tokens into; the layer sees ordinary
[B, KVH, P, D] tensors (get_seq_length, masks, crop and beam reorder work as before)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kernelbot import KernelbotError

_CAPACITY = "_kb_capacity"  # set only on the views this module makes: positions their buffer holds


class SteppingAttention(Protocol):
    num_kv_heads: int
    head_dim: int

    def step(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, past_len: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class BoundStep:
    """A kernel's step with its weights and constants bound (the engine's hot path); a SteppingAttention."""

    num_kv_heads: int
    head_dim: int
    step: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def kv_with_room(keys: torch.Tensor, values: torch.Tensor, new_tokens: int,
                 room: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, KVH, P + new_tokens, D] caches to append into after `keys`' P positions. Where `keys` and `values` are
    what this returned before, the views grow over the same buffers while these have room; otherwise new buffers
    with `room` spare positions are allocated and the past copied in once (any other tensor: a fresh cache, one
    cropped or reordered by transformers). Not for tensors shared between sequences: both would append into the
    same buffer."""
    needed = keys.shape[2] + new_tokens
    if _has_room(keys, needed) and _has_room(values, needed):
        return _grown_in_place(keys, needed), _grown_in_place(values, needed)
    return _reallocated(keys, needed, room), _reallocated(values, needed, room)


def _has_room(cache: torch.Tensor, needed: int) -> bool:
    return getattr(cache, _CAPACITY, -1) >= needed


def _grown_in_place(cache: torch.Tensor, needed: int) -> torch.Tensor:
    view = cache.as_strided((*cache.shape[:2], needed, cache.shape[3]), cache.stride(), cache.storage_offset())
    setattr(view, _CAPACITY, getattr(cache, _CAPACITY))
    return view


def _reallocated(cache: torch.Tensor, needed: int, room: int) -> torch.Tensor:
    batch, heads, past, dim = cache.shape
    buffer = cache.new_empty(batch, heads, needed + room, dim)
    buffer[:, :, :past].copy_(cache)
    view = buffer[:, :, :needed]
    setattr(view, _CAPACITY, needed + room)
    return view


def pure_forward(attention: SteppingAttention, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 past_key: torch.Tensor, past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's pure form on `step`: fresh caches holding the past, appended to, and the new keys and values
    returned (none of the outputs aliases an input)."""
    batch, tokens, _ = hidden_states.shape
    past_len = past_key.shape[2]
    shape = (batch, attention.num_kv_heads, past_len + tokens, attention.head_dim)
    key_cache, value_cache = hidden_states.new_empty(shape), hidden_states.new_empty(shape)
    key_cache[:, :, :past_len].copy_(past_key)
    value_cache[:, :, :past_len].copy_(past_value)
    out = attention.step(hidden_states, cos, sin, key_cache, value_cache, past_len)
    return out, key_cache[:, :, past_len:], value_cache[:, :, past_len:]


class RotaryForward:
    """Put before the reference Model in the bases of a kernel for an attention whose reference takes
    LlamaAttention's five inputs: `forward` is the pure form on the kernel's own `step`."""

    def forward(self: SteppingAttention, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past_key: torch.Tensor, past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pure_forward(self, hidden_states, cos, sin, past_key, past_value)


def step_dynamic_layer(attention: SteppingAttention, layer: Any, hidden_states: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, room: int = 256) -> torch.Tensor:
    """LlamaAttention.forward's work with a DynamicCache layer (`cache.layers[layer_idx]`, one `steppable_layer`
    accepts): the new tokens' rotated keys and values are appended to the layer by `attention.step` and its output
    returned. A sliding layer then keeps its last `sliding_window - 1` positions, as its own update does (the kernel
    attended over the window in the cache's own positions)."""
    batch, tokens, _ = hidden_states.shape
    if not layer.is_initialized or layer.keys is None or layer.keys.dim() != 4:
        empty = hidden_states.new_empty(batch, attention.num_kv_heads, 0, attention.head_dim)
        layer.lazy_initialization(empty, empty)
        layer.keys, layer.values = empty, empty
    past_len = layer.keys.shape[2]
    key_cache, value_cache = kv_with_room(layer.keys, layer.values, tokens, room)
    out = attention.step(hidden_states, cos, sin, key_cache, value_cache, past_len)
    layer.keys, layer.values = key_cache, value_cache
    if getattr(layer, "is_sliding", False):
        layer.cumulative_length += tokens
        keep = layer.sliding_window - 1
        layer.keys, layer.values = _tail(key_cache, keep), _tail(value_cache, keep)
    return out


def _tail(cache: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` positions of a view kv_with_room made, still growable over the rest of its buffer."""
    drop = cache.shape[2] - keep
    if drop <= 0:
        return cache
    view = cache[:, :, drop:]
    setattr(view, _CAPACITY, getattr(cache, _CAPACITY) - drop)
    return view


def steppable_layer(cache: Any, layer_idx: int, window: int | None = None) -> Any | None:
    """The cache's layer `layer_idx` where a kernel attending with `window` can step it, else None: transformers'
    plain DynamicLayer (an attention without a window), or its DynamicSlidingWindowLayer keeping that same window
    and no recorded past. Quantized and offloaded layers keep their module's path."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    if layers is None or not 0 <= layer_idx < len(layers):
        return None
    layer = layers[layer_idx]
    if type(layer) is DynamicLayer:
        return layer if window is None else None
    if type(layer) is DynamicSlidingWindowLayer and layer.sliding_window == window and not layer.record_past:
        return layer
    return None


def cached_positions(layer: Any) -> int:
    """Positions a steppable layer holds (a sliding layer's, not its cumulative length): the new tokens' offset in
    the keys the engine's mask covers."""
    keys = layer.keys if layer.is_initialized else None
    return 0 if keys is None or keys.dim() != 4 else keys.shape[2]


def check_cache_dtypes(family: str, dtype: torch.dtype, hidden_states: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor) -> None:
    """A bound step runs one dtype: the activations and both caches in the one it was bound for, else a one-line
    error naming the fix."""
    if key_cache.dtype != dtype or value_cache.dtype != dtype or hidden_states.dtype != dtype:
        raise KernelbotError(f"{family}: the caches are {key_cache.dtype}, the activations {hidden_states.dtype}, the "
                             f"kernel was bound for {dtype}: allocate the caches in the activations' dtype")


class IdentityRotation:
    """cos 1 and sin 0 over the first two dims of every head, [1, T, 2]: the step rotates those by nothing (exact in
    any dtype) and copies the rest, the rotation of an attention without RoPE; made once per (tokens, dtype, device)."""

    def __init__(self) -> None:
        self._made: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (hidden_states.shape[1], hidden_states.dtype, hidden_states.device)
        if key not in self._made:
            self._made[key] = (hidden_states.new_ones(1, key[0], 2), hidden_states.new_zeros(1, key[0], 2))
        return self._made[key]
