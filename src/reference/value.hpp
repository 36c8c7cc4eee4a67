#pragma once
// Internals of the reference interpreter. Every value is held as doubles with
// its extents (ir::F64Value); each op's rule (its op table entry's reference)
// computes in double and the dispatcher rounds the result to the node's dtype
// once, so a composite rounds exactly once like a fused backend kernel would.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/f64_value.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::reference::detail {

using Ext = ir::Extents;
using Value = ir::F64Value;
using ir::extents_str;
using ir::for_each_index;
using ir::numel;

// The node being evaluated with its input values (an op table reference
// rule's arguments) and its graph; errors carry the node's description.
struct Ctx : ir::ReferenceArgs {
  const ir::Graph& g;

  Ctx(const ir::Graph& graph, const ir::Node& node, std::span<const Value* const> values)
      : ir::ReferenceArgs{values, node}, g(graph) {}
  [[noreturn]] void fail(const std::string& msg) const;
};

Value evaluate(const Ctx& c);           // one node, rounded to its dtype (interpreter.cpp)
Value eval_custom(const Ctx& c);        // through the extension's lowering or reference
Value eval_control_flow(const Ctx& c);  // scan, if, while: bodies run through the reference
Value eval_formula(const Ctx& c);       // an op's formula from the op table, in float64

}  // namespace rlx::reference::detail
