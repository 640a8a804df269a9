// Small-M GEMM for decode: y[M,N] = x[M,K] @ W[N,K]^T (+ bias); fp32 with AVX2/FMA, bf16 with AVX512-BF16 (and
// with AMX tiles at prefill rows on CPUs that have them: amx_gemm.h).
// At decode M is the batch (a handful of rows), so the work is streaming W once: W is pre-packed
// into panels of output columns laid out K-major (per precision, below); each panel is read once per
// block of rows while the rows of x stay in L1. G = 2 interleaves a gate and an up projection so
// the act-and-mul epilogue of a gated MLP (SiLU, or GELU's tanh form) is applied in registers, never written out twice.
// Included by the linear family's extension and by decode attention's (its q/k/v and o projections).
#pragma once
#include "extension.h"
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <string>

#include "lanes.h"

// A gated MLP's activation written as g * sigmoid(z): SiLU is z = g; GELU's tanh form,
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), is z = 2 sqrt(2/pi) (g + 0.044715 g^3).
static inline float gate_arg(float g, bool gelu) {
  return gelu ? 1.5957691216057308f * (g + 0.044715f * g * g * g) : g;
}

// fp32: W packed as [NP, G, K, 8]; one FMA per k multiplies x's k (broadcast) into 8 output columns.
struct F32 {
  static constexpr int W = 8;     // output columns per panel
  static constexpr int STEP = 8;  // panel elements per k step and projection
  using X = float;                // one k step of a row of x
  using P = float;                // panel element
  using L = Lanes<float>;         // output element

  template <int MB, int G>
  static void tile(const float* x, int64_t K, const float* panel, float* out /*[G][MB][8]*/) {
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

  static void store_bias(const float* acc, const float* bias, float* o, int64_t nv) {
    for (int64_t j = 0; j < nv; ++j) o[j] = acc[j] + (bias ? bias[j] : 0.f);
  }
  static void store_gated(const float* g, const float* u, float* o, int64_t nv, bool gelu) {
    for (int64_t j = 0; j < nv; ++j) o[j] = g[j] / (1.f + std::exp(-gate_arg(g[j], gelu))) * u[j];
  }
};

// bf16: W packed as [NP, G, K/2, 16, 2] (16 output columns per panel, each lane holding a pair of k), so one
// vdpbf16ps multiplies a pair of x's k (broadcast) into 16 columns and accumulates in fp32 (x and W products are
// exact in fp32; subnormal bf16 inputs count as zero, as on the instruction). Built for this ISA per function, run
// only where the CPU has it (has_avx512_bf16), so the file still builds and loads on AVX2-only machines.
inline bool has_avx512_bf16() { return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f"); }

struct BF16 {
  static constexpr int W = 16;
  static constexpr int STEP = 32;
  using X = uint32_t;  // a pair of k
  using P = uint16_t;
  using L = Lanes<c10::BFloat16>;
  // Panel lines (k steps) prefetched ahead of the one read: at decode the weights stream from memory, and the
  // hardware prefetcher alone left the loop waiting. 12 KB ahead reached a plain read's bandwidth on an EPYC (one
  // core at 8 rows: 26 -> 34-40 GB/s against 2 KB; 8-32 KB within noise of it); prefetches past the last panel's end
  // are harmless, they never fault.
  static constexpr int64_t AHEAD = 192;

  template <int MB, int G>
  __attribute__((target("avx512f,avx512bf16"))) static void tile(const uint32_t* x, int64_t K2,
                                                                 const uint16_t* panel, float* out) {
    __m512 acc[G][MB];
    for (int g = 0; g < G; ++g)
      for (int m = 0; m < MB; ++m) acc[g][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K2; ++k) {
      __m512bh w[G];
      for (int g = 0; g < G; ++g) {
        _mm_prefetch(reinterpret_cast<const char*>(panel + (g * K2 + k + AHEAD) * 32), _MM_HINT_T0);
        w[g] = (__m512bh)_mm512_loadu_si512(panel + (g * K2 + k) * 32);
      }
      for (int m = 0; m < MB; ++m) {
        const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * K2 + k]));
        for (int g = 0; g < G; ++g) acc[g][m] = _mm512_dpbf16_ps(acc[g][m], b, w[g]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + (g * MB + m) * 16, acc[g][m]);
  }

  // Epilogues, 16 columns at a time: fp32 sums rounded to bf16 once (round to nearest even, as L::out; the
  // instruction treats subnormal sums as zero). A partial panel (nv < 16) goes lane by lane.
  __attribute__((target("avx512f,avx512bf16"))) static void store_bias(const float* acc, const uint16_t* bias,
                                                                       uint16_t* o, int64_t nv) {
    if (nv < W) {
      for (int64_t j = 0; j < nv; ++j) o[j] = L::out(acc[j] + (bias ? L::in(bias[j]) : 0.f));
      return;
    }
    __m512 v = _mm512_loadu_ps(acc);
    if (bias) v = _mm512_add_ps(v, widen(bias));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), (__m256i)_mm512_cvtneps_pbh(v));
  }
  // act(g) * u (SiLU, or GELU's tanh form: see gate_arg) with exp by range reduction (x = n ln2 + r, |r| <= ln2/2)
  // and a degree-6 Taylor polynomial (its truncation under 1.2e-7 relative), far below the bf16 rounding that follows.
  __attribute__((target("avx512f,avx512bf16"))) static void store_gated(const float* g, const float* u, uint16_t* o,
                                                                        int64_t nv, bool gelu) {
    if (nv < W) {
      for (int64_t j = 0; j < nv; ++j) o[j] = L::out(g[j] / (1.f + std::exp(-gate_arg(g[j], gelu))) * u[j]);
      return;
    }
    const __m512 x = _mm512_loadu_ps(g);
    __m512 z = x;
    if (gelu) {  // 2 sqrt(2/pi) (x + 0.044715 x^3)
      const __m512 x2 = _mm512_mul_ps(x, x);
      z = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.f))),
                        _mm512_set1_ps(1.5957691216057308f));
    }
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), z));
    const __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(s, _mm512_loadu_ps(u))));
  }
  __attribute__((target("avx512f"))) static __m512 widen(const uint16_t* b) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))), 16));
  }
  __attribute__((target("avx512f"))) static __m512 exp512(__m512 x) {
    // clamped with the constant first: vmaxps/vminps return their second operand where one is NaN, so NaN stays NaN
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-104.f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145752f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
  }
};

