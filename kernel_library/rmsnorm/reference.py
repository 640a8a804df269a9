import torch
from torch import nn


class Model(nn.Module):
    """RMSNorm as Llama computes it: fp32 statistics, cast back, then the weight (in the model's dtype)."""

    def __init__(self, hidden_size: int, eps: float, dtype: str = "float32"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=getattr(torch, dtype)))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
