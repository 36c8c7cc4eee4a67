#include "rlx/llm/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "rlx/error.hpp"

namespace rlx::llm {
namespace sampling {
namespace {

bool higher(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

void sort_desc(std::vector<TokenLogit>& c) { std::sort(c.begin(), c.end(), higher); }

}  // namespace

std::vector<TokenLogit> candidates(std::span<const float> logits) {
  std::vector<TokenLogit> c;
  c.reserve(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) c.push_back({static_cast<std::int32_t>(i), logits[i], 0.0F});
  return c;
}

void softmax(std::vector<TokenLogit>& c) {
  if (c.empty()) return;
  sort_desc(c);
  const float max = c.front().logit;
  double sum = 0;
  for (auto& t : c) {
    t.p = std::exp(t.logit - max);
    sum += t.p;
  }
  for (auto& t : c) t.p = static_cast<float>(t.p / sum);
}

void penalties(std::vector<TokenLogit>& c, std::span<const std::int32_t> last, float repeat, float frequency,
               float presence) {
  if (last.empty() || (repeat == 1.0F && frequency == 0.0F && presence == 0.0F)) return;
  std::unordered_map<std::int32_t, int> count;
  for (const std::int32_t id : last) ++count[id];
  for (auto& t : c) {
    const auto it = count.find(t.id);
    if (it == count.end()) continue;
    t.logit = t.logit <= 0 ? t.logit * repeat : t.logit / repeat;
    t.logit -= static_cast<float>(it->second) * frequency + presence;
  }
}

void top_k(std::vector<TokenLogit>& c, std::int32_t k) {
  if (k <= 0 || static_cast<std::size_t>(k) >= c.size()) {
    sort_desc(c);
    return;
  }
  std::partial_sort(c.begin(), c.begin() + k, c.end(), higher);
  c.resize(k);
}

void top_p(std::vector<TokenLogit>& c, float p, std::size_t min_keep) {
  if (p >= 1.0F || c.empty()) return;
  softmax(c);
  double cum = 0;
  std::size_t keep = c.size();
  for (std::size_t i = 0; i < c.size(); ++i) {
    cum += c[i].p;
    if (cum >= p && i + 1 >= min_keep) {
      keep = i + 1;
      break;
    }
  }
  c.resize(keep);
}

void min_p(std::vector<TokenLogit>& c, float p, std::size_t min_keep) {
  if (p <= 0.0F || c.empty()) return;
  softmax(c);
  const float threshold = c.front().p * p;
  std::size_t keep = 0;
  while (keep < c.size() && c[keep].p >= threshold) ++keep;
  c.resize(std::max(keep, std::min(min_keep, c.size())));
}

void temperature(std::vector<TokenLogit>& c, float t) {
  for (auto& x : c) x.logit /= t;
}

std::int32_t greedy(const std::vector<TokenLogit>& c) { return std::min_element(c.begin(), c.end(), higher)->id; }

double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

std::int32_t draw(std::vector<TokenLogit>& c, std::mt19937_64& rng) {
  softmax(c);
  const double u = uniform(rng);
  double cum = 0;
  for (const auto& t : c) {
    cum += t.p;
    if (u < cum) return t.id;
  }
  return c.back().id;  // rounding left the sum just under 1
}

}  // namespace sampling

Sampler::Sampler(SamplerConfig config) : config_(config), rng_(config.seed) {}

void Sampler::reset() {
  history_.clear();
  rng_.seed(config_.seed);
}

void Sampler::accept(std::int32_t id) {
  history_.push_back(id);
  // Keep what the window can see (the whole history for -1).
  const std::int64_t cap = config_.repeat_last_n < 0 ? std::numeric_limits<std::int64_t>::max()
                                                     : std::max<std::int64_t>(config_.repeat_last_n, 1);
  while (static_cast<std::int64_t>(history_.size()) > cap) history_.pop_front();
}

std::int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw Error("Sampler::sample: the logits row is empty");
  auto c = sampling::candidates(logits);
  std::erase_if(c, [](const TokenLogit& t) { return !(t.logit > -std::numeric_limits<float>::infinity()); });
  if (c.empty()) throw Error("Sampler::sample: no finite logit in a row of " + std::to_string(logits.size()));
  if (config_.repeat_last_n != 0) {
    const std::vector<std::int32_t> window(history_.begin(), history_.end());
    sampling::penalties(c, window, config_.repeat_penalty, config_.frequency_penalty, config_.presence_penalty);
  }
  std::int32_t id = 0;
  if (config_.temperature <= 0.0F) {
    id = sampling::greedy(c);
  } else {
    sampling::top_k(c, config_.top_k);
    sampling::top_p(c, config_.top_p);
    sampling::min_p(c, config_.min_p);
    sampling::temperature(c, config_.temperature);
    id = sampling::draw(c, rng_);
  }
  accept(id);
  return id;
}

}  // namespace rlx::llm
