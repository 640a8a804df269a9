"""BLOOM-style attention on decode_attention's C++ step (kernel_library/decode_attention/attention.cpp): the step adds
each head's ALiBi slope times the key's position to its scores; query_key_value's rows, per head q, k, v as in
GPT-NeoX, are reordered once into the order the step's GEMM writes; no rotation (cos 1, sin 0 over the first two
dims of a head: the rest are copied); dense and its bias in the output GEMM, then the residual added."""

from __future__ import annotations

from typing import Any

import torch

from kernelbot.kernel_library.alibi_attention.reference import Model
from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.decode_attention.cache import (
    BoundStep,
    IdentityRotation,
    check_cache_dtypes,
    pure_forward,
)
from kernelbot.kernel_library.decode_attention.cpp import SOURCE
from kernelbot.kernel_library.linear.cpp import PackedWeights, bf16_path, pack_panels, pack_panels_bf16
from kernelbot.kernel_library.neox_attention.cpp import grouped_packing, heads_grouped


class AlibiAttentionCpp(Model):
    """`step` is the engine's path (appends into caches it is given, returns the attention before the residual), one
    C++ call; `forward` is the pure form for verification."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._qkv = PackedWeights()
        self._o = PackedWeights()
        self._pack_qkv = grouped_packing(self.num_heads)
        self._identity = IdentityRotation()

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, key, value = pure_forward(self, hidden_states, None, None, past_key, past_value)
        return out.add_(residual), key, value

    def step(self, hidden_states: torch.Tensor, cos: None, sin: None, key_cache: torch.Tensor,
             value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
        """Attention of hidden_states' T tokens at positions past_len.., appending their keys and values to
        key_cache/value_cache [B, heads, capacity >= past_len + T, D] (written in place) -> [B, T, hidden], the
        residual not yet added."""
        return self.bound(hidden_states.dtype).step(hidden_states, cos, sin, key_cache, value_cache, past_len)

    def bound(self, dtype: torch.dtype) -> BoundStep:
        """step for activations of this dtype, with the weights packed and the constants taken once: the engine's hot
        path (bound again whenever a pack is applied)."""
        ext, heads, scaling, grain = self._ext, self.num_heads, self.scaling, self.CONFIG["grain"]
        bf16 = bf16_path(ext, dtype)
        qkv = self._qkv.get([self.query_key_value.weight], self._pack_qkv[bf16])
        o = self._o.get([self.dense.weight], pack_panels_bf16 if bf16 else pack_panels)
        bias_dtype = torch.bfloat16 if bf16 else torch.float32
        qkv_bias = heads_grouped(self.query_key_value.bias, heads).to(bias_dtype).contiguous()
        o_bias = self.dense.bias.detach().to(bias_dtype).contiguous()
        slopes, identity = self.slopes.float().contiguous(), self._identity

        def step(hidden_states: torch.Tensor, cos: None, sin: None, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
            check_cache_dtypes("alibi_attention", dtype, hidden_states, key_cache, value_cache)
            one, zero = identity(hidden_states)
            return ext.step(hidden_states, qkv, qkv_bias, o, o_bias, one, zero, key_cache, value_cache, past_len,
                            heads, scaling, grain, 0.0, 0, slopes)
        return BoundStep(self.num_kv_heads, self.head_dim, step)
