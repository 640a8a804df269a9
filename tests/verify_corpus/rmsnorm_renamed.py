"""RMSNorm with its weight under another name (`scale`, not the reference's `weight`), using the library's Triton
kernel. With BAKED, the weight is copied on the first call and that copy used from then on: new weights copied into
the parameter are ignored, which a skipped new-weights test never saw."""
import torch
import triton
from torch import nn

from kernelbot.kernel_library.rmsnorm.triton_kernel import _rmsnorm_kernel

BAKED = False


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps=1e-6, *args):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.frozen = None

    def forward(self, hidden_states):
        x = hidden_states.contiguous()
        n = x.shape[-1]
        out = torch.empty_like(x)
        if BAKED and self.frozen is None:
            self.frozen = self.scale.detach().clone()
        weight = self.frozen if BAKED else self.scale
        _rmsnorm_kernel[(x.numel() // n,)](x, weight.to(x.dtype), out, n, self.eps, BLOCK=triton.next_power_of_2(n))
        return out
