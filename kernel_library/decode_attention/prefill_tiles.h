// Prefill attention in tiles on AVX-512-BF16 (vdpbf16ps), for one (batch, kv head) item: the group's G query heads
// over T new tokens are G*T query rows (token-major: row r is token r / G, head r % G), all against the same keys, so
// each block of keys is read once for the whole group (GQA).
//   - keys are packed once per item into panels of 16 keys, pairs of head dims per key ([D/2][16][2]), so one
//     vdpbf16ps multiplies a pair of a query's dims (broadcast) into 16 keys' scores; a tile of 8 query rows keeps 8
//     score registers (bf16 products are exact in fp32, sums in fp32, the scale applied after, as the decode path);
//   - per block of 16 keys an online softmax per row (running max and sum, the accumulator rescaled when the max
//     grows), exp by exp512 (small_m_gemm.h), causal by each row's token: keys past past_len + t are masked;
//   - values are widened to fp32 once per item, and each row's output accumulates in fp32 as probability times
//     value, as the decode path does; rounded once to bf16 at the end.
// Plain scores only (no soft-capping, ALiBi or window): the caller sends those to the per-query path.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "../lanes.h"
#include "../small_m_gemm.h"

struct PrefillTilesBf16 {
  static constexpr int64_t KB = 16;  // keys per panel (one zmm of scores)
  static constexpr int64_t MB = 8;   // query rows per tile
  std::vector<uint32_t> kp;          // [n_keys / KB][D / 2][KB] pairs of dims
  std::vector<float> vf;             // [n_keys][D] values in fp32
  std::vector<float> o, m, l;        // per tile row: output accumulator [MB][D], running max, running sum
  alignas(64) float p[MB * KB];

  // Keys [n_keys, D] (row stride k_pos) into panels, zero past the last key; values widened.
  void pack(const uint16_t* k, const uint16_t* v, int64_t k_pos, int64_t v_pos, int64_t n_keys, int64_t D) {
    const int64_t blocks = (n_keys + KB - 1) / KB, D2 = D / 2;
    kp.assign(blocks * D2 * KB, 0u);
    vf.resize(n_keys * D);
    for (int64_t j = 0; j < n_keys; ++j) {
      const uint32_t* kr = reinterpret_cast<const uint32_t*>(k + j * k_pos);
      uint32_t* panel = kp.data() + (j / KB) * D2 * KB + j % KB;
      for (int64_t d2 = 0; d2 < D2; ++d2) panel[d2 * KB] = kr[d2];
      const uint16_t* vr = v + j * v_pos;
      for (int64_t d = 0; d < D; ++d) vf[j * D + d] = Lanes<c10::BFloat16>::in(vr[d]);
    }
  }

  // q: rotated queries [rows rounded up to MB][D] bf16, row r = token r / G, head r % G, the rows past `rows` zero;
  // out: row r written at out + (r / G) * out_token + (r % G) * D. Row r's token sees keys 0..pos + r / G.
  __attribute__((target("avx512f,avx512bf16"))) void run(const uint16_t* q, int64_t rows, int64_t G, int64_t D,
                                                         float scale, int64_t pos, int64_t n_keys, uint16_t* out,
                                                         int64_t out_token) {
    o.resize(MB * D);
    m.resize(MB);
    l.resize(MB);
    const int64_t D2 = D / 2;
    const uint32_t* q2 = reinterpret_cast<const uint32_t*>(q);
    for (int64_t r0 = 0; r0 < rows; r0 += MB) {
      const int64_t mb = std::min(MB, rows - r0);
      std::fill(o.begin(), o.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      const int64_t last = std::min(n_keys, pos + (r0 + mb - 1) / G + 1);  // keys the tile's last row sees
      for (int64_t j0 = 0; j0 < last; j0 += KB) {
        scores(q2 + r0 * D2, D2, kp.data() + (j0 / KB) * D2 * KB, scale);
        for (int64_t i = 0; i < mb; ++i) accumulate(i, std::min<int64_t>(KB, pos + (r0 + i) / G + 1 - j0), j0, D);
      }
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t r = r0 + i;
        uint16_t* dst = out + (r / G) * out_token + (r % G) * D;
        const float inv = 1.f / l[i];
        for (int64_t d = 0; d < D; ++d) dst[d] = Lanes<c10::BFloat16>::out(o[i * D + d] * inv);
      }
    }
  }

  // p[i][0..16) = scale * (q_i . k_j) for a tile's MB rows and one panel of keys.
  __attribute__((target("avx512f,avx512bf16"))) void scores(const uint32_t* q2, int64_t D2, const uint32_t* panel,
                                                            float scale) {
    __m512 acc[MB];
    for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t d2 = 0; d2 < D2; ++d2) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(panel + d2 * KB);
      for (int i = 0; i < MB; ++i)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_set1_epi32(static_cast<int>(q2[i * D2 + d2])), kv);
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int i = 0; i < MB; ++i) _mm512_store_ps(p + i * KB, _mm512_mul_ps(acc[i], s));
  }

  // Row i's scores for keys j0..j0+seen folded into its running softmax and output.
  __attribute__((target("avx512f,avx512bf16"))) void accumulate(int64_t i, int64_t seen, int64_t j0, int64_t D) {
    if (seen <= 0) return;
    const __mmask16 live = static_cast<__mmask16>(seen >= KB ? 0xffff : (1u << seen) - 1);
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const __m512 s = _mm512_mask_blend_ps(live, neg_inf, _mm512_load_ps(p + i * KB));
    const float new_max = std::max(m[i], _mm512_reduce_max_ps(s));
    const float correction = m[i] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m[i] - new_max);
    const __m512 e = _mm512_maskz_mov_ps(live, BF16::exp512(_mm512_sub_ps(s, _mm512_set1_ps(new_max))));
    _mm512_store_ps(p + i * KB, e);
    l[i] = l[i] * correction + _mm512_reduce_add_ps(e);
    m[i] = new_max;
    float* oi = o.data() + i * D;
    const __m512 c = _mm512_set1_ps(correction);
    const float* pi = p + i * KB;
    for (int64_t d = 0; d < D; d += 32) {  // two registers of the row's output at a time, over the block's keys
      __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(oi + d), c), a1 = _mm512_mul_ps(_mm512_loadu_ps(oi + d + 16), c);
      const float* vcol = vf.data() + j0 * D + d;
      for (int64_t j = 0; j < seen; ++j) {
        const __m512 pj = _mm512_set1_ps(pi[j]);
        a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vcol + j * D), a0);
        a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vcol + j * D + 16), a1);
      }
      _mm512_storeu_ps(oi + d, a0);
      _mm512_storeu_ps(oi + d + 16, a1);
    }
  }

  // Whether this path takes a head of D dims: pairs fill whole registers of 16 keys, values whole registers of 16.
  static bool takes(int64_t D) { return D % 32 == 0 && D <= 512; }
};
