from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from kernelbot.kernel_library.cpp_build import load_cpp


class RMSNormCpp(nn.Module):
    CONFIG: dict[str, Any] = {"grain": 8}

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self._ext = load_cpp(Path(__file__).with_name("rmsnorm.cpp"))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.contiguous()
        return self._ext.rmsnorm(x, self.weight.to(x.dtype).contiguous(), self.variance_epsilon,
                                 self.CONFIG["grain"])
