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
    case DType::I16: return "i16";
    case DType::U16: return "u16";
    case DType::U32: return "u32";
    case DType::U64: return "u64";
    case DType::F8E4M3FN: return "f8e4m3fn";
    case DType::F8E4M3FNUZ: return "f8e4m3fnuz";
    case DType::F8E5M2: return "f8e5m2";
    case DType::F8E5M2FNUZ: return "f8e5m2fnuz";
    case DType::F8E8M0: return "f8e8m0";
    case DType::F4E2M1: return "f4e2m1";
    case DType::I4: return "i4";
    case DType::U4: return "u4";
    case DType::I2: return "i2";
    case DType::U2: return "u2";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == s) return t;
  for (DType t : kStorageDTypes)
    if (dtype_name(t) == s) return t;
  for (DType t : kBlockDTypes)
    if (dtype_name(t) == s) return t;
  throw Error("unknown dtype '" + std::string(s) +
              "' (expected f32, f16, bf16, f64, i8, u8, i16, u16, i32, u32, i64, u64, bool, a storage-only type: "
              "f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0, f4e2m1, i4, u4, i2, u2, or a block type: q4_0, q4_1, "
              "q5_0, q5_1, q8_0, q8_1, q2_k, q3_k, q4_k, q5_k, q6_k, q8_k)");
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }
bool is_integer(DType t) {
  switch (t) {
    case DType::I8:
    case DType::U8:
    case DType::I16:
    case DType::U16:
    case DType::I32:
    case DType::U32:
    case DType::I64:
    case DType::U64: return true;
    default: return false;
  }
}
bool is_unsigned(DType t) {
  return t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64 || t == DType::U4 || t == DType::U2;
}
bool is_signed(DType t) {
  return is_float(t) || is_storage_float(t) || t == DType::I8 || t == DType::I16 || t == DType::I32 ||
         t == DType::I64 || t == DType::I4 || t == DType::I2;
}

std::pair<double, double> integer_range(DType t) {
  switch (t) {
    case DType::I8: return {-128, 127};
    case DType::U8: return {0, 255};
    case DType::I16: return {-32768, 32767};
    case DType::U16: return {0, 65535};
    case DType::I32: return {-2147483648.0, 2147483647.0};
    case DType::U32: return {0, 4294967295.0};
    case DType::U64: return {0, 18446744073709551615.0};
    case DType::I4: return {-8, 7};
    case DType::U4: return {0, 15};
    case DType::I2: return {-2, 1};
    case DType::U2: return {0, 3};
    case DType::Bool: return {0, 1};
    default: return {-9223372036854775808.0, 9223372036854775807.0};
  }
}

E8M0Round parse_e8m0_round(std::string_view s) {
  if (s == "up") return E8M0Round::Up;
  if (s == "down") return E8M0Round::Down;
  if (s == "nearest") return E8M0Round::Nearest;
  throw Error("round_mode '" + std::string(s) + "' is not one of up, down, nearest");
}

namespace {

// The layout of a small float type: exponent and mantissa bits, bias, and how it spells NaN and infinity.
struct MiniFloat {
  int exp_bits, mant_bits, bias;
  bool has_inf;   // E5M2: S.11111.00 is infinity
  bool uz;        // FNUZ: no -0, NaN is 0x80
  bool all_ones;  // E4M3FN: only S.1111.111 is NaN, S.1111.xxx otherwise finite
  bool has_nan;   // F4E2M1 has none
};

MiniFloat mini_float(DType t) {
  switch (t) {
    case DType::F8E4M3FN: return {4, 3, 7, false, false, true, true};
    case DType::F8E4M3FNUZ: return {4, 3, 8, false, true, false, true};
    case DType::F8E5M2: return {5, 2, 15, true, false, false, true};
    case DType::F8E5M2FNUZ: return {5, 2, 16, false, true, false, true};
    default: return {2, 1, 1, false, false, false, false};  // F4E2M1
  }
}

double mini_max(const MiniFloat& f) {
  const int top = (1 << f.exp_bits) - 1;
  // The largest exponent is finite when the type has neither infinities nor IEEE NaNs (FNUZ, E4M3FN, E2M1).
  const int emax = (f.has_inf ? top - 1 : top) - f.bias;
  const int mant = (1 << f.mant_bits) - (f.all_ones ? 2 : 1);  // E4M3FN's all-ones mantissa is its NaN
  return std::ldexp(1.0 + mant / double(1 << f.mant_bits), emax);
}

double mini_decode(const MiniFloat& f, std::uint8_t bits) {
  const int width = 1 + f.exp_bits + f.mant_bits;
  bits &= std::uint8_t((1u << width) - 1);
  const bool neg = bits >> (width - 1);
  const int e = (bits >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = bits & ((1 << f.mant_bits) - 1);
  const int top = (1 << f.exp_bits) - 1;
  if (f.uz && neg && e == 0 && m == 0) return std::nan("");
  if (f.has_inf && e == top) return m == 0 ? (neg ? -INFINITY : INFINITY) : std::nan("");
  if (f.all_ones && e == top && m == (1 << f.mant_bits) - 1) return std::nan("");
  const double mag =
      e == 0 ? std::ldexp(m, 1 - f.bias - f.mant_bits) : std::ldexp(1.0 + m / double(1 << f.mant_bits), e - f.bias);
  return neg ? -mag : mag;
}

// v rounded to the nearest value of the type (ties to even); past the largest finite value it saturates
// or overflows (infinity where the type has one, else NaN).
double mini_round(const MiniFloat& f, double v, bool saturate) {
  const double max = mini_max(f);
  if (std::isnan(v)) return f.has_nan ? v : -0.0;  // float4 has no NaN: ml_dtypes (and so ONNX) stores -0
  if (std::isinf(v)) {
    if (saturate || !f.has_nan) return std::copysign(max, v);
    return f.has_inf ? v : std::nan("");
  }
  const double a = std::fabs(v);
  int e = 0;
  (void)std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int emin = 1 - f.bias;
  const int lead = a == 0 ? emin : std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, lead - f.mant_bits);
  double r = std::nearbyint(a / quantum) * quantum;  // exact scaling, then ties to even
  if (r > max) {
    if (saturate || !f.has_nan)
      r = max;
    else
      return f.has_inf ? std::copysign(INFINITY, v) : std::nan("");
  }
  if (f.uz && r == 0) return 0.0;  // no -0
  return std::copysign(r, v);
}

std::uint8_t mini_encode(const MiniFloat& f, double v) {
  const int width = 1 + f.exp_bits + f.mant_bits;
  const std::uint8_t sign = std::uint8_t(1u << (width - 1));
  const int top = (1 << f.exp_bits) - 1;
  if (std::isnan(v)) {
    if (f.uz) return 0x80;
    return std::uint8_t((std::signbit(v) ? sign : 0) | (f.all_ones ? 0x7f : (top << f.mant_bits) | 1));
  }
  const std::uint8_t s = std::signbit(v) && !(f.uz && v == 0) ? sign : 0;
  if (std::isinf(v)) return std::uint8_t(s | (top << f.mant_bits));
  const double a = std::fabs(v);
  if (a == 0) return s;
  int e = 0;
  (void)std::frexp(a, &e);
  const int emin = 1 - f.bias;
  if (e - 1 < emin)  // subnormal
    return std::uint8_t(s | int(std::ldexp(a, f.bias - 1 + f.mant_bits)));
  const int m = int(std::ldexp(a, f.mant_bits - (e - 1))) - (1 << f.mant_bits);
  return std::uint8_t(s | ((e - 1 + f.bias) << f.mant_bits) | m);
}

// float8e8m0 from a float's exponent bits, as ONNX's to_float8e8m0 computes it (on the value as f32).
std::uint8_t e8m0_encode(double v, CastMode mode) {
  const float x = static_cast<float>(v);
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  std::uint32_t e = (bits >> 23) & 0xffu;
  if (e == 0xffu) return 0xff;
  const std::uint32_t frac = bits & 0x7fffffu;
  bool up = false;
  if (mode.round == E8M0Round::Up) up = frac != 0;
  if (mode.round == E8M0Round::Nearest) {
    const bool g = bits & 0x400000u, r = bits & 0x200000u, sticky = bits & 0x1fffffu;
    up = g && (r || sticky || e > 0);
  }
  if (up && mode.saturate && e == 0xfeu) up = false;
  return std::uint8_t(e + (up ? 1 : 0));
}

double e8m0_decode(std::uint8_t b) { return b == 0xff ? std::nan("") : std::ldexp(1.0, int(b) - 127); }

// Storing a value already rounded: a power of two in range keeps its exponent (2^-127 is an f32 subnormal,
// which the cast's rounding would take up to 2^-126), anything else rounds as a default cast.
std::uint8_t e8m0_store(double v) {
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);
  if (m == 0.5 && e - 1 >= -127 && e - 1 <= 127) return std::uint8_t(e - 1 + 127);
  return e8m0_encode(v, {.saturate = false});
}

