// Attention over a KV cache for decode and prefill, as one op (`step`), nothing between its parts in Python:
//   q, k and v projected by one small-M GEMM over their stacked weights (small_m_gemm.h);
//   per (batch, kv head): the new queries and keys rotated (RoPE, rotate_half form, over all of a head or its first
//   R dims), the rotated keys and the new values written into preallocated caches at positions
//   past_len..past_len+T-1 (no concatenation), then the group's
//   queries over the first past_len+t+1 cached positions (causal with offset past_len, GQA; optionally a sliding
//   window, soft-capped scores, ALiBi biases), fp32 accumulation with
//   an online softmax over blocks of keys, rounded once to the output type;
//   the o projection by the same GEMM.
// fp32 and bf16 (bf16 through its raw bits, lanes.h); every loop over head_dim is a plain vectorisable loop.
#include "../extension.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../lanes.h"
#include "../small_m_gemm.h"
#include "prefill_tiles.h"

template <typename T>
using Raw = typename Lanes<T>::raw;

// Rows of a [B, T, width] tensor whose last dim is unit-stride: the element offset of (b, t).
struct RowStrides {
  int64_t batch, token;
  int64_t at(int64_t b, int64_t t) const { return b * batch + t * token; }
};

// A [B, heads, capacity, D] cache with unit-stride D: the element offset of (b, head, position).
struct CacheStrides {
  int64_t batch, head, pos;
  int64_t at(int64_t b, int64_t h, int64_t p) const { return b * batch + h * head + p * pos; }
};

// x * cos + rotate_half(x) * sin over a head's first R dims (partial rotary: NeoX rotates a fraction of each head,
// rotate_half pairing dim i with i + R/2), its other D - R dims as they are; from fp32 cos/sin rows, rounded once.
template <typename T>
static inline void rotate_head(const Raw<T>* x, const float* cs, const float* sn, Raw<T>* o, int64_t D, int64_t R) {
  using L = Lanes<T>;
  const int64_t half = R / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) o[i] = L::out(L::in(x[i]) * cs[i] - L::in(x[half + i]) * sn[i]);
#pragma omp simd
  for (int64_t i = half; i < R; ++i) o[i] = L::out(L::in(x[i]) * cs[i] + L::in(x[i - half]) * sn[i]);
  std::copy(x + R, x + D, o + R);
}

static RowStrides row_strides(const at::Tensor& x) { return {x.stride(0), x.stride(1)}; }
static CacheStrides cache_strides(const at::Tensor& x) { return {x.stride(0), x.stride(1), x.stride(2)}; }

static void check_cache(const at::Tensor& c, const char* name, int64_t B, int64_t KVH, int64_t D, int64_t end,
                        const at::Tensor& like) {
  TORCH_CHECK(c.dim() == 4 && c.size(0) == B && c.size(1) == KVH && c.size(3) == D && c.stride(3) == 1, name,
              " must be [B, kv_heads, capacity, head_dim] with a unit-stride last dim");
  TORCH_CHECK(c.size(2) >= end, name, " holds ", c.size(2), " positions, fewer than the ", end,
              " needed: allocate it with more capacity");
  TORCH_CHECK(c.scalar_type() == like.scalar_type(), name, " has another dtype than q");
}

// Runs f(T{}) for the tensor's dtype: fp32 or bf16.
template <typename F>
static void dispatch(const at::Tensor& x, const char* op, F&& f) {
  if (x.scalar_type() == at::kFloat) return f(float{});
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, op, ": float32 or bfloat16 tensors only, got ", x.scalar_type());
  f(c10::BFloat16{});
}

// What turns a query-key dot product into a score: the scale; soft-capping where cap > 0 (Gemma-2:
// cap * tanh(s / cap)); ALiBi where slopes are given (BLOOM: + the query head's slope times the key's position; a
// softmax does not see the query's own position, a constant per row). `first`: the position of the first key in view.
struct ScoreRule {
  float scale, cap;
  const float* slopes;  // the group's query heads' slopes, or nullptr
  int64_t first;

  float operator()(float scaled, int64_t g, int64_t j) const {
    const float s = cap > 0.f ? cap * std::tanh(scaled / cap) : scaled;
    return slopes ? s + slopes[g] * static_cast<float>(first + j) : s;
  }
  bool plain() const { return cap <= 0.f && slopes == nullptr; }
};

