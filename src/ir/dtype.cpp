#include "rlx/ir/dtype.hpp"

#include <cmath>
#include <string>

#include "rlx/error.hpp"

namespace rlx::ir {

std::size_t storage_bytes(DType t, std::span<const std::int64_t> shape) {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= std::size_t(d);
  if (!is_block_quantized(t)) return n * dtype_size(t);
  const BlockLayout b = block_layout(t);
  if (shape.empty() || shape.back() <= 0 || std::size_t(shape.back()) % b.elems != 0) {
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    throw Error(std::string(dtype_name(t)) + "[" + dims + "]: a block-quantized tensor's last extent must be a " +
                "positive multiple of its block of " + std::to_string(b.elems));
  }
  return n / b.elems * b.bytes;
}

std::size_t dtype_size(DType t) {
  if (!is_block_quantized(t)) return block_bytes(t);
  throw Error(std::string(dtype_name(t)) + " is block-quantized: " + std::to_string(block_elems(t)) +
              " elements share " + std::to_string(block_bytes(t)) + " bytes, so an element has no size of its own");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "bool";
    case DType::Q4_0: return "q4_0";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q8_0: return "q8_0";
    case DType::Q8_1: return "q8_1";
    case DType::Q2_K: return "q2_k";
    case DType::Q3_K: return "q3_k";
    case DType::Q4_K: return "q4_k";
    case DType::Q5_K: return "q5_k";
    case DType::Q6_K: return "q6_k";
    case DType::Q8_K: return "q8_k";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == s) return t;
  for (DType t : kBlockDTypes)
    if (dtype_name(t) == s) return t;
  throw Error("unknown dtype '" + std::string(s) +
              "' (expected f32, f16, bf16, f64, i8, u8, i32, i64, bool, or a block type: q4_0, q4_1, q5_0, q5_1, "
              "q8_0, q8_1, q2_k, q3_k, q4_k, q5_k, q6_k, q8_k)");
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }
bool is_integer(DType t) { return t == DType::I8 || t == DType::U8 || t == DType::I32 || t == DType::I64; }
bool is_signed(DType t) { return is_float(t) || t == DType::I8 || t == DType::I32 || t == DType::I64; }

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | std::uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  std::uint32_t sign = (bits >> 16) & 0x8000u;
  std::uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // overflow (rounds to inf)
  if (abs < 0x38800000u) {  // subnormal or zero in half: round at 2^-24 granularity
    float a;
    std::memcpy(&a, &abs, 4);
    auto m = static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f));  // units of 2^-24, half-even
    return std::uint16_t(sign | m);
  }
  std::uint32_t e = (abs >> 23) - 127 + 15;
  std::uint32_t mant = abs & 0x7fffffu;
  std::uint32_t h = e << 10 | mant >> 13;
  std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into the exponent correctly
  return std::uint16_t(sign | h);
}

double round_to_dtype(double v, DType t) {
  switch (t) {
    case DType::F64: return v;
    case DType::F32: return static_cast<float>(v);
    case DType::F16: return half_to_float(float_to_half(static_cast<float>(v)));
    case DType::BF16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    case DType::Bool: return v != 0 ? 1.0 : 0.0;
    default: break;
  }
  // A block type's elements round together (rlx::ir::quantize); one alone is kept as its f32.
  if (is_block_quantized(t)) return static_cast<float>(v);
  // NaN and the infinities have no integer value; they become 0 (converting them would be undefined).
  if (!std::isfinite(v)) return 0;
  // Wrap around like a two's complement store of the truncated integer: into [-2^63, 2^63), exactly (a double
  // that large is a multiple of 2^11), before the conversion, which is undefined outside that range.
  constexpr double k2p63 = 9223372036854775808.0, k2p64 = 18446744073709551616.0;
  double wrapped = std::fmod(std::trunc(v), k2p64);
  if (wrapped >= k2p63) wrapped -= k2p64;
  if (wrapped < -k2p63) wrapped += k2p64;
  auto wide = static_cast<std::int64_t>(wrapped);
  switch (t) {
    case DType::I8: return static_cast<std::int8_t>(wide);
    case DType::U8: return static_cast<std::uint8_t>(wide);
    case DType::I32: return static_cast<std::int32_t>(wide);
    default: return static_cast<double>(wide);
  }
}

}  // namespace rlx::ir
