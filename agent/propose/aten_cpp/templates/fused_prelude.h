using BF = Lanes<c10::BFloat16>;
static inline float kb_half(float v) { return static_cast<float>(static_cast<c10::Half>(v)); }
static inline float kb_fmax(float a, float b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
static inline float kb_fmin(float a, float b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
static inline float kb_relu(float a) { return a != a ? a : (a < 0.f ? 0.f : a); }
static inline float kb_clamp(float a, float lo, float hi) { return a != a ? a : std::min(std::max(a, lo), hi); }

// A fused loop's domain: its operands' shapes broadcast together, seen as rows x n (n: the last dim).
constexpr int64_t KB_MAX_RANK = 8;
struct KbDomain {
  bool ok = false;
  int64_t rank = 0, rows = 1, n = 1;
  int64_t full[KB_MAX_RANK] = {};
  uint64_t ones = 0;  // the dims of size 1
};
static KbDomain kb_domain(std::initializer_list<at::IntArrayRef> shapes, int64_t rank) {
  KbDomain d;
  d.rank = rank;
  for (int64_t k = 0; k < rank; ++k) d.full[k] = 1;
  for (const auto& s : shapes) {
    const int64_t pad = rank - static_cast<int64_t>(s.size());
    if (pad < 0) return d;
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& have = d.full[pad + k];
      if (s[k] == have || s[k] == 1) continue;
      if (have != 1) return d;
      have = s[k];
    }
  }
  for (int64_t k = 0; k < rank; ++k) {
    if (d.full[k] == 1) d.ones |= uint64_t(1) << k;
    if (k + 1 < rank) d.rows *= d.full[k];
  }
  d.n = rank ? d.full[rank - 1] : 1;
  d.ok = true;
  return d;
}
// An operand as the loop reads it: strides over the domain (0 where it broadcasts) and its size-1 dims. It must
// have the traced dtype, and its dims of size > 1 must be in row-major order: then ATen's TensorIterator gives
// every op's result row-major memory too (as the loop's outputs have), which later views of them rely on.
struct KbOperand {
  int64_t strides[KB_MAX_RANK] = {};
  uint64_t ones = 0;
};
static bool kb_operand(const at::Tensor& t, const KbDomain& d, bool varies, at::ScalarType dtype, KbOperand& op) {
  if (t.scalar_type() != dtype) return false;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t pad = d.rank - static_cast<int64_t>(sizes.size());
  int64_t outer = std::numeric_limits<int64_t>::max();
  for (int64_t k = 0; k < d.rank; ++k) {
    const bool one = k < pad || sizes[k - pad] == 1;
    op.strides[k] = one ? 0 : strides[k - pad];
    if (one) op.ones |= uint64_t(1) << k;
    if (op.strides[k] == 0) continue;
    if (op.strides[k] >= outer) return false;
    outer = op.strides[k];
  }
  if (d.rank == 0) return !varies;
  const bool last_one = (op.ones >> (d.rank - 1)) & 1;
  return varies ? (last_one ? d.n == 1 : op.strides[d.rank - 1] == 1) : last_one;
}
static at::Tensor kb_empty(const KbDomain& d, bool per_row, at::ScalarType dtype) {
  std::vector<int64_t> shape(d.full, d.full + d.rank);
  if (per_row && !shape.empty()) shape.back() = 1;
  return at::Tensor(at::detail::empty_cpu(shape, dtype, false, std::nullopt));
}
static inline int64_t kb_grain(int64_t n, int64_t elements) {
  return std::max<int64_t>(1, elements / std::max<int64_t>(n, 1));
}
