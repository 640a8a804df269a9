import torch
import torch.nn.functional as F
from torch import nn


class Model(nn.Module):
    """nn.Linear: y = x @ W^T (+ b), weights in the model's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: str = "float32"):
        super().__init__()
        t = getattr(torch, dtype)
        self.weight = nn.Parameter((torch.randn(out_features, in_features) / in_features**0.5).to(t))
        self.bias = nn.Parameter((torch.randn(out_features) * 0.1).to(t)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
