"""The gated MLP's C++ backend: gate and up projections in one pass (act-and-mul in registers: SiLU or GELU's tanh
form), then down, through the small-M GEMMs of kernel_library/small_m_gemm.h."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.gated_mlp.reference import Model
from kernelbot.kernel_library.linear.cpp import SOURCE, PackedWeights, bf16_path, even_k, pack_panels_bf16


class GatedMLPCpp(Model):
    """gate and up share one pass over x (interleaved panels, act-and-mul in registers), then down."""

    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._gate_up = PackedWeights()
        self._down = PackedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound(x.dtype)(x)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward for inputs of this dtype, with the weights packed and the constants taken once: the engine's hot
        path (bound again whenever a pack is applied)."""
        ext, (inter, hidden), grain = self._ext, self.gate_proj.weight.shape, self.CONFIG["grain"]
        gelu = self.act == "gelu_tanh"
        gate_up = [self.gate_proj.weight, self.up_proj.weight]
        if bf16_path(ext, dtype):  # h rounded to bf16 once, where eager rounds gate, up, silu and the product
            panels = self._gate_up.get(gate_up, pack_panels_bf16)
            down = self._down.get([self.down_proj.weight], pack_panels_bf16)

            def run(x: torch.Tensor) -> torch.Tensor:
                h = ext.gate_up_act_bf16(even_k(x.reshape(-1, hidden).contiguous()), panels, inter, grain, gelu)
                return ext.small_m_linear_bf16(even_k(h), down, None, hidden, grain).view(*x.shape[:-1], hidden)
        else:
            panels, down = self._gate_up.get(gate_up), self._down.get([self.down_proj.weight])

            def run(x: torch.Tensor) -> torch.Tensor:
                h = ext.gate_up_act(x.reshape(-1, hidden).float().contiguous(), panels, inter, grain, gelu)
                out = ext.small_m_linear(h, down, None, hidden, grain)
                return out.to(x.dtype).view(*x.shape[:-1], hidden)
        return run
