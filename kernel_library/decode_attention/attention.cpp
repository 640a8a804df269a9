// Attention over a KV cache for decode and prefill, in two ops:
//   rope_append: rotate the new queries and keys (RoPE, rotate_half form) and write the rotated keys and the new
//                values into preallocated caches at positions past_len..past_len+T-1 (no concatenation);
//   attend:      the T new queries over the first past_len+T cached positions, causal with offset past_len, GQA,
//                fp32 accumulation with an online softmax over blocks of keys, rounded once to the output type.
// fp32 and bf16 (bf16 through its raw bits, lanes.h); every loop over head_dim is a plain vectorisable loop.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../lanes.h"

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

// x * cos + rotate_half(x) * sin for one head, from fp32 cos/sin rows, rounded once.
template <typename T>
static inline void rotate_head(const Raw<T>* x, const float* cs, const float* sn, Raw<T>* o, int64_t D) {
  using L = Lanes<T>;
  const int64_t half = D / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) o[i] = L::out(L::in(x[i]) * cs[i] - L::in(x[half + i]) * sn[i]);
#pragma omp simd
  for (int64_t i = half; i < D; ++i) o[i] = L::out(L::in(x[i]) * cs[i] + L::in(x[i - half]) * sn[i]);
}

template <typename T>
static void rope_append_rows(const Raw<T>* q, RowStrides qs, const Raw<T>* k, RowStrides ks, const Raw<T>* v,
                             RowStrides vs, const Raw<T>* cos, const Raw<T>* sin, RowStrides cs, bool cos_per_batch,
                             Raw<T>* q_rot, Raw<T>* kc, CacheStrides kcs, Raw<T>* vc, CacheStrides vcs, int64_t B,
                             int64_t T_, int64_t H, int64_t KVH, int64_t D, int64_t past_len, int64_t grain) {
  using L = Lanes<T>;
  at::parallel_for(0, B * T_, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> cf(D), sf(D);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / T_, t = r % T_;
      const int64_t c = cs.at(cos_per_batch ? b : 0, t);
      for (int64_t i = 0; i < D; ++i) {
        cf[i] = L::in(cos[c + i]);
        sf[i] = L::in(sin[c + i]);
      }
      for (int64_t h = 0; h < H; ++h) rotate_head<T>(q + qs.at(b, t) + h * D, cf.data(), sf.data(),
                                                     q_rot + (r * H + h) * D, D);
      for (int64_t h = 0; h < KVH; ++h) {
        rotate_head<T>(k + ks.at(b, t) + h * D, cf.data(), sf.data(), kc + kcs.at(b, h, past_len + t), D);
        const Raw<T>* src = v + vs.at(b, t) + h * D;
        Raw<T>* dst = vc + vcs.at(b, h, past_len + t);
        std::copy(src, src + D, dst);
      }
    }
  });
}

static RowStrides row_strides(const at::Tensor& x) { return {x.stride(0), x.stride(1)}; }
static CacheStrides cache_strides(const at::Tensor& x) { return {x.stride(0), x.stride(1), x.stride(2)}; }

static void check_rows(const at::Tensor& x, const char* name, int64_t B, int64_t T, const at::Tensor& like) {
  TORCH_CHECK(x.dim() == 3 && x.size(0) == B && x.size(1) == T && x.stride(2) == 1, "rope_append: ", name,
              " must be [B, T, heads * head_dim] with a unit-stride last dim, like q");
  TORCH_CHECK(x.scalar_type() == like.scalar_type(), "rope_append: ", name, " has another dtype than q");
}

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

// q [B,T,H*D], k and v [B,T,KVH*D] (e.g. column slices of one qkv buffer); cos, sin [1 or B, T, D];
// key_cache, value_cache [B, KVH, capacity, D] (may be strided views). Returns the rotated q as [B, T, H, D].
at::Tensor rope_append(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& key_cache, const at::Tensor& value_cache,
                       int64_t past_len, int64_t grain) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "rope_append: q must be [B, T, heads * head_dim], unit-stride rows");
  const int64_t B = q.size(0), T = q.size(1);
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && cos.strides() == sin.strides() && cos.stride(2) == 1,
              "rope_append: cos and sin must be [1 or B, T, head_dim] alike, unit-stride last dim");
  const int64_t D = cos.size(2);
  TORCH_CHECK(D > 0 && D % 2 == 0, "rope_append: head_dim must be even (RoPE pairs its halves)");
  TORCH_CHECK((cos.size(0) == 1 || cos.size(0) == B) && cos.size(1) == T,
              "rope_append: cos/sin must be [1 or B, T, head_dim] for q's B and T");
  TORCH_CHECK(cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type(),
              "rope_append: cos/sin must have q's dtype (cast them as transformers does)");
  check_rows(k, "k", B, T, q);
  check_rows(v, "v", B, T, q);
  TORCH_CHECK(q.size(2) % D == 0 && k.size(2) % D == 0 && v.size(2) == k.size(2),
              "rope_append: q, k, v widths must be multiples of head_dim, k and v alike");
  const int64_t H = q.size(2) / D, KVH = k.size(2) / D;
  TORCH_CHECK(past_len >= 0, "rope_append: past_len must be >= 0");
  check_cache(key_cache, "rope_append: key_cache", B, KVH, D, past_len + T, q);
  check_cache(value_cache, "rope_append: value_cache", B, KVH, D, past_len + T, q);
  auto q_rot = at::empty({B, T, H, D}, q.options());
  if (B * T == 0) return q_rot;
  dispatch(q, "rope_append", [&](auto tag) {
    using T_ = decltype(tag);
    rope_append_rows<T_>(raw_ptr<T_>(q.data_ptr<T_>()), row_strides(q), raw_ptr<T_>(k.data_ptr<T_>()),
                         row_strides(k), raw_ptr<T_>(v.data_ptr<T_>()), row_strides(v),
                         raw_ptr<T_>(cos.data_ptr<T_>()), raw_ptr<T_>(sin.data_ptr<T_>()), row_strides(cos),
                         cos.size(0) == B && B > 1, raw_ptr<T_>(q_rot.data_ptr<T_>()),
                         raw_ptr<T_>(key_cache.data_ptr<T_>()), cache_strides(key_cache),
                         raw_ptr<T_>(value_cache.data_ptr<T_>()), cache_strides(value_cache), B, T, H, KVH, D,
                         past_len, grain);
  });
  return q_rot;
}

