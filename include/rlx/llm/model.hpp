#pragma once
// A Llama-family language model from a GGUF file: the architecture read from
// its metadata, the weights from its tensors, the forward pass built with the
// flow blocks (one LayerStage per transformer block), and a KV cache resident
// in the compiled graphs between runs (persistent handles fed back by each run).
//
// The weights stay in the file's blocks: each block-quantized tensor is a param
// of its block dtype read in place from the mapping (share_param), shared by
// every compiled graph, and its layer runs quantized_matmul. Only f16/bf16
// tensors are converted (to f32).
//
//   auto model = rlx::llm::LlamaModel::load("SmolLM2-135M-Instruct.Q4_1.gguf");
//   auto logits = model.forward({1, 2, 3});  // [3, vocab] for positions 0..2 (the cache now holds them)
//   auto next = model.forward({4});          // [1, vocab] for position 3
//
// Errors are rlx::Error naming the key or the tensor.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rlx/flow/flow.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::llm {

// The hyperparameters of a Llama-family model, from "<arch>.*" metadata.
struct LlamaConfig {
  std::string arch;            // general.architecture: "llama" (and families with its layout)
  std::int64_t n_layer = 0;    // <arch>.block_count
  std::int64_t n_embd = 0;     // <arch>.embedding_length
  std::int64_t n_ff = 0;       // <arch>.feed_forward_length
  std::int64_t n_head = 0;     // <arch>.attention.head_count
  std::int64_t n_head_kv = 0;  // <arch>.attention.head_count_kv (GQA; = n_head without it)
  std::int64_t head_dim = 0;   // n_embd / n_head
  std::int64_t rope_dim = 0;   // <arch>.rope.dimension_count (= head_dim without it)
  double rope_base = 10000;    // <arch>.rope.freq_base
  double rms_eps = 1e-5;       // <arch>.attention.layer_norm_rms_epsilon
  std::int64_t vocab = 0;      // the token embedding's rows
  std::int64_t context = 0;    // <arch>.context_length (the model's limit)
  bool tied_output = false;    // no output.weight: the logits reuse the token embedding
  // The dtype each weight has in the graph: its block type as stored, or f32 (f32, f16 and bf16 tensors).
  // Empty (build_graph's default): every weight f32.
  std::map<std::string, ir::DType, std::less<>> weight_dtypes;
  ir::DType weight_dtype(std::string_view name) const;

  static LlamaConfig from_gguf(const gguf::File& file);
};

struct LoadOptions {
  // Positions the KV cache holds (the compiled graphs' bound); 0: min(the model's context, 512). A run costs
  // the rows it writes and attends to, not the bound: the cache is updated in place (dynamic_update_slice over
  // its handle) and attention stops at the last row the mask keeps. Memory is the bound's.
  std::int64_t context = 0;
  // Prompt tokens per prefill run: a prompt runs in chunks of this many (the last one padded). A short rest
  // (padded to at most half a chunk by chunks of 16) runs in chunks of 16 instead, in a third graph.
  std::int64_t prefill_chunk = 64;
  Device device = Device::Cpu;
  // The exact mode, for checking: f32 activations into every quantized matmul (each weight row dequantized
  // exactly, then f32 dot products). The default fast mode rounds each activation row per block to 8 bits and
  // takes integer dot products, as llama.cpp does (quantized_matmul{activations="q8"}).
  bool exact = false;
};

// The model's compiled graphs (prefill chunks of prefill_chunk and 16 tokens, one-token decode) over
// one KV cache. Not thread-safe: one sequence at a time.
class LlamaModel {
 public:
  static LlamaModel load(const std::filesystem::path& path, const LoadOptions& options = {});
  // The model reads its weights from `file`'s mapping, which it keeps alive.
  static LlamaModel load(const std::shared_ptr<const gguf::File>& file, const LoadOptions& options = {});
  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

  const LlamaConfig& config() const { return config_; }
  std::int64_t context() const { return context_; }
  // Tokens in the cache: the next forward's first position.
  std::int64_t position() const { return position_; }
  // Empties the cache (a new sequence).
  void reset();
  // Runs `tokens` at positions position()..position()+n-1, adding them to the
  // cache; returns the logits, [n, vocab] row-major (float32), or of the last
  // position only ([vocab]) when `all_positions` is false.
  std::vector<float> forward(std::span<const std::int32_t> tokens, bool all_positions = true);

  // Per-kernel times: with profiling on, every run records its kernels' times; kernel_times returns the last
  // prefill run's (the last run of more than one token) or decode run's, in LIR order (rlx generate --profile).
  void set_profiling(bool on);
  std::vector<runtime::KernelTime> kernel_times(bool decode) const;

  // The graph of one run of `tokens` tokens (for inspection and tests); `activations` is quantized_matmul's.
  static flow::BuiltModel build_graph(const LlamaConfig& config, std::int64_t tokens, std::int64_t context,
                                      std::string_view activations = "q8");

 private:
  LlamaModel() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LlamaConfig config_;
  std::int64_t context_ = 0;
  std::int64_t position_ = 0;
};

}  // namespace rlx::llm
