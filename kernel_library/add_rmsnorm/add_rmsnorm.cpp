// Fused residual add + RMSNorm as serving engines compute it: the fp32 sum x + residual is written back rounded as
// the new residual, and the fp32 sum itself is normalised and multiplied by the weight, either after a cast to the
// input dtype (vLLM) or in fp32 with one cast at the end (weight_fp32: SGLang's default).
#include "../extension.h"
#include <cmath>

#include "../lanes.h"

template <typename T>
static void add_rmsnorm_rows(const T* xt, const T* rt, const T* wt, T* outt, T* rest, int64_t rows, int64_t n,
                             double eps, bool weight_fp32, int64_t grain) {
  using L = Lanes<T>;
  const auto* x = raw_ptr<T>(xt);
  const auto* res = raw_ptr<T>(rt);
  const auto* w = raw_ptr<T>(wt);
  auto* out = raw_ptr<T>(outt);
  auto* res_out = raw_ptr<T>(rest);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto* xr = x + r * n;
      const auto* rr = res + r * n;
      auto* o = out + r * n;
      auto* ro = res_out + r * n;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < n; ++i) {
        const float s = L::in(xr[i]) + L::in(rr[i]);
        ro[i] = L::out(s);
        ss += s * s;
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float s = L::in(xr[i]) + L::in(rr[i]);  // the fp32 sum again: the stored residual is rounded
        const float normed = weight_fp32 ? s * inv : L::in(L::out(s * inv));
        o[i] = L::out(L::in(w[i]) * normed);
      }
    }
  });
}

std::vector<at::Tensor> add_rmsnorm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                    double eps, bool weight_fp32, int64_t grain) {
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && weight.is_contiguous(),
              "add_rmsnorm: contiguous inputs only");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() && residual.scalar_type() == x.scalar_type(),
              "add_rmsnorm: x, residual and weight dtypes differ");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_rmsnorm: x and residual shapes differ");
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.numel() == n, "add_rmsnorm: weight does not match the last dim");
  auto out = at::empty_like(x);
  auto res_out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rmsnorm", [&] {
    add_rmsnorm_rows<scalar_t>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                               out.data_ptr<scalar_t>(), res_out.data_ptr<scalar_t>(), x.numel() / n, n, eps,
                               weight_fp32, grain);
  });
  return {out, res_out};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_rmsnorm", &add_rmsnorm); }