// One (batch, kv head, new token): the group's G query heads over keys 0..past_len+t, in blocks of KB keys with an
// online softmax (running max m, running sum l, accumulator acc rescaled when the max grows).
template <typename T>
struct GroupAttention {
  static constexpr int64_t KB = 64;  // keys per block
  int64_t G, D;
  std::vector<float> qf, acc, p, m, l;

  GroupAttention(int64_t groups, int64_t head_dim)
      : G(groups), D(head_dim), qf(groups * head_dim), acc(groups * head_dim), p(groups * KB), m(groups), l(groups) {}

  void run(const Raw<T>* q /*[G, D]*/, const ScoreRule& rule, const Raw<T>* k, const Raw<T>* v, int64_t k_pos,
           int64_t v_pos, int64_t n_keys, Raw<T>* out /*[G, D]*/) {
    accumulate(q, rule, k, v, k_pos, v_pos, n_keys);
    store(out);
  }

  // acc, m, l: each query head's unnormalised output, running max and sum over the keys given.
  void accumulate(const Raw<T>* q /*[G, D]*/, const ScoreRule& rule, const Raw<T>* k, const Raw<T>* v, int64_t k_pos,
                  int64_t v_pos, int64_t n_keys) {
    using L = Lanes<T>;
    for (int64_t i = 0; i < G * D; ++i) qf[i] = L::in(q[i]) * rule.scale;
    std::fill(acc.begin(), acc.end(), 0.f);
    std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
    std::fill(l.begin(), l.end(), 0.f);
    for (int64_t j0 = 0; j0 < n_keys; j0 += KB) {
      const int64_t jb = std::min(KB, n_keys - j0);
      scores(k + j0 * k_pos, k_pos, jb);
      if (!rule.plain())
        for (int64_t g = 0; g < G; ++g)
          for (int64_t j = 0; j < jb; ++j) p[g * KB + j] = rule(p[g * KB + j], g, j0 + j);
      softmax_block(jb);
      for (int64_t j = 0; j < jb; ++j) {
        const Raw<T>* vr = v + (j0 + j) * v_pos;
        for (int64_t g = 0; g < G; ++g) {
          const float pj = p[g * KB + j];
          float* a = acc.data() + g * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] += pj * L::in(vr[d]);
        }
      }
    }
  }

  void store(Raw<T>* out /*[G, D]*/) const {
    using L = Lanes<T>;
    for (int64_t g = 0; g < G; ++g) {
      const float inv = 1.f / l[g];
      const float* a = acc.data() + g * D;
      Raw<T>* o = out + g * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] = L::out(a[d] * inv);
    }
  }

  // p[g, j] = (scaled q_g) . k_j for the block's keys.
  void scores(const Raw<T>* k, int64_t k_pos, int64_t jb) {
    using L = Lanes<T>;
    for (int64_t j = 0; j < jb; ++j) {
      const Raw<T>* kr = k + j * k_pos;
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = qf.data() + g * D;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < D; ++d) s += qg[d] * L::in(kr[d]);
        p[g * KB + j] = s;
      }
    }
  }

  // Scores -> unnormalised probabilities against the new running max; rescales what was accumulated before.
  void softmax_block(int64_t jb) {
    for (int64_t g = 0; g < G; ++g) {
      float* pg = p.data() + g * KB;
      float block_max = pg[0];
      for (int64_t j = 1; j < jb; ++j) block_max = std::max(block_max, pg[j]);
      const float new_max = std::max(m[g], block_max);
      const float correction = m[g] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m[g] - new_max);
      float sum = 0.f;
      for (int64_t j = 0; j < jb; ++j) {
        pg[j] = std::exp(pg[j] - new_max);
        sum += pg[j];
      }
      if (correction != 1.f) {
        float* a = acc.data() + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] *= correction;
      }
      l[g] = l[g] * correction + sum;
      m[g] = new_max;
    }
  }
};

