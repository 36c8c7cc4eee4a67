// Unary elementwise ops, and cast and clamp. The ops with a formula have no
// code of their own in any generator: they decompose into it unless a backend
// has a kernel for them (the CPU's SIMD kernels for sigmoid, gelu, silu and
// softplus, checked against the formula by the conformance suite).
#include "ops/family.hpp"

namespace rlx::ops {
namespace {

using std::numbers::pi;
using std::numbers::sqrt2;

// 1 / (1 + e^-x) with one exp of -|x|, accurate in both tails.
Expr sigmoid(Expr x) {
  Expr t = exp(-abs(x));
  Expr r = 1.0 / (1.0 + t);
  return where(x >= 0.0, r, t * r);
}

Expr softplus(Expr x) { return max(x, 0.0) + log1p(exp(-abs(x))); }

ir::TypeInfo bool_unary(const ir::InferArgs& a) {
  a.require(a.inputs[0].dtype == ir::DType::Bool, "needs a bool input");
  return a.inputs[0];
}

bool from_float(ir::DType t) { return ir::is_float(t) || ir::is_storage_float(t); }

// A float cast to int4, uint4, int2 or uint2 as ml_dtypes (and so ONNX's reference) casts it: truncated, and 0
// when that is outside the type (NaN too), where an integer source wraps. The CPU's Narrow does the same
// (backends/cpu/isa/elementwise_impl.inc).
double float_to_small_int(double v, ir::DType t) {
  const auto [lo, hi] = ir::integer_range(t);
  const double w = std::trunc(v);
  return w >= lo && w <= hi ? w : 0.0;
}

ir::TypeInfo cast_infer(const ir::InferArgs& a) {
  const ir::DType to = a.attrs.get_dtype("to");
  a.require(!ir::is_block_quantized(to),
            "cannot cast to " + std::string(ir::dtype_name(to)) + ", a block-quantized type: use quantize");
  if (a.attrs.has("round_mode")) (void)ir::parse_e8m0_round(a.attrs.get_str("round_mode"));
  return {to, a.inputs[0].shape};
}

ir::TypeInfo clamp_infer(const ir::InferArgs& a) {
  a.require(a.inputs[0].dtype != ir::DType::Bool, "does not take bool");
  // A NaN bound makes a float result NaN (numpy's clip); an integer result has no NaN.
  a.require(ir::is_float(a.inputs[0].dtype) ||
                (!std::isnan(a.attrs.get_float("min")) && !std::isnan(a.attrs.get_float("max"))),
            "a NaN bound needs a float input (the result would be NaN)");
  return a.inputs[0];
}

// numpy's clip: a NaN bound makes every element NaN, a NaN element stays NaN.
F64Value clamp_reference(const ReferenceArgs& c) {
  const double lo = c.attrs().get_float("min"), hi = c.attrs().get_float("max");
  F64Value r = c.x(0);
  const bool nan_bound = std::isnan(lo) || std::isnan(hi);
  for (auto& v : r.v) v = nan_bound ? NAN : std::isnan(v) ? v : std::fmin(std::fmax(v, lo), hi);
  return r;
}

// Inside [min, max] (inclusive, like torch) the derivative is 1, else 0.
NodeId clamp_partial(const DerivativeArgs& s, std::size_t, NodeId v) {
  Expr x(s.g, s.x[0]), dv(s.g, v);
  Expr inside = apply(OpKind::And, x >= s.n.attrs.get_float("min"), x <= s.n.attrs.get_float("max"));
  return where(inside, dv, dv.constant(0)).id();
}

}  // namespace

ir::TypeInfo numeric_unary(const ir::InferArgs& a) {
  a.require(a.inputs[0].dtype != ir::DType::Bool, "does not take bool (cast first)");
  return a.inputs[0];
}

ir::TypeInfo float_unary(const ir::InferArgs& a) {
  numeric_unary(a);
  a.require(ir::is_float(a.inputs[0].dtype), "needs a float input");
  return a.inputs[0];
}

}  // namespace rlx::ops

