// Small-M GEMM for decode: y[M,N] = x[M,K] @ W[N,K]^T (+ bias); fp32 with AVX2/FMA, bf16 with AVX512-BF16.
// At decode M is the batch (a handful of rows), so the work is streaming W once: W is pre-packed
// into panels of 8 output columns laid out K-major ([NP, G, K, 8]); each panel is read once per
// block of rows while the rows of x stay in L1. G = 2 interleaves a gate and an up projection so
// the SiLU-and-mul epilogue of a gated MLP is applied in registers, never written out twice.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>

#include "../lanes.h"

template <int MB, int G>
static inline void tile(const float* x, int64_t K, const float* panel, float* out /*[G][MB][8]*/) {
  __m256 acc[G][MB];
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < MB; ++m) acc[g][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 w[G];
    for (int g = 0; g < G; ++g) w[g] = _mm256_loadu_ps(panel + g * K * 8 + k * 8);
    for (int m = 0; m < MB; ++m) {
      const __m256 b = _mm256_broadcast_ss(x + m * K + k);
      for (int g = 0; g < G; ++g) acc[g][m] = _mm256_fmadd_ps(b, w[g], acc[g][m]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < MB; ++m) _mm256_storeu_ps(out + (g * MB + m) * 8, acc[g][m]);
}

template <int G, int MBMAX>
static void tile_dispatch(int64_t mb, const float* x, int64_t K, const float* panel, float* buf) {
  if constexpr (MBMAX > 1) {
    if (mb == MBMAX) return tile<MBMAX, G>(x, K, panel, buf);
    return tile_dispatch<G, MBMAX - 1>(mb, x, K, panel, buf);
  } else {
    return tile<1, G>(x, K, panel, buf);
  }
}

template <int G, int MBMAX>
static void run(const at::Tensor& x, const at::Tensor& panels, const float* bias, int64_t N, at::Tensor& out,
                int64_t grain) {
  const int64_t M = x.size(0), K = x.size(1), NP = panels.size(0);
  const float* xp = x.data_ptr<float>();
  const float* pp = panels.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, NP, grain, [&](int64_t p0, int64_t p1) {
    alignas(32) float buf[G * MBMAX * 8];
    for (int64_t p = p0; p < p1; ++p) {
      const float* panel = pp + p * G * K * 8;
      const int64_t nv = std::min<int64_t>(8, N - p * 8);
      for (int64_t m0 = 0; m0 < M; m0 += MBMAX) {
        const int64_t mb = std::min<int64_t>(MBMAX, M - m0);
        tile_dispatch<G, MBMAX>(mb, xp + m0 * K, K, panel, buf);
        for (int64_t m = 0; m < mb; ++m) {
          float* o = op + (m0 + m) * N + p * 8;
          for (int64_t j = 0; j < nv; ++j) {
            if constexpr (G == 2) {
              const float g = buf[m * 8 + j], u = buf[(mb + m) * 8 + j];
              o[j] = g / (1.f + std::exp(-g)) * u;
            } else {
              o[j] = buf[m * 8 + j] + (bias ? bias[p * 8 + j] : 0.f);
            }
          }
        }
      }
    }
  });
}

static void check(const at::Tensor& x, const at::Tensor& panels, int64_t G, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous fp32 [M,K]");
  TORCH_CHECK(panels.dim() == 4 && panels.is_contiguous() && panels.scalar_type() == at::kFloat &&
                  panels.size(1) == G && panels.size(2) == x.size(1) && panels.size(3) == 8,
              "panels: contiguous fp32 [NP,G,K,8] matching x");
  TORCH_CHECK(panels.size(0) * 8 >= N && N > 0, "panels do not cover N");
}

at::Tensor small_m_linear(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias,
                          int64_t N, int64_t grain) {
  check(x, panels, 1, N);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->scalar_type() == at::kFloat, "bias: fp32 [N]");
    b = bias->data_ptr<float>();
  }
  auto out = at::empty({x.size(0), N}, x.options());
  run<1, 8>(x, panels, b, N, out, grain);
  return out;
}

at::Tensor gate_up_silu(const at::Tensor& x, const at::Tensor& panels, int64_t N, int64_t grain) {
  check(x, panels, 2, N);
  auto out = at::empty({x.size(0), N}, x.options());
  run<2, 4>(x, panels, nullptr, N, out, grain);
  return out;
}

// bf16: W packed as [NP, G, K/2, 16, 2] (16 output columns per panel, each lane holding a pair of k), so one
// vdpbf16ps multiplies a pair of x's k (broadcast) into 16 columns and accumulates in fp32 (x and W products are
// exact in fp32; subnormal bf16 inputs count as zero, as on the instruction). Built for this ISA per function, run
// only where the CPU has it (has_avx512_bf16), so the file still builds and loads on AVX2-only machines.
using BF16 = Lanes<c10::BFloat16>;

