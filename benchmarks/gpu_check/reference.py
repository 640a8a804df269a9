"""RMSNorm as Llama computes it, in KernelBench format: the reference that the GPU check's two Triton candidates
(correct_triton.py, racy_triton.py) replace."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.variance_epsilon)).to(x.dtype)


rows, hidden = 256, 512


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(rows, hidden)]


def get_init_inputs() -> list:
    return [hidden, 1e-6]
