"""Triton attention over a KV cache: the fused q/k/v projection and o_proj through the linear family's GEMM, one RoPE
kernel that rotates q and writes the rotated keys and the values straight into the caches, and a flash-style
attention kernel: one program per (batch, kv head, block of query rows), the rows being the new tokens times the
group's query heads (GQA heads share the keys they read), with an online softmax over the cache in blocks of keys."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernelbot import KernelbotError
from kernelbot.kernel_library.cpp_wrapper import PackedWeights
from kernelbot.kernel_library.decode_attention.cache import RotaryForward
from kernelbot.kernel_library.decode_attention.reference import Model
from kernelbot.kernel_library.linear.triton_kernel import triton_linear

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _rope_kernel(src_ptr, cos_ptr, sin_ptr, dst_ptr, v_ptr, v_dst_ptr, T, half, pos0,
                 src_sb, src_st, cos_sb, cos_st, dst_sb, dst_sh, dst_sp, v_sb, v_st, v_dst_sb, v_dst_sh, v_dst_sp,
                 HALF: tl.constexpr, COPY_V: tl.constexpr):
    """One (token row b*T+t, head h): x*cos + rotate_half(x)*sin in fp32, rounded once, written to dst at position
    pos0+t; with COPY_V, the head's value is copied to v_dst at the same position (the cache append)."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    b = row // T
    t = row % T
    d = head * 2 * half  # the head's first column in src and v
    i = tl.arange(0, HALF)
    m = i < half
    cs = cos_ptr + b * cos_sb + t * cos_st
    sn = sin_ptr + b * cos_sb + t * cos_st
    src = src_ptr + b * src_sb + t * src_st + d
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + i, mask=m, other=0.0).to(tl.float32)
    dst = dst_ptr + b * dst_sb + head * dst_sh + (pos0 + t) * dst_sp
    out_ty = dst_ptr.dtype.element_ty
    c1 = tl.load(cs + i, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(sn + i, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + i, (x1 * c1 - x2 * s1).to(out_ty), mask=m)
    c2 = tl.load(cs + half + i, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(sn + half + i, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + half + i, (x2 * c2 + x1 * s2).to(out_ty), mask=m)
    if COPY_V:
        v_src = v_ptr + b * v_sb + t * v_st + d
        v_dst = v_dst_ptr + b * v_dst_sb + head * v_dst_sh + (pos0 + t) * v_dst_sp
        tl.store(v_dst + i, tl.load(v_src + i, mask=m), mask=m)
        tl.store(v_dst + half + i, tl.load(v_src + half + i, mask=m), mask=m)


@triton.jit
def _attend_kernel(q_ptr, k_ptr, v_ptr, out_ptr, T, H, G, D, past_len, scale, softcap,
                   k_sb, k_sh, k_sp, v_sb, v_sh, v_sp,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                   CAPPED: tl.constexpr, WINDOW: tl.constexpr):
    """Program (b * KVH + kv head, row block); row r is (token r // G, query head kv_head * G + r % G). q [B,T,H,D]
    contiguous, out [B,T,H*D]; key j is visible to token t when j <= past_len + t (and, WINDOW > 0, when
    j > past_len + t - WINDOW). CAPPED: scores soft-capped, softcap * tanh(s / softcap), before the softmax."""
    pid_bh = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    kv_heads = H // G
    b = pid_bh // kv_heads
    kvh = pid_bh % kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T * G
    t = rows // G
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q_off = ((b * T + t) * H + kvh * G + rows % G) * D
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b * k_sb + kvh * k_sh
    v_base = v_ptr + b * v_sb + kvh * v_sh
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    last_token = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G, T - 1)
    n_keys = past_len + last_token + 1  # keys the block's last token sees
    first = 0
    if WINDOW > 0:  # keys before the block's first token's window are seen by no row: skip their blocks
        first = tl.maximum(past_len + (pid_m * BLOCK_M) // G + 1 - WINDOW, 0) // BLOCK_N * BLOCK_N
    for j0 in range(first, n_keys, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        j_ok = j < n_keys
        k = tl.load(k_base + j[None, :] * k_sp + d[:, None], mask=j_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, k, input_precision=PRECISION) * scale
        if CAPPED:  # tanh(x) = 2 / (1 + exp(-2x)) - 1
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
        s = s * LOG2E
        seen = j[None, :] <= past_len + t[:, None]
        if WINDOW > 0:
            seen = seen & (j[None, :] > past_len + t[:, None] - WINDOW)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if WINDOW > 0:  # a row may see no key of a block yet (its window starts later): no -inf - -inf
            m_new = tl.where(m_new == float("-inf"), -1e30, m_new)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + j[:, None] * v_sp + d[None, :], mask=j_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_off[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


def _cat_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """q, k, v weights (or biases) stacked along N: the fused projection's."""
    return torch.cat([x.detach() for x in tensors]).contiguous()


def _strides3(x: torch.Tensor) -> tuple[int, int]:
    return x.stride(0), x.stride(1)


class DecodeAttentionTriton(RotaryForward, Model):
    """Same contract as DecodeAttentionCpp: `step` appends into given caches, `forward` is the pure form."""

    CONFIG: dict[str, Any] = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "ATTN_BLOCK_M": 16, "ATTN_BLOCK_N": 32,
                              "num_warps": 4}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._qkv = PackedWeights()
        self._qkv_bias = PackedWeights()

    def step(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, past_len: int) -> torch.Tensor:
        """Attention of hidden_states' T tokens at positions past_len.., appending their rotated keys and values to
        key_cache/value_cache [B, KVH, capacity >= past_len + T, D] (written in place) -> [B, T, hidden]."""
        batch, tokens, hidden = hidden_states.shape
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        _check_caches(key_cache, value_cache, (batch, kv_heads, dim), past_len + tokens, hidden_states.dtype)
        if batch * tokens == 0:
            return hidden_states.new_empty(batch, tokens, hidden)
        qkv = self._project_qkv(hidden_states.reshape(batch * tokens, hidden)).view(batch, tokens, -1)
        q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        cos, sin = (x.to(hidden_states.dtype).contiguous() for x in (cos, sin))
        q_rot = hidden_states.new_empty(batch, tokens, heads, dim)
        self._rope(q, cos, sin, q_rot, (tokens * heads * dim, dim, heads * dim), 0, heads)
        self._rope(k, cos, sin, key_cache, key_cache.stride()[:3], past_len, kv_heads, v, value_cache)
        attn = hidden_states.new_empty(batch, tokens, heads * dim)
        self._attend(q_rot, key_cache, value_cache, attn, past_len)
        return triton_linear(attn.view(batch * tokens, heads * dim), self.o_proj.weight.contiguous(), None,
                             self.CONFIG).view(batch, tokens, hidden)

    def _project_qkv(self, x2: torch.Tensor) -> torch.Tensor:
        weight = self._qkv.get([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], _cat_rows)
        bias = None
        if self.q_proj.bias is not None:
            bias = self._qkv_bias.get([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], _cat_rows)
        return triton_linear(x2.contiguous(), weight.to(x2.dtype), None if bias is None else bias.to(x2.dtype),
                             self.CONFIG)

    def _rope(self, src: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dst: torch.Tensor,
              dst_strides: tuple[int, ...], pos0: int, heads: int, v: torch.Tensor | None = None,
              v_dst: torch.Tensor | None = None) -> None:
        batch, tokens, _ = src.shape
        half = self.head_dim // 2
        cos_sb = cos.stride(0) if cos.shape[0] > 1 else 0
        v_src, v_out = (src, dst) if v is None else (v, v_dst)
        v_dst_strides = dst_strides if v_dst is None else v_dst.stride()[:3]
        _rope_kernel[(batch * tokens, heads)](
            src, cos, sin, dst, v_src, v_out, tokens, half, pos0, *_strides3(src), cos_sb, cos.stride(1),
            *dst_strides, *_strides3(v_src), *v_dst_strides, HALF=triton.next_power_of_2(half), COPY_V=v is not None,
            num_warps=1)

    def _attend(self, q_rot: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, out: torch.Tensor,
                past_len: int) -> None:
        batch, tokens, heads, dim = q_rot.shape
        groups = heads // self.num_kv_heads
        block_m, block_n = self.CONFIG["ATTN_BLOCK_M"], self.CONFIG["ATTN_BLOCK_N"]
        grid = (batch * self.num_kv_heads, triton.cdiv(tokens * groups, block_m))
        precision = "ieee" if q_rot.dtype == torch.float32 else None  # fp32: no tf32 rounding of q, k, p, v
        _attend_kernel[grid](q_rot, key_cache, value_cache, out, tokens, heads, groups, dim, past_len,
                             self.scaling, self.softcap or 1.0, *key_cache.stride()[:3],
                             *value_cache.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n,
                             BLOCK_D=max(16, triton.next_power_of_2(dim)), PRECISION=precision,
                             CAPPED=self.softcap is not None,
                             WINDOW=self.sliding_window or 0, num_warps=self.CONFIG["num_warps"])


def _check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor, dims: tuple[int, int, int], end: int,
                  dtype: torch.dtype) -> None:
    """The checks the C++ op makes before it writes: shape, room for the new tokens, unit-stride rows, dtype."""
    batch, kv_heads, dim = dims
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4 or (cache.shape[0], cache.shape[1], cache.shape[3]) != dims or cache.stride(3) != 1:
            raise KernelbotError(f"decode_attention: {name} must be [{batch}, {kv_heads}, capacity, {dim}] with a "
                                 f"unit-stride last dim, got {list(cache.shape)}")
        if cache.shape[2] < end:
            raise KernelbotError(f"decode_attention: {name} holds {cache.shape[2]} positions, fewer than the {end} "
                                 "needed: allocate it with more capacity")
        if cache.dtype != dtype:
            raise KernelbotError(f"decode_attention: {name} is {cache.dtype}, the activations {dtype}: allocate the "
                                 "caches in the activations' dtype")
