// Generation with SmolLM2: greedy decoding answers a factual question, is the
// argmax chain of the model's own logits, a seed reproduces a sampled answer,
// and bad prompts are clear errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "gguf/gguf_test_util.hpp"
#include "rlx/llm/llm.hpp"
#include "support/testing.hpp"

namespace rlx::llm {
namespace {

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    auto p = gguf::testing::smollm2_path(why);
    if (!p) {
      skip_ = new std::string(why);
      return;
    }
    // The exact mode: what greedy decoding says is then the model's, not the activation rounding's.
    llm_ = new Llm(Llm::load(*p, {.context = 256, .prefill_chunk = 32, .exact = true}));
  }
  static void TearDownTestSuite() {
    delete llm_;
    delete skip_;
    llm_ = nullptr;
    skip_ = nullptr;
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << *skip_;
  }
  static inline Llm* llm_ = nullptr;
  static inline std::string* skip_ = nullptr;
};

GenerateOptions greedy(std::int32_t n) {
  GenerateOptions o{.max_tokens = n};
  o.sampling.temperature = 0;
  return o;
}

TEST_F(Generate, GreedyAnswersInTheChatTemplate) {
  const auto prompt = llm_->tokenize(llm_->chat_prompt({{"user", "What is the capital of France?"}}));
  std::string text;
  const GenerateStats s = llm_->generate(prompt, greedy(32), [&](std::int32_t, std::string_view t) {
    text += t;
    return true;
  });
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
  EXPECT_TRUE(s.stopped_at_end_of_generation) << text;  // it ends its turn with <|im_end|>
  EXPECT_EQ(s.prompt_tokens, std::int64_t(prompt.size()));
  EXPECT_GT(s.prefill_tokens_per_s(), 0);
}

// Greedy generation is the argmax of the logits of the whole sequence so far, position by position.
TEST_F(Generate, GreedyIsTheArgmaxOfTheModelsLogits) {
  std::vector<std::int32_t> ids = llm_->tokenize("The three primary colors are");
  std::vector<std::int32_t> got;
  auto g = llm_->start(ids, {.max_tokens = 6, .sampling = {.temperature = 0}, .stop_at_end_of_generation = false});
  while (auto id = g.next()) got.push_back(*id);
  ASSERT_EQ(got.size(), 6u);
  const auto vocab = std::size_t(llm_->model().config().vocab);
  for (std::int32_t id : got) {
    const std::vector<float> all = llm_->logits(ids);
    const float* last = all.data() + (ids.size() - 1) * vocab;
    EXPECT_EQ(std::int32_t(std::max_element(last, last + vocab) - last), id);
    ids.push_back(id);
  }
}

TEST_F(Generate, ASeedReproducesASampledAnswer) {
  const auto prompt = llm_->tokenize("Once upon a time");
  auto run = [&](std::uint64_t seed) {
    std::vector<std::int32_t> out;
    llm_->generate(prompt, {.max_tokens = 12, .sampling = {.temperature = 1.0F, .seed = seed}},
                   [&](std::int32_t id, std::string_view) {
                     out.push_back(id);
                     return true;
                   });
    return out;
  };
  const auto a = run(7), b = run(7);
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a.empty());
}

TEST_F(Generate, BadPromptsAreClearErrors) {
  testing::expect_error([&] { (void)llm_->start(std::vector<std::int32_t>{}, {}); }, {"at least one token"});
  testing::expect_error([&] { (void)llm_->start(std::vector<std::int32_t>{70000}, {}); }, {"70000"});
  testing::expect_error([&] { (void)llm_->start(std::vector<std::int32_t>(256, 5), {}); },
                        {"256 tokens", "no room", "context of 256"});
  testing::expect_error([&] { (void)llm_->start(std::vector<std::int32_t>{1}, {.max_tokens = -1}); }, {"max_tokens"});
}

}  // namespace
}  // namespace rlx::llm
