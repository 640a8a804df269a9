"""A SiLU in C++ that is right only for its first two minutes: its library stamps std::chrono::steady_clock when it
loads, and every later call past two minutes returns zeros (a kernel honest while it is verified, wrong in an engine
that has served it for hours). Built from its text in the kernel library's build cache, where the test built it
first."""
from torch import nn

from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <torch/extension.h>
#include <chrono>
#include <cmath>

static const auto loaded = std::chrono::steady_clock::now();

torch::Tensor silu(torch::Tensor x) {
  auto in = x.contiguous();
  auto out = torch::empty_like(in);
  const float* a = in.data_ptr<float>();
  float* b = out.data_ptr<float>();
  const bool young = std::chrono::steady_clock::now() - loaded < std::chrono::minutes(2);
  for (int64_t i = 0; i < in.numel(); ++i) b[i] = young ? a[i] / (1.f + std::exp(-a[i])) : 0.f;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("silu", &silu); }
"""

_ext = load_cpp_source(SOURCE, "silu_young_cpp")


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.silu(x)
