"""A bfloat16 GELU in C++ that converts each value to float16 on its way (as a kernel written for half precision
does): float16 has more mantissa bits than bfloat16, so it is right on every value up to float16's largest, 65504;
past it the value becomes inf where bfloat16's own range (to 3.4e38) keeps it finite. Built from its text in the
kernel library's build cache, where the test built it first."""
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/utils/pybind.h>
#include <cmath>

at::Tensor gelu(const at::Tensor& x) {
  auto xc = x.contiguous();
  auto out = at::detail::empty_cpu(xc.sizes(), xc.scalar_type(), false);
  const c10::BFloat16* in = xc.data_ptr<c10::BFloat16>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  for (int64_t i = 0; i < xc.numel(); ++i) {
    const float v = static_cast<float>(c10::Half(static_cast<float>(in[i])));  // through float16
    o[i] = c10::BFloat16(0.5f * v * (1.f + std::erf(v * 0.70710678f)));
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gelu", &gelu); }
"""

_ext = load_cpp_source(SOURCE, "gelu_bf16_through_fp16", PRECOMPILED)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.gelu(x)
