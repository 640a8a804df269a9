// SiLU(gate) * up over the two halves of the last dim, rounded as torch rounds SGLang's forward_native:
// silu in fp32 cast to the input dtype, then the product in fp32 cast again.
#include "../extension.h"
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../lanes.h"

// exp(x) = 2^n * exp(r) with n = round(x / ln 2) and r = x - n ln 2 (ln 2 split in two for precision), exp(r)
// by Cephes' degree-6 polynomial: within about an ulp of expf, and plain arithmetic the compiler vectorises
// (libm's expf is a scalar call). Inputs past the float range saturate to 0 or inf; NaN stays NaN.
static inline float exp_approx(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float y = p * scale;
  return x > 88.7f ? INFINITY : (x < -87.3f ? 0.f : y);
}

template <typename T>
static void silu_and_mul_rows(const T* xt, T* outt, int64_t rows, int64_t d, int64_t grain) {
  using L = Lanes<T>;
  const auto* x = raw_ptr<T>(xt);
  auto* out = raw_ptr<T>(outt);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto* gate = x + r * 2 * d;
      const auto* up = gate + d;
      auto* o = out + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) {
        const float g = L::in(gate[i]);
        const float act = L::in(L::out(g / (1.f + exp_approx(-g))));  // silu rounded to the input dtype
        o[i] = L::out(act * L::in(up[i]));
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
