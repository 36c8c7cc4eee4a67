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

ir::TypeInfo cast_infer(const ir::InferArgs& a) { return {a.attrs.get_dtype("to"), a.inputs[0].shape}; }

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
  auto plain = [](OpKind k, std::string_view doc, double (*f)(double)) {
    rlx::ir::define_op(
        {.kind = k, .doc = doc, .operands = {"x"}, .infer = float_unary, .reference = unary_reference(f)});
  };
  auto numeric = [](OpKind k, std::string_view doc, double (*f)(double)) {
    rlx::ir::define_op(
        {.kind = k, .doc = doc, .operands = {"x"}, .infer = numeric_unary, .reference = unary_reference(f)});
  };
  numeric(OpKind::Neg, "-x", [](double x) { return -x; });
  numeric(OpKind::Abs, "absolute value", [](double x) { return std::fabs(x); });
  plain(OpKind::Exp, "e^x", [](double x) { return std::exp(x); });
  plain(OpKind::Log, "natural logarithm", [](double x) { return std::log(x); });
  plain(OpKind::Sqrt, "square root", [](double x) { return std::sqrt(x); });
  plain(OpKind::Rsqrt, "1 / sqrt(x)", [](double x) { return 1 / std::sqrt(x); });
  plain(OpKind::Reciprocal, "1 / x", [](double x) { return 1 / x; });
  plain(OpKind::Tanh, "hyperbolic tangent", [](double x) { return std::tanh(x); });
  numeric(OpKind::Relu, "max(x, 0), NaN kept", [](double x) { return x < 0 ? 0.0 : x; });
  plain(OpKind::Erf, "error function", [](double x) { return std::erf(x); });
  plain(OpKind::Sin, "sine", [](double x) { return std::sin(x); });
  plain(OpKind::Cos, "cosine", [](double x) { return std::cos(x); });
  numeric(OpKind::Floor, "round down", [](double x) { return std::floor(x); });
  numeric(OpKind::Ceil, "round up", [](double x) { return std::ceil(x); });
  // nearbyint in the default rounding mode: half to even.
  numeric(OpKind::Round, "round half to even", [](double x) { return std::nearbyint(x); });
  numeric(OpKind::Sign, "-1, 0 or 1; NaN kept", [](double x) { return std::isnan(x) ? x : double((x > 0) - (x < 0)); });
  rlx::ir::define_op({.kind = OpKind::Not,
                      .doc = "logical not (bool)",
                      .operands = {"x"},
                      .infer = bool_unary,
                      .reference = unary_reference([](double x) { return x == 0 ? 1.0 : 0.0; })});
  auto formula = [](OpKind k, std::string_view doc, auto f) {
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"x"},
                        .infer = float_unary,
                        .formula = unary_formula(f),
                        .flops_per_element = 8});
  };
  formula(OpKind::Sigmoid, "1 / (1 + e^-x)", [](Expr x) { return sigmoid(x); });
  formula(OpKind::Gelu, "x Phi(x), the erf form", [](Expr x) { return 0.5 * x * (1.0 + erf(x * (1 / sqrt2))); });
  formula(OpKind::GeluTanh, "gelu's tanh approximation",
          [](Expr x) { return 0.5 * x * (1.0 + tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x))); });
  formula(OpKind::Silu, "x sigmoid(x)", [](Expr x) { return x * sigmoid(x); });
  formula(OpKind::Softplus, "log(1 + e^x)", [](Expr x) { return softplus(x); });
  formula(OpKind::Mish, "x tanh(softplus(x))", [](Expr x) { return x * tanh(apply(OpKind::Softplus, x)); });
  // `rlx new-op --builtin NAME` adds a unary op's formula above this line.
  rlx::ir::define_op({.kind = OpKind::Cast,
                      .doc = "convert to dtype `to` (bool: x != 0)",
                      .operands = {"x"},
                      .attrs = {{"to", T::DType, true}},
                      .infer = cast_infer,
                      // The interpreter's rounding of every result to its node's dtype is the cast.
                      .reference = [](const ReferenceArgs& c) { return c.x(0); }});
  rlx::ir::define_op({.kind = OpKind::Clamp,
                      .doc = "numpy's clip: min(max(x, min), max); a NaN bound gives NaN",
                      .operands = {"x"},
                      .attrs = {{"min", T::Float, true}, {"max", T::Float, true}},
                      .infer = clamp_infer,
                      .reference = clamp_reference});
}
