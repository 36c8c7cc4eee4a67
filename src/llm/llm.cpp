#include "rlx/llm/llm.hpp"

#include <fmt/format.h>

#include <chrono>

#include "rlx/error.hpp"

namespace rlx::llm {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Llm Llm::load(const std::filesystem::path& path, const LoadOptions& options,
              std::optional<ChatTemplateKind> chat_template) {
  const auto file = std::make_shared<const gguf::File>(gguf::File::open(path));
  Tokenizer tok = Tokenizer::from_gguf(*file);
  LlamaModel model = LlamaModel::load(file, options);
  if (tok.vocab_size() != model.config().vocab)
    throw Error(fmt::format("gguf '{}': the tokenizer has {} tokens, the model's embedding {}", path.string(),
                            tok.vocab_size(), model.config().vocab));
  // A model without a template RLX renders still generates from plain prompts; chat_prompt then fails.
  ChatTemplate chat(ChatTemplateKind::ChatMl);
  if (chat_template || !tok.chat_template().empty()) chat = ChatTemplate::from_tokenizer(tok, chat_template);
  return {std::move(tok), std::move(chat), std::move(model)};
}

Generation::Generation(Llm& llm, GenerateOptions options)
    : llm_(&llm), options_(options), sampler_(options_.sampling), decoder_(llm.tokenizer_) {}

Generation Llm::start(std::span<const std::int32_t> prompt, const GenerateOptions& options) {
  if (prompt.empty()) throw Error("llm: generate needs a prompt of at least one token");
  if (options.max_tokens < 0) throw Error("llm: max_tokens must be >= 0");
  if (std::int64_t(prompt.size()) >= model_.context())
    throw Error(
        fmt::format("llm: a prompt of {} tokens leaves no room in the context of {}", prompt.size(), model_.context()));
  for (std::int32_t id : prompt) tokenizer_.check_id(id);
  Generation g(*this, options);
  g.stats_.prompt_tokens = std::int64_t(prompt.size());
  for (std::int32_t id : prompt) g.sampler_.accept(id);
  model_.reset();
  const auto t0 = std::chrono::steady_clock::now();
  g.logits_ = model_.forward(prompt, false);
  g.stats_.prefill_s = seconds_since(t0);
  g.decode_start_ = std::chrono::steady_clock::now();
  return g;
}

std::optional<std::int32_t> Generation::next() {
  text_.clear();
  if (done_) return std::nullopt;
  auto finish = [&] {
    done_ = true;
    text_ = decoder_.finish();
    if (stats_.generated_tokens > 1) stats_.decode_s = seconds_since(decode_start_);
    return std::nullopt;
  };
  LlamaModel& model = llm_->model_;
  if (stats_.generated_tokens >= options_.max_tokens) return finish();
  if (stats_.generated_tokens > 0) {
    if (model.position() >= model.context()) return finish();
    logits_ = model.forward(std::span(&last_, 1), false);
  }
  const std::int32_t id = sampler_.sample(logits_);
  if (options_.stop_at_end_of_generation && llm_->tokenizer_.is_eog(id)) {
    stats_.stopped_at_end_of_generation = true;
    return finish();
  }
  ++stats_.generated_tokens;
  last_ = id;
  text_ = decoder_.push(id);
  return id;
}

GenerateStats Llm::generate(std::span<const std::int32_t> prompt, const GenerateOptions& options,
                            const TokenCallback& on_token) {
  Generation g = start(prompt, options);
  while (auto id = g.next())
    if (on_token && !on_token(*id, g.text())) return g.stats();
  if (on_token && !g.text().empty()) on_token(-1, g.text());
  return g.stats();
}

std::vector<float> Llm::logits(std::span<const std::int32_t> ids) {
  model_.reset();
  return model_.forward(ids, true);
}

}  // namespace rlx::llm
