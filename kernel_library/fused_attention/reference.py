"""GPT-2-style self-attention over a KV cache, in the pure form a verifier can check: one fused QKV projection and an
output projection, both Conv1D (y = x @ W + b, W stored [in, out]), no rotary embedding (positions are added to the
embeddings before the first layer); the past keys and values come in as tensors, the new ones come back."""

import torch
import torch.nn.functional as F
from torch import nn

from kernelbot.kernel_library.attention_reference import causal_mask


class Conv1D(nn.Module):
    """transformers' Conv1D: a linear layer whose weight is stored transposed, [in, out]."""

    def __init__(self, n_in: int, n_out: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out, dtype=dtype) * n_in**-0.5)
        self.bias = nn.Parameter(torch.randn(n_out, dtype=dtype) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Model(nn.Module):
    """transformers' GPT2Attention.forward (self-attention, sdpa, no padding mask) with a DynamicCache holding
    `past_key`, `past_value`: c_attn gives q, k and v side by side; attention of the T new queries over cat(past, new)
    keys, causal with offset P, every head its own keys (no GQA), scaled by `scaling` (1/sqrt(head_dim), divided by
    the layer's number where the model scales by the inverse layer index); c_proj. Submodule names give the
    state_dict keys of GPT2Attention."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, scaling: float, dtype: str = "float32"):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scaling = num_heads, num_heads, head_dim, scaling
        self.c_attn = Conv1D(hidden_size, 3 * num_heads * head_dim, getattr(torch, dtype))
        self.c_proj = Conv1D(num_heads * head_dim, hidden_size, getattr(torch, dtype))

    def forward(self, hidden_states: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = hidden_states.shape
        query, key, value = (t.view(batch, tokens, -1, self.head_dim).transpose(1, 2)
                             for t in self.c_attn(hidden_states).chunk(3, dim=-1))
        keys = torch.cat((past_key.to(key.dtype), key), dim=2)
        values = torch.cat((past_value.to(value.dtype), value), dim=2)
        mask = None if tokens == 1 else causal_mask(tokens, past_key.shape[2], hidden_states.device)
        attn = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=self.scaling)
        return self.c_proj(attn.transpose(1, 2).reshape(batch, tokens, -1)), key, value


# A task overrides these with its observed shapes and the layer's arguments.
# hidden_states [B,T,hidden]; past key, value [B, heads, P, head_dim]
INPUT_SHAPES = [[2, 5, 128], [2, 4, 11, 32], [2, 4, 11, 32]]
DTYPE = torch.float32
INIT_ARGS = [128, 4, 32, 32**-0.5, "float32"]  # hidden, heads, head_dim, scaling, dtype


def get_init_inputs():
    return list(INIT_ARGS)
