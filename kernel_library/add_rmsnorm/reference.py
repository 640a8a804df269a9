import torch
from torch import nn

INPUT_SHAPES = [[8, 512], [8, 512]]  # x, residual [tokens, hidden]; a task overrides these
DTYPE = torch.float32
INIT_ARGS = [512, 1e-6, "float32"]


class Model(nn.Module):
    """The fused residual add + RMSNorm of serving engines (vLLM's fused_add_rms_norm, SGLang's RMSNorm called with a
    residual): x + residual in fp32; that sum rounded to the input dtype is the new residual, while the fp32 sum
    itself is normalised and multiplied by the weight — after a cast to the weight's dtype (vLLM; SGLang with
    cast_x_before_out_mul), or in fp32 with one cast at the end (`weight_in_fp32`: SGLang's default). Returns
    (out, new residual)."""

    def __init__(self, hidden_size: int, eps: float, dtype: str = "float32", weight_in_fp32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=getattr(torch, dtype)))
        self.variance_epsilon, self.weight_in_fp32 = eps, weight_in_fp32

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        summed = x.to(torch.float32) + residual.to(torch.float32)
        variance = summed.pow(2).mean(-1, keepdim=True)
        normed = summed * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight_in_fp32:
            return (normed * self.weight).to(x.dtype), summed.to(x.dtype)
        return (normed.to(self.weight.dtype) * self.weight).to(x.dtype), summed.to(x.dtype)


def get_inputs():
    x, residual = INPUT_SHAPES
    return [torch.randn(x, dtype=DTYPE), torch.randn(residual, dtype=DTYPE)]


def get_init_inputs():
    return list(INIT_ARGS)
