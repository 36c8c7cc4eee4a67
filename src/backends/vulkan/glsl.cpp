#ifdef RLX_HAVE_VULKAN
// The pieces every generator shares: storage access with dtype conversions,
// rounding to narrow dtypes, literals, broadcasting index math, the helper
// functions, and the elementwise expression of every op.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

#include "backends/vulkan/codegen.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::vulkan {

using ir::DType;
using ir::OpKind;

std::string u(std::int64_t v) { return std::to_string(v) + "u"; }

std::span<const DType> vulkan_dtypes() {
  static constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8,
                                     DType::U8,  DType::I32, DType::I64,  DType::Bool};
  return kTypes;
}

CT compute_type(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return CT::F32;
    case DType::F64: return CT::F64;
    case DType::I64: return CT::I64;
    case DType::Bool: return CT::Bool;
    default: return CT::I32;
  }
}

std::string_view ct_name(CT t) {
  switch (t) {
    case CT::F32: return "float";
    case CT::F64: return "double";
    case CT::I32: return "int";
    case CT::I64: return "int64_t";
    case CT::Bool: return "bool";
  }
  return "?";
}

namespace {

std::string float_bits(float f) { return fmt::format("uintBitsToFloat(0x{:08x}u)", std::bit_cast<std::uint32_t>(f)); }

// GLSL helper functions by name, with the helpers each one calls.
struct Helper {
  std::string_view name;
  std::vector<std::string_view> needs;
  std::string_view code;
};

const std::vector<Helper>& helper_table() {
  static const std::vector<Helper> table = {
      {"nan", {}, "float rlx_nan() { return uintBitsToFloat(0x7fc00000u); }\n"},
      {"h2f", {}, "float rlx_h2f(uint16_t h) { return unpackHalf2x16(uint(h)).x; }\n"},
      // Round to nearest even, as ir::float_to_half; subnormals at 2^-24 granularity.
      {"f2h", {}, R"(uint16_t rlx_f2h(float f) {
  uint bits = floatBitsToUint(f);
  uint sgn = (bits >> 16) & 0x8000u, a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sgn | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sgn | 0x7c00u);
  if (a < 0x38800000u) return uint16_t(sgn | uint(roundEven(uintBitsToFloat(a) * 16777216.0)));
  uint h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13), rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) h += 1u;
  return uint16_t(sgn | h);
}
)"},
      {"bf2f", {}, "float rlx_bf2f(uint16_t h) { return uintBitsToFloat(uint(h) << 16); }\n"},
      {"f2bf", {}, R"(uint16_t rlx_f2bf(float f) {
  uint b = floatBitsToUint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}
)"},
      {"rf16", {"h2f", "f2h"}, "float rlx_rf16(float x) { return rlx_h2f(rlx_f2h(x)); }\n"},
      {"rbf16", {"bf2f", "f2bf"}, "float rlx_rbf16(float x) { return rlx_bf2f(rlx_f2bf(x)); }\n"},
      // Cephes tanhf: a polynomial near 0 (no cancellation), exp-based beyond.
      {"tanh", {}, R"(float rlx_tanh(float x) {
  float a = abs(x);
  if (a < 0.625) {
    float z = x * x;
    return ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z -
            3.33332819422e-1) * z * x + x;
  }
  if (a > 10.0) return x > 0.0 ? 1.0 : -1.0;
  float r = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
  return x < 0.0 ? -r : r;
}
)"},
      // Abramowitz & Stegun 7.1.26 refined: |error| < 1.5e-7.
      {"erf", {}, R"(float rlx_erf(float x) {
  float a = abs(x), t = 1.0 / (1.0 + 0.3275911 * a);
  float y = 1.0 - ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t *
                      exp(-a * a);
  return x < 0.0 ? -y : (x >= 0.0 ? y : x);
}
)"},
      // C99's (and numpy's) special cases come first: GLSL leaves log2 of 0, of a negative and of NaN undefined
      // (lavapipe returns 0 for 0^-1 and NaN^2). A negative base, -0 and -inf included, keeps its sign under an
      // odd integer exponent; a non-integer one makes a finite negative base NaN.
      {"pow", {"nan"}, R"(float rlx_pow(float x, float y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (isnan(x) || isnan(y)) return rlx_nan();
  float ax = abs(x), inf = uintBitsToFloat(0x7f800000u);
  if (isinf(y)) return ax == 1.0 ? 1.0 : ((ax < 1.0) == (y < 0.0) ? inf : 0.0);
  bool integral = floor(y) == y, odd = integral && mod(y, 2.0) == 1.0;
  float r;
  if (ax == 0.0) r = y < 0.0 ? inf : 0.0;
  else if (isinf(x)) r = y < 0.0 ? 0.0 : inf;
  else if (x < 0.0 && !integral) return rlx_nan();
  else r = exp2(y * log2(ax));
  return (odd && (floatBitsToUint(x) >> 31) != 0u) ? -r : r;
}
)"},
      {"max", {"nan"}, "float rlx_max(float a, float b) { return (isnan(a) || isnan(b)) ? rlx_nan() : max(a, b); }\n"},
      {"min", {"nan"}, "float rlx_min(float a, float b) { return (isnan(a) || isnan(b)) ? rlx_nan() : min(a, b); }\n"},
      {"sign", {}, "float rlx_sign(float x) { return isnan(x) ? x : sign(x); }\n"},
      // Like std::fmod then NumPy's sign fix; in double so the quotient is exact for f32 operands.
      {"fmod", {}, R"(float rlx_fmod(float a, float b) {
  double da = double(a), db = double(b);
  // fmod(a, +-inf) is a for a finite a; the quotient form would give inf * 0 = NaN.
  float r = isinf(b) && !isinf(a) ? a : float(da - db * trunc(da / db));
  if (r == 0.0) return b < 0.0 ? uintBitsToFloat(0x80000000u) : 0.0;
  return ((r < 0.0) != (b < 0.0)) ? r + b : r;
}
)"},
      {"idiv", {}, R"(int rlx_idiv(int a, int b) { return b == 0 ? 0 : (b == -1 ? -a : a / b); }
int64_t rlx_idiv(int64_t a, int64_t b) { return b == 0l ? 0l : (b == -1l ? -a : a / b); }
)"},
      {"imod", {}, R"(int rlx_imod(int a, int b) {
  if (b == 0 || b == -1) return 0;
  int r = a - (a / b) * b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
int64_t rlx_imod(int64_t a, int64_t b) {
  if (b == 0l || b == -1l) return 0l;
  int64_t r = a - (a / b) * b;
  return (r != 0l && ((r < 0l) != (b < 0l))) ? r + b : r;
}
)"},
      {"ipow", {}, R"(int64_t rlx_ipow(int64_t b, int64_t e) {
  if (e < 0l) return b == 1l ? 1l : (b == -1l ? ((e & 1l) != 0l ? -1l : 1l) : 0l);
  uint64_t r = 1ul, x = uint64_t(b);
  for (; e > 0l; e >>= 1) {
    if ((e & 1l) != 0l) r *= x;
    x *= x;
  }
  return int64_t(r);
}
)"},
      // ---- f64: GLSL has no double transcendentals; these stay well inside f64 test tolerances (~1e-15). ----
      {"d_nan",
       {},
       "double rlx_dnan() { return packDouble2x32(uvec2(0u, 0x7ff80000u)); }\n"
       "double rlx_dinf() { return packDouble2x32(uvec2(0u, 0x7ff00000u)); }\n"
       "double rlx_pow2i(int k) { return packDouble2x32(uvec2(0u, uint(k + 1023) << 20)); }\n"},
      {"d_exp", {"d_nan"}, R"(double rlx_exp(double x) {
  if (isnan(x)) return x;
  if (x > 709.78lf) return rlx_dinf();
  if (x < -745.2lf) return 0.0lf;
  double k = roundEven(x * 1.4426950408889634lf);
  double r = (x - k * 6.93147180369123816490e-01lf) - k * 1.90821492927058770002e-10lf;
  double p = 1.0lf / 6227020800.0lf;
  p = p * r + 1.0lf / 479001600.0lf; p = p * r + 1.0lf / 39916800.0lf; p = p * r + 1.0lf / 3628800.0lf;
  p = p * r + 1.0lf / 362880.0lf; p = p * r + 1.0lf / 40320.0lf; p = p * r + 1.0lf / 5040.0lf; p = p * r + 1.0lf / 720.0lf;
  p = p * r + 1.0lf / 120.0lf; p = p * r + 1.0lf / 24.0lf; p = p * r + 1.0lf / 6.0lf; p = p * r + 0.5lf;
  p = p * r + 1.0lf; p = p * r + 1.0lf;
  int ki = int(k);
  return p * rlx_pow2i(ki / 2) * rlx_pow2i(ki - ki / 2);
}
)"},
      {"d_expm1", {"d_exp"}, R"(double rlx_expm1(double x) {
  if (abs(x) > 0.3lf) return rlx_exp(x) - 1.0lf;
  double p = 1.0lf / 6227020800.0lf;
  p = p * x + 1.0lf / 479001600.0lf; p = p * x + 1.0lf / 39916800.0lf; p = p * x + 1.0lf / 3628800.0lf;
  p = p * x + 1.0lf / 362880.0lf; p = p * x + 1.0lf / 40320.0lf; p = p * x + 1.0lf / 5040.0lf; p = p * x + 1.0lf / 720.0lf;
  p = p * x + 1.0lf / 120.0lf; p = p * x + 1.0lf / 24.0lf; p = p * x + 1.0lf / 6.0lf; p = p * x + 0.5lf;
  return (p * x + 1.0lf) * x;
}
)"},
      {"d_log", {"d_nan"}, R"(double rlx_log(double x) {
  if (isnan(x) || x < 0.0lf) return rlx_dnan();
  if (x == 0.0lf) return -rlx_dinf();
  if (isinf(x)) return x;
  int e;
  double m = frexp(x, e);
  if (m < 0.70710678118654752lf) { m *= 2.0lf; e -= 1; }
  double s = (m - 1.0lf) / (m + 1.0lf), z = s * s;
  double p = 1.0lf / 23.0lf;
  p = p * z + 1.0lf / 21.0lf; p = p * z + 1.0lf / 19.0lf; p = p * z + 1.0lf / 17.0lf; p = p * z + 1.0lf / 15.0lf;
  p = p * z + 1.0lf / 13.0lf; p = p * z + 1.0lf / 11.0lf; p = p * z + 1.0lf / 9.0lf; p = p * z + 1.0lf / 7.0lf;
  p = p * z + 1.0lf / 5.0lf; p = p * z + 1.0lf / 3.0lf; p = p * z + 1.0lf;
  return 2.0lf * s * p + double(e) * 6.93147180369123816490e-01lf + double(e) * 1.90821492927058770002e-10lf;
}
)"},
      // sin and cos share a reduction by pi/2 (fdlibm's three-part constant) and Taylor polynomials on [-pi/4, pi/4].
      {"d_sincos", {"d_nan"}, R"(double rlx_sin_poly(double r) {
  double z = r * r, p = -1.0lf / 1307674368000.0lf;
  p = p * z + 1.0lf / 6227020800.0lf; p = p * z - 1.0lf / 39916800.0lf; p = p * z + 1.0lf / 362880.0lf;
  p = p * z - 1.0lf / 5040.0lf; p = p * z + 1.0lf / 120.0lf; p = p * z - 1.0lf / 6.0lf;
  return r + r * z * p;
}
double rlx_cos_poly(double r) {
  double z = r * r, p = 1.0lf / 20922789888000.0lf;
  p = p * z - 1.0lf / 87178291200.0lf; p = p * z + 1.0lf / 479001600.0lf; p = p * z - 1.0lf / 3628800.0lf;
  p = p * z + 1.0lf / 40320.0lf; p = p * z - 1.0lf / 720.0lf; p = p * z + 1.0lf / 24.0lf; p = p * z - 0.5lf;
  return 1.0lf + z * p;
}
double rlx_trig(double x, int shift) {
  if (isnan(x) || isinf(x)) return rlx_dnan();
  double k = roundEven(x * 0.63661977236758134lf);
  double r = ((x - k * 1.57079632673412561417e+00lf) - k * 6.07710050630396597660e-11lf) - k * 2.02226624879595063154e-21lf;
  int q = (int(mod(k, 4.0lf)) + shift) & 3;
  return q == 0 ? rlx_sin_poly(r) : q == 1 ? rlx_cos_poly(r) : q == 2 ? -rlx_sin_poly(r) : -rlx_cos_poly(r);
}
double rlx_sin(double x) { return rlx_trig(x, 0); }
double rlx_cos(double x) { return rlx_trig(x, 1); }
)"},
      {"d_tanh", {"d_expm1"}, R"(double rlx_tanh(double x) {
  if (abs(x) > 20.0lf) return x > 0.0lf ? 1.0lf : -1.0lf;
  double e = rlx_expm1(2.0lf * x);
  return e / (e + 2.0lf);
}
)"},
      // A Taylor series below 2.5, erfc's continued fraction above.
      {"d_erf", {"d_exp"}, R"(double rlx_erf(double x) {
  if (isnan(x)) return x;
  double a = abs(x), r;
  if (a < 2.5lf) {
    double z = a * a, term = a, sum = a;
    for (int n = 1; n < 80; ++n) {
      term *= -z / double(n);
      double t = term / double(2 * n + 1);
      sum += t;
      if (abs(t) < 1e-17lf * abs(sum)) break;
    }
    r = sum * 1.1283791670955126lf;
  } else {
    double f = a;
    for (int n = 60; n >= 1; --n) f = a + (0.5lf * double(n)) / f;
    r = 1.0lf - rlx_exp(-a * a) / (1.7724538509055160lf * f);
  }
  return x < 0.0lf ? -r : r;
}
)"},
      {"d_pow", {"d_exp", "d_log", "d_nan"}, R"(double rlx_pow(double x, double y) {
  if (y == 0.0lf || x == 1.0lf) return 1.0lf;  // the special cases as rlx_pow's (f32)
  if (isnan(x) || isnan(y)) return rlx_dnan();
  double ax = abs(x);
  if (isinf(y)) return ax == 1.0lf ? 1.0lf : ((ax < 1.0lf) == (y < 0.0lf) ? rlx_dinf() : 0.0lf);
  bool integral = floor(y) == y, odd = integral && mod(y, 2.0lf) == 1.0lf;
  double r;
  if (ax == 0.0lf) r = y < 0.0lf ? rlx_dinf() : 0.0lf;
  else if (isinf(x)) r = y < 0.0lf ? 0.0lf : rlx_dinf();
  else if (x < 0.0lf && !integral) return rlx_dnan();
  else r = rlx_exp(y * rlx_log(ax));
  return (odd && (unpackDouble2x32(x).y >> 31) != 0u) ? -r : r;
}
)"},
      {"d_max",
       {"d_nan"},
       "double rlx_max(double a, double b) { return (isnan(a) || isnan(b)) ? rlx_dnan() : max(a, b); }\n"},
      {"d_min",
       {"d_nan"},
       "double rlx_min(double a, double b) { return (isnan(a) || isnan(b)) ? rlx_dnan() : min(a, b); }\n"},
      {"d_sign", {}, "double rlx_sign(double x) { return isnan(x) ? x : sign(x); }\n"},
      {"d_fmod", {}, R"(double rlx_fmod(double a, double b) {
  double r = isinf(b) && !isinf(a) ? a : a - b * trunc(a / b);  // fmod(a, +-inf) = a
  if (r == 0.0lf) return b < 0.0lf ? -0.0lf : 0.0lf;
  return ((r < 0.0lf) != (b < 0.0lf)) ? r + b : r;
}
)"},
  };
  return table;
}

}  // namespace

