#pragma once
// Graph passes beyond the pipeline's core set (rlx/compile/pipeline.hpp).
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "rlx/ir/graph.hpp"

namespace rlx::compile::passes {

// Nodes whose op is in `f32_ops` and that compute in f16 or bf16 get their
// operands of that dtype cast to f32, compute in f32, and are cast back.
ir::Graph legalize_f32_compute(const ir::Graph& g, const std::set<ir::OpKind>& f32_ops);

// promote_params, plus the values the new params must be fed with, keyed by
// the param names it chose ("const_<source node id>").
struct Promotion {
  ir::Graph graph;
  std::map<std::string, ir::Tensor, std::less<>> values;
};
Promotion promote_params_with_values(const ir::Graph& g, std::int64_t min_bytes);

}  // namespace rlx::compile::passes
