#pragma once
// A language model ready to generate: the GGUF file's tokenizer, chat
// template and Llama model, and the generation loop with a sampler chain.
//
//   auto llm = rlx::llm::Llm::load("SmolLM2-135M-Instruct.Q4_1.gguf");
//   auto prompt = llm.tokenize(llm.chat_prompt({{"user", "What is 2 + 2?"}}));
//   auto stats = llm.generate(prompt, {.max_tokens = 64}, [](std::int32_t, std::string_view text) {
//     std::fputs(std::string(text).c_str(), stdout);
//     return true;  // false stops
//   });
//   // stats.prefill_tokens_per_s(), stats.decode_tokens_per_s()
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/llm/chat_template.hpp"
#include "rlx/llm/model.hpp"
#include "rlx/llm/sampler.hpp"
#include "rlx/llm/tokenizer.hpp"

namespace rlx::llm {

struct GenerateOptions {
  std::int32_t max_tokens = 64;
  SamplerConfig sampling;                 // temperature 0: greedy
  bool stop_at_end_of_generation = true;  // the tokenizer's end-of-generation tokens end it (not printed)
};

struct GenerateStats {
  std::int64_t prompt_tokens = 0;
  std::int64_t generated_tokens = 0;
  double prefill_s = 0;  // the prompt's run, up to the first token's logits
  double decode_s = 0;   // the one-token runs after it
  bool stopped_at_end_of_generation = false;
  double prefill_tokens_per_s() const { return prefill_s > 0 ? double(prompt_tokens) / prefill_s : 0; }
  double decode_tokens_per_s() const {
    return decode_s > 0 && generated_tokens > 1 ? double(generated_tokens - 1) / decode_s : 0;
  }
};

// Called with each sampled token and the text it completes (possibly empty: part of a UTF-8 character);
// returning false stops the generation.
using TokenCallback = std::function<bool(std::int32_t id, std::string_view text)>;

class Llm;

// One generation, a token at a time (what generate() loops over, and Python's generator):
//
//   auto g = llm.start(prompt, options);
//   while (auto id = g.next()) std::cout << g.text();
class Generation {
 public:
  // The next sampled token, or nullopt once max_tokens are out, the context is full, or (with
  // stop_at_end_of_generation) the model ended its turn.
  std::optional<std::int32_t> next();
  // The text the last token completed (may be empty: part of a UTF-8 character); after the end, what was held back.
  const std::string& text() const { return text_; }
  const GenerateStats& stats() const { return stats_; }

 private:
  friend class Llm;
  Generation(Llm& llm, GenerateOptions options);
  Llm* llm_;
  GenerateOptions options_;
  Sampler sampler_;
  StreamDecoder decoder_;
  std::vector<float> logits_;
  GenerateStats stats_;
  std::string text_;
  bool done_ = false;
  std::int32_t last_ = -1;  // the last token sampled, which the next step runs
  std::chrono::steady_clock::time_point decode_start_;
};

class Llm {
 public:
  static Llm load(const std::filesystem::path& path, const LoadOptions& options = {},
                  std::optional<ChatTemplateKind> chat_template = std::nullopt);

  const Tokenizer& tokenizer() const { return tokenizer_; }
  LlamaModel& model() { return model_; }
  const ChatTemplate& chat_template() const { return chat_; }

  std::vector<std::int32_t> tokenize(std::string_view text, bool add_special = true) const {
    return tokenizer_.encode(text, add_special, true);
  }
  std::string detokenize(std::span<const std::int32_t> ids) const { return tokenizer_.decode(ids); }
  // The conversation as prompt text in the model's chat template, with the assistant's turn opened.
  std::string chat_prompt(std::span<const ChatMessage> messages) const { return chat_.apply(messages, true); }
  std::string chat_prompt(std::initializer_list<ChatMessage> messages) const { return chat_.apply(messages, true); }

  // Runs `prompt` as a new sequence (the cache is reset) and returns the generation that samples after it.
  // rlx::Error for an empty prompt, an id outside the vocabulary, or a prompt that leaves no room in the
  // context. The Llm must outlive it, and one generation runs at a time.
  Generation start(std::span<const std::int32_t> prompt, const GenerateOptions& options);
  // start() and next() to the end, calling `on_token` for each token (and once with id -1 for text held back
  // at the end, if any).
  GenerateStats generate(std::span<const std::int32_t> prompt, const GenerateOptions& options,
                         const TokenCallback& on_token = {});
  // The logits of every position of `ids` as one new sequence: [ids.size(), vocab] row-major.
  std::vector<float> logits(std::span<const std::int32_t> ids);

 private:
  friend class Generation;
  Llm(Tokenizer tokenizer, ChatTemplate chat, LlamaModel model)
      : tokenizer_(std::move(tokenizer)), chat_(std::move(chat)), model_(std::move(model)) {}
  Tokenizer tokenizer_;
  ChatTemplate chat_;
  LlamaModel model_;
};

}  // namespace rlx::llm
