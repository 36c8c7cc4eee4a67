#pragma once
// Post-training quantization (docs/precision.md, "Post-training quantization"): the activations feeding each
// matmul are calibrated over user batches, and a matmul becomes an int8 one (u8 activations per tensor,
// asymmetric; s8 weights per output channel, symmetric; i32 accumulation; dequantized in its epilogue) only
// where the backend lists (matmul, i8) in BackendTraits::fast_low_precision. Everything else stays f32, and
// the report says why.
//
//   auto q = compile::quantize(graph, params, batches, cpu_backend.traits());
//   auto compiled = session.compile(q.graph);  // then set every param of q.params
#include <span>
#include <string>
#include <vector>

#include "rlx/compile/pipeline.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::compile {

enum class Calibration : std::uint8_t {
  MinMax,      // the smallest and largest value seen
  Percentile,  // the `percentile` of |x| (outliers clipped), and the minimum when no value is negative
  Mse,         // the range within min-max whose u8 quantization of the values seen has the least mean squared
               // error: a sparse tail is clipped where rounding the rest finer pays for it
};

struct QuantizeOptions {
  Calibration calibration = Calibration::MinMax;
  double percentile = 99.99;
  // Runs quant_propagate on the quantized graph (int8 kept between layers: requantize epilogues, u8 movement).
  bool propagate = true;
};

struct QuantizedGraph {
  ir::Graph graph;                      // primitives; quantized matmuls read int8 params
  reference::TensorMap params;          // every param of `graph`: the f32 ones given, and the int8 weights made
  std::vector<PrecisionEntry> report;   // each matmul considered: i8 or f32, and why
  std::vector<std::string> propagated;  // what quant_propagate did (passes_extra.hpp), one line per rewrite
  std::string report_text() const;
};

// `params` holds every param's value; `batches` the graph's inputs for each calibration batch (at least one).
// Throws rlx::Error on a missing param or input, or no batch.
QuantizedGraph quantize(const ir::Graph& graph, const reference::TensorMap& params,
                        std::span<const reference::TensorMap> batches, const BackendTraits& backend,
                        const QuantizeOptions& options = {});

}  // namespace rlx::compile
