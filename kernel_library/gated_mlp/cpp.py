"""The gated MLP's C++ backend: gate and up projections in one pass (act-and-mul in registers: SiLU or GELU's tanh
form), then down, through the small-M GEMMs of kernel_library/small_m_gemm.h."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelbot.kernel_library.cpp_wrapper import CppWrapper
from kernelbot.kernel_library.gated_mlp.reference import Model
from kernelbot.kernel_library.linear.cpp import SOURCE, bf16_path, even_k, pack_panels, pack_panels_bf16


class GatedMLPCpp(CppWrapper, Model):
    """gate and up share one pass over x (interleaved panels, act-and-mul in registers), then down."""

    SOURCE = SOURCE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound(x.dtype)(x)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        ext, (inter, hidden), grain = self._ext, self.gate_proj.weight.shape, self.CONFIG["grain"]
        gelu = self.act == "gelu_tanh"
        gate_up = [self.gate_proj.weight, self.up_proj.weight]
        if bf16_path(ext, dtype):  # h rounded to bf16 once, where eager rounds gate, up, silu and the product
            panels = self.packed("gate_up", gate_up, pack_panels_bf16)
            down = self.packed("down", [self.down_proj.weight], pack_panels_bf16)

            def run(x: torch.Tensor) -> torch.Tensor:
                h = ext.gate_up_act_bf16(even_k(x.reshape(-1, hidden).contiguous()), panels, inter, grain, gelu)
                return ext.small_m_linear_bf16(even_k(h), down, None, hidden, grain).view(*x.shape[:-1], hidden)
        else:
            panels = self.packed("gate_up", gate_up, pack_panels)
            down = self.packed("down", [self.down_proj.weight], pack_panels)

            def run(x: torch.Tensor) -> torch.Tensor:
                h = ext.gate_up_act(x.reshape(-1, hidden).float().contiguous(), panels, inter, grain, gelu)
                out = ext.small_m_linear(h, down, None, hidden, grain)
                return out.to(x.dtype).view(*x.shape[:-1], hidden)
        return run
