// ONNX's elementwise ops: unary math and activations (those RLX lacks are decomposed), binary and
// variadic arithmetic, comparisons and logic, Where, Cast, Clip.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"

namespace rlx::onnx::detail {

namespace {

using ir::OpKind;

// A scalar constant of x's dtype.

void unary(Table& t, const char* name, OpKind op) {
  t[name] = {[op](Ctx& c) -> Outs { return {c.g.unary(op, c.in(0))}; }};
}

// f(c, x) -> y, one input, one output.
// A decomposed unary op runs in f32 for f16 and bf16 inputs, rounding once at the end as a fused kernel
// (and ONNX Runtime) would, instead of after every step.
template <class F>
void unary_fn(Table& t, const char* name, F f) {
  t[name] = {[f](Ctx& c) -> Outs {
    const auto dt = c.dtype(0);
    if (dt != ir::DType::F16 && dt != ir::DType::BF16) return {f(c, c.in(0))};
    auto y = f(c, c.g.cast(c.in(0), ir::DType::F32));
    return {c.g.node(y).dtype == ir::DType::F32 ? c.g.cast(y, dt) : y};  // IsNaN, IsInf: bool stays
  }};
}

void binary(Table& t, const char* name, OpKind op) {
  t[name] = {[op](Ctx& c) -> Outs {
    if (c.dtype(0) != c.dtype(1))
      c.fail(fmt::format("the operands' types differ ({} and {})", ir::dtype_name(c.dtype(0)),
                         ir::dtype_name(c.dtype(1))));
    return {c.g.binary(op, c.in(0), c.in(1))};
  }};
}

// Max, Min, Sum, Mean: any number of operands, broadcast together.
void variadic(Table& t, const char* name, OpKind op, bool mean) {
  t[name] = {[op, mean](Ctx& c) -> Outs {
    NodeId acc = c.in(0);
    for (std::size_t i = 1; i < c.num_inputs(); ++i) acc = c.g.binary(op, acc, c.in(i));
    if (mean) acc = c.g.div(acc, k(c, double(c.num_inputs()), acc));
    return {acc};
  }};
}

NodeId is_nan(Ctx& c, NodeId x) { return c.g.binary(OpKind::Ne, x, x); }

// atan without an RLX op: odd symmetry, atan(t) = pi/2 - atan(1/t) past 1, atan(t) = pi/4 + atan((t-1)/(t+1))
// past tan(pi/8), then the Taylor series on [0, tan(pi/8)] (error below 2e-8 with terms to u^15).
NodeId atan(Ctx& c, NodeId x) {
  const double pi = 3.14159265358979323846;
  auto one = k(c, 1, x);
  auto a = c.g.unary(OpKind::Abs, x);
  auto big = c.g.binary(OpKind::Gt, a, one);
  auto t = c.g.where(big, c.g.div(one, a), a);  // in [0, 1]
  auto mid = c.g.binary(OpKind::Gt, t, k(c, 0.41421356237309503, x));
  auto u = c.g.where(mid, c.g.div(c.g.sub(t, one), c.g.add(t, one)), t);
  auto u2 = c.g.mul(u, u);
  // u - u^3/3 + u^5/5 - ... - u^15/15, by Horner's rule in u^2.
  NodeId poly = k(c, -1.0 / 15, x);
  for (int n = 13; n >= 1; n -= 2) poly = c.g.add(c.g.mul(poly, u2), k(c, (n % 4 == 1 ? 1.0 : -1.0) / n, x));
  auto r = c.g.mul(poly, u);
  r = c.g.where(mid, c.g.add(r, k(c, pi / 4, x)), r);
  r = c.g.where(big, c.g.sub(k(c, pi / 2, x), r), r);
  return c.g.mul(r, c.g.unary(OpKind::Sign, x));
}

NodeId asin(Ctx& c, NodeId x) {
  auto d = c.g.unary(OpKind::Sqrt, c.g.sub(k(c, 1, x), c.g.mul(x, x)));
  return atan(c, c.g.div(x, d));
}

// A cast with ONNX's `saturate` (float8, from opset 19) and `round_mode` (float8e8m0, opset 25) when they
// are not the defaults; other casts are plain.
NodeId cast_with_mode(Ctx& c, NodeId x, ir::DType to) {
  if (!ir::is_storage_float(to) || c.g.node(x).dtype == to) return cast_to(c, x, to);
  ir::Attrs a;
  a.set("to", to);
  if (c.attr_int("saturate", 1) == 0) a.set("saturate", false);
  if (const auto mode = c.attr_str("round_mode", "up"); mode != "up") a.set("round_mode", mode);
  return c.g.add(OpKind::Cast, {x}, a);
}

}  // namespace

void register_elementwise(Table& t) {
  unary(t, "Abs", OpKind::Abs);
  unary(t, "Neg", OpKind::Neg);
  unary(t, "Exp", OpKind::Exp);
  unary(t, "Log", OpKind::Log);
  unary(t, "Sqrt", OpKind::Sqrt);
  unary(t, "Reciprocal", OpKind::Reciprocal);
  unary(t, "Tanh", OpKind::Tanh);
  unary(t, "Sigmoid", OpKind::Sigmoid);
  unary(t, "Relu", OpKind::Relu);
  unary(t, "Erf", OpKind::Erf);
  unary(t, "Sin", OpKind::Sin);
  unary(t, "Cos", OpKind::Cos);
  unary(t, "Floor", OpKind::Floor);
  unary(t, "Ceil", OpKind::Ceil);
  unary(t, "Round", OpKind::Round);
  unary(t, "Sign", OpKind::Sign);
  unary(t, "Not", OpKind::Not);
  unary(t, "Softplus", OpKind::Softplus);
  unary(t, "Mish", OpKind::Mish);
  unary_fn(t, "Identity", [](Ctx&, NodeId x) { return x; });
  unary_fn(t, "Tan", [](Ctx& c, NodeId x) { return c.g.div(c.g.unary(OpKind::Sin, x), c.g.unary(OpKind::Cos, x)); });
  unary_fn(t, "Sinh", [](Ctx& c, NodeId x) {
    return c.g.mul(c.g.sub(c.g.exp(x), c.g.exp(c.g.unary(OpKind::Neg, x))), k(c, 0.5, x));
  });
  unary_fn(t, "Cosh", [](Ctx& c, NodeId x) {
    return c.g.mul(c.g.add(c.g.exp(x), c.g.exp(c.g.unary(OpKind::Neg, x))), k(c, 0.5, x));
  });
  unary_fn(t, "Asinh", [](Ctx& c, NodeId x) {
    return c.g.unary(OpKind::Log, c.g.add(x, c.g.unary(OpKind::Sqrt, c.g.add(c.g.mul(x, x), k(c, 1, x)))));
  });
  unary_fn(t, "Acosh", [](Ctx& c, NodeId x) {
    return c.g.unary(OpKind::Log, c.g.add(x, c.g.unary(OpKind::Sqrt, c.g.sub(c.g.mul(x, x), k(c, 1, x)))));
  });
  unary_fn(t, "Atanh", [](Ctx& c, NodeId x) {
    auto one = k(c, 1, x);
    return c.g.mul(c.g.unary(OpKind::Log, c.g.div(c.g.add(one, x), c.g.sub(one, x))), k(c, 0.5, x));
  });
  unary_fn(t, "Softsign", [](Ctx& c, NodeId x) { return c.g.div(x, c.g.add(c.g.unary(OpKind::Abs, x), k(c, 1, x))); });
  unary_fn(t, "Swish", [](Ctx& c, NodeId x) {
    return c.g.mul(x, c.g.unary(OpKind::Sigmoid, c.g.mul(x, k(c, c.attr_float("alpha", 1.0), x))));
  });
  unary_fn(t, "Atan", [](Ctx& c, NodeId x) { return atan(c, x); });
  unary_fn(t, "Asin", [](Ctx& c, NodeId x) { return asin(c, x); });
  unary_fn(t, "Acos", [](Ctx& c, NodeId x) { return c.g.sub(k(c, 3.14159265358979323846 / 2, x), asin(c, x)); });
  unary_fn(t, "IsNaN", [](Ctx& c, NodeId x) { return is_nan(c, x); });
  unary_fn(t, "IsInf", [](Ctx& c, NodeId x) {
    const bool pos = c.attr_int("detect_positive", 1) != 0, neg = c.attr_int("detect_negative", 1) != 0;
    const auto inf = std::numeric_limits<double>::infinity();
    auto p = c.g.binary(OpKind::Eq, x, k(c, inf, x));
    auto n = c.g.binary(OpKind::Eq, x, k(c, -inf, x));
    if (pos && neg) return c.g.binary(OpKind::Or, p, n);
    if (pos) return p;
    if (neg) return n;
    return c.g.binary(OpKind::And, p, n);  // all false
  });
  unary_fn(t, "Elu", [](Ctx& c, NodeId x) {
    const double alpha = c.attr_float("alpha", 1.0);
    auto neg = c.g.mul(c.g.sub(c.g.exp(x), k(c, 1, x)), k(c, alpha, x));
    return c.g.where(c.g.binary(OpKind::Gt, x, k(c, 0, x)), x, neg);
  });
  unary_fn(t, "Celu", [](Ctx& c, NodeId x) {
    const double alpha = c.attr_float("alpha", 1.0);
    auto neg = c.g.mul(c.g.sub(c.g.exp(c.g.div(x, k(c, alpha, x))), k(c, 1, x)), k(c, alpha, x));
    return c.g.add(c.g.relu(x), c.g.binary(OpKind::Min, k(c, 0, x), neg));
  });
  unary_fn(t, "Selu", [](Ctx& c, NodeId x) {
    const double alpha = c.attr_float("alpha", 1.67326319217681884765625);
    const double gamma = c.attr_float("gamma", 1.05070102214813232421875);
    auto neg = c.g.mul(c.g.sub(c.g.exp(x), k(c, 1, x)), k(c, alpha, x));
    return c.g.mul(c.g.where(c.g.binary(OpKind::Gt, x, k(c, 0, x)), x, neg), k(c, gamma, x));
  });
  unary_fn(t, "LeakyRelu", [](Ctx& c, NodeId x) {
    const double alpha = c.attr_float("alpha", 0.01);
    return c.g.where(c.g.binary(OpKind::Ge, x, k(c, 0, x)), x, c.g.mul(x, k(c, alpha, x)));
  });
  unary_fn(t, "ThresholdedRelu", [](Ctx& c, NodeId x) {
    const double alpha = c.attr_float("alpha", 1.0);
    return c.g.where(c.g.binary(OpKind::Gt, x, k(c, alpha, x)), x, k(c, 0, x));
  });
  unary_fn(t, "HardSigmoid", [](Ctx& c, NodeId x) {
    const double alpha = c.attr_float("alpha", 0.2), beta = c.attr_float("beta", 0.5);
    return c.g.clamp(c.g.add(c.g.mul(x, k(c, alpha, x)), k(c, beta, x)), 0, 1);
  });
  unary_fn(t, "HardSwish", [](Ctx& c, NodeId x) {
    return c.g.mul(x, c.g.clamp(c.g.add(c.g.mul(x, k(c, 1.0 / 6, x)), k(c, 0.5, x)), 0, 1));
  });
  unary_fn(t, "Shrink", [](Ctx& c, NodeId x) {
    const double lambd = c.attr_float("lambd", 0.5), bias = c.attr_float("bias", 0.0);
    auto lo = c.g.binary(OpKind::Lt, x, k(c, -lambd, x));
    auto hi = c.g.binary(OpKind::Gt, x, k(c, lambd, x));
    return c.g.where(lo, c.g.add(x, k(c, bias, x)), c.g.where(hi, c.g.sub(x, k(c, bias, x)), k(c, 0, x)));
  });
  unary_fn(t, "Gelu", [](Ctx& c, NodeId x) {
    const auto approx = c.attr_str("approximate", "none");
    if (approx == "tanh") return c.g.unary(OpKind::GeluTanh, x);
    if (approx != "none") c.fail(fmt::format("attribute 'approximate' is '{}', not none or tanh", approx));
    return c.g.unary(OpKind::Gelu, x);
  });
  t["PRelu"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0), slope = c.in(1);
    return {c.g.where(c.g.binary(OpKind::Lt, x, k(c, 0, x)), c.g.mul(x, slope), x)};
  }};

  binary(t, "Add", OpKind::Add);
  binary(t, "Sub", OpKind::Sub);
  binary(t, "Mul", OpKind::Mul);
  binary(t, "Div", OpKind::Div);
  binary(t, "Equal", OpKind::Eq);
  binary(t, "Less", OpKind::Lt);
  binary(t, "LessOrEqual", OpKind::Le);
  binary(t, "Greater", OpKind::Gt);
  binary(t, "GreaterOrEqual", OpKind::Ge);
  binary(t, "And", OpKind::And);
  binary(t, "Or", OpKind::Or);
  binary(t, "Xor", OpKind::Ne);
  variadic(t, "Max", OpKind::Max, false);
  variadic(t, "Min", OpKind::Min, false);
  variadic(t, "Sum", OpKind::Add, false);
  variadic(t, "Mean", OpKind::Add, true);
  t["Pow"] = {[](Ctx& c) -> Outs {
    // The exponent may have its own type; RLX's pow takes one.
    return {c.g.binary(OpKind::Pow, c.in(0), cast_to(c, c.in(1), c.dtype(0)))};
  }};
  t["Mod"] = {[](Ctx& c) -> Outs {
    auto a = c.in(0), b = c.in(1);
    auto r = c.g.binary(OpKind::Mod, a, b);
    if (c.attr_int("fmod", 0) == 0) return {r};
    // fmod: the sign of the dividend. numpy's mod differs from it by b where the signs differ.
    auto zero = k(c, 0, r);
    auto differ = c.g.binary(OpKind::And, c.g.binary(OpKind::Ne, r, zero),
                             c.g.binary(OpKind::Ne, c.g.binary(OpKind::Lt, r, zero), c.g.binary(OpKind::Lt, a, zero)));
    return {c.g.where(differ, c.g.sub(r, b), r)};
  }};
  t["SwiGLU"] = {[](Ctx& c) -> Outs {
    auto a = c.in(0), b = c.in(1);
    const double alpha = c.attr_float("alpha", 1.0);
    auto gate = c.g.mul(a, c.g.unary(OpKind::Sigmoid, c.g.mul(a, k(c, alpha, a))));
    return {c.g.mul(gate, b)};
  }};
  t["BitShift"] = {[](Ctx& c) -> Outs {
    // In int64, where types up to 32 bits cannot overflow: LEFT multiplies by 2^s and wraps to the type,
    // RIGHT divides by 2^s rounding down (an arithmetic shift). Shifts outside [0, width) give 0, or -1
    // for a negative value shifted right, as ONNX's reference.
    const auto dt = c.dtype(0);
    const int width = dt == ir::DType::U8 || dt == ir::DType::I8 ? 8
                      : dt == ir::DType::I16                     ? 16
                      : dt == ir::DType::I32                     ? 32
                      : dt == ir::DType::I64                     ? 64
                                                                 : 0;
    const auto dir = c.attr_str("direction", "");
    if (dir != "LEFT" && dir != "RIGHT") c.fail(fmt::format("direction '{}' is not LEFT or RIGHT", dir));
    if (dt == ir::DType::U16 || dt == ir::DType::U32 || dt == ir::DType::U64) {
      // In the unsigned type itself (u64 has no wider type): a product wraps to it and a quotient is the
      // logical shift.
      const int w = int(ir::dtype_size(dt)) * 8;
      auto x = c.in(0), sh = cast_to(c, c.in(1), dt);
      auto kt = [&](double v) { return c.g.scalar(v, dt); };
      auto valid = c.g.binary(OpKind::Lt, sh, kt(w));
      auto p = c.g.binary(OpKind::Pow, kt(2), c.g.where(valid, sh, kt(0)));
      return {c.g.where(valid, dir == "LEFT" ? c.g.mul(x, p) : c.g.div(x, p), kt(0))};
    }
    if (width == 0)
      c.fail(fmt::format("{} is not supported (uint8, uint16, uint32, uint64, int8, int16, int32, int64)",
                         ir::dtype_name(dt)));
    auto i64 = [&](double v) { return c.g.scalar(v, ir::DType::I64); };
    auto x = c.g.cast(c.in(0), ir::DType::I64), sh = c.g.cast(c.in(1), ir::DType::I64);
    auto valid = c.g.binary(OpKind::And, c.g.binary(OpKind::Ge, sh, i64(0)), c.g.binary(OpKind::Lt, sh, i64(width)));
    auto p = c.g.binary(OpKind::Pow, i64(2), c.g.where(valid, sh, i64(0)));
    NodeId y;
    if (dir == "LEFT") {
      y = c.g.where(valid, c.g.mul(x, p), i64(0));
    } else {
      auto floor_div = c.g.div(c.g.sub(x, c.g.binary(OpKind::Mod, x, p)), p);
      y = c.g.where(valid, floor_div, c.g.where(c.g.binary(OpKind::Lt, x, i64(0)), i64(-1), i64(0)));
    }
    // Wrap to the type's width first: a cast of an out-of-range integer is not defined everywhere. (int64 wraps
    // as it computes; 2^63, a shift of 63, is the one shift whose power it cannot hold.)
    if (width == 64) return {y};
    const double span = double(std::int64_t(1) << width);
    y = c.g.binary(OpKind::Mod, y, i64(span));
    if (ir::is_signed(dt)) y = c.g.where(c.g.binary(OpKind::Ge, y, i64(span / 2)), c.g.sub(y, i64(span)), y);
    return {c.g.cast(y, dt)};
  }};
  t["Where"] = {[](Ctx& c) -> Outs { return {c.g.where(c.in(0), c.in(1), c.in(2))}; }};
  t["Cast"] = {[](Ctx& c) -> Outs {
    const auto to = c.attr_int("to");
    auto dt = dtype_of(to);
    if (!dt) c.fail(fmt::format("attribute 'to' is {}, which RLX has no dtype for", onnx_type_name(to)));
    return {cast_with_mode(c, c.in(0), *dt)};
  }};
  t["CastLike"] = {[](Ctx& c) -> Outs { return {cast_with_mode(c, c.in(0), c.dtype(1))}; }};
  t["Clip"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    if (c.opset() < 11) {
      const double inf = std::numeric_limits<double>::infinity();
      return {c.g.clamp(x, c.attr_float("min", -inf), c.attr_float("max", inf))};
    }
    // min and max are tensors from opset 11; max(min(x)) keeps their run-time values.
    if (c.has(1)) x = c.g.binary(OpKind::Max, x, c.in(1));
    if (c.has(2)) x = c.g.binary(OpKind::Min, x, c.in(2));
    return {x};
  }};
}

}  // namespace rlx::onnx::detail
