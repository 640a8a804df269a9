"""The same layer norm with a two-pass variance (mean first, then the mean square of x - mean)."""
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _layernorm(x_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / n_cols
    tl.store(out_ptr + row * n_cols + cols, centred / tl.sqrt(var + eps), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.eps = 1e-5

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n_cols = x.shape[-1]
        _layernorm[(x.numel() // n_cols,)](x, out, n_cols, self.eps, BLOCK=triton.next_power_of_2(n_cols))
        return out
