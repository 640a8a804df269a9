"""C++ attention over a KV cache: one packed GEMM for q, k and v, RoPE and the cache append in one kernel, attention
with an online softmax reading the cache in place, and the o_proj GEMM; nothing is concatenated or repeated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kernelbot import KernelbotError
from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.decode_attention.cache import pure_forward
from kernelbot.kernel_library.decode_attention.reference import Model
from kernelbot.kernel_library.linear.cpu import SOURCE as LINEAR_SOURCE
from kernelbot.kernel_library.linear.cpu import PackedWeights, bf16_path, even_k, pack_panels, pack_panels_bf16

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
    """`step` is the engine's path (appends into caches it is given); `forward` is the pure form for verification."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._gemm = load_cpp(LINEAR_SOURCE)
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
        batch, tokens, hidden = hidden_states.shape
        dtype, grain = hidden_states.dtype, self.CONFIG["grain"]
        if key_cache.dtype != dtype or value_cache.dtype != dtype:
            raise KernelbotError(f"decode_attention: the caches are {key_cache.dtype}, the activations {dtype}: "
                                 "allocate the caches in the activations' dtype")
        qkv = self._project_qkv(hidden_states.reshape(batch * tokens, hidden)).view(batch, tokens, -1)
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split((q_width, kv_width, kv_width), dim=-1)
        cos, sin = cos.to(dtype), sin.to(dtype)
        if cos.stride(-1) != 1:
            cos, sin = cos.contiguous(), sin.contiguous()
        q_rot = self._ext.rope_append(q, k, v, cos, sin, key_cache, value_cache, past_len, grain)
        attn = self._ext.attend(q_rot, key_cache, value_cache, past_len + tokens, self.scaling, 1)
        return self._linear(attn.view(batch * tokens, q_width), self._o, [self.o_proj.weight], None,
                            hidden).view(batch, tokens, hidden)

    def _project_qkv(self, x2: torch.Tensor) -> torch.Tensor:
        weights = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        bias = None
        if self.q_proj.bias is not None:
            bias = self._qkv_bias.get([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], concat_biases)
        n = sum(w.shape[0] for w in weights)
        return self._linear(x2, self._qkv, weights, bias, n)

    def _linear(self, x2: torch.Tensor, packed: PackedWeights, weights: list[torch.Tensor],
                bias: torch.Tensor | None, n: int) -> torch.Tensor:
        """x2 [M, K] @ (the weights stacked along N)^T (+ bias) with the linear family's C++ GEMM."""
        grain, dtype = self.CONFIG["grain"], x2.dtype
        x2 = x2.contiguous()
        if bf16_path(self._gemm, x2):
            panels = packed.get(weights, pack_fused_bf16)
            b = None if bias is None else bias.to(torch.bfloat16).contiguous()
            return self._gemm.small_m_linear_bf16(even_k(x2), panels, b, n, grain)
        panels = packed.get(weights, pack_fused)
        b = None if bias is None else bias.float().contiguous()
        return self._gemm.small_m_linear(x2.float(), panels, b, n, grain).to(dtype)
