#pragma once
// Small reference models used by `rlx demo`, the benchmarks and the tests, so
// all three measure and check the same graphs.
#include <cstdint>
#include <map>
#include <string>

#include "rlx/ir/graph.hpp"

namespace rlx::models {

struct MlpConfig {
  std::int64_t batch = 64;
  std::int64_t width = 1024;
  int layers = 2;
};
// x[batch, width] -> (linear + relu) x (layers - 1) -> linear. Params w<i> [width, width], b<i> [width].
ir::Graph mlp(const MlpConfig& c = {});

struct EncoderConfig {
  std::int64_t batch = 1;
  std::int64_t seq = 128;
  std::int64_t d_model = 512;
  std::int64_t heads = 8;
  std::int64_t d_ff = 2048;
  double eps = 1e-5;
};
// One pre-LN transformer encoder block: x + attn(ln1(x)), then + ffn(ln2(.)) with GELU.
ir::Graph encoder_block(const EncoderConfig& c = {});

// Deterministic random values for every param of `g` (scaled like a
// Glorot init so activations stay O(1)); norms' gammas are ~1.
std::map<std::string, ir::Tensor, std::less<>> random_params(const ir::Graph& g, std::uint64_t seed);
// Deterministic random values for every input of `g`.
std::map<std::string, ir::Tensor, std::less<>> random_inputs(const ir::Graph& g, std::uint64_t seed);

}  // namespace rlx::models