// The tile instantiation for a block of mb rows (tiles keep MB accumulators per projection in registers).
template <typename Isa, int G, int MBMAX>
static void tile_rows(int64_t mb, const typename Isa::X* x, int64_t steps, const typename Isa::P* panel,
                      float* buf) {
  if constexpr (MBMAX > 1) {
    if (mb == MBMAX) return Isa::template tile<MBMAX, G>(x, steps, panel, buf);
    return tile_rows<Isa, G, MBMAX - 1>(mb, x, steps, panel, buf);
  } else {
    return Isa::template tile<1, G>(x, steps, panel, buf);
  }
}

// Panels split over threads; per block of rows a tile sums into buf ([G][mb][W]), then the epilogue: + bias, or
// SiLU(gate) * up for G = 2, rounded once to the output type. With one projection and more rows than a tile holds
// (prefill), a tile takes two adjacent panels (laid out as one G = 2 panel would be): twice the accumulators per
// broadcast of x, so the multiply-adds are not waiting on each other's latency. Decode keeps one panel per tile,
// and with G = 2 sums the gate's panel, then the up's, into the same buf: one weight stream at a time (on an EPYC,
// one core, 8 rows, Qwen2.5-0.5B's gate and up: 791 -> ~500 us, what one projection of their width takes).
template <typename Isa, int G, int MBMAX>
static void run(const typename Isa::X* xp, int64_t M, int64_t steps, const typename Isa::P* pp, int64_t NP,
                const typename Isa::L::raw* bias, typename Isa::L::raw* op, int64_t N, int64_t grain,
                bool gelu = false) {
  constexpr int W = Isa::W;
  const bool pairs = G == 1 && M > MBMAX;
  const bool one_by_one = G == 2 && M <= MBMAX;
  at::parallel_for(0, NP, grain, [&](int64_t p0, int64_t p1) {
    alignas(64) float buf[2 * G * MBMAX * W];
    for (int64_t p = p0; p < p1;) {
      const typename Isa::P* panel = pp + p * G * steps * Isa::STEP;
      const int64_t np = pairs && p + 1 < p1 ? 2 : 1;
      for (int64_t m0 = 0; m0 < M; m0 += MBMAX) {
        const int64_t mb = std::min<int64_t>(MBMAX, M - m0);
        if (np == 2) {
          tile_rows<Isa, 2, MBMAX>(mb, xp + m0 * steps, steps, panel, buf);
        } else if (one_by_one) {
          for (int g = 0; g < G; ++g)
            tile_rows<Isa, 1, MBMAX>(mb, xp + m0 * steps, steps, panel + g * steps * Isa::STEP, buf + g * mb * W);
        } else {
          tile_rows<Isa, G, MBMAX>(mb, xp + m0 * steps, steps, panel, buf);
        }
        for (int64_t q = 0; q < np; ++q) {
          const int64_t col = (p + q) * W, nv = std::min<int64_t>(W, N - col);
          for (int64_t m = 0; m < mb; ++m) {
            auto* o = op + (m0 + m) * N + col;
            if constexpr (G == 2) Isa::store_gated(buf + m * W, buf + (mb + m) * W, o, nv, gelu);
            else Isa::store_bias(buf + (q * mb + m) * W, bias ? bias + col : nullptr, o, nv);
          }
        }
      }
      p += np;
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

// The bias's elements where one is given, checked to be N contiguous elements of `dtype` (`what` says so); else null.
template <typename T>
static const T* bias_data(const c10::optional<at::Tensor>& bias, int64_t N, at::ScalarType dtype, const char* what) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->scalar_type() == dtype, what);
  return static_cast<const T*>(bias->data_ptr());
}

inline at::Tensor small_m_linear(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias,
                          int64_t N, int64_t grain) {
  check(x, panels, 1, N);
  const float* b = bias_data<float>(bias, N, at::kFloat, "bias: fp32 [N]");
  auto out = at::empty({x.size(0), N}, x.options());
  run<F32, 1, 8>(x.data_ptr<float>(), x.size(0), x.size(1), panels.data_ptr<float>(), panels.size(0), b,
                 out.data_ptr<float>(), N, grain);
  return out;
}

// act(x W_gate^T) * (x W_up^T) from one pass over x: SiLU, or with `gelu` GELU's tanh form.
inline at::Tensor gate_up_act(const at::Tensor& x, const at::Tensor& panels, int64_t N, int64_t grain, bool gelu) {
  check(x, panels, 2, N);
  auto out = at::empty({x.size(0), N}, x.options());
  run<F32, 2, 4>(x.data_ptr<float>(), x.size(0), x.size(1), panels.data_ptr<float>(), panels.size(0), nullptr,
                 out.data_ptr<float>(), N, grain, gelu);
  return out;
}

#include "amx_gemm.h"  // after BF16: its epilogues are BF16's

// Which engine a bf16 GEMM of M rows and K columns runs on: AMX tiles for prefill-sized M where the CPU has them
// (and K fills whole tiles), else AVX-512-BF16.
inline bool amx_takes(int64_t M, int64_t K) { return M >= amx::MB && K % amx::KSTEP == 0 && has_amx_bf16(); }

inline std::string gemm_engine(int64_t M, int64_t K) {
  return amx_takes(M, K) ? "amx_bf16" : has_avx512_bf16() ? "avx512_bf16" : "fp32";
}

template <int G, int MBMAX>
static void run_bf16(const at::Tensor& x, const at::Tensor& panels, const uint16_t* bias, at::Tensor& out, int64_t N,
                     int64_t grain, bool gelu = false) {
  using R = uint16_t;
  if (amx_takes(x.size(0), x.size(1))) {
    return amx::gemm<G>(reinterpret_cast<const R*>(x.data_ptr<at::BFloat16>()), x.size(0), x.size(1),
                        reinterpret_cast<const R*>(panels.data_ptr<at::BFloat16>()), panels.size(0), bias,
                        reinterpret_cast<R*>(out.data_ptr<at::BFloat16>()), N, gelu);
  }
  run<BF16, G, MBMAX>(reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>()), x.size(0), panels.size(2),
                      reinterpret_cast<const R*>(panels.data_ptr<at::BFloat16>()), panels.size(0), bias,
                      reinterpret_cast<R*>(out.data_ptr<at::BFloat16>()), N, grain, gelu);
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

inline at::Tensor small_m_linear_bf16(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias,
                               int64_t N, int64_t grain) {
  check_bf16(x, panels, 1, N);
  const uint16_t* b = bias_data<uint16_t>(bias, N, at::kBFloat16, "bias: bf16 [N]");
  auto out = at::empty({x.size(0), N}, x.options());
  run_bf16<1, 8>(x, panels, b, out, N, grain);
  return out;
}

inline at::Tensor gate_up_act_bf16(const at::Tensor& x, const at::Tensor& panels, int64_t N, int64_t grain,
                                   bool gelu) {
  check_bf16(x, panels, 2, N);
  auto out = at::empty({x.size(0), N}, x.options());
  run_bf16<2, 8>(x, panels, nullptr, out, N, grain, gelu);
  return out;
}

// x [M,K] in fp32 or bf16 through panels packed for either precision (pack_panels: 4-dim fp32; pack_panels_bf16:
// 5-dim bf16) -> [M,N] in x's dtype. bf16 activations with fp32 panels (CPUs without avx512_bf16) go through fp32
// and are rounded once at the end, as the linear family's wrapper does.
inline at::Tensor small_m_project(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias,
                                  int64_t N, int64_t grain) {
  if (panels.dim() == 5) {
    const at::Tensor even = x.size(1) % 2 ? at::constant_pad_nd(x, {0, 1}) : x.contiguous();
    return small_m_linear_bf16(even, panels, bias, N, grain);
  }
  const c10::optional<at::Tensor> bias_f32 =
      bias.has_value() ? c10::optional<at::Tensor>(bias->to(at::kFloat).contiguous()) : c10::nullopt;
  return small_m_linear(x.to(at::kFloat).contiguous(), panels, bias_f32, N, grain).to(x.scalar_type());
}
