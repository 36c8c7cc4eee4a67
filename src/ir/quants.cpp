// Dispatch, the float types and the 32-element blocks of rlx/ir/quants.hpp. Each quantizer
// follows ggml's quantize_row_*_ref operation by operation (gguf.quants does the same operations
// in numpy for these types), so that every float rounds the same way; docs/quants.md.
#include <cmath>
#include <string>

#include "ir/quants_impl.hpp"
#include "rlx/error.hpp"

namespace rlx::ir {
namespace detail {

int round_clamp(float v, int lo, int hi) {
  if (std::isnan(v)) return 0;
  const float r = std::round(v);
  if (r <= static_cast<float>(lo)) return lo;
  if (r >= static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

namespace {

// ---- dequantize: x = d * q (+ m), in f32, as gguf.quants and ggml's dequantize_row_* ----

void dequantize_q4_0(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQK4) {
    const auto b = load_block<BlockQ4_0>(in + i * sizeof(BlockQ4_0));
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK4 / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0f) - 8) * d;
      y[j + kQK4 / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQK4) {
    const auto b = load_block<BlockQ4_1>(in + i * sizeof(BlockQ4_1));
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int j = 0; j < kQK4 / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0f) * d + m;
      y[j + kQK4 / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// The five-bit quant j of a Q5 block: four bits from qs, the fifth from bit j of qh.
inline int q5(const std::uint8_t* qs, std::uint32_t qh, int j) {
  const int low = j < kQK4 / 2 ? (qs[j] & 0x0f) : (qs[j - kQK4 / 2] >> 4);
  return low | static_cast<int>((qh >> j) & 1u) << 4;
}

void dequantize_q5_0(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQK4) {
    const auto b = load_block<BlockQ5_0>(in + i * sizeof(BlockQ5_0));
    const float d = f16_to_f32(b.d);
    std::uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < kQK4; ++j) y[j] = static_cast<float>(q5(b.qs, qh, j) - 16) * d;
  }
}

void dequantize_q5_1(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQK4) {
    const auto b = load_block<BlockQ5_1>(in + i * sizeof(BlockQ5_1));
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    std::uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < kQK4; ++j) y[j] = static_cast<float>(q5(b.qs, qh, j)) * d + m;
  }
}

void dequantize_q8_0(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQK4) {
    const auto b = load_block<BlockQ8_0>(in + i * sizeof(BlockQ8_0));
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK4; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

void dequantize_q8_1(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQK4) {
    const auto b = load_block<BlockQ8_1>(in + i * sizeof(BlockQ8_1));
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK4; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// ---- quantize: ggml's quantize_row_*_ref ----

// The element of largest magnitude, the first one on ties (ggml's `amax < fabsf(v)` scan and
// numpy's argmax agree on that).
inline float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}
inline float absmax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::fabs(x[j]) > amax ? std::fabs(x[j]) : amax;
  return amax;
}
// min and max as ggml's strict comparisons find them (the first of equal values: -0 and +0 can
// differ from numpy's reduction there, the only place gguf.quants and ggml disagree).
inline void min_max(const float* x, int n, float& min, float& max) {
  min = 3.402823466e+38f;
  max = -3.402823466e+38f;
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
}
inline float inverse(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

void quantize_q4_0(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQK4) {
    const float d = signed_absmax(x, kQK4) / -8.0f;
    const float id = inverse(d);
    BlockQ4_0 b{};
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK4 / 2; ++j) {
      const int lo = trunc_clamp(x[j] * id + 8.5f, 0, 15);
      const int hi = trunc_clamp(x[j + kQK4 / 2] * id + 8.5f, 0, 15);
      b.qs[j] = static_cast<std::uint8_t>(lo | hi << 4);
    }
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q4_1(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQK4) {
    float min, max;
    min_max(x, kQK4, min, max);
    const float d = (max - min) / 15.0f;
    const float id = inverse(d);
    BlockQ4_1 b{};
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(min);
    for (int j = 0; j < kQK4 / 2; ++j) {
      const int lo = trunc_clamp((x[j] - min) * id + 0.5f, 0, 15);
      const int hi = trunc_clamp((x[j + kQK4 / 2] - min) * id + 0.5f, 0, 15);
      b.qs[j] = static_cast<std::uint8_t>(lo | hi << 4);
    }
    store_block(b, out + i * sizeof b);
  }
}

// Packs 32 five-bit quants: low nibbles as Q4_0, fifth bits into qh.
template <class Block>
void pack_q5(Block& b, const int* q) {
  std::uint32_t qh = 0;
  for (int j = 0; j < kQK4 / 2; ++j) {
    b.qs[j] = static_cast<std::uint8_t>((q[j] & 0x0f) | (q[j + kQK4 / 2] & 0x0f) << 4);
    qh |= static_cast<std::uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<std::uint32_t>((q[j + kQK4 / 2] >> 4) & 1) << (j + kQK4 / 2);
  }
  std::memcpy(b.qh, &qh, 4);
}

void quantize_q5_0(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQK4) {
    const float d = signed_absmax(x, kQK4) / -16.0f;
    const float id = inverse(d);
    BlockQ5_0 b{};
    b.d = f32_to_f16(d);
    int q[kQK4];
    for (int j = 0; j < kQK4; ++j) q[j] = trunc_clamp(x[j] * id + 16.5f, 0, 31);
    pack_q5(b, q);
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q5_1(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQK4) {
    float min, max;
    min_max(x, kQK4, min, max);
    const float d = (max - min) / 31.0f;
    const float id = inverse(d);
    BlockQ5_1 b{};
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(min);
    int q[kQK4];
    // ggml casts without a clamp here; (x - min) * id + 0.5 stays below 32 for finite inputs.
    for (int j = 0; j < kQK4; ++j) q[j] = trunc_clamp((x[j] - min) * id + 0.5f, 0, 31);
    pack_q5(b, q);
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q8_0(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQK4) {
    const float d = absmax(x, kQK4) / 127.0f;
    const float id = inverse(d);
    BlockQ8_0 b{};
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK4; ++j) b.qs[j] = static_cast<std::int8_t>(round_clamp(x[j] * id, -128, 127));
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q8_1(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQK4) {
    const float d = absmax(x, kQK4) / 127.0f;
    const float id = inverse(d);
    BlockQ8_1 b{};
    b.d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQK4; ++j) {
      b.qs[j] = static_cast<std::int8_t>(round_clamp(x[j] * id, -128, 127));
      sum += b.qs[j];
    }
    b.s = f32_to_f16(static_cast<float>(sum) * d);
    store_block(b, out + i * sizeof b);
  }
}

// ---- the float types ----

void dequantize_f32(const std::byte* in, float* y, std::size_t n) { std::memcpy(y, in, n * sizeof(float)); }
void quantize_f32(const float* x, std::byte* out, std::size_t n) { std::memcpy(out, x, n * sizeof(float)); }

void dequantize_f16(const std::byte* in, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    y[i] = f16_to_f32(h);
  }
}
void quantize_f16(const float* x, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = f32_to_f16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}
void dequantize_bf16(const std::byte* in, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    y[i] = bf16_to_f32(h);
  }
}
void quantize_bf16(const float* x, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = f32_to_bf16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace
}  // namespace detail

