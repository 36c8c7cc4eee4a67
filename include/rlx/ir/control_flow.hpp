#pragma once
// Control flow: scan, if and while. Their bodies are graphs held as attributes
// (ir::GraphRef: immutable, shared). A body has Input nodes only (no params);
// its inputs and outputs are matched by position.
//
// Nodes have one result each, so an op with several results is several
// sibling nodes, like MLX's sibling arrays: the same op, inputs and
// attributes except `result`, the index of the result the node stands for.
// Evaluators compute a sibling group once (the lowering puts all of them in
// one kernel); an unused result is simply a node that dce drops.
//
//   scan{body, length, num_carries, num_consts=0, reverse=false}(carries..., xs..., consts...)
//     body(carries..., x slices..., consts...) -> (new carries..., y slices...)
//     results: final carries..., ys... (each y stacked along a new axis 0 of extent `length`).
//     Each xs has a leading axis of extent `length`; step t reads xs[t]. With reverse the
//     steps run t = length-1 .. 0 and y from step t still lands at ys[t] (like jax.lax.scan).
//   if{then, else}(cond, operands...)
//     cond is a bool scalar; both bodies take the operands and give results of equal types.
//   while{cond, body, num_carries, max_trip_count?}(carries..., consts...)
//     cond(carries..., consts...) -> bool scalar; body(carries..., consts...) -> new carries.
//     Loops while cond holds, at most max_trip_count times when that is given (>= 0).
//     results: the final carries.
#include <cstdint>
#include <string_view>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::ir {

inline bool is_control_flow(OpKind k) { return op_info(k).cls == OpClass::ControlFlow; }

// Number of results of a control-flow node's op (all its siblings).
std::size_t num_results(const Node& n);
// Whether a and b are results of one control-flow op.
bool are_siblings(const Node& a, const Node& b);
// The node's attributes with `result` set to `k`.
Attrs with_result(const Node& n, std::int64_t k);
// The graph-valued attributes (bodies) of a node, by key.
std::vector<std::pair<std::string_view, const GraphRef*>> bodies_of(const Node& n);

// Builders: each verifies the bodies, adds one sibling node per result and
// returns them in result order. Mistyped bodies throw rlx::Error naming the
// node, the op, the carry (or operand) and both types.
// `length` -1 takes it from xs' leading extent.
std::vector<NodeId> scan(Graph& g, GraphRef body, std::vector<NodeId> init, std::vector<NodeId> xs,
                         std::int64_t length = -1, bool reverse = false, std::vector<NodeId> consts = {});
std::vector<NodeId> if_else(Graph& g, NodeId cond, GraphRef then_body, GraphRef else_body,
                            std::vector<NodeId> operands);
// max_trip_count < 0: unbounded.
std::vector<NodeId> while_loop(Graph& g, GraphRef cond, GraphRef body, std::vector<NodeId> init,
                               std::vector<NodeId> consts = {}, std::int64_t max_trip_count = -1);

// A GraphRef from a graph value (verified).
GraphRef body_ref(Graph body);

}  // namespace rlx::ir