std::string literal(double v, DType t) {
  switch (compute_type(t)) {
    case CT::F32: return float_bits(float(ir::round_to_dtype(v, t)));
    case CT::F64: {
      auto bits = std::bit_cast<std::uint64_t>(v);
      return fmt::format("packDouble2x32(uvec2(0x{:08x}u, 0x{:08x}u))", std::uint32_t(bits), std::uint32_t(bits >> 32));
    }
    case CT::I32: return fmt::format("int(0x{:08x}u)", std::uint32_t(std::int32_t(ir::round_to_dtype(v, t))));
    case CT::I64: return fmt::format("int64_t(0x{:016x}ul)", std::uint64_t(std::int64_t(ir::round_to_dtype(v, t))));
    case CT::Bool: return v != 0 ? "true" : "false";
  }
  return "?";
}

std::int64_t numel(const std::vector<std::int64_t>& extents) {
  std::int64_t n = 1;
  for (auto d : extents) n *= d;
  return n;
}

std::string declare_coords(const std::string& lin, const std::vector<std::int64_t>& extents,
                           const std::vector<std::string>& names) {
  std::string code;
  std::int64_t inner = 1;
  for (std::size_t d = extents.size(); d-- > 0;) {
    std::string e = inner == 1 ? "(" + lin + ")" : "((" + lin + ") / " + u(inner) + ")";
    if (d > 0) e += " % " + u(extents[d]);
    code += "uint " + names[d] + " = " + e + ";\n";
    inner *= extents[d];
  }
  return code;
}

