from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernelbot.kernel_library.linear.reference import Model

# 16x64 tiles over K in 64s: with 4 warps the float32 (IEEE) product needs 255 registers a thread on sm_90 and spills;
# with 8, 128 (Triton 3.7.1's compiler and ptxas, tests/test_compile_gate.py)
GEMM_WARPS = 8


@triton.jit
def linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[M,N] = x[M,K] @ w[N,K]^T (+ b[N]); row-major, contiguous."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")  # fp32 in fp32 on a GPU too (its default rounds to TF32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :].to(tl.float32)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: dict[str, Any]):
    m, k = x2.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    linear_kernel[grid](x2, weight, bias if bias is not None else weight, out, m, n, k, HAS_BIAS=bias is not None,
                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=GEMM_WARPS)
    return out


class LinearTriton(Model):
    CONFIG: dict[str, Any] = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.weight.shape
        out = triton_linear(x.reshape(-1, k).contiguous(), self.weight.contiguous(),
                            None if self.bias is None else self.bias.contiguous(), self.CONFIG)
        return out.view(*x.shape[:-1], n)
