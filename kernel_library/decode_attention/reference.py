"""Llama-style self-attention over a KV cache, in the pure form a verifier can check: the past keys and values
come in as tensors, the rotated new keys and the new values come back (what a cache appends)."""

import torch
import torch.nn.functional as F
from torch import nn

from kernelbot.kernel_library.attention_reference import causal_mask, rotate_half, step_inputs


class Model(nn.Module):
    """transformers' LlamaAttention.forward (sdpa, no padding mask) with a DynamicCache holding `past_key`,
    `past_value`: q, k, v projections; RoPE in the rotate_half form, in the activation dtype; attention of the T new
    queries over cat(past, new) keys, causal with offset P, GQA; o_proj. Submodule names give the state_dict keys of
    LlamaAttention (Qwen2Attention with bias=True: biases on q, k, v, none on o_proj). Gemma-2's attention too: its
    own `scaling` (query_pre_attn_scalar), soft-capped scores and, on its sliding layers, a window."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool = False,
                 dtype: str = "float32", scaling: float | None = None, softcap: float | None = None,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        kw = {"dtype": getattr(torch, dtype)}
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling = head_dim**-0.5 if scaling is None else scaling
        self.softcap, self.sliding_window = softcap, sliding_window
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias, **kw)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False, **kw)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = hidden_states.shape
        heads_shape = (batch, tokens, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(heads_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(heads_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(heads_shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query = (query * cos) + (rotate_half(query) * sin)
        key = (key * cos) + (rotate_half(key) * sin)
        keys = torch.cat((past_key.to(key.dtype), key), dim=2)
        values = torch.cat((past_value.to(value.dtype), value), dim=2)
        groups = self.num_heads // self.num_kv_heads
        past_len = past_key.shape[2]
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        if self.softcap is None and self.sliding_window is None:
            mask = None if tokens == 1 else causal_mask(tokens, past_len, hidden_states.device)
            attn = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=self.scaling)
        else:
            attn = self.capped_attention(query, keys, values, past_len)
        out = self.o_proj(attn.transpose(1, 2).reshape(batch, tokens, -1))
        return out, key, value

    def capped_attention(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         past_len: int) -> torch.Tensor:
        """Gemma-2's eager attention: scores scaled, soft-capped (cap * tanh(s / cap)) in the activation dtype, the
        causal mask (and a sliding window: only the last `sliding_window` keys up to a query's position), softmax in
        fp32."""
        scores = torch.matmul(query, keys.transpose(2, 3)) * self.scaling
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        tokens = query.shape[2]
        seen = causal_mask(tokens, past_len, query.device)
        if self.sliding_window is not None:
            keys_at = torch.arange(past_len + tokens, device=query.device)[None, :]
            seen &= keys_at > past_len + torch.arange(tokens, device=query.device)[:, None] - self.sliding_window
        scores = scores.masked_fill(~seen, float("-inf"))
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, values)


# A task overrides these with its observed shapes and the layer's arguments.
# hidden_states [B,T,hidden]; cos, sin [1 or B, T, head_dim]; past key, value [B, kv heads, P, head_dim]
INPUT_SHAPES = [[2, 5, 128], [1, 5, 32], [1, 5, 32], [2, 2, 11, 32], [2, 2, 11, 32]]
DTYPE = torch.float32
INIT_ARGS = [128, 4, 2, 32, False, "float32"]  # hidden, heads, kv heads, head_dim, bias, dtype


def get_inputs():
    """Hidden states and past keys/values at INPUT_SHAPES; cos/sin of positions P..P+T-1 under a drawn theta."""
    return step_inputs(INPUT_SHAPES, DTYPE)


def get_init_inputs():
    return list(INIT_ARGS)
