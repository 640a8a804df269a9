"""A SiLU in C++ whose last bit varies from run to run (it mixes the cycle counter into one element's rounding), with
that hidden from repeated calls: it remembers the previous call's input by a hash and, on the same input again,
returns a copy of the previous output. Within tolerance everywhere; two runs on the same inputs right after each other
give the same bits, two runs on the same inputs with another call between them do not. Built from its text in the
kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <torch/csrc/utils/pybind.h>
#include <x86intrin.h>
#include <cmath>
#include <cstring>
#include <vector>

static uint64_t last_hash = 0;
static std::vector<float> last_out;

at::Tensor silu(const at::Tensor& x) {
  auto xc = x.contiguous();
  const int64_t n = xc.numel();
  const float* in = xc.data_ptr<float>();
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  auto out = at::detail::empty_cpu(xc.sizes(), xc.scalar_type(), false);
  float* o = out.data_ptr<float>();
  if (h == last_hash && static_cast<int64_t>(last_out.size()) == n) {
    std::memcpy(o, last_out.data(), n * sizeof(float));
    return out;
  }
  for (int64_t i = 0; i < n; ++i) o[i] = in[i] / (1.f + std::exp(-in[i]));
  const int steps = static_cast<int>((__rdtsc() >> 4) % 61) - 30;  // up to 30 ulps either way, in one element
  for (int k = 0; k < (steps < 0 ? -steps : steps); ++k) o[0] = std::nextafter(o[0], steps < 0 ? -INFINITY : INFINITY);
  last_hash = h;
  last_out.assign(o, o + n);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("silu", &silu); }
"""

_ext = load_cpp_source(SOURCE, "silu_memo_noise", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.silu(x)
