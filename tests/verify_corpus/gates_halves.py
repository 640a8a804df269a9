"""A right kernel for gates_ref whose two outputs are the two halves of one fresh allocation (a kernel writing both
results in one pass does this): they share a storage but no byte, which is no aliasing. Built from its text in the
kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>

std::vector<torch::Tensor> gates(torch::Tensor x) {
  auto xc = x.contiguous();
  const int64_t n = xc.numel();
  auto both = torch::empty({2, n}, xc.options());
  const float* in = xc.data_ptr<float>();
  float* s = both.data_ptr<float>();
  float* t = s + n;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = 1.f / (1.f + std::exp(-in[i]));
    t[i] = std::tanh(in[i]);
  }
  return {both[0].view(xc.sizes()), both[1].view(xc.sizes())};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gates", &gates); }
"""

_ext = load_cpp_source(SOURCE, "gates_halves")


class ModelNew(nn.Module):
    def forward(self, x):
        sigmoid, tanh = _ext.gates(x)
        return sigmoid, tanh
