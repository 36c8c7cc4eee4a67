#pragma once
// The block-quantized dtypes' codecs (rlx/ir/dtype.hpp): ggml's formats as pure functions: dequantize a run of blocks
// to f32, and quantize f32 to blocks with ggml's reference (non-imatrix) quantizers. docs/quants.md gives each type's
// layout and formula, and what each is checked against bit for bit (tests/gguf/test_quants.cpp: gguf.quants and
// llama.cpp's ggml-quants.c).
//
// A "run" is one row or several rows back to back: every block stands alone, so a tensor of
// rows whose length is a multiple of the block quantizes as one run. The block structs below
// are ggml's layouts (little-endian, no padding); the fast kernels read the same structs.
// Block data in a file need not be aligned for them: copy a block out (std::memcpy) rather than
// casting a pointer into the file.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "rlx/ir/dtype.hpp"

namespace rlx::ir {

static_assert(std::endian::native == std::endian::little, "ggml's block layouts are little-endian");

inline constexpr int kQK4 = 32;   // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1
inline constexpr int kQKK = 256;  // elements per super-block of the K-quants and Q8_K

// f16 fields are IEEE half bit patterns (ggml_half).
struct BlockQ4_0 {
  std::uint16_t d;            // scale: x = d * (q - 8)
  std::uint8_t qs[kQK4 / 2];  // element j in the low nibble of qs[j], element j + 16 in the high nibble
};
struct BlockQ4_1 {
  std::uint16_t d, m;  // x = d * q + m
  std::uint8_t qs[kQK4 / 2];
};
struct BlockQ5_0 {
  std::uint16_t d;            // x = d * (q - 16)
  std::uint8_t qh[4];         // bit j of this little-endian u32: the fifth bit of element j
  std::uint8_t qs[kQK4 / 2];  // low four bits, as Q4_0
};
struct BlockQ5_1 {
  std::uint16_t d, m;  // x = d * q + m
  std::uint8_t qh[4];
  std::uint8_t qs[kQK4 / 2];
};
struct BlockQ8_0 {
  std::uint16_t d;  // x = d * q
  std::int8_t qs[kQK4];
};
struct BlockQ8_1 {
  std::uint16_t d;  // x = d * q
  std::uint16_t s;  // d * sum(q), for the dot products
  std::int8_t qs[kQK4];
};
struct BlockQ2_K {
  std::uint8_t scales[kQKK / 16];  // per 16 elements: scale in the low nibble, min in the high nibble
  std::uint8_t qs[kQKK / 4];       // 2-bit quants
  std::uint16_t d, dmin;           // x = d * scale * q - dmin * min
};
struct BlockQ3_K {
  std::uint8_t hmask[kQKK / 8];  // the third bit of each quant (set means no -4 offset)
  std::uint8_t qs[kQKK / 4];     // low two bits of each quant
  std::uint8_t scales[12];       // sixteen 6-bit scales, biased by 32
  std::uint16_t d;               // x = d * (scale - 32) * q, q in [-4, 3]
};
struct BlockQ4_K {
  std::uint16_t d, dmin;    // x = d * scale * q - dmin * min, per 32 elements
  std::uint8_t scales[12];  // eight 6-bit scales and eight 6-bit mins
  std::uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];  // as Q4_K
  std::uint8_t qh[kQKK / 8];
  std::uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  std::uint8_t ql[kQKK / 2];  // low four bits
  std::uint8_t qh[kQKK / 4];  // high two bits
  std::int8_t scales[kQKK / 16];
  std::uint16_t d;  // x = d * scale * (q - 32)
};
struct BlockQ8_K {
  float d;  // x = d * q (an f32 scale: the activation side of the K-quant dot products)
  std::int8_t qs[kQKK];
  std::int16_t bsums[kQKK / 16];  // sum of each 16 quants
};

