"""What the references of the attentions over a KV cache share: the causal mask aligned to the end of the keys; for
the rotary ones (decode_attention, neox_attention), rotating half of each head and the inputs of one step (hidden
states, the cos and sin of the new tokens' positions, the past keys and values)."""

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def causal_mask(new_tokens: int, past_len: int, device: torch.device) -> torch.Tensor:
    """[T, P+T] bool: new token t sees keys 0..P+t (the causal mask aligned to the end of the keys)."""
    keys = torch.arange(past_len + new_tokens, device=device)
    return keys[None, :] <= past_len + torch.arange(new_tokens, device=device)[:, None]


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., rotary_dim] cos and sin in fp32, laid out as transformers' rotary embeddings (Llama, GPT-NeoX) do:
    cat(freqs, freqs)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = positions[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def step_inputs(shapes: list[list[int]], dtype: torch.dtype) -> list[torch.Tensor]:
    """At `shapes` ([B,T,hidden], cos and sin [1 or B,T,R], past key and value [B,heads,P,head_dim]): random hidden
    states and past keys/values; cos/sin of positions P..P+T-1 under a drawn theta."""
    (batch, tokens, hidden), (cos_batch, _, rotary_dim), _, (_, heads, past_len, head_dim), _ = shapes
    theta = float(10.0 ** (4 + 2 * torch.rand((), device="cpu").item()))  # 1e4 .. 1e6, as real models use
    positions = torch.arange(past_len, past_len + tokens).expand(cos_batch, tokens)
    cos, sin = rope_cos_sin(positions, rotary_dim, theta)
    past = (batch, heads, past_len, head_dim)
    return [torch.randn(batch, tokens, hidden, dtype=dtype), cos.to(dtype), sin.to(dtype),
            torch.randn(past, dtype=dtype), torch.randn(past, dtype=dtype)]
