import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = ("silu", "gelu_tanh")  # the gate's activation: SiLU (Llama), GELU's tanh form (Gemma)


class Model(nn.Module):
    """Llama's MLP: down(act(gate(x)) * up(x)), no biases, weights in the model's dtype; act SiLU, or GELU's tanh
    form (Gemma's `gelu_pytorch_tanh`)."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: str = "float32", act: str = "silu"):
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"gated_mlp: activation {act!r} is not one of {ACTIVATIONS}")
        kw = {"bias": False, "dtype": getattr(torch, dtype)}
        self.act = act
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        gate = F.silu(gate) if self.act == "silu" else F.gelu(gate, approximate="tanh")
        return self.down_proj(gate * self.up_proj(x))
