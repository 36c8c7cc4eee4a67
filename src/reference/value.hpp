#pragma once
// Internals of the reference interpreter. Every value is held as doubles with
// its extents; kernels compute in double and the dispatcher rounds the result
// to the node's dtype once, so a composite rounds exactly once like a fused
// backend kernel would.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::reference::detail {

using Ext = std::vector<std::int64_t>;

std::int64_t numel(const Ext& e);

// The element count, refused before allocation when the float64 values would not fit in memory.
inline std::size_t checked_size(const Ext& e) {
  const std::int64_t n = numel(e);
  ir::limits::check_allocation(n * 8, "a float64 reference value");
  return std::size_t(n);
}

// The extents and elements are an ir::F64Value, so an op table's reference rule reads it in place.
struct Value : ir::F64Value {
  ir::DType dtype = ir::DType::F64;

  Value() = default;
  Value(ir::DType d, Ext e) : ir::F64Value{std::move(e), {}}, dtype(d) { v.assign(checked_size(ext), 0.0); }
  std::size_t rank() const { return ext.size(); }
};

// The node being evaluated with its input values; errors carry the node's description.
struct Ctx {
  const ir::Graph& g;
  const ir::Node& n;
  std::span<const Value* const> in;

  const Value& x(std::size_t i) const { return *in[i]; }
  const ir::Attrs& attrs() const { return n.attrs; }
  [[noreturn]] void fail(const std::string& msg) const;
  std::int64_t axis(std::int64_t a, std::size_t rank) const;
  // Extents of the node's declared shape (reshape, expand, iota, random).
  Ext declared() const;
  // An Int or Ints attribute as a list of dflt.size() entries: a single entry
  // is repeated, and an absent or empty one gives `dflt`.
  Ext ints_n(std::string_view key, const Ext& dflt) const;
  // An index value wrapped once python-style and range-checked against `extent`.
  std::int64_t index(double raw, std::int64_t extent) const;
};

std::string ext_str(const Ext& e);
// NumPy broadcast of two extents; fails naming both.
Ext broadcast_ext(const Ctx& c, const Ext& a, const Ext& b);
// For every element of `out` (row-major), the offset base + sum(idx[d] * strides[d]).
std::vector<std::int64_t> strided_map(const Ext& out, const Ext& strides, std::int64_t base = 0);
// Offsets into a tensor of extents `in` broadcast to `out`.
std::vector<std::int64_t> broadcast_map(const Ctx& c, const Ext& in, const Ext& out);
// Calls f(idx, flat) for every index of `ext` in row-major order.
template <class F>
void for_each_index(const Ext& ext, F&& f) {
  std::int64_t n = numel(ext);
  Ext idx(ext.size(), 0);
  for (std::int64_t flat = 0; flat < n; ++flat) {
    f(static_cast<const Ext&>(idx), flat);
    for (std::size_t d = ext.size(); d-- > 0;) {
      if (++idx[d] < ext[d]) break;
      idx[d] = 0;
    }
  }
}

Value eval_custom(const Ctx& c);           // through the extension's lowering or reference
Value eval_control_flow(const Ctx& c);     // scan, if, while: bodies run through the reference
Value eval_elementwise(const Ctx& c);      // unary, binary, where, cast, clamp
Value evaluate(const Ctx& c);              // one node, rounded to its dtype (interpreter.cpp)
Value eval_formula(const Ctx& c);          // an op's formula from the op table, in float64
Value eval_table_reference(const Ctx& c);  // an op's reference rule from the op table
Value eval_reduce(const Ctx& c);           // reduce_*, argmax, argmin
Value eval_movement(const Ctx& c);         // reshape ... flip
Value eval_nn(const Ctx& c);               // matmul and the HIR composites
Value matmul(const Ctx& c, const Value& a, const Value& b);

}  // namespace rlx::reference::detail
