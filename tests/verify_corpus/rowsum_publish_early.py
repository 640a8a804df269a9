"""Row sums in C++ over two OpenMP threads with a publication race: thread 0 owns an accumulator it must zero before
thread 1 adds its share, and it says "zeroed" first and zeroes after (zeroing each row as it reaches it). Thread 1
computes its share, twice thread 0's columns, before it adds, so on a quiet machine the zeroing is long done by then
and every result is right; when thread 0 loses its core for a while right after saying "zeroed" (another process
loading the cores), thread 1's sums land first and are wiped: wrong once in a while, and only under load. Built from
its text in the kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/utils/pybind.h>
#include <omp.h>
#include <atomic>
#include <vector>

at::Tensor row_sums(const at::Tensor& x) {
  auto xc = x.contiguous();
  const int64_t rows = xc.size(0), cols = xc.size(1), split = cols / 3;
  const float* in = xc.data_ptr<float>();
  std::vector<float> acc(rows, 1.f), own(rows), share(rows);
  std::atomic<int> zeroed{0};
  #pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 0) {
      zeroed.store(1, std::memory_order_release);  // the bug: published before the zeroing below
      for (int64_t r = 0; r < rows; ++r) {
        reinterpret_cast<std::atomic<float>&>(acc[r]).store(0.f, std::memory_order_relaxed);
        float s = 0.f;
        for (int64_t c = 0; c < split; ++c) s += in[r * cols + c];
        own[r] = s;
      }
    } else if (omp_get_thread_num() == 1) {
      for (int64_t r = 0; r < rows; ++r) {
        float s = 0.f;
        for (int64_t c = split; c < cols; ++c) s += in[r * cols + c];
        share[r] = s;
      }
      while (!zeroed.load(std::memory_order_acquire)) {}
      for (int64_t r = 0; r < rows; ++r) {
        auto& a = reinterpret_cast<std::atomic<float>&>(acc[r]);
        a.store(a.load(std::memory_order_relaxed) + share[r], std::memory_order_relaxed);
      }
    }
  }
  auto out = at::detail::empty_cpu({rows}, xc.scalar_type(), false);
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) o[r] = own[r] + acc[r];
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("row_sums", &row_sums); }
"""

_ext = load_cpp_source(SOURCE, "rowsum_publish_early", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.row_sums(x)
