#pragma once
// Float64 values for the op table's reference rules (rlx/ir/op_def.hpp): a
// tensor as row-major extents and doubles, and the indexing helpers every
// reference rule shares. The reference interpreter (rlx/reference/) evaluates a
// graph with them, one op's rule at a time, and rounds each result to the
// node's dtype once.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::ir {

using Extents = std::vector<std::int64_t>;

struct F64Value {
  DType dtype = DType::F64;  // the dtype the value stands for (integer ops follow it)
  Extents ext;
  std::vector<double> v;

  F64Value() = default;
  // Zero-filled; refused before allocating when the doubles would not fit in memory.
  F64Value(DType d, Extents e);
  std::size_t rank() const { return ext.size(); }
};

// What a reference rule sees: the operand values and the node (its attributes,
// its declared type). Errors are plain rlx::Error; the interpreter prefixes the node.
struct ReferenceArgs {
  std::span<const F64Value* const> in;
  const Node& n;

  const F64Value& x(std::size_t i) const { return *in[i]; }
  const Attrs& attrs() const { return n.attrs; }
  [[noreturn]] void fail(const std::string& msg) const;
  // `a` in [-rank, rank), made non-negative.
  std::int64_t axis(std::int64_t a, std::size_t rank) const;
  // The node's declared extents (reshape, expand, iota, random); they must be static.
  Extents declared() const;
  // An Int or Ints attribute as dflt.size() entries: a single entry is
  // repeated, and an absent or empty one gives `dflt`.
  Extents ints_n(std::string_view key, const Extents& dflt) const;
  // An index value wrapped once python-style and range-checked against `extent`.
  std::int64_t index(double raw, std::int64_t extent) const;
  // A result of the node's dtype with extents `e`.
  F64Value result(Extents e) const { return {n.dtype, std::move(e)}; }
};

std::int64_t numel(const Extents& e);
std::string extents_str(const Extents& e);
// NumPy broadcast of two extents; fails naming both.
Extents broadcast_extents(const ReferenceArgs& c, const Extents& a, const Extents& b);
// For every element of `out` (row-major), the offset base + sum(idx[d] * strides[d]).
std::vector<std::int64_t> strided_map(const Extents& out, const Extents& strides, std::int64_t base = 0);
// Offsets into a tensor of extents `in` broadcast to `out`.
std::vector<std::int64_t> broadcast_map(const ReferenceArgs& c, const Extents& in, const Extents& out);
// Calls f(idx, flat) for every index of `ext` in row-major order.
template <class F>
void for_each_index(const Extents& ext, F&& f) {
  const std::int64_t n = numel(ext);
  Extents idx(ext.size(), 0);
  for (std::int64_t flat = 0; flat < n; ++flat) {
    f(static_cast<const Extents&>(idx), flat);
    for (std::size_t d = ext.size(); d-- > 0;) {
      if (++idx[d] < ext[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace rlx::ir
