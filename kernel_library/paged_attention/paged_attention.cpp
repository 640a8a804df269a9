// Attention of each request's new query tokens over its paged KV cache in vLLM's CPU layout ("vec" ISA): each
// (block, kv head) of the cache holds the block's keys transposed ([head_size][block_size]) then its values
// ([block_size][head_size]). One task per (request, kv head): the query heads sharing that kv head go together, so
// each block's keys and values are read once for all of them. Scores block by block (for each dim, a row of the
// transposed keys times the query: contiguous over the block's tokens), softmax in fp32, sums accumulated in fp32.
#include "../extension.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../small_m_gemm.h"  // has_avx512_bf16, and lanes.h

template <typename T>
static void attend(const T* qt, const T* ct, const int32_t* table, const int32_t* lens, const int32_t* starts, T* ot,
                   int64_t requests, int64_t heads, int64_t kv_heads, int64_t d, int64_t bs, int64_t per_request,
                   float scale) {
  using L = Lanes<T>;
  const auto* q = raw_ptr<T>(qt);
  const auto* cache = raw_ptr<T>(ct);
  auto* out = raw_ptr<T>(ot);
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, requests * kv_heads, 1, [&](int64_t b, int64_t e) {
    std::vector<float> qf, scores, acc;
    for (int64_t task = b; task < e; ++task) {
      const int64_t r = task / kv_heads, kh = task % kv_heads;
      const int64_t len = lens[r], first = starts[r], last = starts[r + 1], n = last - first;
      for (int64_t i = first; i < last; ++i) {
        const int64_t seen = len - n + (i - first) + 1;  // causal: keys 0 .. this token's position
        qf.assign(group * d, 0.f);
        scores.assign(group * seen, 0.f);
        acc.assign(group * d, 0.f);
        for (int64_t g = 0; g < group; ++g)
          for (int64_t x = 0; x < d; ++x) qf[g * d + x] = L::in(q[(i * heads + kh * group + g) * d + x]) * scale;
        const int64_t nblocks = (seen + bs - 1) / bs;
        for (int64_t j = 0; j < nblocks; ++j) {
          const auto* keys = cache + ((static_cast<int64_t>(table[r * per_request + j]) * kv_heads + kh) * 2 * bs * d);
          const int64_t width = std::min(bs, seen - j * bs);
          for (int64_t g = 0; g < group; ++g) {
            float* s = scores.data() + g * seen + j * bs;
            for (int64_t x = 0; x < d; ++x) {
              const float qx = qf[g * d + x];
              const auto* row = keys + x * bs;
#pragma omp simd
              for (int64_t t = 0; t < width; ++t) s[t] += qx * L::in(row[t]);
            }
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          float* s = scores.data() + g * seen;
          float top = -std::numeric_limits<float>::infinity();
          for (int64_t t = 0; t < seen; ++t) top = std::max(top, s[t]);
          float total = 0.f;
          for (int64_t t = 0; t < seen; ++t) {
            s[t] = std::exp(s[t] - top);
            total += s[t];
          }
          const float inv = 1.f / total;
          for (int64_t t = 0; t < seen; ++t) s[t] *= inv;
        }
        for (int64_t j = 0; j < nblocks; ++j) {
          const auto* values =
              cache + ((static_cast<int64_t>(table[r * per_request + j]) * kv_heads + kh) * 2 * bs * d) + bs * d;
          const int64_t width = std::min(bs, seen - j * bs);
          for (int64_t g = 0; g < group; ++g) {
            const float* p = scores.data() + g * seen + j * bs;
            float* a = acc.data() + g * d;
            for (int64_t t = 0; t < width; ++t) {
              const float w = p[t];
              const auto* row = values + t * d;
#pragma omp simd
              for (int64_t x = 0; x < d; ++x) a[x] += w * L::in(row[x]);
            }
          }
        }
        for (int64_t g = 0; g < group; ++g)
          for (int64_t x = 0; x < d; ++x) out[(i * heads + kh * group + g) * d + x] = L::out(acc[g * d + x]);
      }
    }
  });
}