// bf16 on a CPU with avx512_bf16, for head_dim = 16 * DV: the same attention with the group's rotated bf16 queries
// dotted with the keys by vdpbf16ps (bf16 products are exact in fp32, sums in fp32; scaled after the dot) and all of
// a query head's scores kept (a plain softmax over them, no rescaling). Every pass is vectorised across keys:
//   - scores, 16 keys at a time: each of the group's heads dotted with the block's rows (read from memory once, then
//     from L1 for the other heads), the 16 dot products summed across lanes by one shuffle tree (sum16), not one
//     horizontal sum per key and head;
//   - the softmax: max, exp (BF16::exp512) and sum 16 scores at a time;
//   - values: HS heads at a time, whose DV accumulators stay in registers: two keys' rows interleaved into bf16 pairs
//     and dotted with the heads' probability pairs (weigh_pairs) where head_dim is a multiple of 32, else each row
//     widened once for them.
// Keys and values are prefetched a block ahead: at decode these loops stream the cache from memory.
struct GroupAttentionBf16 {
  static constexpr int64_t KB = 16;  // keys per score block: one register of scores
  std::vector<float> s;              // [heads padded to HS, keys padded to KB] scores, then probabilities
  std::vector<float> best, total;    // per head: its largest score, the sum of its exponentials

  // Where a run's results go: each head's output rounded to bf16 (out), or, for one chunk of a split context, its
  // unnormalised fp32 output, max score and sum of exponentials (acc [G, D], m [G], l [G]).
  struct Sink {
    uint16_t* out = nullptr;
    float *acc = nullptr, *m = nullptr, *l = nullptr;
  };

