"""A softmax in C++ that follows its input's row stride but takes its column stride for 1: right on contiguous rows
and on rows sliced out of a wider buffer (a fused projection's output), wrong on a transposed (column-major) input.
Built from its text in the kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/utils/pybind.h>
#include <algorithm>
#include <cmath>

at::Tensor softmax(const at::Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1), row_stride = x.stride(0);
  auto out = at::detail::empty_cpu({rows, cols}, x.scalar_type(), false);
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * row_stride;  // the column stride taken for 1
    float top = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) top = std::max(top, row[c]);
    double total = 0.0;
    for (int64_t c = 0; c < cols; ++c) total += std::exp(row[c] - top);
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = static_cast<float>(std::exp(row[c] - top) / total);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("softmax", &softmax); }
"""

_ext = load_cpp_source(SOURCE, "softmax_column_stride", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.softmax(x)
