// The Llama model on the real SmolLM2 file: exact-mode logits against an
// independent float64 forward pass (tests/llm/llama_reference.py, numpy over
// gguf's dequantizers), the KV cache across runs, and bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "gguf/gguf_test_util.hpp"
#include "rlx/llm/model.hpp"
#include "support/testing.hpp"

namespace rlx::llm {
namespace {

namespace fs = std::filesystem;
using gguf::testing::shell_quote;

class Llama : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    auto p = gguf::testing::smollm2_path(why);
    if (!p) {
      skip_reason_ = new std::string(why);
      return;
    }
    path_ = new fs::path(*p);
    model_ = new LlamaModel(LlamaModel::load(*p, {.context = 128, .prefill_chunk = 16, .exact = true}));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete path_;
    delete skip_reason_;
    model_ = nullptr;
    path_ = nullptr;
    skip_reason_ = nullptr;
  }
  void SetUp() override {
    if (skip_reason_) GTEST_SKIP() << *skip_reason_;
    model_->reset();
  }

  // The reference's logits for every position of `ids`, [ids.size(), vocab].
  static std::vector<double> reference(const std::vector<std::int32_t>& ids) {
    std::string why;
    auto py = gguf::testing::python_with_gguf(why);
    if (!py) throw Error(why);
    const fs::path out = fs::temp_directory_path() / ("rlx_llama_ref_" + std::to_string(::getpid()) + ".f64");
    std::string cmd = shell_quote(*py) + " " +
                      shell_quote(std::string(RLX_SOURCE_DIR) + "/tests/llm/llama_reference.py") + " " +
                      shell_quote(path_->string()) + " " + shell_quote(out.string());
    for (auto id : ids) cmd += " " + std::to_string(id);
    if (std::system(cmd.c_str()) != 0) throw Error("the reference failed: " + cmd);
    std::ifstream f(out, std::ios::binary);
    std::vector<double> v(ids.size() * std::size_t(model_->config().vocab));
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(double)));
    fs::remove(out);
    if (!f) throw Error("the reference wrote too little");
    return v;
  }

  static inline LlamaModel* model_ = nullptr;
  static inline fs::path* path_ = nullptr;
  static inline std::string* skip_reason_ = nullptr;
};

TEST_F(Llama, ConfigComesFromTheMetadata) {
  const LlamaConfig& c = model_->config();
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_head_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_ff, 1536);
  EXPECT_EQ(c.vocab, 49152);
  EXPECT_TRUE(c.tied_output);
  EXPECT_DOUBLE_EQ(c.rope_base, 100000.0);
}

// Every position's logits, within 1e-3 of the largest, on prompts that cross the prefill chunk (16).
TEST_F(Llama, ExactLogitsMatchAFloat64Reference) {
  std::mt19937 rng(testing::test_seed());
  std::uniform_int_distribution<std::int32_t> id(3, 49151);
  for (std::size_t n : {1u, 5u, 23u}) {
    std::vector<std::int32_t> ids(n);
    for (auto& t : ids) t = id(rng);
    model_->reset();
    const std::vector<float> got = model_->forward(ids);
    const std::vector<double> want = reference(ids);
    ASSERT_EQ(got.size(), want.size());
    const auto vocab = std::size_t(model_->config().vocab);
    for (std::size_t p = 0; p < n; ++p) {
      double top = 0, err = 0;
      for (std::size_t j = 0; j < vocab; ++j) {
        top = std::max(top, std::fabs(want[p * vocab + j]));
        const double d = std::fabs(double(got[p * vocab + j]) - want[p * vocab + j]);
        err = std::isnan(d) ? INFINITY : std::max(err, d);
      }
      EXPECT_LE(err, 1e-3 * top) << n << " tokens, position " << p;
    }
  }
}

// A token at a time through the cache gives the logits of the whole sequence at once.
TEST_F(Llama, DecodingThroughTheCacheEqualsOneRun) {
  const std::vector<std::int32_t> ids{1, 9690, 314, 253, 2, 77, 1024, 300};
  const std::vector<float> all = model_->forward(ids);
  model_->reset();
  const auto vocab = std::size_t(model_->config().vocab);
  (void)model_->forward(std::span(ids).first(3));
  for (std::size_t p = 3; p < ids.size(); ++p) {
    const std::vector<float> one = model_->forward(std::span(ids).subspan(p, 1), false);
    ASSERT_EQ(one.size(), vocab);
    float err = 0;
    for (std::size_t j = 0; j < vocab; ++j) err = std::max(err, std::fabs(one[j] - all[p * vocab + j]));
    EXPECT_LE(err, 2e-3f) << "position " << p;
  }
  EXPECT_EQ(model_->position(), std::int64_t(ids.size()));
}

// Generation asks for the last position's logits, which the prefill graph computes from one row of the output
// layer (the all-positions graph is another, compiled on first use): they equal the last row of all positions,
// over a prompt of two chunks (16 and 4 tokens), and the cache they leave behind decodes the same.
TEST_F(Llama, LastPositionLogitsEqualTheLastRowOfAllPositions) {
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 21; ++i) ids.push_back(1 + (i * 7919) % 40000);
  const auto vocab = std::size_t(model_->config().vocab);
  const std::vector<float> all = model_->forward(ids);
  model_->reset();
  const std::vector<float> last = model_->forward(std::span(ids).first(20), false);
  ASSERT_EQ(last.size(), vocab);
  const std::vector<float> next = model_->forward(std::span(ids).subspan(20, 1), false);
  float err = 0, err_next = 0;
  for (std::size_t j = 0; j < vocab; ++j) {
    err = std::max(err, std::fabs(last[j] - all[19 * vocab + j]));
    err_next = std::max(err_next, std::fabs(next[j] - all[20 * vocab + j]));
  }
  EXPECT_LE(err, 1e-4f);  // NaN fails both
  EXPECT_LE(err_next, 2e-3f);
}

