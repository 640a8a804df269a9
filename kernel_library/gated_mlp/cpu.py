from __future__ import annotations

from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.gated_mlp.reference import Model
from kernelbot.kernel_library.linear.cpu import SOURCE, PackedWeights


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
        h = self._ext.gate_up_silu(x2, self._gate_up.get([self.gate_proj.weight, self.up_proj.weight]), inter, grain)
        out = self._ext.small_m_linear(h, self._down.get([self.down_proj.weight]), None, hidden, grain)
        return out.view(*x.shape[:-1], hidden)
