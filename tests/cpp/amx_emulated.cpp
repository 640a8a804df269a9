// kernel_library/amx_gemm.h's GEMM with the AMX tile instructions emulated in software (each intrinsic replaced,
// before the header is included, by a function over a per-thread register file of 8 tiles), so its blocking, panel
// offsets, tail rows and epilogues are checked on a CPU without AMX. What the emulation cannot check is the hardware
// itself: TDPBF16PS is modelled as exact bf16 products summed in fp32.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace emu {
struct Tile {
  alignas(64) uint8_t data[16][64];
  int rows = 16, colsb = 64;
};
thread_local Tile tiles[8];
thread_local bool configured = false;

inline float bf16(const uint8_t* p) {
  uint32_t u = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void loadconfig(const void* cfg) {
  const uint8_t* c = static_cast<const uint8_t*>(cfg);
  for (int t = 0; t < 8; ++t) {
    std::memcpy(&tiles[t].colsb, c + 16 + 2 * t, 2);
    tiles[t].rows = c[48 + t];
  }
  configured = true;
}
inline void require() {
  if (!configured) throw std::runtime_error("a tile instruction before _tile_loadconfig");
}
inline void zero(int t) { require(); std::memset(tiles[t].data, 0, sizeof tiles[t].data); }
inline void load(int t, const void* base, int64_t stride) {
  require();
  for (int r = 0; r < tiles[t].rows; ++r)
    std::memcpy(tiles[t].data[r], static_cast<const uint8_t*>(base) + r * stride, tiles[t].colsb);
}
inline void store(int t, void* base, int64_t stride) {
  require();
  for (int r = 0; r < tiles[t].rows; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, tiles[t].data[r], tiles[t].colsb);
}
inline void dpbf16(int c, int a, int b) {  // C[m][n] += sum over k pairs of A[m][2k + i] * B[k][2n + i]
  require();
  for (int m = 0; m < tiles[c].rows; ++m)
    for (int n = 0; n < tiles[c].colsb / 4; ++n) {
      float* acc = reinterpret_cast<float*>(tiles[c].data[m]) + n;
      for (int k = 0; k < tiles[a].colsb / 4; ++k)
        for (int i = 0; i < 2; ++i)
          *acc += bf16(tiles[a].data[m] + 4 * k + 2 * i) * bf16(tiles[b].data[k] + 4 * n + 2 * i);
    }
}
inline void release() { configured = false; }
}  // namespace emu

#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#define _tile_loadconfig(cfg) emu::loadconfig(cfg)
#define _tile_release() emu::release()
#define _tile_zero(t) emu::zero(t)
#define _tile_loadd(t, base, stride) emu::load(t, base, stride)
#define _tile_stored(t, base, stride) emu::store(t, base, stride)
#define _tile_dpbf16ps(c, a, b) emu::dpbf16(c, a, b)

#include "../../kernel_library/small_m_gemm.h"

// x [M, K] bf16 (K a multiple of 32), panels from pack_panels_bf16 (G = 1 or 2), bias bf16 [N] or none.
at::Tensor amx_gemm(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias, int64_t N,
                    bool gelu) {
  check_bf16(x, panels, panels.size(1), N);
  TORCH_CHECK(x.size(1) % amx::KSTEP == 0, "K must be a multiple of 32");
  auto out = at::empty({x.size(0), N}, x.options());
  const uint16_t* b = bias_data<uint16_t>(bias, N, at::kBFloat16, "bias: bf16 [N]");
  auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  auto* pp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  if (panels.size(1) == 2) amx::gemm<2>(xp, x.size(0), x.size(1), pp, panels.size(0), nullptr, op, N, gelu);
  else amx::gemm<1>(xp, x.size(0), x.size(1), pp, panels.size(0), b, op, N, gelu);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("amx_gemm", &amx_gemm); }