std::string coords_code(Space& s, const std::string& prefix) {
  s.coords.clear();
  for (std::size_t d = 0; d < s.dims.size(); ++d) s.coords.push_back(prefix + std::to_string(d));
  return declare_coords(s.linear, s.dims, s.coords);
}

std::string bcast_index(const Space& s, const std::vector<std::int64_t>& shape) {
  const std::int64_t n = numel(shape), total = numel(s.dims);
  if (n == 1) return "0u";
  if (n == total) return "(" + s.linear + ")";
  assert(shape.size() <= s.dims.size() && s.coords.size() == s.dims.size());
  std::size_t off = s.dims.size() - shape.size();
  std::string e;
  std::int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1) e += (e.empty() ? "" : " + ") + s.coords[off + d] + (stride == 1 ? "" : " * " + u(stride));
    stride *= shape[d];
  }
  return "(" + e + ")";
}

// ---- Shader -------------------------------------------------------------------

std::string Shader::array(int binding, DType t, bool raw) {
  std::string_view type, suffix;
  if (raw) {
    switch (ir::dtype_size(t)) {
      case 1: type = "uint8_t", suffix = "u8"; break;
      case 2: type = "uint16_t", suffix = "u16"; break;
      case 4: type = "uint", suffix = "u32"; break;
      default: type = "uint64_t", suffix = "u64"; break;
    }
  } else {
    switch (t) {
      case DType::F32: type = "float", suffix = "f32"; break;
      case DType::F16:
      case DType::BF16: type = "uint16_t", suffix = "u16"; break;
      case DType::F64: type = "double", suffix = "f64"; break;
      case DType::I8: type = "int8_t", suffix = "i8"; break;
      case DType::U8:
      case DType::Bool: type = "uint8_t", suffix = "u8"; break;
      case DType::I32: type = "int", suffix = "i32"; break;
      case DType::I64: type = "int64_t", suffix = "i64"; break;
    }
  }
  arrays_.insert(fmt::format("{}:{}:{}", binding, suffix, type));
  return fmt::format("m{}_{}", binding, suffix);
}

