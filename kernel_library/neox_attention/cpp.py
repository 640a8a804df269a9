"""GPT-NeoX-style attention on decode_attention's C++ step (kernel_library/decode_attention/attention.cpp, which
rotates the first R dims of a head when cos/sin are R wide): query_key_value's rows, laid out per head as q, k, v,
are reordered once into the q-heads, k-heads, v-heads order the step's GEMM writes (with its bias), so the step's
cache rows and outputs are the module's own; dense and its bias go into the output GEMM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.decode_attention.cache import BoundStep, check_cache_dtypes, pure_forward
from kernelbot.kernel_library.decode_attention.cpp import SOURCE
from kernelbot.kernel_library.linear.cpp import PackedWeights, bf16_path, pack_panels, pack_panels_bf16
from kernelbot.kernel_library.neox_attention.reference import Model

Pack = Callable[[list[torch.Tensor]], torch.Tensor]


def heads_grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [heads, 3, head_dim, ...] (NeoX's per-head q, k, v) -> [3, heads, head_dim, ...] (all q, all k, all v)."""
    return t.detach().reshape(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def grouped_packing(heads: int) -> dict[bool, Pack]:
    """bf16 or not -> the packing of per-head q, k, v rows (heads_grouped first), each function built once:
    PackedWeights keys on the packing function."""
    return {bf16: (lambda weights, pack=pack_panels_bf16 if bf16 else pack_panels:
                   pack([heads_grouped(w, heads) for w in weights])) for bf16 in (False, True)}


class NeoxAttentionCpp(Model):
    """`step` is the engine's path (appends into caches it is given), one C++ call; `forward` is the pure form for
    verification."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._qkv = PackedWeights()
        self._o = PackedWeights()
        self._pack_qkv = grouped_packing(self.num_heads)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pure_forward(self, hidden_states, cos, sin, past_key, past_value)

    def step(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
        """Attention of hidden_states' T tokens at positions past_len.., appending their rotated keys and values to
        key_cache/value_cache [B, heads, capacity >= past_len + T, D] (written in place) -> [B, T, hidden]."""
        return self.bound(hidden_states.dtype).step(hidden_states, cos, sin, key_cache, value_cache, past_len)

    def bound(self, dtype: torch.dtype) -> BoundStep:
        """step for activations of this dtype, with the weights packed and the constants taken once: the engine's hot
        path (bound again whenever a pack is applied)."""
        ext, heads, scaling, grain = self._ext, self.num_heads, self.scaling, self.CONFIG["grain"]
        bf16 = bf16_path(ext, dtype)
        qkv = self._qkv.get([self.query_key_value.weight], self._pack_qkv[bf16])
        o = self._o.get([self.dense.weight], pack_panels_bf16 if bf16 else pack_panels)
        bias_dtype = torch.bfloat16 if bf16 else torch.float32
        qkv_bias, o_bias = None, None
        if self.query_key_value.bias is not None:
            qkv_bias = heads_grouped(self.query_key_value.bias, heads).to(bias_dtype).contiguous()
        if self.dense.bias is not None:
            o_bias = self.dense.bias.detach().to(bias_dtype).contiguous()

        def step(hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
            check_cache_dtypes("neox_attention", dtype, hidden_states, key_cache, value_cache)
            return ext.step(hidden_states, qkv, qkv_bias, o, o_bias, cos, sin, key_cache, value_cache, past_len, heads,
                            scaling, grain, 0.0, 0, None)
        return BoundStep(self.num_kv_heads, self.head_dim, step)
