// Rotary position embedding of query and key heads, rounded as SGLang's forward_native is up to the last step:
// the cos/sin of each token's position are cast to the activation dtype, each rotated pair is computed in fp32
// and rounded once (torch rounds the two products and their sum separately: within an ulp of this).
#include "../extension.h"
#include <cstdint>
#include <tuple>

template <typename T, typename C>
static void rotate(const int64_t* pos, const T* x, int64_t row_stride, T* out, const C* cache, int64_t tokens,
                   int64_t heads, int64_t head_size, int64_t rot, bool neox, int64_t grain) {
  const int64_t half = rot / 2;
  at::parallel_for(0, tokens, grain, [&](int64_t t0, int64_t t1) {
    float cos[512], sin[512];  // half <= 512: checked by the caller
    for (int64_t t = t0; t < t1; ++t) {
      const C* cs = cache + pos[t] * rot;
      for (int64_t i = 0; i < half; ++i) {
        cos[i] = static_cast<float>(static_cast<T>(cs[i]));
        sin[i] = static_cast<float>(static_cast<T>(cs[half + i]));
      }
      for (int64_t h = 0; h < heads; ++h) {
        const T* xi = x + t * row_stride + h * head_size;
        T* o = out + (t * heads + h) * head_size;
        if (neox) {
#pragma omp simd
          for (int64_t i = 0; i < half; ++i) {
            const float a = static_cast<float>(xi[i]), b = static_cast<float>(xi[half + i]);
            o[i] = static_cast<T>(a * cos[i] - b * sin[i]);
            o[half + i] = static_cast<T>(b * cos[i] + a * sin[i]);
          }
        } else {
          for (int64_t i = 0; i < half; ++i) {
            const float a = static_cast<float>(xi[2 * i]), b = static_cast<float>(xi[2 * i + 1]);
            o[2 * i] = static_cast<T>(a * cos[i] - b * sin[i]);
            o[2 * i + 1] = static_cast<T>(b * cos[i] + a * sin[i]);
          }
        }
        for (int64_t i = rot; i < head_size; ++i) o[i] = xi[i];
      }
    }
  });
}

static at::Tensor rotate_heads(const at::Tensor& positions, const at::Tensor& x, const at::Tensor& cache,
                               int64_t head_size, int64_t rot, bool neox, int64_t grain) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rotary_embedding: query/key must be [tokens, heads * head_size] "
              "with contiguous rows");
  TORCH_CHECK(x.size(0) == positions.size(0), "rotary_embedding: one position per token");
  TORCH_CHECK(x.size(1) % head_size == 0, "rotary_embedding: width not a multiple of head_size");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  if (x.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary_embedding", [&] {
    using T = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, cache.scalar_type(), "rotary_cache", [&] {
      rotate<T, scalar_t>(positions.data_ptr<int64_t>(), x.data_ptr<T>(), x.stride(0), out.data_ptr<T>(),
                          cache.data_ptr<scalar_t>(), x.size(0), x.size(1) / head_size, head_size, rot, neox, grain);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& positions, const at::Tensor& query,
                                                    const at::Tensor& key, const at::Tensor& cache,
                                                    int64_t head_size, bool neox, int64_t grain) {
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "rotary_embedding: positions must be contiguous int64 [tokens]");
  TORCH_CHECK(cache.dim() == 2 && cache.is_contiguous() && cache.size(1) % 2 == 0 && cache.size(1) <= 1024 &&
              cache.size(1) <= head_size, "rotary_embedding: cos_sin_cache must be contiguous [positions, rotary_dim]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < positions.numel(); ++t)  // index_select's bounds check, before anything is read
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cache.size(0), "rotary_embedding: position ", pos[t], " out of range");
  const int64_t rot = cache.size(1);
  return {rotate_heads(positions, query, cache, head_size, rot, neox, grain),
          rotate_heads(positions, key, cache, head_size, rot, neox, grain)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("rotary_embedding", &rotary_embedding); }
