#pragma once
// What the op table's derivative rules (OpDef::partial, vjp, jvp in
// rlx/ir/op_def.hpp) build with: the site being differentiated and the graph
// helpers every rule shares. The sweeps that call them are rlx::autodiff's.
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::ir {

// A (co)tangent; nullopt stands for zero and is never materialized.
using Tangent = std::optional<NodeId>;

// One differentiation site: node `n` of `src`, whose operands and result
// already exist in `g` as `x` and `y`. Shapes are read from `src`, whose
// storage does not move while `g` grows. Rules emit only ops that have rules
// themselves, and comparisons only as where() conditions, so a derivative
// graph can be differentiated again.
struct DerivativeArgs {
  Graph& g;
  const Graph& src;
  const Node& n;
  std::vector<NodeId> x;
  NodeId y;

  const Node& in(std::size_t i) const { return src.node(n.inputs[i]); }
  // A rank-0 constant of the node's dtype (every op that reaches a rule
  // computes in its operands' float dtype, except cast, which needs none).
  NodeId constant(double v) const { return g.scalar(v, n.dtype); }
  // Throws rlx::Error naming the node.
  [[noreturn]] void fail(const std::string& why) const;
};

NodeId zeros(Graph& g, DType t, const Shape& s);
// Sums v over the dims that broadcasting added to reach v's shape from `to`.
NodeId unbroadcast(Graph& g, NodeId v, const Shape& to);
// Broadcasts v up to `to` (tangents of broadcast operands).
NodeId fit(Graph& g, NodeId v, const Shape& to);
// The sum of `terms` fitted to `to`; nullopt (zero) for none.
Tangent sum_terms(Graph& g, std::span<const NodeId> terms, const Shape& to);
// The node's op applied to other operands, with its attributes and result type.
NodeId same_op(const DerivativeArgs& s, std::vector<NodeId> inputs);

}  // namespace rlx::ir
