#pragma once
// The reference interpreter: the oracle for every test. It runs any HIR or
// MIR graph (composites directly, not via their decomposition) in float64,
// rounding each node's result to its dtype so storage rounding matches what a
// backend produces. Slow on purpose: clarity over speed.
#include <map>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::reference {

using TensorMap = std::map<std::string, ir::Tensor, std::less<>>;

// Evaluates the graph's outputs. `inputs` and `params` are keyed by name;
// a missing or mis-shaped one throws rlx::Error.
std::vector<ir::Tensor> run(const ir::Graph& g, const TensorMap& inputs, const TensorMap& params = {});
// Evaluates one node given its input values (used by const_fold).
ir::Tensor eval_node(const ir::Graph& g, const ir::Node& n, const std::vector<const ir::Tensor*>& inputs);

}  // namespace rlx::reference
