"""C++ attention over a KV cache in one call: one packed GEMM for q, k and v, RoPE, the cache append and attention
with an online softmax reading the cache in place (one parallel region), and the o_proj GEMM; nothing is
concatenated or repeated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.decode_attention.cache import BoundStep, check_cache_dtypes, pure_forward
from kernelbot.kernel_library.decode_attention.reference import Model
from kernelbot.kernel_library.linear.cpp import PackedWeights, bf16_path, pack_panels, pack_panels_bf16

SOURCE = Path(__file__).with_name("attention.cpp")


def pack_fused(weights: list[torch.Tensor]) -> torch.Tensor:
    """Weights stacked along N (q, k and v; or o_proj's alone), packed as one fp32 GEMM's panels."""
    return pack_panels([torch.cat([w.detach() for w in weights])])


def pack_fused_bf16(weights: list[torch.Tensor]) -> torch.Tensor:
    """Weights stacked along N, packed as one bf16 GEMM's panels."""
    return pack_panels_bf16([torch.cat([w.detach() for w in weights])])


def concat_biases(biases: list[torch.Tensor]) -> torch.Tensor:
    """q, k, v biases as one [N] vector (the fused GEMM's)."""
    return torch.cat([b.detach() for b in biases])


class DecodeAttentionCpp(Model):
    """`step` is the engine's path (appends into caches it is given), one C++ call; `forward` is the pure form for
    verification."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._qkv = PackedWeights()
        self._qkv_bias = PackedWeights()
        self._o = PackedWeights()

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pure_forward(self, hidden_states, cos, sin, past_key, past_value)

    def step(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
        """Attention of hidden_states' T tokens at positions past_len.., appending their rotated keys and values to
        key_cache/value_cache [B, KVH, capacity >= past_len + T, D] (written in place) -> [B, T, hidden]."""
        return self.bound(hidden_states.dtype).step(hidden_states, cos, sin, key_cache, value_cache, past_len)

    def bound(self, dtype: torch.dtype) -> BoundStep:
        """step for activations of this dtype, with the weights packed and the constants taken once: the engine's hot
        path (bound again whenever a pack is applied)."""
        ext, heads, scaling, grain = self._ext, self.num_heads, self.scaling, self.CONFIG["grain"]
        softcap, window = self.softcap or 0.0, self.sliding_window or 0
        bf16 = bf16_path(ext, dtype)
        pack = pack_fused_bf16 if bf16 else pack_fused
        qkv = self._qkv.get([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], pack)
        o = self._o.get([self.o_proj.weight], pack)
        bias = None
        if self.q_proj.bias is not None:
            bias = self._qkv_bias.get([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], concat_biases)
            bias = bias.to(torch.bfloat16 if bf16 else torch.float32).contiguous()

        def step(hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
            check_cache_dtypes("decode_attention", dtype, hidden_states, key_cache, value_cache)
            return ext.step(hidden_states, qkv, bias, o, None, cos, sin, key_cache, value_cache, past_len, heads,
                            scaling, grain, softcap, window, None)
        return BoundStep(self.num_kv_heads, self.head_dim, step)