// One (batch, kv head, new token): the group's G query heads over keys 0..past_len+t, in blocks of KB keys with an
// online softmax (running max m, running sum l, accumulator acc rescaled when the max grows).
template <typename T>
struct GroupAttention {
  static constexpr int64_t KB = 64;  // keys per block
  int64_t G, D;
  std::vector<float> qf, acc, p, m, l;

  GroupAttention(int64_t groups, int64_t head_dim)
      : G(groups), D(head_dim), qf(groups * head_dim), acc(groups * head_dim), p(groups * KB), m(groups), l(groups) {}

  void run(const Raw<T>* q /*[G, D]*/, float scale, const Raw<T>* k, const Raw<T>* v, int64_t k_pos, int64_t v_pos,
           int64_t n_keys, Raw<T>* out /*[G, D]*/) {
    using L = Lanes<T>;
    for (int64_t i = 0; i < G * D; ++i) qf[i] = L::in(q[i]) * scale;
    std::fill(acc.begin(), acc.end(), 0.f);
    std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
    std::fill(l.begin(), l.end(), 0.f);
    for (int64_t j0 = 0; j0 < n_keys; j0 += KB) {
      const int64_t jb = std::min(KB, n_keys - j0);
      scores(k + j0 * k_pos, k_pos, jb);
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

template <typename T>
static void attend_items(const Raw<T>* q, const Raw<T>* kc, CacheStrides kcs, const Raw<T>* vc, CacheStrides vcs,
                         Raw<T>* out, int64_t B, int64_t T_, int64_t H, int64_t KVH, int64_t D, int64_t past_len,
                         float scale, int64_t grain) {
  const int64_t G = H / KVH;
  at::parallel_for(0, B * KVH * T_, grain, [&](int64_t i0, int64_t i1) {
    GroupAttention<T> group(G, D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i % T_, h = (i / T_) % KVH, b = i / (T_ * KVH);
      const int64_t row = (b * T_ + t) * H + h * G;  // the group's first query head, [B, T, H, D] and output alike
      group.run(q + row * D, scale, kc + kcs.at(b, h, 0), vc + vcs.at(b, h, 0), kcs.pos, vcs.pos, past_len + t + 1,
                out + row * D);
    }
  });
}

// q_rot [B, T, H, D] contiguous (rope_append's output); the caches [B, KVH, capacity, D]; kv_len = past_len + T
// positions are read. Returns [B, T, H * D].
at::Tensor attend(const at::Tensor& q_rot, const at::Tensor& key_cache, const at::Tensor& value_cache, int64_t kv_len,
                  double scaling, int64_t grain) {
  TORCH_CHECK(q_rot.dim() == 4 && q_rot.is_contiguous(), "attend: q_rot must be contiguous [B, T, heads, head_dim]");
  const int64_t B = q_rot.size(0), T = q_rot.size(1), H = q_rot.size(2), D = q_rot.size(3);
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.size(1) > 0 && H % key_cache.size(1) == 0,
              "attend: key_cache must be [B, kv_heads, capacity, head_dim] with kv_heads dividing q's heads");
  const int64_t KVH = key_cache.size(1);
  TORCH_CHECK(kv_len >= T, "attend: kv_len (", kv_len, ") must count the ", T, " new tokens as well as the past");
  check_cache(key_cache, "attend: key_cache", B, KVH, D, kv_len, q_rot);
  check_cache(value_cache, "attend: value_cache", B, KVH, D, kv_len, q_rot);
  auto out = at::empty({B, T, H * D}, q_rot.options());
  if (out.numel() == 0) return out;
  dispatch(q_rot, "attend", [&](auto tag) {
    using T_ = decltype(tag);
    attend_items<T_>(raw_ptr<T_>(q_rot.data_ptr<T_>()), raw_ptr<T_>(key_cache.data_ptr<T_>()),
                     cache_strides(key_cache), raw_ptr<T_>(value_cache.data_ptr<T_>()), cache_strides(value_cache),
                     raw_ptr<T_>(out.data_ptr<T_>()), B, T, H, KVH, D, kv_len - T, static_cast<float>(scaling), grain);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope_append", &rope_append);
  m.def("attend", &attend);
}
