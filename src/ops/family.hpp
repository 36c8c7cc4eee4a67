#pragma once
// What every family file under src/ops/ uses to fill the op table
// (rlx/ir/op_def.hpp).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "rlx/ir/op_def.hpp"

namespace rlx::ops {

using ir::AttrSpec;
using ir::Expr;
// The float64 references' value type and helpers (rlx/ir/f64_value.hpp).
using ir::broadcast_extents;
using ir::broadcast_map;
using ir::Extents;
using ir::extents_str;
using ir::F64Value;
using ir::for_each_index;
using ir::numel;
using ir::OpDef;
using ir::OpKind;
using ir::ReferenceArgs;
using ir::strided_map;
// The derivative rules' site and helpers (rlx/ir/derivative.hpp).
using ir::DerivativeArgs;
using ir::fit;
using ir::NodeId;
using ir::same_op;
using ir::sum_terms;
using ir::Tangent;
using ir::unbroadcast;
using ir::zeros;
// The batching rules' arguments (rlx/ir/batching.hpp).
using ir::BatchArgs;
using ir::BatchedValue;

// The batching rule of every elementwise op and matmul: shared operands
// broadcast as they did; batched ones get 1-dims up to the result's rank so
// that the batch axis lines up in front.
BatchedValue batch_elementwise(const BatchArgs& a);
using T = ir::AttrType;
using i64 = std::int64_t;

// Shape rules shared by a family's ops.
ir::TypeInfo float_unary(const ir::InferArgs& a);    // a float operand; the result has its type
ir::TypeInfo numeric_unary(const ir::InferArgs& a);  // any dtype but bool
ir::TypeInfo same_dtypes_broadcast(const ir::InferArgs& a, ir::DType* common);  // the broadcast shape

// The float64 reference of a unary elementwise op from its scalar function.
template <class F>
std::function<F64Value(const ReferenceArgs&)> unary_reference(F f) {
  return [f](const ReferenceArgs& c) {
    const F64Value& x = c.x(0);
    F64Value r = c.result(x.ext);
    for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = f(x.v[i]);
    return r;
  };
}

// Helpers of the derivative rules: axes normalized and sorted; an extent a
// rule needs static (naming what for); the inverse of a permutation.
inline std::vector<i64> normalized_axes(const std::vector<i64>& axes, std::size_t rank) {
  std::vector<i64> out;
  for (auto a : axes) out.push_back(ir::normalize_axis(a, rank));
  std::sort(out.begin(), out.end());
  return out;
}
inline i64 static_extent(const DerivativeArgs& s, const ir::Dim& d, const char* what) {
  if (!d.is_static()) s.fail(std::string("its derivative needs a static ") + what + ", got " + d.str());
  return d.size;
}
inline std::vector<i64> inverse_permutation(const std::vector<i64>& perm) {
  std::vector<i64> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[std::size_t(perm[i])] = i64(i);
  return inv;
}

// A unary op's partial written over Expr, as f(x, y, v) = v * dy/dx with x
// the operand and y the result.
template <class F>
std::function<NodeId(const DerivativeArgs&, std::size_t, NodeId)> unary_partial(F f) {
  return [f](const DerivativeArgs& s, std::size_t, NodeId v) {
    return f(Expr(s.g, s.x[0]), Expr(s.g, s.y), Expr(s.g, v)).id();
  };
}

// An elementwise formula of one operand.
template <class F>
std::function<Expr(std::span<const Expr>)> unary_formula(F f) {
  return [f](std::span<const Expr> x) { return f(x[0]); };
}

}  // namespace rlx::ops

// Registers a family's ops once, when librlx loads (RLX_OP_FAMILY(unary) { define_op(...); ... }).
#define RLX_OP_FAMILY(family)                                                                          \
  static void rlx_define_##family##_ops();                                                             \
  [[maybe_unused]] static const bool rlx_##family##_ops_defined = (rlx_define_##family##_ops(), true); \
  static void rlx_define_##family##_ops()
