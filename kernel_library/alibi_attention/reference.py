"""BLOOM-style self-attention over a KV cache, in the pure form a verifier can check: one fused projection whose
output holds each head's q, k and v side by side, no rotary; scores biased by ALiBi (each head's slope times the
key's position), a dense output projection, biases on both, and the residual added; the past keys and values come in
as tensors, the new keys and values come back (what a cache appends)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


def alibi_slopes(heads: int) -> torch.Tensor:
    """fp32 [heads]: the ALiBi paper's geometric slopes, 2^(-8 i / n) for i = 1..n with n the largest power of two up
    to `heads`; heads beyond n take every other slope of the sequence for 2n."""
    def geometric(n: int) -> torch.Tensor:
        return torch.tensor([2.0 ** (-8.0 * i / n) for i in range(1, n + 1)], dtype=torch.float32)

    n = 2 ** int(math.floor(math.log2(heads)))
    return torch.cat((geometric(n), geometric(2 * n)[0::2][:heads - n]))


class Model(nn.Module):
    """transformers' BloomAttention.forward (no padding, eval mode) with a DynamicCache holding `past_key`,
    `past_value`: query_key_value's output viewed [B, T, heads, 3, head_dim]; scores = alibi + q k^T / sqrt(d) in the
    activation dtype (torch.baddbmm, the alibi built in that dtype as BloomModel builds it), causal with offset P,
    softmax in fp32; dense; + residual. Submodule names give the state_dict keys of BloomAttention."""

    def __init__(self, hidden_size: int, num_heads: int, dtype: str = "float32") -> None:
        super().__init__()
        kw = {"dtype": getattr(torch, dtype)}
        self.num_heads = self.num_kv_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.scaling = self.head_dim**-0.5
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size, bias=True, **kw)
        self.dense = nn.Linear(hidden_size, hidden_size, bias=True, **kw)
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = hidden_states.shape
        heads, d, past_len = self.num_heads, self.head_dim, past_key.shape[2]
        qkv = self.query_key_value(hidden_states).view(batch, tokens, heads, 3, d)
        query, key, value = (qkv[..., i, :].transpose(1, 2) for i in range(3))
        keys = torch.cat((past_key.to(key.dtype), key), dim=2)
        values = torch.cat((past_value.to(value.dtype), value), dim=2)
        length = past_len + tokens
        positions = torch.arange(length, device=hidden_states.device)
        alibi = (self.slopes[:, None, None] * positions).repeat(batch, 1, 1).to(hidden_states.dtype)
        scores = alibi.baddbmm(query.reshape(batch * heads, tokens, d), keys.reshape(batch * heads, length, d)
                               .transpose(1, 2), beta=1.0, alpha=self.scaling).view(batch, heads, tokens, length)
        seen = positions[None, :] <= past_len + torch.arange(tokens, device=hidden_states.device)[:, None]
        scores = scores.masked_fill(~seen, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(hidden_states.dtype)
        context = torch.matmul(probs, values).transpose(1, 2).reshape(batch, tokens, heads * d)
        return self.dense(context) + residual, key, value


# A task overrides these with its observed shapes and the layer's arguments.
# hidden_states, residual [B,T,hidden]; past key, value [B, heads, P, head_dim]
INPUT_SHAPES = [[2, 5, 128], [2, 5, 128], [2, 4, 11, 32], [2, 4, 11, 32]]
DTYPE = torch.float32
INIT_ARGS = [128, 4, "float32"]  # hidden, heads, dtype


def get_inputs():
    return [torch.randn(s, dtype=DTYPE) for s in INPUT_SHAPES]


def get_init_inputs():
    return list(INIT_ARGS)
