"""Two gates of one input: its sigmoid and its tanh, two outputs."""
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x), torch.tanh(x)


batch, dim = 128, 512


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []
