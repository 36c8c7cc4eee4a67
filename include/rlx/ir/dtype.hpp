#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace rlx::ir {

// Element types. The enum leaves room for block-quantized types (q4_0, q8_0...)
// whose element size is fractional: they will carry a block size as well.
enum class DType : std::uint8_t { F32, F16, BF16, F64, I8, U8, I32, I64, Bool };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8,
                                       DType::U8,  DType::I32, DType::I64,  DType::Bool};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);   // "f32", "f16", ...
DType parse_dtype(std::string_view s);  // throws rlx::Error naming the bad string
bool is_float(DType t);                 // f32 f16 bf16 f64
bool is_integer(DType t);               // i8 u8 i32 i64 (not bool)
bool is_signed(DType t);

// IEEE half and bfloat16 conversion, round to nearest even. Shared by every
// backend and the reference so they round identically.
inline float bf16_to_float(std::uint16_t h) {
  std::uint32_t bits = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return std::uint16_t(bits >> 16);
}
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);

// Rounds a double to what storing it in `t` and reading it back yields
// (float rounding, integer truncation with wrap-around, bool as 0/1).
double round_to_dtype(double v, DType t);

}  // namespace rlx::ir
