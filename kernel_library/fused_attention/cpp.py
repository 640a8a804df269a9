"""GPT-2-style attention on decode_attention's C++ step (kernel_library/decode_attention/attention.cpp): the fused
c_attn weight is already q, k and v stacked (transposed once into panels), c_proj's bias goes into its GEMM, and the
rotation is the identity (cos 1, sin 0 over two dims of a head, the rest copied: exact in any dtype)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.decode_attention.cache import (
    BoundStep,
    IdentityRotation,
    check_cache_dtypes,
    pure_forward,
)
from kernelbot.kernel_library.decode_attention.cpp import SOURCE
from kernelbot.kernel_library.fused_attention.reference import Model
from kernelbot.kernel_library.linear.cpp import PackedWeights, bf16_path, pack_panels, pack_panels_bf16

Pack = Callable[[list[torch.Tensor]], torch.Tensor]


def _transposed(pack: Pack) -> Pack:
    """Conv1D weights ([in, out]) packed as the [out, in] weights the GEMMs take."""
    return lambda weights: pack([w.detach().t() for w in weights])


PACK, PACK_BF16 = _transposed(pack_panels), _transposed(pack_panels_bf16)  # built once: PackedWeights keys on them


class FusedAttentionCpp(Model):
    """`step` is the engine's path (appends into caches it is given), one C++ call; `forward` is the pure form for
    verification."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._qkv = PackedWeights()
        self._o = PackedWeights()
        self._identity = IdentityRotation()

    def forward(self, hidden_states: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pure_forward(self, hidden_states, None, None, past_key, past_value)

    def step(self, hidden_states: torch.Tensor, cos: None, sin: None, key_cache: torch.Tensor,
             value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
        """Attention of hidden_states' T tokens at positions past_len.., appending their keys and values to
        key_cache/value_cache [B, heads, capacity >= past_len + T, D] (written in place) -> [B, T, hidden]."""
        return self.bound(hidden_states.dtype).step(hidden_states, cos, sin, key_cache, value_cache, past_len)

    def bound(self, dtype: torch.dtype) -> BoundStep:
        """step for activations of this dtype, with the weights packed and the constants taken once: the engine's hot
        path (bound again whenever a pack is applied)."""
        ext, heads, scaling, grain = self._ext, self.num_heads, self.scaling, self.CONFIG["grain"]
        bf16 = bf16_path(ext, dtype)
        qkv = self._qkv.get([self.c_attn.weight], PACK_BF16 if bf16 else PACK)
        o = self._o.get([self.c_proj.weight], PACK_BF16 if bf16 else PACK)
        bias_dtype = torch.bfloat16 if bf16 else torch.float32
        qkv_bias = self.c_attn.bias.detach().to(bias_dtype).contiguous()
        o_bias = self.c_proj.bias.detach().to(bias_dtype).contiguous()
        identity = self._identity

        def step(hidden_states: torch.Tensor, cos: None, sin: None, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
            check_cache_dtypes("fused_attention", dtype, hidden_states, key_cache, value_cache)
            one, zero = identity(hidden_states)
            return ext.step(hidden_states, qkv, qkv_bias, o, o_bias, one, zero, key_cache, value_cache, past_len,
                            heads, scaling, grain, 0.0, 0, None)
        return BoundStep(self.num_heads, self.head_dim, step)
