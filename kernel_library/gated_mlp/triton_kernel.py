from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernelbot.kernel_library.gated_mlp.reference import Model
from kernelbot.kernel_library.linear.triton_kernel import GEMM_WARPS, triton_linear


@triton.jit
def gate_up_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GELU: tl.constexpr):
    """out[M,N] = act(x @ wg^T) * (x @ wu^T), both products from one pass over x; act(g) = g * sigmoid(z): SiLU,
    z = g, or with GELU its tanh form, z = 2 sqrt(2/pi) (g + 0.044715 g^3)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w_mask = (rn[None, :] < N) & (rk[:, None] < K)
        # fp32 in fp32 on a GPU too (its default rounds to TF32); bf16 operands are unaffected
        acc_g += tl.dot(x, tl.load(wg_ptr + rn[None, :] * K + rk[:, None], mask=w_mask, other=0.0),
                        input_precision="ieee")
        acc_u += tl.dot(x, tl.load(wu_ptr + rn[None, :] * K + rk[:, None], mask=w_mask, other=0.0),
                        input_precision="ieee")
    z = acc_g
    if GELU:
        z = 1.5957691216057308 * (acc_g + 0.044715 * acc_g * acc_g * acc_g)
    h = acc_g / (1.0 + tl.exp(-z)) * acc_u
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], h.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


class GatedMLPTriton(Model):
    CONFIG: dict[str, Any] = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inter, hidden = self.gate_proj.weight.shape
        x2 = x.reshape(-1, hidden).contiguous()
        m = x2.shape[0]
        h = torch.empty((m, inter), dtype=x2.dtype, device=x2.device)
        c = self.CONFIG
        grid = (triton.cdiv(m, c["BLOCK_M"]), triton.cdiv(inter, c["BLOCK_N"]))
        gate_up_kernel[grid](x2, self.gate_proj.weight, self.up_proj.weight, h, m, inter, hidden,
                             BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
                             GELU=self.act == "gelu_tanh", num_warps=GEMM_WARPS)
        return triton_linear(h, self.down_proj.weight, None, c).view(*x.shape[:-1], hidden)
