// Binary elementwise ops (NumPy broadcasting, one dtype) and where.
#include <cmath>
#include <limits>
#include <string>

#include "ops/family.hpp"

namespace rlx::ops {

ir::TypeInfo same_dtypes_broadcast(const ir::InferArgs& a, ir::DType* common) {
  const ir::DType x = a.inputs[0].dtype, y = a.inputs[1].dtype;
  a.require(x == y, "operand dtypes differ (" + std::string(ir::dtype_name(x)) + " vs " +
                        std::string(ir::dtype_name(y)) + "); insert a cast");
  *common = x;
  return {x, ir::broadcast_shapes(a.inputs[0].shape, a.inputs[1].shape)};
}

BatchedValue batch_elementwise(const BatchArgs& a) {
  const std::size_t rank = a.n.shape.rank();
  std::vector<NodeId> ins;
  for (std::size_t k = 0; k < a.x.size(); ++k)
    ins.push_back(a.x[k].batched ? ir::align(a.g, a.x[k].id, a.rank(k), rank) : a.x[k].id);
  return BatchArgs::out(a.g.add(a.n.op, std::move(ins), a.n.attrs));
}

namespace {

ir::TypeInfo arithmetic(const ir::InferArgs& a) {
  ir::DType t{};
  ir::TypeInfo r = same_dtypes_broadcast(a, &t);
  a.require(t != ir::DType::Bool, "does not take bool operands");
  return r;
}

ir::TypeInfo comparison(const ir::InferArgs& a) {
  ir::DType t{};
  return {ir::DType::Bool, same_dtypes_broadcast(a, &t).shape};
}

ir::TypeInfo logical(const ir::InferArgs& a) {
  ir::DType t{};
  ir::TypeInfo r = same_dtypes_broadcast(a, &t);
  a.require(t == ir::DType::Bool, "needs bool operands");
  return r;
}

ir::TypeInfo where_infer(const ir::InferArgs& a) {
  a.require(a.inputs[0].dtype == ir::DType::Bool, "condition must be bool");
  a.require(a.inputs[1].dtype == a.inputs[2].dtype, "branch dtypes differ");
  return {a.inputs[1].dtype,
          ir::broadcast_shapes(ir::broadcast_shapes(a.inputs[0].shape, a.inputs[1].shape), a.inputs[2].shape)};
}

// ---- float64 references ----

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A binary op's reference over broadcast operands from its float64 scalar
// function; an integer division, remainder or power has its own, in int64, so
// i64 operands are exact and wrap like hardware.
using Scalar2 = double (*)(double, double);
std::function<F64Value(const ReferenceArgs&)> binary_reference(Scalar2 f, Scalar2 integer = nullptr) {
  return [f, integer](const ReferenceArgs& c) {
    const F64Value &x = c.x(0), &y = c.x(1);
    F64Value r = c.result(broadcast_extents(c, x.ext, y.ext));
    const auto ma = broadcast_map(c, x.ext, r.ext), mb = broadcast_map(c, y.ext, r.ext);
    const Scalar2 op = integer && !ir::is_float(x.dtype) ? integer : f;
    for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = op(x.v[ma[i]], y.v[mb[i]]);
    return r;
  };
}

std::int64_t ipow(std::int64_t base, std::int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e % 2 ? -1 : 1) : 0;  // what 1/base^|e| truncates to
  std::uint64_t r = 1, b = std::uint64_t(base);
  for (; e; e >>= 1, b *= b)
    if (e & 1) r *= b;
  return std::int64_t(r);
}

// Division by zero yields 0, like NumPy; INT64_MIN / -1 wraps.
double int_div(double a, double b) {
  const auto x = std::int64_t(a), y = std::int64_t(b);
  if (y == 0) return 0;
  return double(y == -1 ? std::int64_t(0 - std::uint64_t(x)) : x / y);
}

double int_mod(double a, double b) {
  const auto x = std::int64_t(a), y = std::int64_t(b);
  if (y == 0 || y == -1) return 0;
  const std::int64_t r = x % y;
  return double(r != 0 && (r < 0) != (y < 0) ? r + y : r);
}

// The divisor's sign, like numpy (a zero remainder keeps it too).
double float_mod(double a, double b) {
  const double r = std::fmod(a, b);
  if (r == 0) return std::copysign(0.0, b);
  return (r < 0) != (b < 0) ? r + b : r;
}

F64Value where_reference(const ReferenceArgs& c) {
  const F64Value &cond = c.x(0), &a = c.x(1), &b = c.x(2);
  F64Value r = c.result(broadcast_extents(c, broadcast_extents(c, cond.ext, a.ext), b.ext));
  const auto mc = broadcast_map(c, cond.ext, r.ext), ma = broadcast_map(c, a.ext, r.ext),
             mb = broadcast_map(c, b.ext, r.ext);
  for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = cond.v[mc[i]] != 0 ? a.v[ma[i]] : b.v[mb[i]];
  return r;
}

// ---- partials: v * d y / d operand k, in the broadcast shape ----

using Partial = std::function<NodeId(const DerivativeArgs&, std::size_t, NodeId)>;

// A binary op's partial written over Expr, as f(k, a, b, y, v).
template <class F>
Partial binary_partial(F f) {
  return [f](const DerivativeArgs& s, std::size_t k, NodeId v) {
    return f(k, Expr(s.g, s.x[0]), Expr(s.g, s.x[1]), Expr(s.g, s.y), Expr(s.g, v)).id();
  };
}

Expr zero_like(Expr v) { return v.constant(0); }

// The masks are torch's: b = 0 gives 0 rather than 0 * inf, and so does a = 0
// with b >= 0 rather than 0 * log(0).
Expr pow_partial(std::size_t k, Expr a, Expr b, Expr y, Expr v) {
  if (k == 0) return where(apply(OpKind::Eq, b, b.constant(0)), zero_like(v), v * (b * apply(OpKind::Pow, a, b - 1.0)));
  return where(apply(OpKind::And, apply(OpKind::Eq, a, a.constant(0)), b >= 0.0), zero_like(v), v * (y * log(a)));
}

// A tie splits the derivative evenly, as in torch and JAX.
Partial extreme_partial(bool is_max) {
  return binary_partial([is_max](std::size_t k, Expr a, Expr b, Expr, Expr v) {
    Expr mine = k == 0 ? a : b, other = k == 0 ? b : a;
    Expr tie = where(apply(OpKind::Eq, mine, other), v * 0.5, zero_like(v));
    return where(is_max ? mine > other : mine < other, v, tie);
  });
}

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(binary) {
  using namespace rlx::ops;
  // Comparisons and logical ops have no partial: their bool results carry no derivative.
  auto plain = [](OpKind k, std::string_view doc, Scalar2 f, Scalar2 integer = nullptr, Partial d = {}) {
    const bool cmp = rlx::ir::is_comparison(k), logic = k == OpKind::And || k == OpKind::Or;
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"a", "b"},
                        .infer = cmp     ? comparison
                                 : logic ? logical
                                         : arithmetic,
                        .reference = binary_reference(f, integer),
                        .partial = std::move(d),
                        .vmap = batch_elementwise});
  };
  plain(
      OpKind::Add, "a + b", [](double a, double b) { return a + b; }, nullptr,
      binary_partial([](std::size_t, Expr, Expr, Expr, Expr v) { return v; }));
  plain(
      OpKind::Sub, "a - b", [](double a, double b) { return a - b; }, nullptr,
      binary_partial([](std::size_t k, Expr, Expr, Expr, Expr v) { return k == 0 ? v : -v; }));
  plain(
      OpKind::Mul, "a * b", [](double a, double b) { return a * b; }, nullptr,
      binary_partial([](std::size_t k, Expr a, Expr b, Expr, Expr v) { return v * (k == 0 ? b : a); }));
  plain(
      OpKind::Div, "a / b; integers truncate, x / 0 = 0", [](double a, double b) { return a / b; }, int_div,
      binary_partial([](std::size_t k, Expr, Expr b, Expr y, Expr v) { return k == 0 ? v / b : -((v * y) / b); }));
  plain(
      OpKind::Pow, "a^b", [](double a, double b) { return std::pow(a, b); },
      [](double a, double b) { return double(ipow(std::int64_t(a), std::int64_t(b))); }, binary_partial(pow_partial));
  plain(
      OpKind::Max, "the larger; NaN if either is",
      [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::fmax(a, b); }, nullptr,
      extreme_partial(true));
  plain(
      OpKind::Min, "the smaller; NaN if either is",
      [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::fmin(a, b); }, nullptr,
      extreme_partial(false));
  // a - b floor(a / b)
  plain(OpKind::Mod, "remainder with the divisor's sign, like numpy", float_mod, int_mod,
        binary_partial([](std::size_t k, Expr a, Expr b, Expr, Expr v) {
          return k == 0 ? v : -(v * apply(OpKind::Floor, a / b));
        }));
  plain(OpKind::Eq, "a == b (bool)", [](double a, double b) { return double(a == b); });
  plain(OpKind::Ne, "a != b (bool)", [](double a, double b) { return double(a != b); });
  plain(OpKind::Lt, "a < b (bool)", [](double a, double b) { return double(a < b); });
  plain(OpKind::Le, "a <= b (bool)", [](double a, double b) { return double(a <= b); });
  plain(OpKind::Gt, "a > b (bool)", [](double a, double b) { return double(a > b); });
  plain(OpKind::Ge, "a >= b (bool)", [](double a, double b) { return double(a >= b); });
  plain(OpKind::And, "logical and (bool)", [](double a, double b) { return double(a != 0 && b != 0); });
  plain(OpKind::Or, "logical or (bool)", [](double a, double b) { return double(a != 0 || b != 0); });
  rlx::ir::define_op({.kind = OpKind::Where,
                      .doc = "cond ? a : b",
                      .operands = {"cond", "a", "b"},
                      .selector_operands = {0},
                      .infer = where_infer,
                      .reference = where_reference,
                      // The condition is a selector: autodiff asks only for the branches.
                      .partial =
                          [](const DerivativeArgs& s, std::size_t k, NodeId v) {
                            Expr cond(s.g, s.x[0]), dv(s.g, v);
                            return (k == 1 ? where(cond, dv, dv.constant(0)) : where(cond, dv.constant(0), dv)).id();
                          },
                      .vmap = batch_elementwise});
}
