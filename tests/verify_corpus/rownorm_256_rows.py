"""An RMS norm in C++ whose scratch table of row scales holds 256 rows (indexed modulo its size): right for up to 256
rows, so on every size a plan that stops at twice the scaled rows (129) makes, wrong past 256 rows, where a later row's
scale overwrites an earlier one's. Built from its text in the kernel library's build cache, where the test built it
first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/utils/pybind.h>
#include <cmath>

constexpr int64_t kTableRows = 256;

at::Tensor row_norm(const at::Tensor& x) {
  auto xc = x.contiguous();
  const int64_t cols = xc.size(-1), rows = xc.numel() / cols;
  auto out = at::detail::empty_cpu(xc.sizes(), xc.scalar_type(), false);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  float scale[kTableRows];
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < cols; ++c) ss += double(in[r * cols + c]) * in[r * cols + c];
    scale[r % kTableRows] = static_cast<float>(1.0 / std::sqrt(ss / cols + 1e-6));
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = in[r * cols + c] * scale[r % kTableRows];
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("row_norm", &row_norm); }
"""

_ext = load_cpp_source(SOURCE, "rownorm_256_rows", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.row_norm(x)
