// The sampler chain: each stage on crafted logits with hand-computed results, greedy and temperature 0, the
// repetition window, reproducibility for a seed, and the draw's distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "rlx/error.hpp"
#include "rlx/llm/sampler.hpp"

namespace rlx::llm {
namespace {

using namespace sampling;  // NOLINT(google-build-using-namespace): the stages under test

std::vector<std::int32_t> ids(const std::vector<TokenLogit>& c) {
  std::vector<std::int32_t> out;
  for (const auto& t : c) out.push_back(t.id);
  return out;
}
using Ids = std::vector<std::int32_t>;

const std::vector<float> kLogits = {1, 2, 3, 4};

TEST(Sampling, Softmax) {
  auto c = candidates(kLogits);
  softmax(c);
  EXPECT_EQ(ids(c), (Ids{3, 2, 1, 0}));
  const double sum = 1 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0);
  EXPECT_NEAR(c[0].p, 1 / sum, 1e-6);
  EXPECT_NEAR(c[1].p, std::exp(-1.0) / sum, 1e-6);  // 0.23688
  EXPECT_NEAR(c[3].p, std::exp(-3.0) / sum, 1e-6);  // 0.03206
}

TEST(Sampling, TopK) {
  auto c = candidates(kLogits);
  top_k(c, 2);
  EXPECT_EQ(ids(c), (Ids{3, 2}));
  c = candidates(kLogits);
  top_k(c, 0);  // off: all, sorted
  EXPECT_EQ(ids(c), (Ids{3, 2, 1, 0}));
}

TEST(Sampling, TopP) {
  // p: 0.6439, 0.2369, 0.0871, 0.0321; cumulative 0.6439, 0.8808, 0.9679, 1.
  auto c = candidates(kLogits);
  top_p(c, 0.5F);
  EXPECT_EQ(ids(c), (Ids{3}));
  c = candidates(kLogits);
  top_p(c, 0.8F);
  EXPECT_EQ(ids(c), (Ids{3, 2}));
  c = candidates(kLogits);
  top_p(c, 0.95F);
  EXPECT_EQ(ids(c), (Ids{3, 2, 1}));
  c = candidates(kLogits);
  top_p(c, 0.5F, 3);  // min_keep
  EXPECT_EQ(ids(c), (Ids{3, 2, 1}));
}

TEST(Sampling, MinP) {
  auto c = candidates(kLogits);
  min_p(c, 0.2F);  // keeps p >= 0.2 * 0.6439 = 0.1288
  EXPECT_EQ(ids(c), (Ids{3, 2}));
  c = candidates(kLogits);
  min_p(c, 0.1F);  // >= 0.0644
  EXPECT_EQ(ids(c), (Ids{3, 2, 1}));
}

TEST(Sampling, Temperature) {
  auto c = candidates(kLogits);
  temperature(c, 2.0F);
  EXPECT_FLOAT_EQ(c[0].logit, 0.5F);
  EXPECT_FLOAT_EQ(c[3].logit, 2.0F);
}

TEST(Sampling, Penalties) {
  auto c = candidates(std::vector<float>{1, -2, 3, 4});
  const Ids last = {1, 3, 3};
  penalties(c, last, 2.0F, 0.0F, 0.0F);
  EXPECT_FLOAT_EQ(c[0].logit, 1.0F);   // not seen
  EXPECT_FLOAT_EQ(c[1].logit, -4.0F);  // negative: multiplied
  EXPECT_FLOAT_EQ(c[2].logit, 3.0F);
  EXPECT_FLOAT_EQ(c[3].logit, 2.0F);  // positive: divided, once however often it was seen
  c = candidates(std::vector<float>{1, -2, 3, 4});
  penalties(c, last, 2.0F, 0.5F, 0.25F);
  EXPECT_FLOAT_EQ(c[1].logit, -4.0F - 0.5F - 0.25F);
  EXPECT_FLOAT_EQ(c[3].logit, 2.0F - 2 * 0.5F - 0.25F);
}

TEST(Sampling, GreedyTiesGoToTheLowestId) { EXPECT_EQ(greedy(candidates(std::vector<float>{1, 4, 4, 2})), 1); }

TEST(Sampler, TemperatureZeroIsGreedyAfterPenalties) {
  Sampler s({.temperature = 0.0F, .repeat_penalty = 2.0F, .repeat_last_n = 4});
  const std::vector<float> logits = {3.0F, 2.0F};
  EXPECT_EQ(s.sample(logits), 0);  // nothing seen yet: the argmax
  // Now 0 is in the window: 3 / 2 = 1.5 < 2.
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_EQ(s.history(), (std::deque<std::int32_t>{0, 1}));
}

TEST(Sampler, RepetitionWindow) {
  Sampler s({.temperature = 0.0F, .repeat_penalty = 10.0F, .repeat_last_n = 2});
  for (std::int32_t id : {0, 5, 6}) s.accept(id);
  EXPECT_EQ(s.history(), (std::deque<std::int32_t>{5, 6}));  // 0 has left the window
  EXPECT_EQ(s.sample(std::vector<float>{3.0F, 2.0F}), 0);
}

TEST(Sampler, SeedReproducibility) {
  const SamplerConfig cfg{.temperature = 1.0F, .top_k = 0, .top_p = 1.0F, .min_p = 0.0F, .seed = 1234};
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2;
  const auto run = [&](SamplerConfig c) {
    Sampler s(c);
    Ids out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits));
    return out;
  };
  const Ids a = run(cfg);
  EXPECT_EQ(run(cfg), a);
  SamplerConfig other = cfg;
  other.seed = 1235;
  EXPECT_NE(run(other), a);
  // reset() starts the same sequence again.
  Sampler s(cfg);
  const Ids first = {s.sample(logits), s.sample(logits), s.sample(logits)};
  s.reset();
  EXPECT_EQ((Ids{s.sample(logits), s.sample(logits), s.sample(logits)}), first);
  EXPECT_EQ(first, (Ids{a[0], a[1], a[2]}));
}

TEST(Sampler, DrawFollowsTheDistribution) {
  Sampler s({.temperature = 1.0F, .top_k = 0, .top_p = 1.0F, .min_p = 0.0F, .seed = 7});
  const std::vector<float> logits = {0.0F, std::log(3.0F)};  // p = 0.25, 0.75
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

TEST(Sampler, TopKOneIsDeterministic) {
  Sampler s({.temperature = 1.5F, .top_k = 1, .seed = 3});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(kLogits), 3);
}

TEST(Sampler, Errors) {
  Sampler s;
  EXPECT_THROW(s.sample(std::vector<float>{}), Error);
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(s.sample(std::vector<float>{ninf, ninf}), Error);
  EXPECT_EQ(s.sample(std::vector<float>{ninf, 0.0F}), 1);  // -inf logits are never drawn
}

}  // namespace
}  // namespace rlx::llm
