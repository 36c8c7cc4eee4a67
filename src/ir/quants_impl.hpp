#pragma once
// Internals of rlx/ir/quants.hpp shared by src/ir/quants.cpp (dispatch, the float types and the
// 32-element blocks) and src/ir/quants_k.cpp (the K-quants and Q8_K). Each row function takes
// whole blocks; the dispatcher has checked the sizes and, for quantize, that the inputs are finite.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "rlx/ir/quants.hpp"

// Every float operation here must round as written, as in ggml's C source: the results are
// compared bit for bit. No contraction of a*b+c into an FMA (only possible where the target has
// FMA, which the default flags do not enable), and no fast-math.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__FAST_MATH__)
#error "src/ir/quants*.cpp must not be built with -ffast-math: the quantizers are compared bit for bit"
#endif

namespace rlx::ir::detail {

template <class Block>
inline Block load_block(const std::byte* p) {
  Block b;
  std::memcpy(&b, p, sizeof b);
  return b;
}
template <class Block>
inline void store_block(const Block& b, std::byte* p) {
  std::memcpy(p, &b, sizeof b);
}

// ggml's nearest_int: adding 1.5 * 2^23 rounds to an integer (to nearest, ties to even) in the low
// mantissa bits. Exact for |v| <= 2^22 - 1, where ggml asserts; outside it this returns the same
// bits ggml's does, and it is defined for every input (NaN included), unlike a cast.
inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<std::uint32_t>(t) & 0x007fffffu) - 0x00400000;
}

// A float to an integer in [lo, hi] by truncation toward zero, for ggml's (int8_t)/(uint8_t) casts
// where the value is in range (ggml's casts are undefined outside it; here NaN gives lo).
inline int trunc_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}
// roundf (half away from zero) to an integer in [lo, hi]; NaN gives 0.
int round_clamp(float v, int lo, int hi);

void quantize_q2_k(const float* x, std::byte* out, std::size_t nblocks);
void quantize_q3_k(const float* x, std::byte* out, std::size_t nblocks);
void quantize_q4_k(const float* x, std::byte* out, std::size_t nblocks);
void quantize_q5_k(const float* x, std::byte* out, std::size_t nblocks);
void quantize_q6_k(const float* x, std::byte* out, std::size_t nblocks);
void quantize_q8_k(const float* x, std::byte* out, std::size_t nblocks);

void dequantize_q2_k(const std::byte* in, float* y, std::size_t nblocks);
void dequantize_q3_k(const std::byte* in, float* y, std::size_t nblocks);
void dequantize_q4_k(const std::byte* in, float* y, std::size_t nblocks);
void dequantize_q5_k(const std::byte* in, float* y, std::size_t nblocks);
void dequantize_q6_k(const std::byte* in, float* y, std::size_t nblocks);
void dequantize_q8_k(const std::byte* in, float* y, std::size_t nblocks);

}  // namespace rlx::ir::detail
