from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernelbot.kernel_library.silu_and_mul.reference import Model


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * d + cols, act.to(tl.float32) * up.to(tl.float32), mask=mask)


class SiluAndMulTriton(Model):
    CONFIG: dict[str, Any] = {"BLOCK": 1024, "num_warps": 4}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        d = x.shape[-1] // 2
        out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
        rows = x.numel() // max(2 * d, 1)
        if rows and d:
            block = min(self.CONFIG["BLOCK"], triton.next_power_of_2(d))
            _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](x, out, d, BLOCK=block,
                                                                num_warps=self.CONFIG["num_warps"])
        return out
