"""C++ attention over a KV cache in one call: one packed GEMM for q, k and v, RoPE, the cache append and attention
with an online softmax reading the cache in place (one parallel region), and the o_proj GEMM; nothing is
concatenated or repeated. StepAttentionCpp binds that step for every attention family built on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

from kernelbot.kernel_library.cpp_wrapper import CppWrapper
from kernelbot.kernel_library.decode_attention.cache import (
    BoundStep,
    IdentityRotation,
    RotaryForward,
    check_cache_dtypes,
)
from kernelbot.kernel_library.decode_attention.reference import Model
from kernelbot.kernel_library.linear.cpp import bf16_path, pack_panels, pack_panels_bf16

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


class StepWeights(NamedTuple):
    """A family's weights as the step takes them: q, k and v packed as one GEMM's panels, its rows in the order
    q heads, k heads, v heads; the output projection's panels; each bias, as the module holds it, or None."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None


class StepAttentionCpp(CppWrapper):
    """Put before the family's reference Model in the bases of a C++ attention kernel: `step` is the engine's path
    (appends into caches it is given), one C++ call; the family's `forward`, the pure form for verification, runs on
    it. The family gives its weights (`step_weights`) and, where it has them, what else shapes its scores."""

    SOURCE = SOURCE
    FAMILY: ClassVar[str]  # names the family in errors
    ROTATES: ClassVar[bool] = True  # the step's cos and sin rotate q and k; else no rotation (IdentityRotation)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._identity = IdentityRotation()

    def step(self, hidden_states: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
             key_cache: torch.Tensor, value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
        """Attention of hidden_states' T tokens at positions past_len.., appending their keys (rotated, where the family
        rotates) and values to key_cache/value_cache [B, KVH, capacity >= past_len + T, D] (written in place) ->
        [B, T, hidden], before any residual the module adds."""
        return self.bound(hidden_states.dtype).step(hidden_states, cos, sin, key_cache, value_cache, past_len)

    def bound(self, dtype: torch.dtype) -> BoundStep:
        """step for activations of this dtype, with the weights packed and the constants taken once: the engine's hot
        path (bound again whenever a pack is applied)."""
        ext, family, heads, scaling, grain = self._ext, self.FAMILY, self.num_heads, self.scaling, self.CONFIG["grain"]
        bf16 = bf16_path(ext, dtype)
        qkv, qkv_bias, o, o_bias = self.step_weights(bf16)
        qkv_bias, o_bias = (None if b is None else b.to(torch.bfloat16 if bf16 else torch.float32).contiguous()
                            for b in (qkv_bias, o_bias))
        softcap, window, slopes = self.score_terms()
        identity = None if self.ROTATES else self._identity

        def step(hidden_states: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                 key_cache: torch.Tensor, value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
            check_cache_dtypes(family, dtype, hidden_states, key_cache, value_cache)
            if identity is not None:
                cos, sin = identity(hidden_states)
            return ext.step(hidden_states, qkv, qkv_bias, o, o_bias, cos, sin, key_cache, value_cache, past_len, heads,
                            scaling, grain, softcap, window, slopes)
        return BoundStep(self.num_kv_heads, self.head_dim, step)

    def step_weights(self, bf16: bool) -> StepWeights:
        """The module's weights for the step, packed for the bf16 GEMMs or (bf16 False) the fp32 ones."""
        raise NotImplementedError

    def score_terms(self) -> tuple[float, int, torch.Tensor | None]:
        """What the step does to the scores besides scaling: soft-cap them at this value (0: no cap), attend within
        this sliding window (0: all keys), add each head's ALiBi slope times the key's position (None: no slopes)."""
        return 0.0, 0, None


class DecodeAttentionCpp(RotaryForward, StepAttentionCpp, Model):
    FAMILY = "decode_attention"

    def step_weights(self, bf16: bool) -> StepWeights:
        pack = pack_fused_bf16 if bf16 else pack_fused
        qkv = self.packed("qkv", [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], pack)
        bias = None
        if self.q_proj.bias is not None:
            bias = self.packed("qkv_bias", [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], concat_biases)
        return StepWeights(qkv, bias, self.packed("o", [self.o_proj.weight], pack), None)

    def score_terms(self) -> tuple[float, int, torch.Tensor | None]:
        return self.softcap or 0.0, self.sliding_window or 0, None
