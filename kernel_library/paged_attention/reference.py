import math

import torch
from torch import nn

# A task overrides these with the engine's observed shapes and the layer's arguments:
# query [tokens, heads, head_size]; the cache [blocks, kv heads, block_size, 2 * head_size];
# block_table [requests, blocks per request]; seq_lens [requests]; query_start_loc [requests + 1]
INPUT_SHAPES = [[6, 4, 32], [16, 2, 32, 64], [3, 4], [3], [4]]
DTYPE = torch.float32
INIT_ARGS = [4, 2, 32, 32 ** -0.5]


def split_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [blocks, kv heads, head_size, block_size], values [blocks, kv heads, block_size, head_size]): vLLM's CPU
    layout ("vec" ISA) keeps each (block, kv head) as the block's keys transposed, then its values row by row."""
    blocks, kv_heads, block_size, width = kv_cache.shape
    head_size = width // 2
    flat = kv_cache.reshape(blocks, kv_heads, 2 * block_size * head_size)
    keys = flat[..., :block_size * head_size].reshape(blocks, kv_heads, head_size, block_size)
    values = flat[..., block_size * head_size:].reshape(blocks, kv_heads, block_size, head_size)
    return keys, values


class Model(nn.Module):
    """Attention of each request's new query tokens over its paged KV cache, as vLLM's CPU attention backend
    computes it (causal, GQA, no sliding window, soft cap, ALiBi or sinks): request r owns query rows
    query_start_loc[r]..query_start_loc[r+1], which are the last of its seq_lens[r] context tokens; its keys and
    values sit in blocks block_table[r] of the cache, laid out as split_cache reads them. Scores, softmax and the
    weighted sum in fp32; the output in the query's dtype."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_size, self.scale = num_heads, num_kv_heads, head_size, scale

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                query_start_loc: torch.Tensor) -> torch.Tensor:
        keys, values = split_cache(kv_cache)
        block_size = kv_cache.shape[2]
        group = self.num_heads // self.num_kv_heads
        out = torch.zeros_like(query)
        for r in range(seq_lens.shape[0]):
            start, end, length = int(query_start_loc[r]), int(query_start_loc[r + 1]), int(seq_lens[r])
            blocks = block_table[r, :math.ceil(length / block_size)].long()
            k = keys[blocks].permute(1, 0, 3, 2).reshape(self.num_kv_heads, -1, self.head_size)[:, :length].float()
            v = values[blocks].permute(1, 0, 2, 3).reshape(self.num_kv_heads, -1, self.head_size)[:, :length].float()
            q = query[start:end].float().transpose(0, 1)  # [heads, new tokens, head_size]
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            scores = torch.matmul(q, k.transpose(1, 2)) * self.scale
            positions = length - (end - start) + torch.arange(end - start)
            scores = scores.masked_fill(torch.arange(length)[None, :] > positions[:, None], float("-inf"))
            probs = torch.softmax(scores, -1)
            if bool(torch.isfinite(v).all()):
                o = torch.matmul(probs, v)
            else:  # a key a token may not see has probability 0, and 0 * inf is NaN: each token's visible keys only
                o = torch.cat([torch.matmul(probs[:, t:t + 1, :p + 1], v[:, :p + 1])
                               for t, p in enumerate(positions.tolist())], 1)
            out[start:end] = o.transpose(0, 1).to(query.dtype)
        return out


def get_inputs():
    """A consistent batch at INPUT_SHAPES' sizes: as many requests as seq_lens has (at most one per query token), the
    query tokens spread over them (one each when there are as many: decode), each request's context between its new
    tokens and all its blocks, its blocks drawn from the cache (which need be no larger than the requests use)."""
    (tokens, heads, head_size), (blocks, kv_heads, block_size, _), (_, per_request), (requests,), _ = INPUT_SHAPES
    requests, per_request = max(1, min(requests, tokens)), max(1, per_request)
    new = torch.ones(requests, dtype=torch.int64)
    if tokens > requests:
        new += torch.bincount(torch.randint(0, requests, (tokens - requests,)), minlength=requests)
    per_request = max(per_request, math.ceil(int(new.max()) / block_size))
    capacity = per_request * block_size
    lens = torch.minimum(new + torch.randint(0, capacity, (requests,)), torch.full((requests,), capacity))
    lens = torch.maximum(lens, new)
    used = min(blocks, requests * per_request)
    return [torch.randn(tokens, heads, head_size, dtype=DTYPE),
            torch.randn(used, kv_heads, block_size, 2 * head_size, dtype=DTYPE),
            torch.randint(0, used, (requests, per_request), dtype=torch.int32),
            lens.to(torch.int32),
            torch.cat((torch.zeros(1, dtype=torch.int64), new.cumsum(0))).to(torch.int32)]


def get_init_inputs():
    return list(INIT_ARGS)
