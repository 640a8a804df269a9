// y = a @ b (+ bias) with b a view of a parameter: W = b^T ([N,K], read through b's strides) packed once into
// small_m_gemm.h's panels (bf16 [NP,1,K/2,16,2] on CPUs with avx512_bf16, else fp32 [NP,1,K,8], zero-padded) and
// kept in `packs` (PACK_SLOTS per GEMM: the view packed, its panels, the weight's version counter then); a weight
// replaced (another storage, sizes or strides) or written in place (its version moved) is packed again.
static bool kb_gemm_fits(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias) {
  const auto dt = a.scalar_type();
  if ((dt != at::kFloat && dt != at::kBFloat16) || b.scalar_type() != dt || a.dim() != 2 || b.dim() != 2) return false;
  if (!a.device().is_cpu() || !b.device().is_cpu() || a.size(1) != b.size(0)) return false;
  if (a.size(0) == 0 || b.size(0) == 0 || b.size(1) == 0) return false;
  return !bias.has_value() || (bias->dim() == 1 && bias->size(0) == b.size(1) && bias->scalar_type() == dt &&
                               bias->is_contiguous() && bias->device().is_cpu());
}

template <typename T, typename P, int LANES, int PAIR>
static at::Tensor kb_pack(const at::Tensor& b, at::ScalarType type) {
  const int64_t K = b.size(0), N = b.size(1), sk = b.stride(0), sn = b.stride(1);
  const int64_t NP = (N + LANES - 1) / LANES, KS = (K + PAIR - 1) / PAIR;
  at::Tensor panels = PAIR == 2 ? at::empty({NP, 1, KS, LANES, 2}, b.options().dtype(type))
                                : at::empty({NP, 1, KS, LANES}, b.options().dtype(type));
  const T* w = b.const_data_ptr<T>();
  P* p = panels.mutable_data_ptr<P>();
  at::parallel_for(0, NP, 1, [&](int64_t begin, int64_t end) {
    for (int64_t np = begin; np < end; ++np)
      for (int64_t ks = 0; ks < KS; ++ks)
        for (int64_t j = 0; j < LANES; ++j)
          for (int64_t t = 0; t < PAIR; ++t) {
            const int64_t n = np * LANES + j, k = ks * PAIR + t;
            p[((np * KS + ks) * LANES + j) * PAIR + t] = (n < N && k < K) ? static_cast<P>(w[k * sk + n * sn])
                                                                         : static_cast<P>(0.f);
          }
  });
  return panels;
}

static at::Tensor kb_gemm(std::vector<at::Tensor>& packs, size_t slot, const at::Tensor& a, const at::Tensor& b,
                          const c10::optional<at::Tensor>& bias) {
  const bool bf16 = a.scalar_type() == at::kBFloat16 && has_avx512_bf16();
  at::Tensor &source = packs[slot], &panels = packs[slot + 1], &version = packs[slot + 2];
  const bool fresh = source.numel() > 0 && source.data_ptr() == b.data_ptr() && source.sizes() == b.sizes() &&
                     source.strides() == b.strides() && source.scalar_type() == b.scalar_type() &&
                     version.numel() == 1 && version.const_data_ptr<int64_t>()[0] == b._version() &&
                     panels.dim() == (bf16 ? 5 : 4);
  if (!fresh) {
    if (bf16) {
      panels = kb_pack<c10::BFloat16, c10::BFloat16, 16, 2>(b, at::kBFloat16);
    } else if (b.scalar_type() == at::kBFloat16) {
      panels = kb_pack<c10::BFloat16, float, 8, 1>(b, at::kFloat);
    } else {
      panels = kb_pack<float, float, 8, 1>(b, at::kFloat);
    }
    version = at::empty({1}, b.options().dtype(at::kLong));
    version.mutable_data_ptr<int64_t>()[0] = b._version();
    source = b;
  }
  const int64_t N = b.size(1);
  if (a.is_contiguous() && bf16 && a.size(1) % 2 == 0) return small_m_linear_bf16(a, panels, bias, N, 4);
  if (a.is_contiguous() && a.scalar_type() == at::kFloat) return small_m_linear(a, panels, bias, N, 4);
  return small_m_project(a, panels, bias, N, 4);  // a conversion, padding or copy first
}