  template <int DV>
  __attribute__((target("avx512f,avx512bw,avx512bf16"))) void run(
      const uint16_t* q, int64_t G, const ScoreRule& rule, const uint16_t* k, const uint16_t* v, int64_t k_pos,
      int64_t v_pos, int64_t n_keys, Sink sink) {
    constexpr int64_t D = 16 * DV;
    constexpr int64_t HS = DV >= 16 ? 1 : 16 / DV;  // heads per value pass: HS * DV accumulators in registers
    alignas(64) static const uint16_t zeros[D] = {};  // the rows past the last key of a partial block
    const int64_t stride = (n_keys + KB - 1) / KB * KB, heads = (G + HS - 1) / HS * HS;
    if (static_cast<int64_t>(s.size()) < heads * stride) s.resize(heads * stride);
    std::fill(s.begin() + G * stride, s.begin() + heads * stride, 0.f);  // padding heads weigh nothing
    const __m512 scale = _mm512_set1_ps(rule.scale);
    for (int64_t j0 = 0; j0 < n_keys; j0 += KB) {
      for (int64_t j = j0 + 2 * KB; j < std::min(j0 + 3 * KB, n_keys); ++j)  // the block after next, keys and values
        for (int64_t c = 0; c < D; c += 32) {
          _mm_prefetch(reinterpret_cast<const char*>(k + j * k_pos + c), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(v + j * v_pos + c), _MM_HINT_T1);
        }
      const int64_t jb = std::min(KB, n_keys - j0);
      for (int64_t g = 0; g < G; ++g) {
        const uint16_t* qg = q + g * D;
        __m512 dots[KB];
        for (int64_t i = 0; i < KB; ++i) {
          const uint16_t* kr = i < jb ? k + (j0 + i) * k_pos : zeros;
          dots[i] = _mm512_setzero_ps();
          for (int64_t c = 0; c < D; c += 32)  // D is a multiple of 16; the last step may hold 16 lanes
            dots[i] = _mm512_dpbf16_ps(dots[i], (__m512bh)load_pairs(qg + c, D - c), (__m512bh)load_pairs(kr + c, D - c));
        }
        _mm512_storeu_ps(s.data() + g * stride + j0, _mm512_mul_ps(sum16(dots), scale));
      }
    }
    if (!rule.plain())
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < n_keys; ++j) s[g * stride + j] = rule(s[g * stride + j], g, j);
    best.assign(heads, 0.f);
    total.assign(heads, 1.f);
    for (int64_t g = 0; g < G; ++g) softmax(s.data() + g * stride, n_keys, best[g], total[g]);
    if constexpr (DV % 2 == 0) to_bf16(s.data(), heads * stride);
    for (int64_t g0 = 0; g0 < G; g0 += HS) {
      __m512 acc[HS][DV];
      for (int64_t h = 0; h < HS; ++h)
        for (int c = 0; c < DV; ++c) acc[h][c] = _mm512_setzero_ps();
      if constexpr (DV % 2 == 0) {
        weigh_pairs<DV, HS>(reinterpret_cast<const uint32_t*>(pb.data() + g0 * stride), stride / 2, v, v_pos, n_keys,
                            zeros, acc);
      } else {
        const float* p = s.data() + g0 * stride;
        for (int64_t j = 0; j < n_keys; ++j) {
          const uint16_t* vr = v + j * v_pos;
          __m512 pj[HS];
          for (int64_t h = 0; h < HS; ++h) pj[h] = _mm512_set1_ps(p[h * stride + j]);
          for (int c = 0; c < DV; ++c) {
            const __m512 vc = widen(vr + 16 * c);
            for (int64_t h = 0; h < HS; ++h) acc[h][c] = _mm512_fmadd_ps(pj[h], vc, acc[h][c]);
          }
        }
      }
      for (int64_t h = 0; h < HS && g0 + h < G; ++h) {
        const int64_t g = g0 + h;
        if (sink.acc != nullptr) {
          for (int c = 0; c < DV; ++c) _mm512_storeu_ps(sink.acc + g * D + 16 * c, acc[h][c]);
          sink.m[g] = best[g];
          sink.l[g] = total[g];
          continue;
        }
        const __m512 inv = _mm512_set1_ps(1.f / total[g]);
        for (int c = 0; c < DV; ++c) {
          alignas(64) float o[16];
          _mm512_store_ps(o, _mm512_mul_ps(acc[h][c], inv));
          for (int i = 0; i < 16; ++i) sink.out[g * D + 16 * c + i] = Lanes<c10::BFloat16>::out(o[i]);
        }
      }
    }
  }

  // The values weighed by dot products of pairs: keys j and j+1's rows interleaved per dim (unpacklo/hi, within each
  // 128-bit lane) and dotted with each head's probabilities of j and j+1 in bf16 (relative error 2^-9 per weight, as
  // eager's bf16 softmax output has; sums in fp32): half the multiply-adds of widening each row, each interleaved
  // pair of rows serving HS heads. The accumulators' lanes come out in the unpacks' order and are put back (UNPACKED).
  static constexpr int32_t UNPACKED[2][16] = {{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
                                              {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
  std::vector<uint16_t> pb;  // the probabilities in bf16, laid out as s

  template <int DV, int64_t HS>
  __attribute__((target("avx512f,avx512bw,avx512bf16"))) static void weigh_pairs(
      const uint32_t* pairs, int64_t pair_stride, const uint16_t* v, int64_t v_pos, int64_t n_keys,
      const uint16_t* zeros, __m512 (&acc)[HS][DV]) {
    for (int64_t j = 0; j < n_keys; j += 2) {
      const uint16_t* v0 = v + j * v_pos;
      const uint16_t* v1 = j + 1 < n_keys ? v0 + v_pos : zeros;  // past the last key: zeros, never the cache's next row
      __m512i pj[HS];
      for (int64_t h = 0; h < HS; ++h) pj[h] = _mm512_set1_epi32(static_cast<int32_t>(pairs[h * pair_stride + j / 2]));
      for (int c = 0; c < DV / 2; ++c) {
        const __m512i a = _mm512_loadu_si512(v0 + 32 * c), b = _mm512_loadu_si512(v1 + 32 * c);
        const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
        for (int64_t h = 0; h < HS; ++h) {
          acc[h][2 * c] = _mm512_dpbf16_ps(acc[h][2 * c], lo, (__m512bh)pj[h]);
          acc[h][2 * c + 1] = _mm512_dpbf16_ps(acc[h][2 * c + 1], hi, (__m512bh)pj[h]);
        }
      }
    }
    const __m512i first = _mm512_loadu_si512(UNPACKED[0]), second = _mm512_loadu_si512(UNPACKED[1]);
    for (int64_t h = 0; h < HS; ++h)
      for (int c = 0; c < DV / 2; ++c) {
        const __m512 a = acc[h][2 * c], b = acc[h][2 * c + 1];
        acc[h][2 * c] = _mm512_permutex2var_ps(a, first, b);
        acc[h][2 * c + 1] = _mm512_permutex2var_ps(a, second, b);
      }
  }

  // The first n probabilities (n a multiple of 16) rounded to bf16 into pb.
  __attribute__((target("avx512f,avx512bf16"))) void to_bf16(const float* x, int64_t n) {
    if (static_cast<int64_t>(pb.size()) < n) pb.resize(n);
    for (int64_t t = 0; t < n; t += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb.data() + t), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + t)));
  }

  // n scores in place -> their exponentials less the largest score (best); total: their sum. A NaN score makes the
  // sum NaN, as the reference's softmax does.
  __attribute__((target("avx512f"))) static void softmax(float* x, int64_t n, float& best, float& total) {
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < n; t += 16)
      top = _mm512_mask_max_ps(top, tail(n - t), top, _mm512_loadu_ps(x + t));
    best = _mm512_reduce_max_ps(top);
    const __m512 b = _mm512_set1_ps(best);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 16) {
      const __mmask16 live = tail(n - t);
      const __m512 e = _mm512_maskz_mov_ps(live, BF16::exp512(_mm512_sub_ps(_mm512_loadu_ps(x + t), b)));
      _mm512_storeu_ps(x + t, e);  // x is padded to whole blocks of 16: the lanes past n hold zeros
      sum = _mm512_add_ps(sum, e);
    }
    total = _mm512_reduce_add_ps(sum);
  }

  static __mmask16 tail(int64_t left) { return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1); }

  // Lane i: the sum of the 16 lanes of x[i] (a transposing tree: pairs of lanes, pairs of pairs, then 128-bit quarters).
  __attribute__((target("avx512f"))) static __m512 sum16(const __m512 (&x)[KB]) {
    __m512 pairs[8], quads[4], halves[2];
    for (int i = 0; i < 8; ++i)  // per quarter: (x[2i], x[2i+1], x[2i], x[2i+1])
      pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {  // per quarter: (x[4i], x[4i+1], x[4i+2], x[4i+3])
      const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
      quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)  // quarters 0+1 and 2+3 of two quads side by side
      halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], 0x88),
                         _mm512_shuffle_f32x4(halves[0], halves[1], 0xDD));
  }

  // 32 bf16 (or the last 16, zero-extended) as one register of pairs.
  __attribute__((target("avx512f"))) static __m512i load_pairs(const uint16_t* x, int64_t left) {
    if (left >= 32) return _mm512_loadu_si512(x);
    return _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  }

  // 16 bf16 -> 16 fp32 (exact).
  __attribute__((target("avx512f"))) static __m512 widen(const uint16_t* x) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }

  // Runs run<D / 16> where head_dim is one this path covers; false where it is not (the generic path takes it).
  template <int DV = 16>
  bool dispatch(int64_t D, const uint16_t* q, int64_t G, const ScoreRule& rule, const uint16_t* k, const uint16_t* v,
                int64_t k_pos, int64_t v_pos, int64_t n_keys, Sink sink) {
    if constexpr (DV == 0) {
      return false;
    } else {
      if (D != 16 * DV) return dispatch<DV - 1>(D, q, G, rule, k, v, k_pos, v_pos, n_keys, sink);
      run<DV>(q, G, rule, k, v, k_pos, v_pos, n_keys, sink);
      return true;
    }
  }
};