bool has_avx512_bf16() { return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f"); }

template <int MB, int G>
__attribute__((target("avx512f,avx512bf16"))) static void tile_bf16(const uint32_t* x, int64_t K2,
                                                                    const uint16_t* panel, float* out) {
  __m512 acc[G][MB];
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < MB; ++m) acc[g][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    __m512bh w[G];
    for (int g = 0; g < G; ++g) w[g] = (__m512bh)_mm512_loadu_si512(panel + (g * K2 + k) * 32);
    for (int m = 0; m < MB; ++m) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * K2 + k]));
      for (int g = 0; g < G; ++g) acc[g][m] = _mm512_dpbf16_ps(acc[g][m], b, w[g]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + (g * MB + m) * 16, acc[g][m]);
}

template <int G, int MBMAX>
static void tile_bf16_dispatch(int64_t mb, const uint32_t* x, int64_t K2, const uint16_t* panel, float* buf) {
  if constexpr (MBMAX > 1) {
    if (mb == MBMAX) return tile_bf16<MBMAX, G>(x, K2, panel, buf);
    return tile_bf16_dispatch<G, MBMAX - 1>(mb, x, K2, panel, buf);
  } else {
    return tile_bf16<1, G>(x, K2, panel, buf);
  }
}

template <int G, int MBMAX>
static void run_bf16(const at::Tensor& x, const at::Tensor& panels, const uint16_t* bias, int64_t N, at::Tensor& out,
                     int64_t grain) {
  const int64_t M = x.size(0), K2 = panels.size(2), NP = panels.size(0);
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());  // pairs of k
  const uint16_t* pp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, NP, grain, [&](int64_t p0, int64_t p1) {
    alignas(64) float buf[G * MBMAX * 16];
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* panel = pp + p * G * K2 * 32;
      const int64_t nv = std::min<int64_t>(16, N - p * 16);
      for (int64_t m0 = 0; m0 < M; m0 += MBMAX) {
        const int64_t mb = std::min<int64_t>(MBMAX, M - m0);
        tile_bf16_dispatch<G, MBMAX>(mb, xp + m0 * K2, K2, panel, buf);
        for (int64_t m = 0; m < mb; ++m) {
          uint16_t* o = op + (m0 + m) * N + p * 16;
          for (int64_t j = 0; j < nv; ++j) {
            if constexpr (G == 2) {
              const float g = buf[m * 16 + j], u = buf[(mb + m) * 16 + j];
              o[j] = BF16::out(g / (1.f + std::exp(-g)) * u);
            } else {
              o[j] = BF16::out(buf[m * 16 + j] + (bias ? BF16::in(bias[p * 16 + j]) : 0.f));
            }
          }
        }
      }
    }
  });
}

static void check_bf16(const at::Tensor& x, const at::Tensor& panels, int64_t G, int64_t N) {
  TORCH_CHECK(has_avx512_bf16(), "bf16 kernels need a CPU with avx512_bf16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 && x.size(1) % 2 == 0,
              "x: contiguous bf16 [M,K], K even (pad it)");
  TORCH_CHECK(panels.dim() == 5 && panels.is_contiguous() && panels.scalar_type() == at::kBFloat16 &&
                  panels.size(1) == G && panels.size(2) * 2 == x.size(1) && panels.size(3) == 16 &&
                  panels.size(4) == 2,
              "panels: contiguous bf16 [NP,G,K/2,16,2] matching x");
  TORCH_CHECK(panels.size(0) * 16 >= N && N > 0, "panels do not cover N");
}

at::Tensor small_m_linear_bf16(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias,
                               int64_t N, int64_t grain) {
  check_bf16(x, panels, 1, N);
  const uint16_t* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->scalar_type() == at::kBFloat16,
                "bias: bf16 [N]");
    b = reinterpret_cast<const uint16_t*>(bias->data_ptr<at::BFloat16>());
  }
  auto out = at::empty({x.size(0), N}, x.options());
  run_bf16<1, 8>(x, panels, b, N, out, grain);
  return out;
}

at::Tensor gate_up_silu_bf16(const at::Tensor& x, const at::Tensor& panels, int64_t N, int64_t grain) {
  check_bf16(x, panels, 2, N);
  auto out = at::empty({x.size(0), N}, x.options());
  run_bf16<2, 8>(x, panels, nullptr, N, out, grain);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_m_linear", &small_m_linear);
  m.def("gate_up_silu", &gate_up_silu);
  m.def("small_m_linear_bf16", &small_m_linear_bf16);
  m.def("gate_up_silu_bf16", &gate_up_silu_bf16);
  m.def("has_avx512_bf16", &has_avx512_bf16);
}