// With 64-token chunks, a 20-token prompt runs as two 16-token chunks (its padding is then 12 rows, not 44); its
// last logits equal the last row of a run over all positions (one 64-token chunk), and decoding goes on the same.
TEST_F(Llama, AShortPromptRunsInSmallerChunks) {
  LlamaModel m = LlamaModel::load(*path_, {.context = 128, .prefill_chunk = 64, .exact = true});
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 21; ++i) ids.push_back(7 + (i * 104729) % 40000);
  const auto vocab = std::size_t(m.config().vocab);
  const std::vector<float> all = m.forward(ids);
  m.reset();
  const std::vector<float> last = m.forward(std::span(ids).first(20), false);
  const std::vector<float> next = m.forward(std::span(ids).subspan(20, 1), false);
  float err = 0, err_next = 0;
  for (std::size_t j = 0; j < vocab; ++j) {
    err = std::max(err, std::fabs(last[j] - all[19 * vocab + j]));
    err_next = std::max(err_next, std::fabs(next[j] - all[20 * vocab + j]));
  }
  EXPECT_LE(err, 1e-4f);
  EXPECT_LE(err_next, 2e-3f);
}

// Resident memory, from /proc/self/statm.
double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  double pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * double(sysconf(_SC_PAGESIZE));
}

// The fast mode (the default): weights in their blocks, read in place from the file's mapping by both compiled
// graphs; activations rounded per block to 8 bits. It stays close to the float64 reference, and loading it (and
// running it, which touches every weight) costs at most the file, the KV cache and 64 MB.
TEST_F(Llama, FastModeReadsTheFileInPlaceAndStaysClose) {
  const double before = rss_bytes();
  LlamaModel fast = LlamaModel::load(*path_, {.context = 128, .prefill_chunk = 16});
  const std::vector<std::int32_t> ids{1, 9690, 314, 253, 2, 77, 1024, 300, 4000, 15};
  const std::vector<float> got = fast.forward(ids);
  const double grown = rss_bytes() - before;
  const LlamaConfig& c = fast.config();
  const double kv = 2.0 * double(c.n_layer * c.n_head_kv * fast.context() * c.head_dim) * sizeof(float);
  const double file = double(fs::file_size(*path_));
#if defined(__SANITIZE_ADDRESS__)
  // ASan's shadow memory and quarantine are in the RSS too: the bound holds for the uninstrumented build.
  (void)grown;
#else
  EXPECT_LE(grown, file + kv + 64e6) << "RSS grew by " << grown / 1e6 << " MB (file " << file / 1e6 << " MB, KV "
                                     << kv / 1e6 << " MB)";
#endif
  const std::vector<double> want = reference(ids);
  const auto vocab = std::size_t(c.vocab);
  std::size_t agree = 0;
  for (std::size_t p = 0; p < ids.size(); ++p) {
    double err = 0;
    std::size_t top_got = 0, top_want = 0;
    for (std::size_t j = 0; j < vocab; ++j) {
      const double d = std::fabs(double(got[p * vocab + j]) - want[p * vocab + j]);
      err = std::isnan(d) ? INFINITY : std::max(err, d);
      if (got[p * vocab + j] > got[p * vocab + top_got]) top_got = j;
      if (want[p * vocab + j] > want[p * vocab + top_want]) top_want = j;
    }
    // llama.cpp's Q4_1 path is up to about 1.5 away from an exact forward on this model (issue 14).
    EXPECT_LE(err, 1.5) << "position " << p;
    agree += top_got == top_want;
  }
  EXPECT_GE(agree, ids.size() - 2);
  // A token at a time through the cache: as close to the reference as the run over the sequence. (Not equal to
  // it: the two graphs' f32 rounding differs in the last bits, and the 8-bit activation rounding turns that into
  // differences of its own size, as in llama.cpp.)
  fast.reset();
  (void)fast.forward(std::span(ids).first(4));
  for (std::size_t p = 4; p < ids.size(); ++p) {
    const std::vector<float> one = fast.forward(std::span(ids).subspan(p, 1), false);
    double e = 0;
    for (std::size_t j = 0; j < vocab; ++j) {
      const double d = std::fabs(double(one[j]) - want[p * vocab + j]);
      e = std::isnan(d) ? INFINITY : std::max(e, d);
    }
    EXPECT_LE(e, 1.5) << "position " << p;
  }
}

TEST_F(Llama, BadInputIsAClearError) {
  testing::expect_error([&] { (void)model_->forward(std::vector<std::int32_t>{}); }, {"at least one token"});
  testing::expect_error([&] { (void)model_->forward(std::vector<std::int32_t>{49152}); },
                        {"token id 49152", "vocabulary of 49152"});
  testing::expect_error([&] { (void)model_->forward(std::vector<std::int32_t>{-1}); }, {"token id -1"});
  std::vector<std::int32_t> many(129, 5);
  testing::expect_error([&] { (void)model_->forward(many); }, {"129 tokens", "context of 128"});
  EXPECT_EQ(model_->position(), 0);  // a refused run changes nothing
  testing::expect_error([&] { (void)LlamaModel::load(*path_, {.context = 100000}); }, {"context of 100000", "8192"});
}

}  // namespace
}  // namespace rlx::llm