std::int64_t Shader::elem_offset(compile::BufferId id) const {
  const auto& b = c_.lir.buffer(id);
  const Loc& l = c_.locs.at(std::size_t(id));
  auto size = std::int64_t(ir::dtype_size(b.dtype));
  if (l.offset % size) throw NoShader{fmt::format("buffer b{} is not aligned to its element size", id)};
  return l.offset / size;
}

std::string Shader::at(compile::BufferId id, const std::string& idx) {
  const auto& b = c_.lir.buffer(id);
  auto off = elem_offset(id);
  return array(c_.locs.at(std::size_t(id)).binding, b.dtype, false) + "[" + (off ? u(off) + " + " : "") + idx + "]";
}

std::string Shader::raw(compile::BufferId id, const std::string& idx) {
  const auto& b = c_.lir.buffer(id);
  auto off = elem_offset(id);
  return array(c_.locs.at(std::size_t(id)).binding, b.dtype, true) + "[" + (off ? u(off) + " + " : "") + idx + "]";
}

std::string Shader::words(int binding) { return array(binding, DType::I32, true); }

std::string Shader::vec4s(int binding) {
  arrays_.insert(fmt::format("{}:v4:vec4", binding));
  return fmt::format("m{}_v4", binding);
}

std::string Shader::raw_type(DType t) const {
  switch (ir::dtype_size(t)) {
    case 1: return "uint8_t";
    case 2: return "uint16_t";
    case 4: return "uint";
    default: return "uint64_t";
  }
}

std::string Shader::load(compile::BufferId id, const std::string& idx) {
  std::string a = at(id, idx);
  switch (c_.lir.buffer(id).dtype) {
    case DType::F16: use("h2f"); return "rlx_h2f(" + a + ")";
    case DType::BF16: use("bf2f"); return "rlx_bf2f(" + a + ")";
    case DType::I8:
    case DType::U8: return "int(" + a + ")";
    case DType::Bool: return "(" + a + " != uint8_t(0))";
    default: return a;
  }
}

std::string Shader::store(compile::BufferId id, const std::string& idx, const std::string& v) {
  std::string a = at(id, idx);
  switch (c_.lir.buffer(id).dtype) {
    case DType::F16: use("f2h"); return a + " = rlx_f2h(" + v + ");\n";
    case DType::BF16: use("f2bf"); return a + " = rlx_f2bf(" + v + ");\n";
    case DType::I8: return a + " = int8_t(" + v + ");\n";
    case DType::U8: return a + " = uint8_t(" + v + ");\n";
    case DType::Bool: return a + " = uint8_t((" + v + ") ? 1u : 0u);\n";
    default: return a + " = " + v + ";\n";
  }
}

std::string Shader::scratch(const std::string& idx) {
  return fmt::format("{}[{} + {}]", array(c_.scratch.binding, DType::F32, false), u(c_.scratch.offset / 4), idx);
}

std::string Shader::fail(const std::string& value) {
  std::string st = array(c_.status.binding, DType::I32, true);
  std::int64_t w = c_.status.offset / 4;
  return fmt::format(
      "if (atomicCompSwap({0}[{1}], 0u, {2}) == 0u) {{ int64_t rlx_v = int64_t({3}); {0}[{4}] = uint(rlx_v & "
      "0xffffffffl); {0}[{5}] = uint(rlx_v >> 32); }}\n",
      st, u(w), u(c_.code), value, u(w + 1), u(w + 2));
}