// The cache a thread will read, block by block in its order (each task's blocks once, then the next task's),
// prefetched into L2 a few lines at a time as the scores are computed, up to BLOCKS blocks beyond the one being read.
// Blocks are scattered, so no hardware prefetcher can guess them, and a decode step streams the cache from memory:
// a burst per block left the core waiting on it (one thread, the served worker's: 274 us a call where the same call
// on a warm cache took 93); paced, the next task's first blocks arrive while this task computes.
struct Ahead {
  static constexpr size_t BLOCKS = 2;
  std::vector<const char*> blocks;  // each (block, kv head)'s keys then values
  int64_t bytes = 0;                // one block's keys and values
  size_t next = 0;
  int64_t offset = 0;

  // Up to `lines` more lines, no further than `beyond` blocks past block `reading`.
  void pace(size_t reading, int64_t lines, size_t beyond = BLOCKS) {
    const size_t limit = std::min(blocks.size(), reading + 1 + beyond);
    for (; lines > 0 && next < limit; --lines) {
      _mm_prefetch(blocks[next] + offset, _MM_HINT_T1);
      if ((offset += 64) >= bytes) offset = 0, ++next;
    }
  }

  // Block `reading` and the one after it, at once, where pacing has not reached them (a thread's first block).
  void catch_up(size_t reading) { pace(reading, std::numeric_limits<int64_t>::max(), 1); }
};

// bf16 on a CPU with AVX-512-BF16, at most MAXG query heads per kv head: by vdpbf16ps (dot_token) where the head size
// is a multiple of 32, else widened to fp32 (token), head_size = 16 * DV: sixteen keys' scores at a
// time (one row of the transposed keys, widened to fp32, times each query head's broadcast dim), the query heads of
// the kv head together so each key row is read once; values accumulated in DV registers per head. The same sums in
// the same order per key as the generic path gives up to fp32 rounding of the dot products' association.
struct PagedBf16 {
  static constexpr int MAXG = 8;
  std::vector<float> scores;
  Ahead ahead;  // the thread's blocks, prefetched as dot_token reads them

