"""GELU (erf) on bfloat16 activations."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)


batch, dim = 24, 96


def get_inputs():
    return [torch.randn(batch, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