std::string Shader::narrow(const std::string& v, DType t) {
  switch (t) {
    case DType::F16: use("rf16"); return "rlx_rf16(" + v + ")";
    case DType::BF16: use("rbf16"); return "rlx_rbf16(" + v + ")";
    case DType::I8: return "int(int8_t(" + v + "))";
    case DType::U8: return "((" + v + ") & 255)";
    default: return v;
  }
}

std::string Shader::convert(const std::string& v, DType from, DType to) {
  if (from == to) return v;
  CT f = compute_type(from), t = compute_type(to);
  const bool fl = f == CT::F32 || f == CT::F64;
  std::string e;
  switch (t) {
    case CT::F32: e = f == CT::Bool ? "((" + v + ") ? 1.0 : 0.0)" : "float(" + v + ")"; break;
    case CT::F64: e = f == CT::Bool ? "((" + v + ") ? 1.0lf : 0.0lf)" : "double(" + v + ")"; break;
    case CT::I32:
      e = fl ? "(isnan(" + v + ") ? 0 : int(" + v + "))" : f == CT::Bool ? "((" + v + ") ? 1 : 0)" : "int(" + v + ")";
      break;
    case CT::I64:
      // Widening an int as two halves: llvmpipe 15 miscompiles a sign extension compared with a constant.
      e = fl              ? "(isnan(" + v + ") ? 0l : int64_t(" + v + "))"
          : f == CT::Bool ? "((" + v + ") ? 1l : 0l)"
                          : "packInt2x32(ivec2(" + v + ", (" + v + ") >> 31))";
      break;
    case CT::Bool:
      e = f == CT::F32   ? "!((" + v + ") == 0.0)"
          : f == CT::F64 ? "!((" + v + ") == 0.0lf)"
          : f == CT::I64 ? "((" + v + ") != 0l)"
                         : "((" + v + ") != 0)";
      break;
  }
  return narrow(e, to);
}

std::string Shader::source(std::array<std::uint32_t, 3> local, const std::string& decls,
                           const std::string& main_body) const {
  std::string s =
      "#version 450\n"
      "#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require\n"
      "#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require\n"
      "#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require\n"
      "#extension GL_EXT_shader_8bit_storage : require\n"
      "#extension GL_EXT_shader_16bit_storage : require\n"
      "#extension GL_EXT_control_flow_attributes : enable\n";
  for (const auto& a : arrays_) {
    const std::string name = "m" + a.substr(0, a.find(':'));
    if (main_body.find("atomicAdd(" + name + "_i64") != std::string::npos ||
        main_body.find("atomicCompSwap(" + name + "_u64") != std::string::npos) {
      s += "#extension GL_EXT_shader_atomic_int64 : require\n";
      break;
    }
  }
  s += fmt::format("layout(local_size_x = {}, local_size_y = {}, local_size_z = {}) in;\n", local[0], local[1],
                   local[2]);
  for (const auto& a : arrays_) {
    auto p1 = a.find(':'), p2 = a.find(':', p1 + 1);
    std::string binding = a.substr(0, p1), suffix = a.substr(p1 + 1, p2 - p1 - 1), type = a.substr(p2 + 1);
    // Shaders never write the weights (odd bindings): readonly lets drivers use their read-only load path.
    s += fmt::format("layout(std430, set = 0, binding = {0}) {3}buffer M{0}_{1} {{ {2} m{0}_{1}[]; }};\n", binding,
                     suffix, type, std::stoi(binding) % 2 ? "readonly " : "");
  }
  // Helpers in table order, which lists each helper after those it calls.
  std::set<std::string> want = helpers_;
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& h : helper_table())
      if (want.contains(std::string(h.name)))
        for (auto n : h.needs) grew |= want.insert(std::string(n)).second;
  }
  for (const auto& h : helper_table())
    if (want.contains(std::string(h.name))) s += h.code;
  s += decls;
  s += "void main() {\n" + main_body + "}\n";
  return s;
}

// ---- Emitter ------------------------------------------------------------------

std::string Emitter::value(ir::NodeId id) {
  if (auto it = names_.find(id); it != names_.end()) return it->second;
  const ir::Node& n = body_.node(id);
  std::string name = prefix_ + std::to_string(id);
  std::string expr;
  switch (n.op) {
    case OpKind::Input: {
      expr = sh_.load(sh_.ctx().kernel.input_buffer(n), bcast_index(space_, n.shape.extents()));
      break;
    }
    case OpKind::Constant:
      if (!n.value || n.value->numel() != 1) throw NoShader{"a body constant with several elements"};
      names_[id] = literal(n.value->get(0), n.dtype);
      return names_[id];
    default: {
      std::vector<std::string> args;
      for (auto in : n.inputs) args.push_back(value(in));
      expr = op_expr(n, args);
    }
  }
  code_ += std::string(ct_name(compute_type(n.dtype))) + " " + name + " = " + expr + ";\n";
  names_[id] = name;
  return name;
}

