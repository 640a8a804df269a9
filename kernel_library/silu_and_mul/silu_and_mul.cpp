// SiLU(gate) * up over the two halves of the last dim, rounded as torch rounds SGLang's forward_native:
// silu in fp32 cast to the input dtype, then the product in fp32 cast again.
#include "../extension.h"
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// bf16 sixteen lanes at a time on AVX-512 (GCC does not vectorise the element loop below through Lanes' bit tricks:
// at 8 x 9728 it took 40 us a call on one core, PyTorch's op 23): the same steps as exp_approx, the silu rounded to
// bf16 and the product rounded again as Lanes<BFloat16>::out rounds (nearest even, NaN to 0x7fc0).
inline bool has_avx512bw() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

namespace x16 {
#define KB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
KB_AVX512 static inline __m512 load(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
KB_AVX512 static inline __m512i rounded_bits(__m512 f) {  // bf16 bits in the low half of each lane
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
}
KB_AVX512 static inline __m512 exp(__m512 x) {
  // clamped with the constant first: vmaxps/vminps return their second operand where one is NaN, so NaN stays NaN
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  const __m512 round = _mm512_set1_ps(12582912.f);  // 1.5 * 2^23, as exp_approx rounds
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), round), round);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.7f), _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ), _mm512_setzero_ps());
}
KB_AVX512 static void row(const uint16_t* gate, const uint16_t* up, uint16_t* o, int64_t d) {
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = d - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (d - i)) - 1);
    const __m512 g = load(gate + i, m);
    const __m512 e = exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
    const __m512 act = _mm512_castsi512_ps(_mm512_slli_epi32(rounded_bits(silu), 16));
    _mm256_mask_storeu_epi16(o + i, m, _mm512_cvtepi32_epi16(rounded_bits(_mm512_mul_ps(act, load(up + i, m)))));
  }
}
#undef KB_AVX512
}  // namespace x16

template <typename T>
static void silu_and_mul_rows(const T* xt, T* outt, int64_t rows, int64_t d, int64_t grain) {
  using L = Lanes<T>;
  const auto* x = raw_ptr<T>(xt);
  auto* out = raw_ptr<T>(outt);
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (has_avx512bw()) {
      at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) x16::row(x + r * 2 * d, x + r * 2 * d + d, out + r * d, d);
      });
      return;
    }
  }
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
