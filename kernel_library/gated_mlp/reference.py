import torch
import torch.nn.functional as F
from torch import nn


class Model(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), no biases, weights in the model's dtype."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: str = "float32"):
        super().__init__()
        kw = {"bias": False, "dtype": getattr(torch, dtype)}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
