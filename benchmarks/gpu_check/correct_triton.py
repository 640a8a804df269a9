"""A correct Triton RMSNorm for reference.py: one program per row, the row's sum of squares kept in registers."""

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, w * x * inv, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = x.shape[-1]
        out = torch.empty_like(x)
        _rmsnorm[(x.numel() // n,)](x, self.weight, out, n, self.variance_epsilon, BLOCK=triton.next_power_of_2(n))
        return out
