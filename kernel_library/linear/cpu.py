from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.linear.reference import Model

SOURCE = Path(__file__).with_name("linear.cpp")


def pack_panels(weights: list[torch.Tensor]) -> torch.Tensor:
    """[N,K] weights (G of them, same shape) -> [ceil(N/8), G, K, 8] panels, zero-padded in N."""
    n, k = weights[0].shape
    n_panels = -(-n // 8)
    panels = [F.pad(w.detach().float(), (0, 0, 0, n_panels * 8 - n)).view(n_panels, 8, k).transpose(1, 2)
              for w in weights]
    return torch.stack(panels, 1).contiguous()


class PackedWeights:
    """Panels packed once from live weights; repacked if a weight is replaced or written in place."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._panels: torch.Tensor | None = None

    def get(self, weights: list[torch.Tensor]) -> torch.Tensor:
        key = tuple((w.data_ptr(), w._version) for w in weights)
        if key != self._key:
            self._panels, self._key = pack_panels(weights), key
        assert self._panels is not None
        return self._panels


class LinearCpp(Model):
    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(SOURCE)
        self._packed = PackedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.weight.shape
        x2 = x.reshape(-1, k).contiguous()
        bias = None if self.bias is None else self.bias.detach().contiguous()
        out = self._ext.small_m_linear(x2, self._packed.get([self.weight]), bias, n, self.CONFIG["grain"])
        return out.view(*x.shape[:-1], n)
