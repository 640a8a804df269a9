"""The MoE experts' C++ backend: the router's choices as the engine made them, then every chosen expert's gated MLP
over its tokens in one call into kernel_library/sparse_moe/moe.cpp (the sparse MoE block's kernel, whose experts'
weights are packed once into the small-M GEMMs' panels)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelbot.kernel_library.cpp_wrapper import CppWrapper
from kernelbot.kernel_library.linear.cpp import bf16_path, pack_panels, pack_panels_bf16
from kernelbot.kernel_library.moe_experts.reference import Model
from kernelbot.kernel_library.sparse_moe.cpp import SOURCE, per_expert


class MoeExpertsCpp(CppWrapper, Model):
    SOURCE = SOURCE

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return self.bound(x.dtype)(x, topk_weights, topk_ids)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """forward for inputs of this dtype, with every expert's weights packed once: the engine's hot path."""
        ext, grain = self._ext, self.CONFIG["grain"]
        inter = self.w2_weight.shape[-1]
        pack = pack_panels_bf16 if bf16_path(ext, dtype) else pack_panels
        gate_up = self.packed("gate_up", [self.w13_weight], per_expert(pack, 2))
        down = self.packed("down", [self.w2_weight], per_expert(pack, 1))

        def run(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
            out = ext.moe_experts(x.contiguous(), topk_ids.to(torch.int64).contiguous(),
                                  topk_weights.to(torch.float32).contiguous(), gate_up, down, inter, grain)
            return out.to(x.dtype)
        return run
