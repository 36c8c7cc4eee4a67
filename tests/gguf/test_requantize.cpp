// rlx quantize's core on SmolLM2: the rewritten file reads back, its types
// follow llama.cpp's fallbacks for a width of 576, the requantized model
// still answers, and llama.cpp loads and runs it (when its tools are built).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "gguf/gguf_test_util.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/requantize.hpp"
#include "rlx/llm/model.hpp"
#include "support/testing.hpp"

namespace rlx::gguf {
namespace {

namespace fs = std::filesystem;

class Requantize : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    auto p = testing::smollm2_path(why);
    if (!p) GTEST_SKIP() << why;
    src_ = *p;
  }
  fs::path tmp(const std::string& name) const {
    return fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".gguf");
  }
  fs::path src_;
};

TEST_F(Requantize, TypesFollowLlamaCppsFallbacksAndTheFileReadsBack) {
  const fs::path out = tmp("rlx_q4k");
  std::size_t calls = 0;
  const auto report =
      requantize(src_, out, GgmlType::Q4_K, [&](std::size_t done, std::size_t total, const std::string&) {
        ++calls;
        EXPECT_LE(done, total);
      });
  const File f = File::open(out);
  EXPECT_EQ(calls, f.tensors().size());
  EXPECT_EQ(f.metadata().get_u32("general.file_type"), 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  for (const TensorInfo& t : f.tensors()) {
    if (t.dims.size() == 1) {
      EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    } else if (t.dims[0] % 256 == 0) {
      EXPECT_EQ(t.type, GgmlType::Q4_K) << t.name;  // ffn_down: rows of 1536
    } else {
      EXPECT_EQ(t.type, GgmlType::Q5_0) << t.name;  // rows of 576: not whole 256-blocks
    }
  }
  EXPECT_EQ(report.tensors_per_type.at("Q4_K"), 30);
  EXPECT_EQ(report.bytes_out, f.file_size());
  fs::remove(out);
}

// Q8_0 is nearly lossless: the requantized model's logits stay close to the original's.
TEST_F(Requantize, AQ8ModelKeepsTheLogits) {
  const fs::path out = tmp("rlx_q8");
  requantize(src_, out, GgmlType::Q8_0);
  const std::vector<std::int32_t> ids{1, 9690, 314, 253, 2, 77};
  auto a = llm::LlamaModel::load(src_, {.context = 32, .prefill_chunk = 8}).forward(ids);
  auto b = llm::LlamaModel::load(out, {.context = 32, .prefill_chunk = 8}).forward(ids);
  ASSERT_EQ(a.size(), b.size());
  double top = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    top = std::max(top, std::fabs(double(a[i])));
    err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
  }
  EXPECT_LT(err, 0.1 * top);
  EXPECT_GT(err, 0.0);  // the weights did change
  fs::remove(out);
}

TEST_F(Requantize, LlamaCppLoadsAndRunsTheFile) {
  const fs::path bench = fs::path(RLX_SOURCE_DIR) / "build/llama.cpp/build/bin/llama-bench";
  if (!fs::exists(bench)) GTEST_SKIP() << "no llama-bench (scripts/build_llama_cpp.sh tools builds it)";
  const fs::path out = tmp("rlx_q40");
  requantize(src_, out, GgmlType::Q4_0);
  const std::string cmd = testing::shell_quote(bench.string()) + " -m " + testing::shell_quote(out.string()) +
                          " -p 8 -n 4 -t 2 -r 1 -o jsonl > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove(out);
}

TEST_F(Requantize, AnUnsupportedTargetIsAClearError) {
  rlx::testing::expect_error([&] { requantize(src_, tmp("x"), GgmlType::IQ2_XXS); }, {"IQ2_XXS"});
  rlx::testing::expect_error([&] { requantize(src_, tmp("x"), GgmlType::Q8_K); }, {"Q8_K"});
  rlx::testing::expect_error([&] { requantize(src_.string() + ".missing", tmp("x"), GgmlType::Q8_0); }, {"missing"});
}

}  // namespace
}  // namespace rlx::gguf
