"""The RMSNorm family's C++ backend: rmsnorm.cpp, one pass per row, bound for Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.rmsnorm.reference import Model


class RMSNormCpp(Model):
    CONFIG: dict[str, Any] = {"grain": 8}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(Path(__file__).with_name("rmsnorm.cpp"))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.contiguous()
        return self._ext.rmsnorm(x, self.weight.to(x.dtype).contiguous(), self.variance_epsilon,
                                 self.CONFIG["grain"])
