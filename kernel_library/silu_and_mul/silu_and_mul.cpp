// SiLU(gate) * up over the two halves of the last dim, rounded as torch rounds SGLang's forward_native:
// silu in fp32 cast to the input dtype, then the product in fp32 cast again.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

template <typename T>
static void silu_and_mul_rows(const T* x, T* out, int64_t rows, int64_t d, int64_t grain) {
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = x + r * 2 * d;
      const T* up = gate + d;
      T* o = out + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) {
        const float g = static_cast<float>(gate[i]);
        const T act = static_cast<T>(g / (1.f + std::exp(-g)));
        o[i] = static_cast<T>(static_cast<float>(act) * static_cast<float>(up[i]));
      }
    }
  });
}

at::Tensor silu_and_mul(const at::Tensor& x, int64_t grain) {
  TORCH_CHECK(x.is_contiguous(), "silu_and_mul: contiguous input only");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "silu_and_mul: the last dim must be even");
  const int64_t d = x.size(-1) / 2;
  auto sizes = x.sizes().vec();
  sizes.back() = d;
  auto out = at::empty(sizes, x.options());
  if (d == 0 || x.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul_rows<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.numel() / (2 * d), d, grain);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("silu_and_mul", &silu_and_mul); }