// How many chunks each (batch, kv head)'s keys are split into for one decode step: enough items for every thread
// twice over, none shorter than MIN_CHUNK keys (flash-decoding: with few sequences and kv heads, a long context is
// what there is to share out).
static int64_t decode_chunks(int64_t items, int64_t n_keys) {
  constexpr int64_t MIN_CHUNK = 256;
  const int64_t threads = at::get_num_threads();
  if (items >= 2 * threads) return 1;
  return std::max<int64_t>(1, std::min((2 * threads + items - 1) / items, n_keys / MIN_CHUNK));
}

// One decode step (one new token per sequence) with each item's context split into `chunks` (decode_chunks): first
// per item, rotate and append the new key and value and rotate the group's queries; then per (item, chunk), the
// group's unnormalised output, max score and sum over its keys; then per item, the chunks combined (each rescaled to
// the largest max) and rounded once.
template <typename T>
static void split_decode(const Raw<T>* qkv, int64_t row, const Raw<T>* cos, const Raw<T>* sin, RowStrides cs,
                         bool cos_per_batch, Raw<T>* kc, CacheStrides kcs, Raw<T>* vc, CacheStrides vcs, Raw<T>* out,
                         int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t R, int64_t past_len, float scale,
                         float cap, int64_t window, const float* slopes, int64_t chunks) {
  using L = Lanes<T>;
  const int64_t G = H / KVH, items = B * KVH;
  const bool fast = std::is_same_v<T, c10::BFloat16> && has_avx512_bf16();
  std::vector<Raw<T>> q_all(items * G * D);
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> cf(R), sf(R);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / KVH, h = i % KVH;
      const Raw<T>* r = qkv + b * row;
      const int64_t c = cs.at(cos_per_batch ? b : 0, 0);
      for (int64_t d = 0; d < R; ++d) {
        cf[d] = L::in(cos[c + d]);
        sf[d] = L::in(sin[c + d]);
      }
      rotate_head<T>(r + (H + h) * D, cf.data(), sf.data(), kc + kcs.at(b, h, past_len), D, R);
      const Raw<T>* v = r + (H + KVH + h) * D;
      std::copy(v, v + D, vc + vcs.at(b, h, past_len));
      for (int64_t g = 0; g < G; ++g)
        rotate_head<T>(r + (h * G + g) * D, cf.data(), sf.data(), q_all.data() + (i * G + g) * D, D, R);
    }
  });
  const int64_t end = past_len + 1, first = window > 0 ? std::max<int64_t>(0, end - window) : 0, n = end - first;
  std::vector<float> acc(items * chunks * G * D, 0.f), mx(items * chunks * G, -std::numeric_limits<float>::infinity()),
      sm(items * chunks * G, 0.f);
  at::parallel_for(0, items * chunks, 1, [&](int64_t w0, int64_t w1) {
    GroupAttention<T> group(G, D);
    GroupAttentionBf16 group_bf16;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t i = w / chunks, part = w % chunks, b = i / KVH, h = i % KVH;
      const int64_t j0 = first + n * part / chunks, j1 = first + n * (part + 1) / chunks;
      if (j1 <= j0) continue;
      const ScoreRule rule{scale, cap, slopes ? slopes + h * G : nullptr, j0};
      float *a = acc.data() + w * G * D, *m = mx.data() + w * G, *l = sm.data() + w * G;
      const Raw<T>* q = q_all.data() + i * G * D;
      const Raw<T>* k = kc + kcs.at(b, h, j0);
      const Raw<T>* v = vc + vcs.at(b, h, j0);
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (fast && group_bf16.dispatch(D, q, G, rule, k, v, kcs.pos, vcs.pos, j1 - j0, {nullptr, a, m, l})) continue;
      }
      group.accumulate(q, rule, k, v, kcs.pos, vcs.pos, j1 - j0);
      std::copy(group.acc.begin(), group.acc.end(), a);
      std::copy(group.m.begin(), group.m.end(), m);
      std::copy(group.l.begin(), group.l.end(), l);
    }
  });
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> o(D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / KVH, h = i % KVH;
      for (int64_t g = 0; g < G; ++g) {
        float top = -std::numeric_limits<float>::infinity(), total = 0.f;
        for (int64_t part = 0; part < chunks; ++part) top = std::max(top, mx[(i * chunks + part) * G + g]);
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t part = 0; part < chunks; ++part) {
          const int64_t w = i * chunks + part;
          if (sm[w * G + g] == 0.f) continue;  // an empty chunk
          const float weight = std::exp(mx[w * G + g] - top);
          total += sm[w * G + g] * weight;
          const float* a = acc.data() + (w * G + g) * D;
          for (int64_t d = 0; d < D; ++d) o[d] += a[d] * weight;
        }
        Raw<T>* dst = out + (b * H + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = L::out(o[d] / total);
      }
    }
  });
}

