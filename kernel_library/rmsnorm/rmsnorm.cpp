// RMSNorm over the last dim, as LlamaRMSNorm computes it: accumulate in fp32, cast the normalised
// row back to the input dtype, then multiply by the weight.
#include "../extension.h"
#include <cmath>

#include "../lanes.h"

template <typename T>
static void rmsnorm_rows(const T* xt, const T* wt, T* outt, int64_t rows, int64_t n, double eps, int64_t grain) {
  using L = Lanes<T>;
  const auto* x = raw_ptr<T>(xt);
  const auto* w = raw_ptr<T>(wt);
  auto* out = raw_ptr<T>(outt);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto* xr = x + r * n;
      auto* o = out + r * n;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < n; ++i) {
        const float v = L::in(xr[i]);
        ss += v * v;
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float normed = L::in(L::out(L::in(xr[i]) * inv));  // cast back to the input dtype first
        o[i] = L::out(L::in(w[i]) * normed);
      }
    }
  });
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t grain) {
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "rmsnorm: contiguous inputs only");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rmsnorm: x and weight dtypes differ");
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.numel() == n, "rmsnorm: weight does not match the last dim");
  auto out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rmsnorm", [&] {
    rmsnorm_rows<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                           x.numel() / n, n, eps, grain);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("rmsnorm", &rmsnorm); }
