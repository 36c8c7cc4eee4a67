#pragma once
// Internals shared by the sweeps (engine.cpp), the dispatch to each op's
// rules in the op table (rules.cpp) and the control-flow rules.
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/ir/derivative.hpp"
#include "rlx/ir/graph.hpp"

namespace rlx::autodiff::detail {

using ir::NodeId;
// A (co)tangent; nullopt stands for zero and is never materialized.
using Maybe = ir::Tangent;

// How a node depends on the differentiated leaves.
enum class Flow : std::uint8_t {
  Inactive,  // not at all (or through a stop_gradient node): a constant
  Active,    // through float values: it has a derivative
  Poisoned,  // only through a non-differentiable op (argmax, comparison, cast to an integer)
};

struct Analysis {
  std::vector<Flow> flow;
  std::vector<NodeId> origin;  // for a Poisoned node: the non-differentiable op it goes back to
};

// Propagates `flow` (set for leaves; other entries are overwritten) forward
// through `g`. Selector operands (where's condition, gather/scatter indices,
// a bool attention mask) carry no derivative and are skipped.
Analysis analyze(const ir::Graph& g, std::vector<Flow> flow, const std::set<NodeId>& stop);

// Sweeps over `src`, whose nodes exist in `g` as map[id]; new nodes go into g.
// reverse: cotangents seeded in `ct` flow back through the nodes with ids in
// [begin, end) (entries of non-leaf nodes are consumed); the whole graph by
// default. forward: tangents seeded on leaves in `t` flow to every node in `needed`.
void reverse(ir::Graph& g, const ir::Graph& src, std::span<const NodeId> map, const Analysis& a, std::vector<Maybe>& ct,
             std::size_t begin = 0, std::size_t end = ~std::size_t{0});
void forward(ir::Graph& g, const ir::Graph& src, std::span<const NodeId> map, const Analysis& a,
             const std::vector<bool>& needed, std::vector<Maybe>& t);
// reverse() over `src` (copied into g with the same ids) with gradient
// checkpointing: the forward segments before the loss's are recomputed,
// each right before its backward part (checkpoint.cpp).
void checkpointed_reverse(ir::Graph& g, const ir::Graph& src, const Analysis& a, std::vector<Maybe>& ct,
                          const Checkpoint& cp, NodeId loss);
// Nodes that `roots` depend on through non-selector operands.
std::vector<bool> needed_for(const ir::Graph& g, std::span<const NodeId> roots);

// One differentiation site (the op table's derivative rules take it).
using Site = ir::DerivativeArgs;

// Cotangents of n's operands given its result's cotangent; operands not in
// `want` may get nullopt.
std::vector<Maybe> vjp_rule(const Site& s, NodeId ct, const std::vector<bool>& want);
// The tangent of n's result given its operands' tangents.
Maybe jvp_rule(const Site& s, std::span<const Maybe> t);

// The rules' helpers (rlx/ir/derivative.hpp).
using ir::fit;
using ir::same_op;
using ir::unbroadcast;
using ir::zeros;

// The composite rule of last resort: the node's decomposition into
// primitives (rlx::compile::passes::decompose) is inlined into g and
// differentiated.
std::vector<Maybe> vjp_decomposed(const Site& s, NodeId ct, const std::vector<bool>& want);
Maybe jvp_decomposed(const Site& s, std::span<const Maybe> t);

}  // namespace rlx::autodiff::detail