  __attribute__((target("avx512f"))) static __m512 widen(const uint16_t* x) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }

  __attribute__((target("avx512f,avx512bw,avx512vl"))) static __m512 widen_masked(const uint16_t* x, int64_t n) {
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }

  // One query token over `seen` keys, for kv head kh's G query heads. Scores: per block, sixteen keys at a time,
  // NV chunks of sixteen in flight per head (independent FMA chains); softmax with a vector exp; values: two
  // interleaved sets of DV accumulators (even and odd keys), added at the end.
  template <int DV, int NV>
  __attribute__((target("avx512f,avx512bw,avx512vl"))) void token(const uint16_t* q, const uint16_t* cache,
                                                                   const int32_t* blocks, int64_t seen, int64_t G,
                                                                   int64_t kv_heads, int64_t kh, int64_t bs,
                                                                   float scale, uint16_t* out) {
    constexpr int64_t D = 16 * DV;
    if (static_cast<int64_t>(scores.size()) < G * (seen + 16)) scores.resize(G * (seen + 16));
    float* s = scores.data();
    const int64_t stride = seen + 16;  // each head's scores, with room for a chunk's overhang
    const int64_t nblocks = (seen + bs - 1) / bs;
    float qf[MAXG][D];
    for (int64_t g = 0; g < G; ++g)
      for (int64_t x = 0; x < D; ++x) qf[g][x] = Lanes<c10::BFloat16>::in(q[g * D + x]) * scale;
    for (int64_t j = 0; j < nblocks; ++j) {
      const uint16_t* keys = cache + (static_cast<int64_t>(blocks[j]) * kv_heads + kh) * 2 * bs * D;
      const int64_t width = std::min(bs, seen - j * bs);
      for (int64_t t = 0; t < width; t += 16 * NV) {
        __m512 acc[MAXG][NV];
        for (int64_t g = 0; g < G; ++g)
          for (int v = 0; v < NV; ++v) acc[g][v] = _mm512_setzero_ps();
        for (int64_t x = 0; x < D; ++x) {
          __m512 k[NV];
          for (int v = 0; v < NV; ++v) k[v] = keys_at(keys + x * bs, t + 16 * v, width);
          for (int64_t g = 0; g < G; ++g) {
            const __m512 qx = _mm512_set1_ps(qf[g][x]);
            for (int v = 0; v < NV; ++v) acc[g][v] = _mm512_fmadd_ps(qx, k[v], acc[g][v]);
          }
        }
        for (int64_t g = 0; g < G; ++g)
          for (int v = 0; v < NV; ++v)
            if (t + 16 * v < width) _mm512_storeu_ps(s + g * stride + j * bs + t + 16 * v, acc[g][v]);
      }
    }
    for (int64_t g = 0; g < G; ++g) softmax(s + g * stride, seen);
    for (int64_t g = 0; g < G; ++g) {
      __m512 even[DV], odd[DV];
      for (int c = 0; c < DV; ++c) even[c] = odd[c] = _mm512_setzero_ps();
      const float* pg = s + g * stride;
      for (int64_t j = 0; j < nblocks; ++j) {
        const uint16_t* values = cache + (static_cast<int64_t>(blocks[j]) * kv_heads + kh) * 2 * bs * D + bs * D;
        const int64_t width = std::min(bs, seen - j * bs);
        int64_t t = 0;
        for (; t + 1 < width; t += 2) {
          const __m512 p0 = _mm512_set1_ps(pg[j * bs + t]), p1 = _mm512_set1_ps(pg[j * bs + t + 1]);
          for (int c = 0; c < DV; ++c) {
            even[c] = _mm512_fmadd_ps(p0, widen(values + t * D + 16 * c), even[c]);
            odd[c] = _mm512_fmadd_ps(p1, widen(values + (t + 1) * D + 16 * c), odd[c]);
          }
        }
        if (t < width) {
          const __m512 p0 = _mm512_set1_ps(pg[j * bs + t]);
          for (int c = 0; c < DV; ++c) even[c] = _mm512_fmadd_ps(p0, widen(values + t * D + 16 * c), even[c]);
        }
      }
      for (int c = 0; c < DV; ++c) {
        alignas(64) float o[16];
        _mm512_store_ps(o, _mm512_add_ps(even[c], odd[c]));
        for (int i = 0; i < 16; ++i) out[g * D + 16 * c + i] = Lanes<c10::BFloat16>::out(o[i]);
      }
    }
  }

  // Sixteen keys' values of one dim (a row of the transposed keys) from key t on, zeros past the block's width.
  __attribute__((target("avx512f,avx512bw,avx512vl"))) static __m512 keys_at(const uint16_t* row, int64_t t,
                                                                           int64_t width) {
    if (t + 16 <= width) return widen(row + t);
    return t < width ? widen_masked(row + t, width - t) : _mm512_setzero_ps();
  }

  // In place: the probabilities of n scores (max subtracted, exp by BF16::exp512, normalised).
  __attribute__((target("avx512f"))) static void softmax(float* s, int64_t n) {
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + t));
    float best = _mm512_reduce_max_ps(top);
    for (int64_t u = t; u < n; ++u) best = std::max(best, s[u]);
    const __m512 b = _mm512_set1_ps(best);
    __m512 sum = _mm512_setzero_ps();
    for (t = 0; t + 16 <= n; t += 16) {
      const __m512 e = BF16::exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), b));
      _mm512_storeu_ps(s + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    float total = _mm512_reduce_add_ps(sum);
    for (int64_t u = t; u < n; ++u) total += (s[u] = std::exp(s[u] - best));
    const __m512 inv = _mm512_set1_ps(1.f / total);
    for (t = 0; t + 16 <= n; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), inv));
    for (int64_t u = t; u < n; ++u) s[u] *= 1.f / total;
  }

  // The same token by vdpbf16ps, for head sizes of 32 * NC and even block sizes: half the multiply-add
  // instructions of the widening path, which bound it (a query head's 16 fp32 FMAs per key and dim pair become 8).
  //   - Scores: per block, 32 keys at a time; rows 2x and 2x+1 of the transposed keys interleaved by unpacklo/hi
  //     into pairs (key t's dims 2x, 2x+1) and dotted with each head's pair of query dims (broadcast): bf16 products
  //     exact in fp32, sums in fp32, the scale applied after. The unpacks leave the keys in an order that one
  //     permute per 16 scores puts back (UNPACKED).
  //   - Values: keys t, t+1's rows interleaved the same way into pairs of (t, t+1) per dim and dotted with the
  //     head's probabilities of t and t+1 rounded to bf16 (relative error 2^-9 per weight; sums in fp32), 32 dims of
  //     HV heads at a time, so their accumulators stay in registers and each line of values is read once (all of a
  //     head's dims at once read them twice for 7 query heads per KV head).
  static constexpr int32_t UNPACKED[2][16] = {{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
                                              {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
  std::vector<uint16_t> probs;  // each head's probabilities in bf16, an even count (zero-padded)

  template <int NC>
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void dot_token(
      const uint16_t* q, const uint16_t* cache, const int32_t* blocks, int64_t seen, int64_t G, int64_t kv_heads,
      int64_t kh, int64_t bs, float scale, uint16_t* out, size_t stream_at) {
    constexpr int64_t D = 32 * NC, D2 = D / 2;
    constexpr int HV = 12;  // heads whose two accumulators of a 32-dim chunk stay in registers at once
    const int64_t stride = seen + 32, pairs = (seen + 1) / 2;
    if (static_cast<int64_t>(scores.size()) < G * stride) scores.resize(G * stride);
    if (static_cast<int64_t>(probs.size()) < G * 2 * pairs) probs.resize(G * 2 * pairs);
    float* s = scores.data();
    const int64_t nblocks = (seen + bs - 1) / bs;
    const uint32_t* q2 = reinterpret_cast<const uint32_t*>(q);  // head g's dims 2x, 2x+1 at q2[g * D2 + x]
    const __m512i first = _mm512_loadu_si512(UNPACKED[0]), second = _mm512_loadu_si512(UNPACKED[1]);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < nblocks; ++j) {
      const uint16_t* keys = cache + (static_cast<int64_t>(blocks[j]) * kv_heads + kh) * 2 * bs * D;
      const int64_t width = std::min(bs, seen - j * bs);
      ahead.catch_up(stream_at + j);
      for (int64_t t = 0; t < width; t += 32) {
        const int64_t n = std::min<int64_t>(32, width - t);
        const __mmask32 m = n == 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
        __m512 lo[MAXG], hi[MAXG];
        for (int64_t g = 0; g < G; ++g) lo[g] = hi[g] = _mm512_setzero_ps();
        for (int64_t x = 0; x < D2; ++x) {
          ahead.pace(stream_at + j, 4);  // a block's keys and values are 4 lines per (32 keys, 2 dims) of its scores
          const __m512i a = _mm512_maskz_loadu_epi16(m, keys + 2 * x * bs + t);
          const __m512i b = _mm512_maskz_loadu_epi16(m, keys + (2 * x + 1) * bs + t);
          const __m512bh pl = (__m512bh)_mm512_unpacklo_epi16(a, b), ph = (__m512bh)_mm512_unpackhi_epi16(a, b);
          for (int64_t g = 0; g < G; ++g) {
            const __m512bh qq = (__m512bh)_mm512_set1_epi32(static_cast<int>(q2[g * D2 + x]));
            lo[g] = _mm512_dpbf16_ps(lo[g], pl, qq);
            hi[g] = _mm512_dpbf16_ps(hi[g], ph, qq);
          }
        }
        for (int64_t g = 0; g < G; ++g) {  // past `width`: scores of zeroed keys, overwritten or never read
          float* dst = s + g * stride + j * bs + t;
          _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_permutex2var_ps(lo[g], first, hi[g]), sc));
          _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo[g], second, hi[g]), sc));
        }
      }
    }
    uint16_t* pb = probs.data();
    for (int64_t g = 0; g < G; ++g) {
      softmax(s + g * stride, seen);
      uint16_t* pg = pb + g * 2 * pairs;
      int64_t t = 0;
      for (; t + 32 <= seen; t += 32)
        _mm512_storeu_si512(pg + t, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + g * stride + t + 16),
                                                                 _mm512_loadu_ps(s + g * stride + t)));
      for (; t < 2 * pairs; ++t) pg[t] = t < seen ? Lanes<c10::BFloat16>::out(s[g * stride + t]) : uint16_t(0);
    }
    const uint32_t* p2 = reinterpret_cast<const uint32_t*>(pb);  // head g's probabilities of keys 2i, 2i+1
    for (int c = 0; c < NC; ++c)  // a chunk of 32 dims at a time, for up to HV heads: each value line read once
      for (int64_t g0 = 0; g0 < G; g0 += HV) {
        const int64_t hg = std::min<int64_t>(HV, G - g0);
        __m512 acc[HV][2];
        for (int h = 0; h < HV; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
        for (int64_t j = 0; j < nblocks; ++j) {
          const uint16_t* values =
              cache + (static_cast<int64_t>(blocks[j]) * kv_heads + kh) * 2 * bs * D + bs * D + 32 * c;
          const int64_t width = std::min(bs, seen - j * bs), pair0 = j * bs / 2;
          for (int64_t t = 0; t < width; t += 2) {
            const __m512i a = _mm512_loadu_si512(values + t * D);
            const __m512i b = t + 1 < width ? _mm512_loadu_si512(values + (t + 1) * D) : _mm512_setzero_si512();
            const __m512bh pl = (__m512bh)_mm512_unpacklo_epi16(a, b), ph = (__m512bh)_mm512_unpackhi_epi16(a, b);
            for (int h = 0; h < HV; ++h) {
              if (h >= hg) break;
              const __m512bh pp =
                  (__m512bh)_mm512_set1_epi32(static_cast<int>(p2[(g0 + h) * pairs + pair0 + t / 2]));
              acc[h][0] = _mm512_dpbf16_ps(acc[h][0], pl, pp);
              acc[h][1] = _mm512_dpbf16_ps(acc[h][1], ph, pp);
            }
          }
        }
        for (int64_t h = 0; h < hg; ++h) {
          uint16_t* o = out + (g0 + h) * D + 32 * c;
          const __m512 d0 = _mm512_permutex2var_ps(acc[h][0], first, acc[h][1]);
          const __m512 d1 = _mm512_permutex2var_ps(acc[h][0], second, acc[h][1]);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), (__m256i)_mm512_cvtneps_pbh(d0));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), (__m256i)_mm512_cvtneps_pbh(d1));
        }
      }
  }

  // The vdpbf16ps path where the head size is 32 * NC (NC <= 8) and blocks hold an even number of keys.
  template <int NC = 8>
  bool dot_dispatch(int64_t D, const uint16_t* q, const uint16_t* cache, const int32_t* blocks, int64_t seen,
                    int64_t G, int64_t kv_heads, int64_t kh, int64_t bs, float scale, uint16_t* out, size_t stream_at) {
    if constexpr (NC == 0) {
      return false;
    } else {
      if (D != 32 * NC || bs % 2 != 0)
        return dot_dispatch<NC - 1>(D, q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out, stream_at);
      dot_token<NC>(q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out, stream_at);
      return true;
    }
  }

  // dot_token where it covers the head size, else token<D / 16>; false where neither does (the generic path takes
  // it).
  template <int DV = 16>
  bool dispatch(int64_t D, const uint16_t* q, const uint16_t* cache, const int32_t* blocks, int64_t seen, int64_t G,
                int64_t kv_heads, int64_t kh, int64_t bs, float scale, uint16_t* out, size_t stream_at) {
    if constexpr (DV == 0) {
      return false;
    } else {
      if (DV == 16 && dot_dispatch(D, q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out, stream_at))
        return true;
      if (D != 16 * DV)
        return dispatch<DV - 1>(D, q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out, stream_at);
      if (G <= 2) token<DV, 4>(q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out);  // 4+ chains in flight
      else if (G <= 4) token<DV, 2>(q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out);
      else token<DV, 1>(q, cache, blocks, seen, G, kv_heads, kh, bs, scale, out);
      return true;
    }
  }
};