std::string Emitter::op_expr(const ir::Node& n, const std::vector<std::string>& a) {
  const DType t = n.dtype;
  const DType in_t = n.inputs.empty() ? t : body_.node(n.inputs[0]).dtype;
  const CT ct = compute_type(in_t);
  auto call = [&](const char* helper, const std::string& args) {
    sh_.use(helper);
    return "rlx_" + std::string(helper) + "(" + args + ")";
  };
  if (ct == CT::F64 && !sh_.ctx().caps.fp64) throw NoShader{"f64 needs shaderFloat64"};
  auto bin = [&](std::string_view op) { return "(" + a[0] + " " + std::string(op) + " " + a[1] + ")"; };
  std::string e;
  if ((ct == CT::F32 || ct == CT::F64) && ir::op_info(n.op).cls != ir::OpClass::Elementwise) {
    const bool dbl = ct == CT::F64;
    auto K = [&](std::string_view lit) { return std::string(lit) + (dbl ? "lf" : ""); };
    // A transcendental: GLSL's builtin for f32, RLX's own for f64.
    auto F = [&](const char* builtin, const std::string& x) {
      if (!dbl) return std::string(builtin) + "(" + x + ")";
      sh_.use(std::string(builtin) == "sin" || std::string(builtin) == "cos" ? "d_sincos"
                                                                             : "d_" + std::string(builtin));
      return "rlx_" + std::string(builtin) + "(" + x + ")";
    };
    auto H = [&](const char* helper, const std::string& args) {
      sh_.use((dbl ? "d_" : "") + std::string(helper));
      return "rlx_" + std::string(helper) + "(" + args + ")";
    };
    switch (n.op) {
      case OpKind::Neg: e = "(-" + a[0] + ")"; break;
      case OpKind::Abs: e = "abs(" + a[0] + ")"; break;
      case OpKind::Exp: e = F("exp", a[0]); break;
      case OpKind::Log: e = F("log", a[0]); break;
      case OpKind::Sqrt: e = "sqrt(" + a[0] + ")"; break;
      case OpKind::Rsqrt: e = "(" + K("1.0") + " / sqrt(" + a[0] + "))"; break;
      case OpKind::Reciprocal: e = "(" + K("1.0") + " / " + a[0] + ")"; break;
      case OpKind::Tanh: e = H("tanh", a[0]); break;
      // NaN passes through: NVIDIA's compiler turns the plain select into a max that drops it.
      case OpKind::Relu: e = "(isnan(" + a[0] + ") ? " + a[0] + " : max(" + a[0] + ", " + K("0.0") + "))"; break;
      case OpKind::Erf: e = H("erf", a[0]); break;
      case OpKind::Sin: e = F("sin", a[0]); break;
      case OpKind::Cos: e = F("cos", a[0]); break;
      case OpKind::Floor: e = "floor(" + a[0] + ")"; break;
      case OpKind::Ceil: e = "ceil(" + a[0] + ")"; break;
      case OpKind::Round: e = "roundEven(" + a[0] + ")"; break;
      case OpKind::Sign: e = H("sign", a[0]); break;
      case OpKind::Add: e = bin("+"); break;
      case OpKind::Sub: e = bin("-"); break;
      case OpKind::Mul: e = bin("*"); break;
      case OpKind::Div: e = bin("/"); break;
      case OpKind::Pow: e = H("pow", a[0] + ", " + a[1]); break;
      case OpKind::Max: e = H("max", a[0] + ", " + a[1]); break;
      case OpKind::Min: e = H("min", a[0] + ", " + a[1]); break;
      case OpKind::Mod:
        if (!sh_.ctx().caps.fp64) throw NoShader{"float mod needs shaderFloat64"};
        e = H("fmod", a[0] + ", " + a[1]);
        break;
      case OpKind::Eq: e = bin("=="); break;
      case OpKind::Ne: e = "!" + bin("=="); break;
      case OpKind::Lt: e = bin("<"); break;
      case OpKind::Le: e = bin("<="); break;
      case OpKind::Gt: e = bin(">"); break;
      case OpKind::Ge: e = bin(">="); break;
      default: throw NoShader{"no shader for " + std::string(ir::op_name(n.op)) + " on floats"};
    }
  } else if ((ct == CT::I32 || ct == CT::I64) && ir::op_info(n.op).cls != ir::OpClass::Elementwise) {
    const std::string zero = ct == CT::I64 ? "0l" : "0";
    switch (n.op) {
      case OpKind::Neg: e = "(-" + a[0] + ")"; break;
      case OpKind::Abs: e = "abs(" + a[0] + ")"; break;
      case OpKind::Relu: e = "max(" + a[0] + ", " + zero + ")"; break;
      case OpKind::Sign: e = "sign(" + a[0] + ")"; break;
      case OpKind::Floor:
      case OpKind::Ceil:
      case OpKind::Round: e = a[0]; break;
      case OpKind::Add: e = bin("+"); break;
      case OpKind::Sub: e = bin("-"); break;
      case OpKind::Mul: e = bin("*"); break;
      case OpKind::Div: e = call("idiv", a[0] + ", " + a[1]); break;
      case OpKind::Mod: e = call("imod", a[0] + ", " + a[1]); break;
      case OpKind::Pow:
        e = call("ipow", "int64_t(" + a[0] + "), int64_t(" + a[1] + ")");
        if (ct == CT::I32) e = "int(" + e + ")";
        break;
      case OpKind::Max: e = "max(" + a[0] + ", " + a[1] + ")"; break;
      case OpKind::Min: e = "min(" + a[0] + ", " + a[1] + ")"; break;
      case OpKind::Eq: e = bin("=="); break;
      case OpKind::Ne: e = bin("!="); break;
      case OpKind::Lt: e = bin("<"); break;
      case OpKind::Le: e = bin("<="); break;
      case OpKind::Gt: e = bin(">"); break;
      case OpKind::Ge: e = bin(">="); break;
      default: throw NoShader{"no shader for " + std::string(ir::op_name(n.op)) + " on integers"};
    }
  } else if (ct == CT::Bool && ir::op_info(n.op).cls != ir::OpClass::Elementwise) {
    auto as_int = [&](std::size_t i) { return "int(" + a[i] + ")"; };
    switch (n.op) {
      case OpKind::Not: e = "(!" + a[0] + ")"; break;
      case OpKind::And: e = bin("&&"); break;
      case OpKind::Or: e = bin("||"); break;
      case OpKind::Eq: e = bin("=="); break;
      case OpKind::Ne: e = bin("!="); break;
      case OpKind::Lt: e = "(" + as_int(0) + " < " + as_int(1) + ")"; break;
      case OpKind::Le: e = "(" + as_int(0) + " <= " + as_int(1) + ")"; break;
      case OpKind::Gt: e = "(" + as_int(0) + " > " + as_int(1) + ")"; break;
      case OpKind::Ge: e = "(" + as_int(0) + " >= " + as_int(1) + ")"; break;
      case OpKind::Max: e = bin("||"); break;
      case OpKind::Min: e = bin("&&"); break;
      default: throw NoShader{"no shader for " + std::string(ir::op_name(n.op)) + " on bool"};
    }
  } else {
    switch (n.op) {
      case OpKind::Where: return "(" + a[0] + " ? " + a[1] + " : " + a[2] + ")";
      case OpKind::Cast: return sh_.convert(a[0], in_t, t);
      case OpKind::Clamp: {
        double lo = n.attrs.float_or("min", -INFINITY), hi = n.attrs.float_or("max", INFINITY);
        if (ct == CT::F32 || ct == CT::F64) {
          const DType lt = ct == CT::F64 ? DType::F64 : DType::F32;
          // A NaN bound gives NaN (numpy's clip); GLSL's min/max leave NaN operands undefined.
          if (std::isnan(lo) || std::isnan(hi))
            e = "(" + a[0] + " + " + literal(NAN, lt) + ")";
          else
            e = "(isnan(" + a[0] + ") ? " + a[0] + " : min(max(" + a[0] + ", " + literal(lo, lt) + "), " +
                literal(hi, lt) + "))";
          break;
        }
        // trunc(min(max(v, lo), hi)) for an integer v: v < lo exactly when v < ceil(lo), and so on.
        const double big = ct == CT::I64 ? 9.2e18 : 2.1e9;
        const DType lt = ct == CT::I64 ? DType::I64 : DType::I32;
        lo = std::max(lo, -big), hi = std::min(hi, big);
        e = "(" + a[0] + " < " + literal(std::ceil(lo), lt) + " ? " + literal(std::trunc(lo), lt) + " : (" + a[0] +
            " > " + literal(std::floor(hi), lt) + " ? " + literal(std::trunc(hi), lt) + " : " + a[0] + "))";
        break;
      }
      default: throw NoShader{"no shader for " + std::string(ir::op_name(n.op))};
    }
  }
  return ir::is_comparison(n.op) || t == DType::Bool ? e : sh_.narrow(e, t);
}

}  // namespace rlx::backends::vulkan
#endif
