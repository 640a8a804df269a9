"""The gated MLP's C++ backend: gate and up projections in one pass (SiLU-and-mul in registers), then down,
through the small-M GEMMs of kernel_library/small_m_gemm.h."""

from __future__ import annotations

from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.gated_mlp.reference import Model
from kernelbot.kernel_library.linear.cpp import SOURCE, PackedWeights, bf16_path, even_k, pack_panels_bf16


class GatedMLPCpp(Model):
    """gate and up share one pass over x (interleaved panels, SiLU-and-mul in registers), then down."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._gate_up = PackedWeights()
        self._down = PackedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inter, hidden = self.gate_proj.weight.shape
        grain = self.CONFIG["grain"]
        x2 = x.reshape(-1, hidden).contiguous()
        gate_up = [self.gate_proj.weight, self.up_proj.weight]
        if bf16_path(self._ext, x2):  # h rounded to bf16 once, where eager rounds gate, up, silu and the product
            h = self._ext.gate_up_silu_bf16(even_k(x2), self._gate_up.get(gate_up, pack_panels_bf16), inter, grain)
            out = self._ext.small_m_linear_bf16(even_k(h), self._down.get([self.down_proj.weight], pack_panels_bf16),
                                                None, hidden, grain)
        else:
            h = self._ext.gate_up_silu(x2.float(), self._gate_up.get(gate_up), inter, grain)
            out = self._ext.small_m_linear(h, self._down.get([self.down_proj.weight]), None, hidden, grain)
        return out.to(x.dtype).view(*x.shape[:-1], hidden)
