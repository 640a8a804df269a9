"""BLOOM-style attention on decode_attention's C++ step (kernel_library/decode_attention/attention.cpp): the step adds
each head's ALiBi slope times the key's position to its scores; query_key_value's rows, per head q, k, v as in
GPT-NeoX, are reordered once into the order the step's GEMM writes; no rotation (cos 1, sin 0 over the first two
dims of a head: the rest are copied); dense and its bias in the output GEMM, then the residual added."""

from __future__ import annotations

import torch

from kernelbot.kernel_library.alibi_attention.reference import Model
from kernelbot.kernel_library.decode_attention.cache import pure_forward
from kernelbot.kernel_library.decode_attention.cpp import StepAttentionCpp, StepWeights
from kernelbot.kernel_library.neox_attention.cpp import per_head_qkv_weights


class AlibiAttentionCpp(StepAttentionCpp, Model):
    FAMILY, ROTATES = "alibi_attention", False

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, key, value = pure_forward(self, hidden_states, None, None, past_key, past_value)
        return out.add_(residual), key, value

    def step_weights(self, bf16: bool) -> StepWeights:
        return per_head_qkv_weights(self, bf16)

    def score_terms(self) -> tuple[float, int, torch.Tensor | None]:
        return 0.0, 0, self.slopes.float().contiguous()
