"""The SiLU-and-mul family's C++ backend: silu_and_mul.cpp, one fused pointwise loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.silu_and_mul.reference import Model


class SiluAndMulCpp(Model):
    CONFIG: dict[str, Any] = {"grain": 8}

    def __init__(self) -> None:
        super().__init__()
        self._ext = load_cpp(Path(__file__).with_name("silu_and_mul.cpp"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._ext.silu_and_mul(x.contiguous(), self.CONFIG["grain"])
