"""The RMSNorm family's C++ backend: rmsnorm.cpp, one pass per row, bound for Python."""

from __future__ import annotations

from collections.abc import Callable
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
        return self.bound(hidden_states.dtype)(hidden_states)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward for inputs of this dtype, with the weight cast and the constants taken once: the engine's hot path
        (bound again whenever a pack is applied)."""
        ext, eps, grain = self._ext, self.variance_epsilon, self.CONFIG["grain"]
        weight = self.weight.detach().to(dtype).contiguous()
        return lambda hidden_states: ext.rmsnorm(hidden_states.contiguous(), weight, eps, grain)
