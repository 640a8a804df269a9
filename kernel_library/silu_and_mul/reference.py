import torch
from torch import nn
from torch.nn import functional as F


class Model(nn.Module):
    """SiLU of the first half of the last dim times its second half, as SGLang's SiluAndMul computes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
