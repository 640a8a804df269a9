"""GPT-NeoX-style self-attention over a KV cache, in the pure form a verifier can check: one fused projection whose
output holds each head's q, k and v side by side, RoPE over the first `rotary_dim` dims of each head only (partial
rotary), a dense output projection, biases on both; the past keys and values come in as tensors, the rotated new keys
and the new values come back (what a cache appends)."""

import torch
import torch.nn.functional as F
from torch import nn

from kernelbot.kernel_library.attention_reference import causal_mask, rotate_half, step_inputs


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] with its first R dims rotated by cos, sin [B or 1, 1, T, R] (rotate_half form), in x's dtype."""
    rotary = cos.shape[-1]
    head, rest = x[..., :rotary], x[..., rotary:]
    return torch.cat(((head * cos) + (rotate_half(head) * sin), rest), dim=-1)


class Model(nn.Module):
    """transformers' GPTNeoXAttention.forward (sdpa, no padding mask) with a DynamicCache holding `past_key`,
    `past_value`: query_key_value's output viewed [B, T, heads, 3 * head_dim] and split into q, k, v per head; partial
    RoPE; attention of the T new queries over cat(past, new) keys, causal with offset P, scaled by 1/sqrt(head_dim);
    dense. Submodule names give the state_dict keys of GPTNeoXAttention."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, rotary_dim: int, bias: bool = True,
                 dtype: str = "float32") -> None:
        super().__init__()
        kw = {"dtype": getattr(torch, dtype)}
        self.num_heads, self.num_kv_heads, self.head_dim, self.rotary_dim = num_heads, num_heads, head_dim, rotary_dim
        self.scaling = head_dim**-0.5
        self.query_key_value = nn.Linear(hidden_size, 3 * num_heads * head_dim, bias=bias, **kw)
        self.dense = nn.Linear(num_heads * head_dim, hidden_size, bias=bias, **kw)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(batch, tokens, -1, 3 * self.head_dim).transpose(1, 2)
        query, key, value = qkv.chunk(3, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query, key = partial_rope(query, cos, sin), partial_rope(key, cos, sin)
        keys = torch.cat((past_key.to(key.dtype), key), dim=2)
        values = torch.cat((past_value.to(value.dtype), value), dim=2)
        mask = None if tokens == 1 else causal_mask(tokens, past_key.shape[2], hidden_states.device)
        attn = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=self.scaling)
        return self.dense(attn.transpose(1, 2).reshape(batch, tokens, -1)), key, value


# A task overrides these with its observed shapes and the layer's arguments.
# hidden_states [B,T,hidden]; cos, sin [1 or B, T, rotary_dim]; past key, value [B, heads, P, head_dim]
INPUT_SHAPES = [[2, 5, 128], [1, 5, 8], [1, 5, 8], [2, 4, 11, 32], [2, 4, 11, 32]]
DTYPE = torch.float32
INIT_ARGS = [128, 4, 32, 8, True, "float32"]  # hidden, heads, head_dim, rotary_dim, bias, dtype


def get_inputs():
    """Hidden states and past keys/values at INPUT_SHAPES; cos/sin of positions P..P+T-1 under a drawn theta."""
    return step_inputs(INPUT_SHAPES, DTYPE)


def get_init_inputs():
    return list(INIT_ARGS)