static void attend_bf16(const uint16_t* q, const uint16_t* cache, const int32_t* table, const int32_t* lens,
                        const int32_t* starts, uint16_t* out, int64_t requests, int64_t heads, int64_t kv_heads,
                        int64_t d, int64_t bs, int64_t per_request, float scale) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, requests * kv_heads, 1, [&](int64_t b, int64_t e) {
    PagedBf16 paged;
    std::vector<size_t> firsts;  // each task's first block's place in the thread's stream
    paged.ahead.bytes = 2 * bs * d * 2;
    for (int64_t task = b; task < e; ++task) {
      const int64_t r = task / kv_heads, kh = task % kv_heads;
      firsts.push_back(paged.ahead.blocks.size());
      for (int64_t j = 0; j < (lens[r] + bs - 1) / bs; ++j)
        paged.ahead.blocks.push_back(reinterpret_cast<const char*>(
            cache + (static_cast<int64_t>(table[r * per_request + j]) * kv_heads + kh) * 2 * bs * d));
    }
    for (int64_t task = b; task < e; ++task) {
      const int64_t r = task / kv_heads, kh = task % kv_heads;
      const int64_t len = lens[r], first = starts[r], last = starts[r + 1], n = last - first;
      for (int64_t i = first; i < last; ++i) {
        const int64_t offset = (i * heads + kh * group) * d;
        paged.dispatch(d, q + offset, cache, table + r * per_request, len - n + (i - first) + 1, group, kv_heads, kh,
                       bs, scale, out + offset, firsts[task - b]);
      }
    }
  });
}