namespace {

using DequantFn = void (*)(const std::byte*, float*, std::size_t);
using QuantFn = void (*)(const float*, std::byte*, std::size_t);

struct Codec {
  DequantFn dequantize = nullptr;
  QuantFn quantize = nullptr;
  bool is_float = false;  // F32/F16/BF16: the row functions take elements, and any value quantizes
};

Codec codec(DType t) {
  using namespace detail;
  switch (t) {
    case DType::F32: return {dequantize_f32, quantize_f32, true};
    case DType::F16: return {dequantize_f16, quantize_f16, true};
    case DType::BF16: return {dequantize_bf16, quantize_bf16, true};
    case DType::Q4_0: return {dequantize_q4_0, quantize_q4_0};
    case DType::Q4_1: return {dequantize_q4_1, quantize_q4_1};
    case DType::Q5_0: return {dequantize_q5_0, quantize_q5_0};
    case DType::Q5_1: return {dequantize_q5_1, quantize_q5_1};
    case DType::Q8_0: return {dequantize_q8_0, quantize_q8_0};
    case DType::Q8_1: return {dequantize_q8_1, quantize_q8_1};
    case DType::Q2_K: return {dequantize_q2_k, quantize_q2_k};
    case DType::Q3_K: return {dequantize_q3_k, quantize_q3_k};
    case DType::Q4_K: return {dequantize_q4_k, quantize_q4_k};
    case DType::Q5_K: return {dequantize_q5_k, quantize_q5_k};
    case DType::Q6_K: return {dequantize_q6_k, quantize_q6_k};
    case DType::Q8_K: return {dequantize_q8_k, quantize_q8_k};
    default: return {};
  }
}

std::string type_name(DType t) { return std::string(dtype_name(t)); }

// The codec of t, or an rlx::Error "<what> IQ2_XXS is not supported".
Codec supported(DType t, const char* what) {
  const Codec c = codec(t);
  if (c.dequantize == nullptr)
    throw Error(std::string(what) + " " + type_name(t) +
                " is not supported (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, q2_k, q3_k, q4_k, "
                "q5_k, q6_k, q8_k)");
  return c;
}

std::size_t checked_bytes(DType t, std::size_t n, const char* what) {
  const std::size_t block = block_elems(t);
  if (n % block != 0)
    throw Error(std::string(what) + " " + type_name(t) + ": " + std::to_string(n) +
                " elements is not a multiple of its block of " + std::to_string(block));
  return n / block * block_bytes(t);
}

}  // namespace

