"""A C++ candidate that reads past its input: row sums eight floats at a time, the tail's lanes past the row's end
loaded and then masked out. Right on every input (the lanes read are never summed) and it writes nothing out of
bounds, so guard regions see nothing; the last row's tail reads up to 7 floats past the buffer, which only
AddressSanitizer sees. Built from its text in the kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <torch/extension.h>
#include <immintrin.h>

torch::Tensor row_sums(torch::Tensor x) {
  auto xc = x.contiguous();
  const int64_t rows = xc.size(0), cols = xc.size(1);
  auto out = torch::empty({rows}, xc.options());
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * cols;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < cols; c += 8) {
      __m256 v = _mm256_loadu_ps(row + c);  // the tail loads lanes past the row
      const int64_t left = cols - c;
      if (left < 8) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), lane));
        v = _mm256_and_ps(v, keep);
      }
      acc = _mm256_add_ps(acc, v);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    float s = 0.f;
    for (int k = 0; k < 8; ++k) s += lanes[k];
    o[r] = s;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("row_sums", &row_sums); }
"""

_ext = load_cpp_source(SOURCE, "rowsum_overread")


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.row_sums(x)
