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

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(unary) {
  using namespace rlx::ops;
  auto plain = [](OpKind k, std::string_view doc) { rlx::ir::define_op({.kind = k, .doc = doc, .operands = {"x"}}); };
  plain(OpKind::Neg, "-x");
  plain(OpKind::Abs, "absolute value");
  plain(OpKind::Exp, "e^x");
  plain(OpKind::Log, "natural logarithm");
  plain(OpKind::Sqrt, "square root");
  plain(OpKind::Rsqrt, "1 / sqrt(x)");
  plain(OpKind::Reciprocal, "1 / x");
  plain(OpKind::Tanh, "hyperbolic tangent");
  plain(OpKind::Relu, "max(x, 0), NaN kept");
  plain(OpKind::Erf, "error function");
  plain(OpKind::Sin, "sine");
  plain(OpKind::Cos, "cosine");
  plain(OpKind::Floor, "round down");
  plain(OpKind::Ceil, "round up");
  plain(OpKind::Round, "round half to even");
  plain(OpKind::Sign, "-1, 0 or 1; NaN kept");
  plain(OpKind::Not, "logical not (bool)");
  auto formula = [](OpKind k, std::string_view doc, auto f) {
    rlx::ir::define_op({.kind = k, .doc = doc, .operands = {"x"}, .formula = unary_formula(f), .flops_per_element = 8});
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
                      .attrs = {{"to", T::DType, true}}});
  rlx::ir::define_op({.kind = OpKind::Clamp,
                      .doc = "numpy's clip: min(max(x, min), max); a NaN bound gives NaN",
                      .operands = {"x"},
                      .attrs = {{"min", T::Float, true}, {"max", T::Float, true}}});
}
