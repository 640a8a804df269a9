"""Row sums in C++ split over column chunks with at::parallel_for, each chunk's sums kept in a slot per thread, with
slots for at most 4 threads (threads past the fourth share the last slot, and overwrite each other's sums): right with
1 to 4 threads (every 2- or 3-core host a plan stopping at cores + 1 threads runs), wrong with more. Built from its
text in the kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <algorithm>

constexpr int64_t kMaxThreads = 4;

at::Tensor row_sums(const at::Tensor& x) {
  auto xc = x.contiguous();
  const int64_t rows = xc.size(0), cols = xc.size(1);
  std::vector<float> slots(kMaxThreads * rows, 0.f);
  const float* in = xc.data_ptr<float>();
  at::parallel_for(0, cols, 256, [&](int64_t c0, int64_t c1) {
    const int64_t slot = std::min<int64_t>(at::get_thread_num(), kMaxThreads - 1);
    for (int64_t r = 0; r < rows; ++r) {
      float s = 0.f;
      for (int64_t c = c0; c < c1; ++c) s += in[r * cols + c];
      slots[slot * rows + r] = s;
    }
  });
  auto out = at::detail::empty_cpu({rows}, xc.scalar_type(), false);
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.f;
    for (int64_t t = 0; t < kMaxThreads; ++t) s += slots[t * rows + r];
    o[r] = s;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("row_sums", &row_sums); }
"""

_ext = load_cpp_source(SOURCE, "rowsum_four_threads", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.row_sums(x)