// One static_assert per block against ggml's sizes (rlx/ir/dtype.hpp's block_layout).
#define RLX_QUANT_BLOCK_SIZE(T, B) \
  static_assert(sizeof(B) == block_bytes(DType::T), #B " does not match ggml's block size")
RLX_QUANT_BLOCK_SIZE(Q4_0, BlockQ4_0);
RLX_QUANT_BLOCK_SIZE(Q4_1, BlockQ4_1);
RLX_QUANT_BLOCK_SIZE(Q5_0, BlockQ5_0);
RLX_QUANT_BLOCK_SIZE(Q5_1, BlockQ5_1);
RLX_QUANT_BLOCK_SIZE(Q8_0, BlockQ8_0);
RLX_QUANT_BLOCK_SIZE(Q2_K, BlockQ2_K);
RLX_QUANT_BLOCK_SIZE(Q3_K, BlockQ3_K);
RLX_QUANT_BLOCK_SIZE(Q4_K, BlockQ4_K);
RLX_QUANT_BLOCK_SIZE(Q5_K, BlockQ5_K);
RLX_QUANT_BLOCK_SIZE(Q6_K, BlockQ6_K);
RLX_QUANT_BLOCK_SIZE(Q8_K, BlockQ8_K);
RLX_QUANT_BLOCK_SIZE(Q8_1, BlockQ8_1);  // ggml's 36 bytes (rlx/gguf/types.hpp says why not gguf-py's 40)
#undef RLX_QUANT_BLOCK_SIZE

// Whether dequantize/quantize take the type: f32, f16, bf16 and every block type (both ways). The
// integer types, f64 and bool are not supported: the functions throw rlx::Error naming the type.
bool can_dequantize(DType t);
bool can_quantize(DType t);

// The bytes of n elements of t (Q8_1: 36 per block). Throws rlx::Error, naming the type, n and the
// block, when n is not a multiple of the block.
std::size_t quantized_bytes(DType t, std::size_t n);

// Dequantizes whole blocks into out: out.size() elements from quantized_bytes(t, out.size()) bytes.
// Matches gguf.quants.dequantize bit for bit (ggml's dequantize_row_* where gguf has none: Q8_1,
// Q8_K). Any bytes are valid input: NaN or inf scales give NaN or inf outputs, never an error.
void dequantize(DType t, std::span<const std::byte> blocks, std::span<float> out);

// Quantizes in.size() elements into quantized_bytes(t, in.size()) bytes of out. F32, F16 and BF16
// take any value (NaN included; F16 and BF16 round to nearest even as numpy and ggml do). The block
// types require finite inputs and throw rlx::Error naming the element otherwise: ggml's quantizers
// have undefined behaviour on NaN and infinity. Results match gguf.quants.quantize (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, F16, BF16) or llama.cpp's quantize_row_*_ref (the rest) bit for bit.
void quantize(DType t, std::span<const float> in, std::span<std::byte> out);

// IEEE half <-> float exactly as numpy converts them (gguf.quants uses numpy): round to nearest
// even, overflow to infinity, NaN payloads kept (the top ten bits, and never turned into infinity).
constexpr float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | mant << 13);
  return std::bit_cast<float>(sign | (exp + 112u) << 23 | mant << 13);
}

constexpr std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: numpy keeps the payload's top bits, and a NaN stays a NaN
    const std::uint32_t m = (a & 0x7fffffu) >> 13;
    return static_cast<std::uint16_t>(sign | 0x7c00u | (m != 0 ? m : 1u));
  }
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                                    // below 2^-14: subnormal half
    if (a < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to zero below)
    const std::uint32_t e = a >> 23;
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // mant * 2^(e - 150) in units of 2^-24
    std::uint32_t q = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t h = (a >> 13) - (112u << 10);
  const std::uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | h);
}

// bfloat16 as gguf.quants and ggml convert it: NaN becomes a quiet NaN with its top bits, the rest
// round to nearest even.
constexpr float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t(h) << 16); }
constexpr std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace rlx::ir