bool can_dequantize(DType t) { return codec(t).dequantize != nullptr; }
bool can_quantize(DType t) { return codec(t).quantize != nullptr; }

std::size_t quantized_bytes(DType t, std::size_t n) { return checked_bytes(t, n, "elements of"); }

void dequantize(DType t, std::span<const std::byte> blocks, std::span<float> out) {
  const Codec c = supported(t, "dequantize of");
  const std::size_t want = checked_bytes(t, out.size(), "dequantize of");
  if (blocks.size() != want)
    throw Error("dequantize of " + type_name(t) + ": " + std::to_string(out.size()) + " elements take " +
                std::to_string(want) + " bytes (blocks of " + std::to_string(block_elems(t)) + " in " +
                std::to_string(block_bytes(t)) + " bytes), but the input has " + std::to_string(blocks.size()));
  if (out.empty()) return;
  const std::size_t units = c.is_float ? out.size() : out.size() / block_elems(t);
  c.dequantize(blocks.data(), out.data(), units);
}

void quantize(DType t, std::span<const float> in, std::span<std::byte> out) {
  const Codec c = supported(t, "quantize to");
  const std::size_t want = checked_bytes(t, in.size(), "quantize to");
  if (out.size() != want)
    throw Error("quantize to " + type_name(t) + ": " + std::to_string(in.size()) + " elements take " +
                std::to_string(want) + " bytes (blocks of " + std::to_string(block_elems(t)) + " in " +
                std::to_string(block_bytes(t)) + " bytes), but the output has " + std::to_string(out.size()));
  if (in.empty()) return;
  if (!c.is_float) {
    for (std::size_t i = 0; i < in.size(); ++i)
      if (!std::isfinite(in[i]))
        throw Error("quantize to " + type_name(t) + ": element " + std::to_string(i) + " is " +
                    (std::isnan(in[i]) ? "nan"
                     : in[i] > 0       ? "inf"
                                       : "-inf") +
                    " (block types quantize finite values only)");
  }
  const std::size_t units = c.is_float ? in.size() : in.size() / block_elems(t);
  c.quantize(in.data(), out.data(), units);
}

}  // namespace rlx::ir
