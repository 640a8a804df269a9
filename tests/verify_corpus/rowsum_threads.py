"""A C++ candidate whose chunks are taken to be its threads: right at the thread count it first ran with, wrong with
one thread. Built from its text in the kernel library's build cache, where the test built it first (a sandboxed
runner reads nothing beside its module and writes nothing there)."""
from torch import nn

from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
// Row sums split over column chunks with at::parallel_for, where each chunk is taken to be the thread's own
// (at::get_thread_num()) instead of the range parallel_for hands over, for the thread count seen on the first call:
// right whenever every chunk gets a thread of its own, wrong with one thread (it computes chunk 0 every time).
#include <torch/extension.h>
#include <ATen/Parallel.h>

static int64_t planned = 0;

torch::Tensor row_sums(torch::Tensor x) {
  auto xc = x.contiguous();
  const int64_t rows = xc.size(0), cols = xc.size(1);
  if (planned == 0) planned = at::get_num_threads();
  auto parts = torch::zeros({planned, rows}, xc.options());
  const float* in = xc.data_ptr<float>();
  float* part = parts.data_ptr<float>();
  at::parallel_for(0, planned, 1, [&](int64_t, int64_t) {
    const int64_t t = at::get_thread_num();
    const int64_t c0 = t * cols / planned, c1 = (t + 1) * cols / planned;
    for (int64_t r = 0; r < rows; ++r) {
      float s = 0.f;
      for (int64_t c = c0; c < c1; ++c) s += in[r * cols + c];
      part[t * rows + r] = s;
    }
  });
  return parts.sum(0);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("row_sums", &row_sums); }
"""

_ext = load_cpp_source(SOURCE, "rowsum_threads")


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.row_sums(x)
