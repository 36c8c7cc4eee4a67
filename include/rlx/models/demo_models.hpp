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

// Tensor parallelism for encoder_block(c), as Megatron-LM cuts it: a shard holds some of the heads (the columns
// of Wq, Wk, Wv and their biases, the rows of Wo) and some of the FFN's hidden units (the columns of W1 and its
// bias, the rows of W2). Each part ends at a row-parallel matmul whose partial products one all-reduce adds up,
// so a block is two parts and two all-reduces:
//   x1 = all_reduce(attention.run(x)),   y = all_reduce(ffn.run(x1)).
// The lead shard (one per group, usually shard 0) also adds the residual and the output biases, which the whole
// block adds once. Ranges come from compile::shard (the attention node cut by heads; W1's matmul by columns).
struct EncoderShardRange {
  std::int64_t head0 = 0, heads = 0;  // heads [head0, head0 + heads)
  std::int64_t ff0 = 0, ff = 0;       // hidden units [ff0, ff0 + ff)
  bool lead = false;
};
struct EncoderShard {
  ir::Graph attention;  // x [B, S, D] -> partial [B, S, D]
  ir::Graph ffn;        // x1 [B, S, D] -> partial [B, S, D]
};
// rlx::Error when a range is empty or outside the block's heads or hidden units.
EncoderShard encoder_block_shard(const EncoderConfig& c, const EncoderShardRange& range);
// The shard's param values, cut from the whole block's (both parts' names in one map).
std::map<std::string, ir::Tensor, std::less<>> encoder_shard_params(
    const std::map<std::string, ir::Tensor, std::less<>>& whole, const EncoderConfig& c,
    const EncoderShardRange& range);

// Deterministic random values for every param of `g` (scaled like a
// Glorot init so activations stay O(1)); norms' gammas are ~1.
std::map<std::string, ir::Tensor, std::less<>> random_params(const ir::Graph& g, std::uint64_t seed);
// Deterministic random values for every input of `g`.
std::map<std::string, ir::Tensor, std::less<>> random_inputs(const ir::Graph& g, std::uint64_t seed);

}  // namespace rlx::models