RLX_OP_FAMILY(unary) {
  using namespace rlx::ops;
  // Float operands only, or (numeric) integers too; each with its float64 scalar function.
  // floor, ceil, round and sign have no partial: autodiff takes their derivative as zero.
  using Partial = std::function<NodeId(const DerivativeArgs&, std::size_t, NodeId)>;
  auto plain = [](OpKind k, std::string_view doc, double (*f)(double), Partial d = {}) {
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"x"},
                        .infer = float_unary,
                        .reference = unary_reference(f),
                        .partial = std::move(d),
                        .vmap = batch_elementwise});
  };
  auto numeric = [](OpKind k, std::string_view doc, double (*f)(double), Partial d = {}) {
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"x"},
                        .infer = numeric_unary,
                        .reference = unary_reference(f),
                        .partial = std::move(d),
                        .vmap = batch_elementwise});
  };
  numeric(
      OpKind::Neg, "-x", [](double x) { return -x; }, unary_partial([](Expr, Expr, Expr v) { return -v; }));
  numeric(
      OpKind::Abs, "absolute value", [](double x) { return std::fabs(x); },
      unary_partial([](Expr x, Expr, Expr v) { return v * apply(OpKind::Sign, x); }));  // 0 at 0, like torch
  plain(
      OpKind::Exp, "e^x", [](double x) { return std::exp(x); },
      unary_partial([](Expr, Expr y, Expr v) { return v * y; }));
  plain(
      OpKind::Log, "natural logarithm", [](double x) { return std::log(x); },
      unary_partial([](Expr x, Expr, Expr v) { return v / x; }));
  plain(
      OpKind::Sqrt, "square root", [](double x) { return std::sqrt(x); },
      unary_partial([](Expr, Expr y, Expr v) { return v * 0.5 / y; }));
  plain(
      OpKind::Rsqrt, "1 / sqrt(x)", [](double x) { return 1 / std::sqrt(x); },
      unary_partial([](Expr, Expr y, Expr v) { return v * (-0.5 * (y * (y * y))); }));
  plain(
      OpKind::Reciprocal, "1 / x", [](double x) { return 1 / x; },
      unary_partial([](Expr, Expr y, Expr v) { return -(v * (y * y)); }));
  plain(
      OpKind::Tanh, "hyperbolic tangent", [](double x) { return std::tanh(x); },
      unary_partial([](Expr, Expr y, Expr v) { return v * (1.0 - y * y); }));
  numeric(
      OpKind::Relu, "max(x, 0), NaN kept", [](double x) { return x < 0 ? 0.0 : x; },
      unary_partial([](Expr x, Expr, Expr v) { return where(x > 0.0, v, v.constant(0)); }));
  plain(
      OpKind::Erf, "error function", [](double x) { return std::erf(x); },
      unary_partial([](Expr x, Expr, Expr v) { return v * (2 * std::numbers::inv_sqrtpi * exp(-(x * x))); }));
  plain(
      OpKind::Sin, "sine", [](double x) { return std::sin(x); },
      unary_partial([](Expr x, Expr, Expr v) { return v * apply(OpKind::Cos, x); }));
  plain(
      OpKind::Cos, "cosine", [](double x) { return std::cos(x); },
      unary_partial([](Expr x, Expr, Expr v) { return -(v * apply(OpKind::Sin, x)); }));
  numeric(OpKind::Floor, "round down", [](double x) { return std::floor(x); });
  numeric(OpKind::Ceil, "round up", [](double x) { return std::ceil(x); });
  // nearbyint in the default rounding mode: half to even.
  numeric(OpKind::Round, "round half to even", [](double x) { return std::nearbyint(x); });
  numeric(OpKind::Sign, "-1, 0 or 1; NaN kept", [](double x) { return std::isnan(x) ? x : double((x > 0) - (x < 0)); });
  rlx::ir::define_op({.kind = OpKind::Not,
                      .doc = "logical not (bool)",
                      .operands = {"x"},
                      .infer = bool_unary,
                      .reference = unary_reference([](double x) { return x == 0 ? 1.0 : 0.0; }),
                      .vmap = batch_elementwise});
  // A hand derivative, where given, is a shorter graph than the formula's own.
  auto formula = [](OpKind k, std::string_view doc, auto f, const Partial& d = {}) {
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"x"},
                        .infer = float_unary,
                        .formula = unary_formula(f),
                        .partial = d,
                        .vmap = batch_elementwise,
                        .flops_per_element = 8});
  };
  formula(
      OpKind::Sigmoid, "1 / (1 + e^-x)", [](Expr x) { return sigmoid(x); },
      unary_partial([](Expr, Expr y, Expr v) { return v * (y * (1.0 - y)); }));
  formula(
      OpKind::Gelu, "x Phi(x), the erf form", [](Expr x) { return 0.5 * x * (1.0 + erf(x * (1 / sqrt2))); },
      unary_partial([](Expr x, Expr, Expr v) {  // Phi(x) + x phi(x)
        Expr cdf = 0.5 * (1.0 + erf(x * (1 / sqrt2)));
        Expr pdf = 0.5 * sqrt2 * std::numbers::inv_sqrtpi * exp(-0.5 * (x * x));
        return v * (cdf + x * pdf);
      }));
  formula(
      OpKind::GeluTanh, "gelu's tanh approximation",
      [](Expr x) { return 0.5 * x * (1.0 + tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x))); },
      unary_partial([](Expr x, Expr, Expr v) {  // 0.5 (1 + th) + 0.5 x (1 - th^2) u'(x), th = tanh(u(x))
        const double a = std::sqrt(2 / pi), b = 0.044715;
        Expr x2 = x * x;
        Expr th = tanh(a * (x + b * (x * x2)));
        Expr du = a * (1.0 + 3 * b * x2);
        return v * (0.5 * (1.0 + th) + (0.5 * x) * ((1.0 - th * th) * du));
      }));
  formula(
      OpKind::Silu, "x sigmoid(x)", [](Expr x) { return x * sigmoid(x); }, unary_partial([](Expr x, Expr, Expr v) {
        Expr sg = apply(OpKind::Sigmoid, x);
        return v * (sg * (1.0 + x * (1.0 - sg)));
      }));
  formula(
      OpKind::Softplus, "log(1 + e^x)", [](Expr x) { return softplus(x); },
      unary_partial([](Expr x, Expr, Expr v) { return v * apply(OpKind::Sigmoid, x); }));
  formula(OpKind::Mish, "x tanh(softplus(x))", [](Expr x) { return x * tanh(apply(OpKind::Softplus, x)); });
  // `rlx new-op --builtin NAME` adds a unary op's formula above this line.
  rlx::ir::define_op(
      {.kind = OpKind::Cast,
       .doc =
           "convert to dtype `to` (bool: x != 0; float8 saturates unless saturate=false; e8m0 rounds by `round_mode`)",
       .operands = {"x"},
       .storage_operands = {0},
       .storage = rlx::ir::StorageKind::Element,
       // ONNX's Cast attributes, for the storage-only floats (rlx::ir::cast_mode): absent, a cast
       // saturates float8 and rounds float8e8m0 up, so other casts print as they always did.
       .attrs = {{"to", T::DType, true}, {"saturate", T::Bool, false}, {"round_mode", T::String, false}},
       .infer = cast_infer,
       // The interpreter's rounding of every result to its node's dtype is the cast, except where
       // the cast's mode rounds a storage-only float otherwise (that rounding then keeps it).
       .reference =
           [](const ReferenceArgs& c) {
             F64Value r = c.x(0);
             if (rlx::ir::is_storage_float(c.n.dtype)) {
               const rlx::ir::CastMode m = rlx::ir::cast_mode(c.attrs());
               for (auto& v : r.v) v = rlx::ir::round_to_dtype(v, c.n.dtype, m);
             } else if (rlx::ir::is_storage_only(c.n.dtype) && from_float(c.x(0).dtype)) {
               for (auto& v : r.v) v = float_to_small_int(v, c.n.dtype);
             }
             return r;
           },
       .vjp = [](const DerivativeArgs& s, NodeId ct, const std::vector<bool>&) -> std::vector<Tangent> {
         return {s.g.cast(ct, s.in(0).dtype)};
       },
       .jvp = [](const DerivativeArgs& s, std::span<const Tangent> t) -> Tangent {
         if (!t[0]) return std::nullopt;
         return s.g.cast(*t[0], s.n.dtype);
       },
       .vmap = batch_elementwise});
  rlx::ir::define_op({.kind = OpKind::Clamp,
                      .doc = "numpy's clip: min(max(x, min), max); a NaN bound gives NaN",
                      .operands = {"x"},
                      .attrs = {{"min", T::Float, true}, {"max", T::Float, true}},
                      .infer = clamp_infer,
                      .reference = clamp_reference,
                      .partial = clamp_partial,
                      .vmap = batch_elementwise});
}
