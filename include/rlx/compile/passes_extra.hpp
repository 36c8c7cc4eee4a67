#pragma once
// Graph passes beyond the pipeline's core set (rlx/compile/pipeline.hpp).
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

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

// quant_propagate (docs/precision.md, "quant_propagate"): keeps quantized tensors u8 or s8 between the ops that
// can carry them. A quantize moves above movement ops (reshape, permute, slice, concat, squeeze, unsqueeze,
// flip, expand) and reduce_max / reduce_min, so they move bytes; a quantize of a dequantize with the same scale
// and zero point disappears; and a dequantize -> bias -> relu -> quantize after an int8 matmul folds into a
// requantize (one scale and offset per column, relu as the clamp at the zero point), which the matmul's
// epilogue computes. The first two are exact; the fold may move a value by one quantization step, rarely.
// `params` gives the values of params it may fold (a bias; one it lacks stays a run-time [N] offset); `report`,
// when given, gets one line per rewrite. The compile pipeline runs it (CompileOptions::quant_propagate) on
// graphs that has_quantize; compile::quantize runs it with the params it made.
ir::Graph quant_propagate(const ir::Graph& g, const std::map<std::string, ir::Tensor, std::less<>>& params,
                          std::vector<std::string>* report = nullptr);
// Whether `g` holds a quantize: a cast to u8 or s8 of a clamp.
bool has_quantize(const ir::Graph& g);

}  // namespace rlx::compile::passes