// Per (batch, kv head), in one parallel region: rotate and append its T new keys (and values), rotate its group's
// queries, then attend each new token over the cache. Items touch only their own kv head's cache rows and their own
// query heads, so they run independently.
template <typename T>
static void rope_attend_items(const Raw<T>* qkv, int64_t row, const Raw<T>* cos, const Raw<T>* sin, RowStrides cs,
                              bool cos_per_batch, Raw<T>* kc, CacheStrides kcs, Raw<T>* vc, CacheStrides vcs,
                              Raw<T>* out, int64_t B, int64_t T_, int64_t H, int64_t KVH, int64_t D, int64_t R,
                              int64_t past_len, float scale, float cap, int64_t window, const float* slopes) {
  using L = Lanes<T>;
  const int64_t G = H / KVH;
  if (T_ == 1) {
    const int64_t chunks = decode_chunks(B * KVH, window > 0 ? std::min(window, past_len + 1) : past_len + 1);
    if (chunks > 1)
      return split_decode<T>(qkv, row, cos, sin, cs, cos_per_batch, kc, kcs, vc, vcs, out, B, H, KVH, D, R, past_len,
                             scale, cap, window, slopes, chunks);
  }
  const bool fast = std::is_same_v<T, c10::BFloat16> && has_avx512_bf16();
  // prefill (several new tokens) with plain scores in tiles: chunks of TQ tokens' queries at a time
  const bool tiled = fast && T_ > 1 && cap <= 0.f && slopes == nullptr && window <= 0 && PrefillTilesBf16::takes(D);
  constexpr int64_t TQ = 64;
  at::parallel_for(0, B * KVH, 1, [&](int64_t i0, int64_t i1) {
    GroupAttention<T> group(G, D);
    GroupAttentionBf16 group_bf16;
    PrefillTilesBf16 tiles;
    std::vector<float> cf(R), sf(R);
    std::vector<Raw<T>> q_rot(tiled ? (TQ * G + PrefillTilesBf16::MB) * D : G * D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / KVH, h = i % KVH;
      for (int64_t t = 0; t < T_; ++t) {  // the new keys first: token t attends to every new key up to itself
        const Raw<T>* r = qkv + (b * T_ + t) * row;
        const int64_t c = cs.at(cos_per_batch ? b : 0, t);
        for (int64_t d = 0; d < R; ++d) {
          cf[d] = L::in(cos[c + d]);
          sf[d] = L::in(sin[c + d]);
        }
        rotate_head<T>(r + (H + h) * D, cf.data(), sf.data(), kc + kcs.at(b, h, past_len + t), D, R);
        const Raw<T>* v = r + (H + KVH + h) * D;
        std::copy(v, v + D, vc + vcs.at(b, h, past_len + t));
      }
      auto rotate_queries = [&](int64_t t, Raw<T>* dst) {  // token t's G query heads, rotated, into dst [G, D]
        const Raw<T>* r = qkv + (b * T_ + t) * row;
        const int64_t c = cs.at(cos_per_batch ? b : 0, t);
        for (int64_t d = 0; d < R; ++d) {
          cf[d] = L::in(cos[c + d]);
          sf[d] = L::in(sin[c + d]);
        }
        for (int64_t g = 0; g < G; ++g) rotate_head<T>(r + (h * G + g) * D, cf.data(), sf.data(), dst + g * D, D, R);
      };
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (tiled) {
          tiles.pack(kc + kcs.at(b, h, 0), vc + vcs.at(b, h, 0), kcs.pos, vcs.pos, past_len + T_, D);
          for (int64_t t0 = 0; t0 < T_; t0 += TQ) {
            const int64_t tq = std::min(TQ, T_ - t0);
            std::fill(q_rot.begin(), q_rot.end(), Raw<T>{0});
            for (int64_t t = 0; t < tq; ++t) rotate_queries(t0 + t, q_rot.data() + t * G * D);
            tiles.run(q_rot.data(), tq * G, G, D, scale, past_len + t0, past_len + T_,
                      out + ((b * T_ + t0) * H + h * G) * D, H * D);
          }
          continue;
        }
      }
      for (int64_t t = 0; t < T_; ++t) {
        rotate_queries(t, q_rot.data());
        const int64_t end = past_len + t + 1, first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
        const Raw<T>* k = kc + kcs.at(b, h, first);  // a sliding window sees only the last `window` keys
        const Raw<T>* v = vc + vcs.at(b, h, first);
        Raw<T>* o = out + ((b * T_ + t) * H + h * G) * D;
        const ScoreRule rule{scale, cap, slopes ? slopes + h * G : nullptr, first};
        if constexpr (std::is_same_v<T, c10::BFloat16>) {
          if (fast && group_bf16.dispatch(D, q_rot.data(), G, rule, k, v, kcs.pos, vcs.pos, end - first, {o}))
            continue;
        }
        group.run(q_rot.data(), rule, k, v, kcs.pos, vcs.pos, end - first, o);
      }
    }
  });
}

