from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernelbot.kernel_library.rotary_embedding.cpp import rows
from kernelbot.kernel_library.rotary_embedding.reference import Model


@triton.jit
def _rotary_kernel(pos_ptr, x_ptr, out_ptr, cache_ptr, row_stride, head_size, half, NEOX: tl.constexpr,
                   HALF: tl.constexpr, REST: tl.constexpr):
    """One (token, head): the rotated pairs in fp32 from cos/sin cast to the activation dtype; the rest copied."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    heads = tl.num_programs(1)
    pos = tl.load(pos_ptr + token)
    i = tl.arange(0, HALF)
    m = i < half
    cos = tl.load(cache_ptr + pos * 2 * half + i, mask=m, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    sin = tl.load(cache_ptr + pos * 2 * half + half + i, mask=m, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    src = x_ptr + token * row_stride + head * head_size
    dst = out_ptr + (token * heads + head) * head_size
    first = i if NEOX else 2 * i
    second = i + half if NEOX else 2 * i + 1
    a = tl.load(src + first, mask=m, other=0.0).to(tl.float32)
    b = tl.load(src + second, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + first, (a * cos - b * sin).to(out_ptr.dtype.element_ty), mask=m)
    tl.store(dst + second, (b * cos + a * sin).to(out_ptr.dtype.element_ty), mask=m)
    j = 2 * half + tl.arange(0, REST)
    tl.store(dst + j, tl.load(src + j, mask=j < head_size), mask=j < head_size)


class RotaryEmbeddingTriton(Model):
    CONFIG: dict[str, Any] = {"num_warps": 1}

    def forward(self, positions: torch.Tensor, query: torch.Tensor,
                key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = positions.reshape(-1).long().contiguous()
        return self._rotate_all(positions, query), self._rotate_all(positions, key)

    def _rotate_all(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        tokens, half = positions.numel(), self.cos_sin_cache.shape[-1] // 2
        src = rows(x, tokens)
        out = torch.empty(src.shape, dtype=x.dtype, device=x.device)
        heads = src.shape[1] // self.head_size if tokens else 0
        if tokens and heads:
            _rotary_kernel[(tokens, heads)](
                positions, src, out, self.cos_sin_cache.contiguous(), src.stride(0), self.head_size, half,
                NEOX=self.is_neox_style, HALF=triton.next_power_of_2(max(half, 1)),
                REST=triton.next_power_of_2(max(self.head_size - 2 * half, 1)), num_warps=self.CONFIG["num_warps"])
        return out.reshape(x.shape)
