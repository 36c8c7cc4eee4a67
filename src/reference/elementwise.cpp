// Unary, binary, where, cast and clamp. Ops with a formula in the op table
// (sigmoid, gelu, silu, softplus, ...) are evaluated from it (eval_formula).
#include <cmath>
#include <limits>

#include "reference/value.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::reference::detail {
namespace {

using ir::OpKind;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double unary(OpKind op, double x) {
  switch (op) {
    case OpKind::Neg: return -x;
    case OpKind::Abs: return std::fabs(x);
    case OpKind::Exp: return std::exp(x);
    case OpKind::Log: return std::log(x);
    case OpKind::Sqrt: return std::sqrt(x);
    case OpKind::Rsqrt: return 1 / std::sqrt(x);
    case OpKind::Reciprocal: return 1 / x;
    case OpKind::Tanh: return std::tanh(x);
    case OpKind::Relu: return x < 0 ? 0.0 : x;  // keeps NaN
    case OpKind::Erf: return std::erf(x);
    case OpKind::Sin: return std::sin(x);
    case OpKind::Cos: return std::cos(x);
    case OpKind::Floor: return std::floor(x);
    case OpKind::Ceil: return std::ceil(x);
    case OpKind::Round: return std::nearbyint(x);  // default rounding mode: half to even
    case OpKind::Sign: return std::isnan(x) ? x : double((x > 0) - (x < 0));
    case OpKind::Not: return x == 0 ? 1.0 : 0.0;
    default: return kNaN;
  }
}

// Integer ops run in int64 so i64 operands are exact and wrap like hardware.
std::int64_t ipow(std::int64_t base, std::int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e % 2 ? -1 : 1) : 0;  // what 1/base^|e| truncates to
  std::uint64_t r = 1, b = std::uint64_t(base);
  for (; e; e >>= 1, b *= b)
    if (e & 1) r *= b;
  return std::int64_t(r);
}

double int_binary(OpKind op, double a, double b) {
  auto x = std::int64_t(a), y = std::int64_t(b);
  switch (op) {
    case OpKind::Div: {  // division by zero yields 0, like NumPy; INT64_MIN / -1 wraps
      if (y == 0) return 0;
      std::int64_t q = y == -1 ? std::int64_t(0 - std::uint64_t(x)) : x / y;
      return double(q);
    }
    case OpKind::Mod: {
      if (y == 0 || y == -1) return 0;
      std::int64_t r = x % y;
      return double(r != 0 && (r < 0) != (y < 0) ? r + y : r);
    }
    case OpKind::Pow: return double(ipow(x, y));
    default: return kNaN;
  }
}

double binary(OpKind op, double a, double b) {
  switch (op) {
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Pow: return std::pow(a, b);
    case OpKind::Max: return std::isnan(a) || std::isnan(b) ? kNaN : std::fmax(a, b);
    case OpKind::Min: return std::isnan(a) || std::isnan(b) ? kNaN : std::fmin(a, b);
    case OpKind::Mod: {
      double r = std::fmod(a, b);
      if (r == 0) return std::copysign(0.0, b);
      return (r < 0) != (b < 0) ? r + b : r;
    }
    case OpKind::Eq: return a == b;
    case OpKind::Ne: return a != b;
    case OpKind::Lt: return a < b;
    case OpKind::Le: return a <= b;
    case OpKind::Gt: return a > b;
    case OpKind::Ge: return a >= b;
    case OpKind::And: return a != 0 && b != 0;
    case OpKind::Or: return a != 0 || b != 0;
    default: return kNaN;
  }
}

}  // namespace

Value eval_elementwise(const Ctx& c) {
  const OpKind op = c.n.op;
  const Value& x = c.x(0);
  switch (ir::op_info(op).cls) {
    case ir::OpClass::Unary: {
      Value r(c.n.dtype, x.ext);
      for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = unary(op, x.v[i]);
      return r;
    }
    case ir::OpClass::Binary: {
      const Value& y = c.x(1);
      Value r(c.n.dtype, broadcast_ext(c, x.ext, y.ext));
      auto ma = broadcast_map(c, x.ext, r.ext), mb = broadcast_map(c, y.ext, r.ext);
      bool integral = !ir::is_float(x.dtype) && (op == OpKind::Div || op == OpKind::Mod || op == OpKind::Pow);
      for (std::size_t i = 0; i < r.v.size(); ++i)
        r.v[i] = integral ? int_binary(op, x.v[ma[i]], y.v[mb[i]]) : binary(op, x.v[ma[i]], y.v[mb[i]]);
      return r;
    }
    default: break;
  }
  switch (op) {
    case OpKind::Where: {
      const Value &a = c.x(1), &b = c.x(2);
      Value r(c.n.dtype, broadcast_ext(c, broadcast_ext(c, x.ext, a.ext), b.ext));
      auto mc = broadcast_map(c, x.ext, r.ext), ma = broadcast_map(c, a.ext, r.ext),
           mb = broadcast_map(c, b.ext, r.ext);
      for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = x.v[mc[i]] != 0 ? a.v[ma[i]] : b.v[mb[i]];
      return r;
    }
    case OpKind::Cast: return x;  // the dispatcher's rounding to the node dtype is the cast
    case OpKind::Clamp: {
      double lo = c.attrs().float_or("min", -INFINITY), hi = c.attrs().float_or("max", INFINITY);
      Value r = x;
      // numpy's clip: a NaN bound makes every element NaN, a NaN element stays NaN.
      const bool nan_bound = std::isnan(lo) || std::isnan(hi);
      for (auto& v : r.v) v = nan_bound ? NAN : std::isnan(v) ? v : std::fmin(std::fmax(v, lo), hi);
      return r;
    }
    default: c.fail("not an elementwise op");
  }
}

// The formula built over float64 operands of the values' extents, and each of
// its nodes evaluated in turn: no rounding until the dispatcher's, once.
Value eval_formula(const Ctx& c) {
  ir::Graph one(std::string(ir::op_name(c.n.op)) + " formula");
  std::vector<ir::NodeId> ins;
  for (std::size_t i = 0; i < c.in.size(); ++i)
    ins.push_back(one.input("x" + std::to_string(i), ir::Shape(c.x(i).ext), ir::DType::F64));
  ir::Node wide = c.n;
  wide.dtype = ir::DType::F64;
  const ir::NodeId result = ir::expand_op(one, wide, ins);
  std::vector<Value> vals(one.size());
  std::vector<const Value*> args;
  for (const ir::Node& m : one.nodes()) {
    if (m.id > result) break;
    if (m.op == OpKind::Input) {
      vals[m.id] = c.x(m.id);  // the formula's operands come first
      continue;
    }
    args.clear();
    for (auto in : m.inputs) args.push_back(&vals[in]);
    vals[m.id] = evaluate(Ctx{one, m, args});
  }
  return std::move(vals[result]);
}

Value eval_table_reference(const Ctx& c) {
  const std::vector<const ir::F64Value*> in(c.in.begin(), c.in.end());
  Value r;
  static_cast<ir::F64Value&>(r) = ir::op_def(c.n.op).reference(in, c.n);
  r.dtype = c.n.dtype;
  if (r.v.size() != std::size_t(numel(r.ext))) c.fail("the op table's reference returned a wrong element count");
  return r;
}

}  // namespace rlx::reference::detail
