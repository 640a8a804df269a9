// Element access as float for the library's C++ kernels. bf16 goes through its raw bits with c10::BFloat16's
// rounding (nearest even, NaN to 0x7fc0): the same results, in a form the compiler vectorises (c10's own
// conversion is a call per element). Included by relative path; cpp_build.py hashes it into every build key.
#pragma once
#include <c10/util/BFloat16.h>
#include <cstdint>
#include <cstring>
#include <type_traits>

template <typename T>
struct Lanes {
  using raw = T;
  static float in(T v) { return static_cast<float>(v); }
  static T out(float f) { return static_cast<T>(f); }
};

template <>
struct Lanes<c10::BFloat16> {
  using raw = uint16_t;
  static float in(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static uint16_t out(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return f != f ? static_cast<uint16_t>(0x7fc0) : rounded;
  }
};

// A tensor's data as the raw lanes above.
template <typename T, typename P>
static inline auto raw_ptr(P* p) {
  using R = typename Lanes<T>::raw;
  if constexpr (std::is_const_v<P>) return reinterpret_cast<const R*>(p);
  else return reinterpret_cast<R*>(p);
}
