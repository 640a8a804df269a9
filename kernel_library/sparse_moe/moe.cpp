// The sparse MoE family's extension: each expert's gated MLP over the tokens routed to it, through the small-M GEMMs
// of small_m_gemm.h (an expert's weights are streamed once per call, however many of the call's tokens chose it),
// each token's experts weighted and summed in fp32, rounded once by the caller.
#include "../small_m_gemm.h"

#include <cstring>
#include <vector>

// x [M,K] through an expert's interleaved gate/up panels -> SiLU(gate) * up [M,N]: bf16 panels (5-dim) take bf16 x
// with K padded to even; fp32 panels (4-dim) take x in fp32.
static at::Tensor gate_up_project(const at::Tensor& x, const at::Tensor& panels, int64_t N, int64_t grain) {
  if (panels.dim() == 5) {
    const at::Tensor even = x.size(1) % 2 ? at::constant_pad_nd(x, {0, 1}) : x;
    return gate_up_act_bf16(even.to(at::kBFloat16).contiguous(), panels, N, grain, false);
  }
  return gate_up_act(x.to(at::kFloat).contiguous(), panels, N, grain, false);
}

static void add_weighted(float* acc, const at::Tensor& y, int64_t row, float w) {
  const int64_t H = y.size(1);
  if (y.scalar_type() == at::kBFloat16) {
    const at::BFloat16* p = y.data_ptr<at::BFloat16>() + row * H;
    for (int64_t h = 0; h < H; ++h) acc[h] += w * static_cast<float>(p[h]);
  } else {
    const float* p = y.data_ptr<float>() + row * H;
    for (int64_t h = 0; h < H; ++h) acc[h] += w * p[h];
  }
}

// x [M,H] (the dtype the panels take), index [M,k] int64 expert ids, weight [M,k] fp32 routing weights,
// gate_up [E, ...] and down [E, ...] packed per expert -> [M,H] fp32: sum over k of weight * expert(x).
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weight,
                       const at::Tensor& gate_up, const at::Tensor& down, int64_t inter, int64_t grain) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: contiguous [M,H]");
  TORCH_CHECK(index.dim() == 2 && index.scalar_type() == at::kLong && index.size(0) == x.size(0) &&
                  index.is_contiguous(), "index: contiguous int64 [M,k]");
  TORCH_CHECK(weight.sizes() == index.sizes() && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "weight: contiguous fp32 [M,k]");
  TORCH_CHECK(gate_up.size(0) == down.size(0), "gate_up and down: one panel set per expert");
  const int64_t M = x.size(0), H = x.size(1), k = index.size(1), E = gate_up.size(0);
  std::vector<std::vector<int64_t>> routed(E);  // per expert: the (row * k + slot) that chose it, in row order
  const int64_t* ids = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < M * k; ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < E, "expert id out of range");
    routed[ids[i]].push_back(i);
  }
  auto acc = at::zeros({M, H}, x.options().dtype(at::kFloat));
  float* out = acc.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const int64_t row_bytes = H * x.element_size();
  for (int64_t e = 0; e < E; ++e) {
    const auto& chosen = routed[e];
    if (chosen.empty()) continue;
    const int64_t me = static_cast<int64_t>(chosen.size());
    auto xe = at::empty({me, H}, x.options());
    auto* dst = static_cast<char*>(xe.data_ptr());
    const auto* src = static_cast<const char*>(x.data_ptr());
    for (int64_t j = 0; j < me; ++j) std::memcpy(dst + j * row_bytes, src + (chosen[j] / k) * row_bytes, row_bytes);
    const at::Tensor h = gate_up_project(xe, gate_up.select(0, e), inter, grain);
    const at::Tensor y = small_m_project(h, down.select(0, e), c10::nullopt, H, grain);
    for (int64_t j = 0; j < me; ++j) add_weighted(out + (chosen[j] / k) * H, y, j, w[chosen[j]]);
  }
  return acc;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("moe_experts", &moe_experts);
  m.def("has_avx512_bf16", &has_avx512_bf16);
}
