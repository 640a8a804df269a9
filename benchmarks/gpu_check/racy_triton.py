"""A racy Triton RMSNorm for reference.py: every program passes its row's sum of squares through one shared global
slot (store, then load back), so a program can read another row's value. Run one program at a time (Triton's CPU
interpreter) it is right, and the interpreter's race check flags the slot; on a GPU the programs run together and
read each other's sums, or the slot before anything was written to it (the verifier fills fresh GPU allocations with
NaN), so `correctness` fails there. compute-sanitizer's racecheck does not catch it: the race is in global memory,
and racecheck watches shared memory only."""

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _rmsnorm_racy(x_ptr, w_ptr, out_ptr, scratch_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(scratch_ptr, tl.sum(x * x, axis=0))  # one slot shared by every program
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.load(scratch_ptr) / n_cols + eps)
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
        scratch = torch.empty(1, dtype=torch.float32, device=x.device)
        _rmsnorm_racy[(x.numel() // n,)](x, self.weight, out, scratch, n, self.variance_epsilon,
                                         BLOCK=triton.next_power_of_2(n))
        return out
