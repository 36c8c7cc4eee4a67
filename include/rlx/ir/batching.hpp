#pragma once
// What the op table's batching rules (OpDef::vmap in rlx/ir/op_def.hpp) build
// with: the node being batched, its operands in the batched graph and the
// helpers every rule shares. rlx::autodiff's vmap calls them.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::ir {

// A value of the batched graph: a batched one carries the batch axis first
// ([B] + its shape in the source); a shared one is the same for every example.
struct BatchedValue {
  NodeId id;
  bool batched;
};

Shape prepend(Dim d, const Shape& s);
// A copy of n's attributes with `key` set to `v`.
Attrs with_attr(const Node& n, const std::string& key, AttrValue v);
// `axes` (normalized against `rank`) moved one place right, past the batch axis.
std::vector<std::int64_t> shifted_axes(const std::vector<std::int64_t>& axes, std::size_t rank);
// v with the batch axis in front, broadcast to `size` if it is shared (its source shape is `s`).
NodeId lift(Graph& g, const BatchedValue& v, const Shape& s, const Dim& size);
// A batched value whose source rank is `rank`, with 1-dims after the batch axis
// up to rank `to`, so that it broadcasts like the source did.
NodeId align(Graph& g, NodeId id, std::size_t rank, std::size_t to);

// One node to batch: node `n` of `src`, some of whose operands `x` (in `g`)
// are batched. A rule returns the node's batched value.
struct BatchArgs {
  Graph& g;
  const Graph& src;
  const Node& n;
  std::span<const BatchedValue> x;
  const Dim& size;  // the batch size
  // The general routes, from vmap itself: the node batched through its
  // decomposition, and an op over an axis of rank-0 operands batched as a row of one.
  std::function<BatchedValue()> decomposed;
  std::function<BatchedValue()> scalar_as_row;

  const Shape& shape(std::size_t k) const { return src.node(n.inputs[k]).shape; }
  std::size_t rank(std::size_t k) const { return shape(k).rank(); }
  NodeId lifted(std::size_t k) const { return lift(g, x[k], shape(k), size); }
  // The node's "axis", normalized against operand k, past the batch axis.
  std::int64_t axis1(std::size_t k) const { return normalize_axis(n.attrs.get_int("axis"), rank(k)) + 1; }
  static BatchedValue out(NodeId id) { return {id, true}; }
  // The node's op with the node's result type, batched.
  BatchedValue declared(OpKind op, std::vector<NodeId> ins, Attrs a) const;
  bool only_first_batched() const;
  std::vector<NodeId> ids() const;
  std::int64_t static_size(const char* why) const;
  // [B, d0, d1, ...] <-> [B * d0, d1, ...]: ops whose rank is fixed (conv,
  // pooling, attention) see the batch as more of their own batch dim.
  NodeId merge(NodeId id) const;
  NodeId split(NodeId id) const;
  bool mergeable() const { return size.is_static() && shape(0)[0].is_static(); }
};

}  // namespace rlx::ir
