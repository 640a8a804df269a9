// bf16 GEMM on Intel AMX tiles (Sapphire Rapids and later), for the prefill rows of small_m_gemm.h's GEMMs:
// y[M,N] = x[M,K] @ W[N,K]^T from the same bf16 panels ([NP, G, K/2, 16, 2]: each panel's K/2 x 16 x 2 block is a
// tile in the VNNI layout TDPBF16PS takes, so weights are packed once at load, as for AVX-512-BF16).
//   - A block of 32 rows x 2 panels is 4 accumulator tiles (16 x 16 fp32); per 32 k, 2 tiles of x (16 rows x 32 k,
//     read in place with the row stride) and 2 of panels, 4 TDPBF16PS;
//   - the 2 panels are a gate and an up projection (G = 2: SiLU or GELU(tanh) times up in the epilogue) or two
//     adjacent panels of one projection (G = 1, + bias); epilogues are small_m_gemm.h's, 16 columns at a time;
//   - per thread: its panels, over chunks of rows that stay in L2 (the x chunk is reused by every panel, each panel
//     by every row block of the chunk); a last block of fewer than 32 rows is copied into a zero-padded buffer.
// Used where the CPU has AMX-BF16, the OS grants the tile state and K is a multiple of 32; elsewhere small_m_gemm.h's
// AVX-512-BF16 tiles run. Not yet run on an AMX host by this project (the development hosts have none): a kernel
// that uses it is verified on the host that runs it, as every kernel is, before it is used.
#pragma once
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

// Linux gives a process the AMX tile data state only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
inline bool has_amx_bf16() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return amx_bf16 && amx_tile && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

namespace amx {

constexpr int64_t MB = 32;          // rows per block: two row tiles
constexpr int64_t KSTEP = 32;       // k per tile
constexpr int64_t CHUNK_ROWS = 256;  // rows of x a thread keeps in L2 while it walks its panels

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3 accumulate (row tile r, panel c) at 2r + c; 4 and 5 hold x's two row tiles, 6 and 7 the two panels.
__attribute__((target("amx-tile"))) inline void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) inline void release() { _tile_release(); }

// c [4][16][16]: the block's sums; x: its first row, `ldx` bf16 elements between rows; b0, b1: the panels' blocks.
__attribute__((target("amx-tile,amx-bf16"))) inline void block(const uint16_t* x, int64_t ldx, const uint16_t* b0,
                                                             const uint16_t* b1, int64_t K, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t stride = ldx * 2;
  for (int64_t k = 0; k < K; k += KSTEP) {
    _tile_loadd(4, x + k, stride);
    _tile_loadd(5, x + 16 * ldx + k, stride);
    _tile_loadd(6, b0 + k * 16, 64);  // k / 2 pairs x 16 columns x 2
    _tile_loadd(7, b1 + k * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}

// The GEMM: G = 2 pairs gate and up panels (act * up), G = 1 pairs adjacent panels (+ bias). x [M, K] bf16, K a
// multiple of 32; panels [NP, G, K/2, 16, 2]; out [M, N] bf16.
template <int G>
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16"))) void gemm(const uint16_t* x, int64_t M, int64_t K,
                                                                          const uint16_t* panels, int64_t NP,
                                                                          const uint16_t* bias, uint16_t* out,
                                                                          int64_t N, bool gelu) {
  const int64_t full = M / MB * MB, tail = M - full;
  std::vector<uint16_t> padded(tail ? MB * K : 0, 0);  // the last rows, zero below them
  if (tail) std::memcpy(padded.data(), x + full * K, tail * K * sizeof(uint16_t));
  const int64_t units = G == 2 ? NP : (NP + 1) / 2;  // what a block's two panels are: one (gate, up), or two
  at::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
    configure();
    alignas(64) float c[4 * 256];
    for (int64_t r0 = 0; r0 < M; r0 += CHUNK_ROWS) {
      const int64_t r1 = std::min(M, r0 + CHUNK_ROWS);
      for (int64_t u = u0; u < u1; ++u) {
        const uint16_t* b0 = panels + (G == 2 ? u : 2 * u) * G * K * 16;
        const bool second = G == 2 || 2 * u + 1 < NP;
        const uint16_t* b1 = second ? b0 + K * 16 : b0;  // a lone last panel: its sums are not stored twice
        for (int64_t m0 = r0; m0 < r1; m0 += MB) {
          const bool last = m0 == full;
          block(last ? padded.data() : x + m0 * K, K, b0, b1, K, c);
          const int64_t rows = last ? tail : MB;
          for (int64_t m = 0; m < rows; ++m) {
            const float* first = c + (m / 16) * 512 + (m % 16) * 16;  // tile 2r + 0, row m % 16
            if constexpr (G == 2) {
              const int64_t col = u * 16;
              BF16::store_gated(first, first + 256, out + (m0 + m) * N + col, std::min<int64_t>(16, N - col), gelu);
            } else {
              for (int64_t q = 0; q < (second ? 2 : 1); ++q) {
                const int64_t col = (2 * u + q) * 16;
                BF16::store_bias(first + q * 256, bias ? bias + col : nullptr, out + (m0 + m) * N + col,
                                 std::min<int64_t>(16, N - col));
              }
            }
          }
        }
      }
    }
    release();
  });
}

}  // namespace amx
