"""GPT-2-style attention on decode_attention's C++ step (kernel_library/decode_attention/attention.cpp): the fused
c_attn weight is already q, k and v stacked (transposed once into panels), c_proj's bias goes into its GEMM, and the
rotation is the identity (cos 1, sin 0 over two dims of a head, the rest copied: exact in any dtype)."""

from __future__ import annotations

import torch

from kernelbot.kernel_library.cpp_wrapper import Pack
from kernelbot.kernel_library.decode_attention.cache import pure_forward
from kernelbot.kernel_library.decode_attention.cpp import StepAttentionCpp, StepWeights
from kernelbot.kernel_library.fused_attention.reference import Model
from kernelbot.kernel_library.linear.cpp import pack_panels, pack_panels_bf16


def _transposed(pack: Pack) -> Pack:
    """Conv1D weights ([in, out]) packed as the [out, in] weights the GEMMs take."""
    return lambda weights: pack([w.detach().t() for w in weights])


PACK, PACK_BF16 = _transposed(pack_panels), _transposed(pack_panels_bf16)  # built once: PackedWeights keys on them


class FusedAttentionCpp(StepAttentionCpp, Model):
    FAMILY, ROTATES = "fused_attention", False

    def forward(self, hidden_states: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pure_forward(self, hidden_states, None, None, past_key, past_value)

    def step_weights(self, bf16: bool) -> StepWeights:
        pack = PACK_BF16 if bf16 else PACK
        return StepWeights(self.packed("qkv", [self.c_attn.weight], pack), self.c_attn.bias.detach(),
                           self.packed("o", [self.c_proj.weight], pack), self.c_proj.bias.detach())