// x [B, T, hidden]; qkv_panels: q, k and v weights stacked along N and packed (linear's pack_panels or
// pack_panels_bf16); o_panels likewise for o_proj, o_bias its bias or none; cos, sin [1 or B, T, R] for the first R
// dims of each head, R even and at most head_dim (ones and zeros: no rotation); key_cache, value_cache
// [B, kv_heads, capacity >= past_len + T, head_dim] (strided views allowed), written at past_len.. in place;
// softcap > 0: scores soft-capped (cap * tanh(s / cap)) before the softmax; window > 0: each query sees only the last
// `window` keys up to its own position; alibi_slopes (fp32 [heads]): each score gets its query head's slope times the
// key's position (ALiBi). Returns [B, T, hidden].
at::Tensor step(const at::Tensor& x, const at::Tensor& qkv_panels, const c10::optional<at::Tensor>& qkv_bias,
                const at::Tensor& o_panels, const c10::optional<at::Tensor>& o_bias, const at::Tensor& cos,
                const at::Tensor& sin, const at::Tensor& key_cache,
                const at::Tensor& value_cache, int64_t past_len, int64_t heads, double scaling, int64_t grain,
                double softcap, int64_t window, const c10::optional<at::Tensor>& alibi_slopes) {
  TORCH_CHECK(x.dim() == 3, "step: hidden_states must be [B, T, hidden]");
  const int64_t B = x.size(0), T = x.size(1), hidden = x.size(2);
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes(), "step: cos and sin must be [1 or B, T, R] alike");
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.size(1) > 0 && heads % key_cache.size(1) == 0,
              "step: key_cache must be [B, kv_heads, capacity, head_dim] with kv_heads dividing heads");
  const int64_t D = key_cache.size(3), R = cos.size(2);
  TORCH_CHECK(D > 0 && R > 0 && R % 2 == 0 && R <= D,
              "step: cos/sin must cover an even number of each head's dims, at most head_dim (RoPE pairs halves)");
  TORCH_CHECK((cos.size(0) == 1 || cos.size(0) == B) && cos.size(1) == T,
              "step: cos/sin must be [1 or B, T, R] for the hidden states' B and T");
  const int64_t KVH = key_cache.size(1);
  TORCH_CHECK(past_len >= 0, "step: past_len must be >= 0");
  check_cache(key_cache, "step: key_cache", B, KVH, D, past_len + T, x);
  check_cache(value_cache, "step: value_cache", B, KVH, D, past_len + T, x);
  TORCH_CHECK(!alibi_slopes.has_value() || (alibi_slopes->scalar_type() == at::kFloat && alibi_slopes->is_contiguous()
                                             && alibi_slopes->numel() == heads),
              "step: alibi_slopes must be fp32 [heads], contiguous");
  const float* slopes = alibi_slopes.has_value() ? alibi_slopes->data_ptr<float>() : nullptr;
  const int64_t width = (heads + 2 * KVH) * D;
  auto qkv = small_m_project(x.reshape({B * T, hidden}), qkv_panels, qkv_bias, width, grain).contiguous();
  auto cs = cos.to(x.scalar_type()).contiguous(), sn = sin.to(x.scalar_type()).contiguous();
  auto attn = at::empty({B * T, heads * D}, x.options());
  if (B * T > 0) {
    dispatch(x, "step", [&](auto tag) {
      using T_ = decltype(tag);
      rope_attend_items<T_>(raw_ptr<T_>(qkv.data_ptr<T_>()), width, raw_ptr<T_>(cs.data_ptr<T_>()),
                            raw_ptr<T_>(sn.data_ptr<T_>()), row_strides(cs), cs.size(0) == B && B > 1,
                            raw_ptr<T_>(key_cache.data_ptr<T_>()), cache_strides(key_cache),
                            raw_ptr<T_>(value_cache.data_ptr<T_>()), cache_strides(value_cache),
                            raw_ptr<T_>(attn.data_ptr<T_>()), B, T, heads, KVH, D, R, past_len,
                            static_cast<float>(scaling), static_cast<float>(softcap), window, slopes);
    });
  }
  return small_m_project(attn, o_panels, o_bias, hidden, grain).view({B, T, hidden});
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("step", &step);
  m.def("has_avx512_bf16", &has_avx512_bf16);
}
