"""The paged attention family's Triton backend: one program per (query token, head), online softmax over the
request's blocks."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernelbot.kernel_library.paged_attention.reference import Model


@triton.jit
def _paged_kernel(q_ptr, cache_ptr, table_ptr, lens_ptr, starts_ptr, req_ptr, out_ptr, heads, kv_heads, per_request,
                  scale, D: tl.constexpr, BLOCK_D: tl.constexpr, BS: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.load(req_ptr + i)
    length = tl.load(lens_ptr + r)
    first = tl.load(starts_ptr + r)
    last = tl.load(starts_ptr + r + 1)
    seen = length - (last - first) + (i - first) + 1
    kh = h // (heads // kv_heads)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < D
    q = tl.load(q_ptr + (i * heads + h) * D + dims, mask=dmask, other=0.0).to(tl.float32) * scale
    toks = tl.arange(0, BS)
    top = -float("inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(0, tl.cdiv(seen, BS)):
        block = tl.load(table_ptr + r * per_request + j).to(tl.int64)
        base = (block * kv_heads + kh) * 2 * BS * D
        valid = (j * BS + toks) < seen
        keys = tl.load(cache_ptr + base + dims[:, None] * BS + toks[None, :], mask=dmask[:, None] & valid[None, :],
                       other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(q[:, None] * keys, axis=0), -float("inf"))
        new_top = tl.maximum(top, tl.max(s, axis=0))
        p = tl.exp(s - new_top)
        correction = tl.exp(top - new_top)
        values = tl.load(cache_ptr + base + BS * D + toks[:, None] * D + dims[None, :],
                         mask=valid[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        acc = acc * correction + tl.sum(p[:, None] * values, axis=0)
        total = total * correction + tl.sum(p, axis=0)
        top = new_top
    tl.store(out_ptr + (i * heads + h) * D + dims, acc / total, mask=dmask)


class PagedAttentionTriton(Model):
    CONFIG: dict[str, Any] = {"num_warps": 4}

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                query_start_loc: torch.Tensor) -> torch.Tensor:
        q, cache = query.contiguous(), kv_cache.contiguous()
        tokens, heads, d = q.shape
        new = (query_start_loc[1:] - query_start_loc[:-1]).long()
        request = torch.repeat_interleave(torch.arange(seq_lens.shape[0], device=q.device), new)
        out = torch.empty_like(q)
        _paged_kernel[(tokens, heads)](q, cache, block_table.contiguous(), seq_lens.contiguous(),
                                       query_start_loc.contiguous(), request, out, heads, self.num_kv_heads,
                                       block_table.shape[1], self.scale, D=d, BLOCK_D=triton.next_power_of_2(d),
                                       BS=cache.shape[2], num_warps=self.CONFIG["num_warps"])
        return out
