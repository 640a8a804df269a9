"""The fused add + RMSNorm family's C++ backend: add_rmsnorm.cpp, one pass per row for the sum and its statistics,
one for the output, bound for Python."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelbot.kernel_library.add_rmsnorm.reference import Model
from kernelbot.kernel_library.cpp_build import load_cpp

Pair = tuple[torch.Tensor, torch.Tensor]


class AddRMSNormCpp(Model):
    CONFIG: dict[str, Any] = {"grain": 8}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(Path(__file__).with_name("add_rmsnorm.cpp"))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> Pair:
        return self.bound(x.dtype)(x, residual)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], Pair]:
        """forward for inputs of this dtype, with the weight cast and the constants taken once (the engine's hot
        path, bound again whenever a pack is applied)."""
        ext, eps, grain, fp32 = self._ext, self.variance_epsilon, self.CONFIG["grain"], self.weight_in_fp32
        weight = self.weight.detach().to(dtype).contiguous()

        def run(x: torch.Tensor, residual: torch.Tensor) -> Pair:
            out, new_residual = ext.add_rmsnorm(x.contiguous(), residual.contiguous(), weight, eps, fp32, grain)
            return out, new_residual

        return run
