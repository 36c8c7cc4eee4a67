#pragma once
// The sampler chain: the next token from a logits row (docs/llm.md, "Sampling"). The stages run in llama.cpp's
// default order: repetition penalties over the last n tokens -> top-k -> top-p -> min-p -> temperature -> a
// draw from the softmax with a seeded RNG. temperature <= 0 is greedy (the argmax after the penalties).
//
//   rlx::llm::Sampler sampler({.temperature = 0.7f, .top_k = 40, .seed = 42});
//   for (auto id : prompt) sampler.accept(id);     // the prompt counts for the repetition penalty
//   std::int32_t next = sampler.sample(logits);     // accepts `next` too
//
// The same seed, config and logits give the same tokens on every machine: the RNG is std::mt19937_64 and the
// uniform draw is computed from its bits (no implementation-defined distribution).
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

namespace rlx::llm {

struct SamplerConfig {
  float temperature = 0.8F;         // <= 0: greedy
  std::int32_t top_k = 40;          // <= 0: all tokens
  float top_p = 0.95F;              // >= 1: off
  float min_p = 0.05F;              // <= 0: off
  float repeat_penalty = 1.0F;      // 1: off; > 1 discourages tokens seen in the last repeat_last_n
  float frequency_penalty = 0.0F;   // subtracted per occurrence in the window
  float presence_penalty = 0.0F;    // subtracted once for a token in the window
  std::int32_t repeat_last_n = 64;  // the penalty window; 0: no penalties, -1: the whole history
  std::uint64_t seed = 0;
};

// One candidate: a token id, its logit, and its probability once softmax has run.
struct TokenLogit {
  std::int32_t id;
  float logit;
  float p = 0.0F;
};

// The stages, on a candidate list (each exposed for tests and for callers that build their own chain).
namespace sampling {
// Every token of the vocabulary, in id order.
std::vector<TokenLogit> candidates(std::span<const float> logits);
// Sorts by logit (descending, ties by id) and sets p to the softmax of the logits.
void softmax(std::vector<TokenLogit>& c);
// llama.cpp's penalties: for each distinct token of `last`, a positive logit is divided by `repeat`, a negative
// one multiplied; then logit -= count * frequency + presence.
void penalties(std::vector<TokenLogit>& c, std::span<const std::int32_t> last, float repeat, float frequency,
               float presence);
// The k highest logits (sorted). k <= 0 or >= size: all, sorted.
void top_k(std::vector<TokenLogit>& c, std::int32_t k);
// The smallest prefix of the sorted candidates whose probability reaches p (at least min_keep).
void top_p(std::vector<TokenLogit>& c, float p, std::size_t min_keep = 1);
// The candidates whose probability is at least p times the largest (at least min_keep).
void min_p(std::vector<TokenLogit>& c, float p, std::size_t min_keep = 1);
// logit /= t.
void temperature(std::vector<TokenLogit>& c, float t);
// The highest logit's id (ties: the lowest id).
std::int32_t greedy(const std::vector<TokenLogit>& c);
// A uniform double in [0, 1) from 53 bits of the generator.
double uniform(std::mt19937_64& rng);
// A draw from softmax(c) (c need not be sorted).
std::int32_t draw(std::vector<TokenLogit>& c, std::mt19937_64& rng);
}  // namespace sampling

class Sampler {
 public:
  explicit Sampler(SamplerConfig config = {});
  // The next token for one logits row; it is then accepted into the history. rlx::Error for an empty row or a
  // row with no finite logit.
  std::int32_t sample(std::span<const float> logits);
  // Adds a token to the history the penalties look at (the prompt's tokens, or tokens chosen elsewhere).
  void accept(std::int32_t id);
  // Empties the history and reseeds the RNG with config().seed.
  void reset();
  const SamplerConfig& config() const { return config_; }
  const std::deque<std::int32_t>& history() const { return history_; }

 private:
  SamplerConfig config_;
  std::mt19937_64 rng_;
  std::deque<std::int32_t> history_;
};

}  // namespace rlx::llm
