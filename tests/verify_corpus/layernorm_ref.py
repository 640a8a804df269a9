"""Layer norm without affine weights: its variance is where a one-pass formula loses its digits."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)

    def forward(self, x):
        return self.norm(x)


rows, dim = 32, 96


def get_inputs():
    return [torch.randn(rows, dim)]


def get_init_inputs():
    return [dim]
