"""A reference whose inputs are transposed views (a column-major activation, as a GEMM's A operand often is)."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.tanh(a) * b


rows, cols = 48, 40


def get_inputs():
    return [torch.randn(cols, rows).t(), torch.randn(rows, cols)]


def get_init_inputs():
    return []
