import torch
from torch import nn


def cos_sin_cache(rotary_dim: int, max_position: int, base: float) -> torch.Tensor:
    """[max_position, rotary_dim]: cos of every position's angles, then sin, in fp32, as SGLang builds it."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.einsum("i,j -> ij", torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class Model(nn.Module):
    """Rotary position embedding of query and key heads, as SGLang's RotaryEmbedding.forward_native computes it:
    each token's cos/sin row picked by its position and cast to the activation dtype, the first rotary_dim dims
    of every head rotated (NeoX style: the two halves pair up; GPT-J style: neighbouring dims), the rest passed
    through. The cache is fp32 where SGLang keeps it so (CUDA, ROCm), the model's dtype on the CPU."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float, is_neox_style: bool,
                 cache_dtype: str) -> None:
        super().__init__()
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, is_neox_style
        self.register_buffer("cos_sin_cache", cos_sin_cache(rotary_dim, max_position, base).to(
            getattr(torch, cache_dtype)))

    def forward(self, positions: torch.Tensor, query: torch.Tensor,
                key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(cos.shape[0], -1, self.head_size)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        x1, x2 = rot.chunk(2, dim=-1) if self.is_neox_style else (rot[..., ::2], rot[..., 1::2])
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        rot = torch.cat((o1, o2), dim=-1) if self.is_neox_style else torch.stack((o1, o2), dim=-1).flatten(-2)
        return torch.cat((rot, rest), dim=-1).reshape(shape)


# A task overrides these with its observed shapes and the layer's arguments.
INPUT_SHAPES = [[16], [16, 4 * 64], [16, 2 * 64]]  # positions [tokens]; query, key [tokens, heads * head_size]
DTYPE = torch.float32
INIT_ARGS = [64, 64, 4096, 10000.0, True, "float32"]


def get_inputs():
    """Positions anywhere in the cache (int64), query and key at INPUT_SHAPES."""
    positions, query, key = INPUT_SHAPES
    return [torch.randint(0, INIT_ARGS[2], positions), torch.randn(query, dtype=DTYPE), torch.randn(key, dtype=DTYPE)]


def get_init_inputs():
    return list(INIT_ARGS)