// Wraps an integer to `bits` bits, two's complement when signed.
double wrap_small(double v, int bits, bool is_signed_type) {
  if (!std::isfinite(v)) return 0;
  const double m = std::ldexp(1.0, bits);
  double w = std::fmod(std::trunc(v), m);
  if (w < 0) w += m;
  if (is_signed_type && w >= m / 2) w -= m;
  return w;
}

}  // namespace

std::uint8_t storage_encode(DType t, double v) {
  switch (t) {
    case DType::F8E8M0: return e8m0_store(v);
    case DType::I4:
    case DType::U4: return std::uint8_t(std::int64_t(wrap_small(v, 4, false)));
    case DType::I2:
    case DType::U2: return std::uint8_t(std::int64_t(wrap_small(v, 2, false)));
    default: {
      const MiniFloat f = mini_float(t);
      return mini_encode(f, mini_round(f, v, false));
    }
  }
}

double storage_decode(DType t, std::uint8_t bits) {
  switch (t) {
    case DType::F8E8M0: return e8m0_decode(bits);
    case DType::I4: return wrap_small(bits & 0xf, 4, true);
    case DType::U4: return bits & 0xf;
    case DType::I2: return wrap_small(bits & 0x3, 2, true);
    case DType::U2: return bits & 0x3;
    default: return mini_decode(mini_float(t), bits);
  }
}

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

double round_to_dtype(double v, DType t, CastMode mode) {
  if (t == DType::F8E8M0) return e8m0_decode(e8m0_encode(v, mode));
  if (is_storage_float(t)) return mini_round(mini_float(t), v, mode.saturate);
  return round_to_dtype(v, t);
}

double round_to_dtype(double v, DType t) {
  if (is_storage_only(t)) {
    if (t == DType::F8E8M0) return e8m0_decode(e8m0_store(v));
    if (is_storage_float(t)) return mini_round(mini_float(t), v, false);
    const bool small4 = t == DType::I4 || t == DType::U4;
    return wrap_small(v, small4 ? 4 : 2, t == DType::I4 || t == DType::I2);
  }
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
  if (t == DType::U64) {  // into [0, 2^64]
    // A negative value wraps to 2^64 - k, which a double may round to 2^64; 2^64 itself stays, so that
    // rounding twice gives what rounding once did (it stores as 2^64 - 1: ir::Tensor::set).
    if (v == k2p64) return v;
    double w = std::fmod(std::trunc(v), k2p64);
    return w < 0 ? w + k2p64 : w;
  }
  double wrapped = std::fmod(std::trunc(v), k2p64);
  if (wrapped >= k2p63) wrapped -= k2p64;
  if (wrapped < -k2p63) wrapped += k2p64;
  auto wide = static_cast<std::int64_t>(wrapped);
  switch (t) {
    case DType::I8: return static_cast<std::int8_t>(wide);
    case DType::U8: return static_cast<std::uint8_t>(wide);
    case DType::I16: return static_cast<std::int16_t>(wide);
    case DType::U16: return static_cast<std::uint16_t>(wide);
    case DType::I32: return static_cast<std::int32_t>(wide);
    case DType::U32: return static_cast<std::uint32_t>(wide);
    default: return static_cast<double>(wide);
  }
}

}  // namespace rlx::ir
