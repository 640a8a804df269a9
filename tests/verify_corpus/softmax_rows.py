"""A right softmax in C++ that does its own work: each row walked through the input's strides (any layout), its
maximum, the sum of exponentials in double, then the outputs. Its CPU time is in its own code, where the harness
samples it from outside the runner. Built from its text in the kernel library's build cache, where the test built it
first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/utils/pybind.h>
#include <cmath>

at::Tensor softmax(const at::Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1), rs = x.stride(0), cs = x.stride(1);
  auto out = at::detail::empty_cpu({rows, cols}, x.scalar_type(), false);
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * rs;
    float top = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) top = std::isnan(row[c * cs]) || row[c * cs] > top ? row[c * cs] : top;
    double total = 0.0;
    for (int64_t c = 0; c < cols; ++c) total += std::exp(static_cast<double>(row[c * cs]) - top);
    for (int64_t c = 0; c < cols; ++c)
      o[r * cols + c] = static_cast<float>(std::exp(static_cast<double>(row[c * cs]) - top) / total);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("softmax", &softmax); }
"""

_ext = load_cpp_source(SOURCE, "softmax_rows", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.softmax(x)
