"""The linear family's C++ backend: weights packed once into panels for the small-M GEMMs of
kernel_library/small_m_gemm.h (fp32 everywhere, bf16 on CPUs with avx512_bf16), and the wrapper that routes to them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kernelbot.kernel_library.cpp_wrapper import CppWrapper
from kernelbot.kernel_library.linear.reference import Model

SOURCE = Path(__file__).with_name("linear.cpp")


def pack_panels(weights: list[torch.Tensor]) -> torch.Tensor:
    """[N,K] weights (G of them, same shape) -> [ceil(N/8), G, K, 8] fp32 panels, zero-padded in N."""
    n, k = weights[0].shape
    n_panels = -(-n // 8)
    panels = [F.pad(w.detach().float(), (0, 0, 0, n_panels * 8 - n)).view(n_panels, 8, k).transpose(1, 2)
              for w in weights]
    return torch.stack(panels, 1).contiguous()


def pack_panels_bf16(weights: list[torch.Tensor]) -> torch.Tensor:
    """[N,K] weights (G of them) -> [ceil(N/16), G, ceil(K/2), 16, 2] bf16 panels (pairs of k per output column,
    as vdpbf16ps takes them), zero-padded in N and K."""
    n, k = weights[0].shape
    n_panels, k2 = -(-n // 16), -(-k // 2)
    panels = [F.pad(w.detach().to(torch.bfloat16), (0, 2 * k2 - k, 0, n_panels * 16 - n))
              .view(n_panels, 16, k2, 2).transpose(1, 2) for w in weights]
    return torch.stack(panels, 1).contiguous()


def even_k(x2: torch.Tensor) -> torch.Tensor:
    """[M,K] with a zero column appended when K is odd (the bf16 kernels consume k in pairs)."""
    return F.pad(x2, (0, 1)) if x2.shape[1] % 2 else x2


def bf16_path(ext: Any, dtype: torch.dtype) -> bool:
    """bf16 activations on a CPU with avx512_bf16 run the bf16 kernels; elsewhere bf16 goes through fp32."""
    return dtype == torch.bfloat16 and ext.has_avx512_bf16()


class LinearCpp(CppWrapper, Model):
    SOURCE = SOURCE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound(x.dtype)(x)

    def bound(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        ext, (n, k), grain = self._ext, self.weight.shape, self.CONFIG["grain"]
        bias = None if self.bias is None else self.bias.detach().to(dtype).contiguous()
        if bf16_path(ext, dtype):
            panels = self.packed("weight", [self.weight], pack_panels_bf16)

            def run(x: torch.Tensor) -> torch.Tensor:
                out = ext.small_m_linear_bf16(even_k(x.reshape(-1, k).contiguous()), panels, bias, n, grain)
                return out.view(*x.shape[:-1], n)
        else:
            panels, bias32 = self.packed("weight", [self.weight], pack_panels), None if bias is None else bias.float()

            def run(x: torch.Tensor) -> torch.Tensor:
                out = ext.small_m_linear(x.reshape(-1, k).float().contiguous(), panels, bias32, n, grain)
                return out.to(x.dtype).view(*x.shape[:-1], n)
        return run
