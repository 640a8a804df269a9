"""A right SiLU in C++ that the candidate calls through ctypes: its extension exports a plain C function beside its
module init, and the candidate loads that same library with ctypes.CDLL (verification wraps CDLL's function type to
count such calls; on Python 3.11 that wrapper once failed to build, and every such candidate failed `compile`).
Built from its text in the kernel library's build cache, where the test built it first."""
import ctypes

import torch
from torch import nn

from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>

extern "C" void kb_silu(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] / (1.f + std::exp(-in[i]));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
"""

_lib = ctypes.CDLL(load_cpp_source(SOURCE, "silu_ctypes").__file__)
_lib.kb_silu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.kb_silu.restype = None


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _lib.kb_silu(x.data_ptr(), out.data_ptr(), x.numel())
        return out