at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_table,
                           const at::Tensor& seq_lens, const at::Tensor& query_start_loc, int64_t kv_heads,
                           double scale) {
  TORCH_CHECK(query.dim() == 3 && kv_cache.dim() == 4, "paged_attention: query [T,H,D] and cache [B,KVH,BS,2D]");
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type(), "paged_attention: query and cache dtypes differ");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  query_start_loc.scalar_type() == at::kInt, "paged_attention: int32 metadata only");
  TORCH_CHECK(kv_cache.size(1) == kv_heads && kv_cache.size(3) == 2 * query.size(2) &&
                  query.size(1) % kv_heads == 0, "paged_attention: heads and cache do not fit");
  TORCH_CHECK(query_start_loc.numel() == seq_lens.numel() + 1 && block_table.size(0) >= seq_lens.numel(),
              "paged_attention: metadata sizes do not fit");
  auto q = query.contiguous();
  auto cache = kv_cache.contiguous();
  auto table = block_table.contiguous();
  auto lens = seq_lens.contiguous();
  auto starts = query_start_loc.contiguous();
  auto out = at::empty_like(q);
  const int64_t requests = lens.numel(), bs = cache.size(2), per_request = table.size(1);
  const int32_t* lp = lens.data_ptr<int32_t>();
  const int32_t* sp = starts.data_ptr<int32_t>();
  const int32_t* tp = table.data_ptr<int32_t>();
  for (int64_t r = 0; r < requests; ++r) {  // every block index read is checked here, once, not in the loop
    const int64_t n = sp[r + 1] - sp[r];
    TORCH_CHECK(n >= 0 && sp[r + 1] <= q.size(0) && lp[r] >= n && (lp[r] + bs - 1) / bs <= per_request,
                "paged_attention: request ", r, " does not fit its query rows or blocks");
    for (int64_t j = 0; j < (lp[r] + bs - 1) / bs; ++j)
      TORCH_CHECK(tp[r * per_request + j] >= 0 && tp[r * per_request + j] < cache.size(0),
                  "paged_attention: block index out of the cache");
  }
  const int64_t d = q.size(2), group = q.size(1) / kv_heads;
  if (q.scalar_type() == at::kBFloat16 && has_avx512_bf16() && d % 16 == 0 && d <= 256 && group <= PagedBf16::MAXG) {
    attend_bf16(reinterpret_cast<const uint16_t*>(q.data_ptr()), reinterpret_cast<const uint16_t*>(cache.data_ptr()),
                tp, lp, sp, reinterpret_cast<uint16_t*>(out.data_ptr()), requests, q.size(1), kv_heads, d, bs,
                per_request, static_cast<float>(scale));
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    attend<scalar_t>(q.data_ptr<scalar_t>(), cache.data_ptr<scalar_t>(), tp, lp, sp, out.data_ptr<scalar_t>(),
                     requests, q.size(1), kv_heads, q.size(2), bs, per_request, static_cast<float>(scale));
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("paged_attention", &paged_attention); }
