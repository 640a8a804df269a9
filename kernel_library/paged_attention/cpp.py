"""The paged attention family's C++ backend: paged_attention.cpp, one task per (request, kv head)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelbot.kernel_library.cpp_build import load_cpp
from kernelbot.kernel_library.paged_attention.reference import Model


class PagedAttentionCpp(Model):
    CONFIG: dict[str, Any] = {}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._ext = load_cpp(Path(__file__).with_name("paged_attention.cpp"))

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                query_start_loc: torch.Tensor) -> torch.Tensor:
        return self.bound(query.dtype)(query, kv_cache, block_table, seq_lens, query_start_loc)

    def bound(self, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
        """forward with the constants taken once (the engine's hot path)."""
        ext, kv_heads, scale = self._ext, self.num_kv_heads, self.scale
        return lambda q, cache, table, lens, starts: ext.paged_attention(q, cache, table, lens, starts, kv_heads, scale)
