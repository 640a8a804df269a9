"""The RoPE family's C++ backend: rotary_embedding.cpp, rotating q and k in one call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.rotary_embedding.reference import Model


class RotaryEmbeddingCpp(Model):
    CONFIG: dict[str, Any] = {"grain": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(Path(__file__).with_name("rotary_embedding.cpp"))

    def forward(self, positions: torch.Tensor, query: torch.Tensor,
                key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = positions.reshape(-1).long().contiguous()
        q, k = self._ext.rotary_embedding(positions, rows(query, positions.numel()), rows(key, positions.numel()),
                                          self.cos_sin_cache.contiguous(), self.head_size, self.is_neox_style,
                                          self.CONFIG["grain"])
        return q.reshape(query.shape), k.reshape(key.shape)


def rows(x: torch.Tensor, tokens: int) -> torch.Tensor:
    """[tokens, heads * head_size] with unit stride along a row (SGLang's q and k are column slices of qkv)."""
    x = x.reshape(tokens, -1)
    return x if x.stride(-1) == 1 else x.contiguous()
