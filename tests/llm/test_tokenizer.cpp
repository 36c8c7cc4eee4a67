// The tokenizer on small vocabularies written here (BPE and SentencePiece, the latter read back from a GGUF
// file made with rlx::gguf::Writer) against hand-derived ids, the pre-tokenizers' splits, the Unicode tables,
// streaming decode, errors, and the real SmolLM2 vocabulary. The cross-check against llama.cpp's tokenizer
// is tests/llm/test_tokenizer_llama_cpp.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "gguf/gguf_test_util.hpp"
#include "llm/pretokenize.hpp"
#include "llm/unicode.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/llm/tokenizer.hpp"

namespace rlx::llm {
namespace {

using Ids = std::vector<std::int32_t>;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- Unicode ----

TEST(Unicode, GptByteMappingIsABijection) {
  EXPECT_EQ(unicode::byte_to_unicode(' '), "\xc4\xa0");   // Ġ
  EXPECT_EQ(unicode::byte_to_unicode('\n'), "\xc4\x8a");  // Ċ
  EXPECT_EQ(unicode::byte_to_unicode('a'), "a");
  for (int b = 0; b < 256; ++b) {
    const auto cpts = unicode::decode_utf8(unicode::byte_to_unicode(static_cast<std::uint8_t>(b)));
    ASSERT_EQ(cpts.size(), 1U);
    EXPECT_EQ(unicode::unicode_to_byte(cpts[0]), b);
  }
  EXPECT_EQ(unicode::unicode_to_byte(0x4E00), -1);
}

TEST(Unicode, Categories) {
  using unicode::flags;
  EXPECT_TRUE(flags('a') & unicode::kLetter);
  EXPECT_TRUE(flags(0x4F60) & unicode::kLetter);       // 你
  EXPECT_TRUE(flags(0x0663) & unicode::kNumber);       // ٣ Arabic-Indic three
  EXPECT_TRUE(flags(0x00BD) & unicode::kNumber);       // ½
  EXPECT_TRUE(flags(0x3002) & unicode::kPunctuation);  // 。
  EXPECT_TRUE(flags(0x0301) & unicode::kMark);         // combining acute
  EXPECT_TRUE(flags('$') & unicode::kSymbol);
  EXPECT_TRUE(flags(0x1F600) & unicode::kSymbol);  // 😀
  EXPECT_TRUE(flags(0x3000) & unicode::kWhitespace);
  EXPECT_TRUE(flags(0x3000) & unicode::kSeparator);
  EXPECT_TRUE(flags('\t') & unicode::kWhitespace);
  EXPECT_TRUE(flags(0x200D) & unicode::kControl);  // ZWJ is Cf
  EXPECT_EQ(flags(0x0378), unicode::kUndefined);   // unassigned
  EXPECT_EQ(flags(0x110000), 0);
}

TEST(Unicode, InvalidUtf8BecomesReplacementCharacters) {
  // A lone continuation byte, a truncated 3-byte sequence, and a valid 2-byte one.
  const auto cpts = unicode::decode_utf8(
      "\x80"
      "a\xe4\xbd"
      "\xc3\xa9");
  const std::vector<std::uint32_t> want = {0xFFFD, 'a', 0xFFFD, 0xFFFD, 0xE9};
  EXPECT_EQ(cpts, want);
}

// ---- pre-tokenizers ----

std::vector<std::string> split(std::string_view pre, std::string_view text) {
  return pre::split(pre::variant(pre), unicode::decode_utf8(text));
}
using Pieces = std::vector<std::string>;

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(split("gpt-2", "I'm  fine\n\n"), (Pieces{"I", "'m", " ", " fine", "\n\n"}));
  EXPECT_EQ(split("gpt-2", "Hello world 123"), (Pieces{"Hello", " world", " 123"}));
  EXPECT_EQ(split("gpt-2", "x = y+1;"), (Pieces{"x", " =", " y", "+", "1", ";"}));
  EXPECT_EQ(split("gpt-2", "DON'T"), (Pieces{"DON", "'", "T"}));  // contractions are lower case only
}

TEST(PreTokenizer, SmolLMIsolatesEveryDigit) {
  EXPECT_EQ(split("smollm", "Hello world 123"), (Pieces{"Hello", " world", " ", "1", "2", "3"}));
  EXPECT_EQ(split("smollm", "v2.0"), (Pieces{"v", "2", ".", "0"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThree) {
  EXPECT_EQ(split("llama3", "12345 abc"), (Pieces{"123", "45", " abc"}));
  EXPECT_EQ(split("llama-bpe", "Hello\n\nWorld"), (Pieces{"Hello", "\n\n", "World"}));
  EXPECT_EQ(split("llama3", "DON'T"), (Pieces{"DON", "'T"}));  // case-insensitive contractions
  EXPECT_EQ(split("llama3", "a...\n\nb"), (Pieces{"a", "...\n\n", "b"}));
  EXPECT_EQ(split("llama3", "  x"), (Pieces{" ", " x"}));
  EXPECT_TRUE(pre::variant("llama3").ignore_merges);
  EXPECT_TRUE(pre::variant("llama3").add_bos);
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(split("qwen2", "12345 abc"), (Pieces{"1", "2", "3", "4", "5", " abc"}));
}

TEST(PreTokenizer, DefaultRules) {
  EXPECT_EQ(split("default", "a+b=12345"), (Pieces{"a", "+", "b", "=", "123", "45"}));
  EXPECT_EQ(split("", "a+b"), split("default", "a+b"));
}

TEST(PreTokenizer, UnknownNameIsAnError) {
  const std::string msg = error_of([] { pre::variant("klingon"); });
  EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'klingon'"), std::string::npos) << msg;
}

// ---- BPE ----

// a b c Ġ ab abc Ġa plus the two bytes of é, and two special tokens.
TokenizerVocab small_bpe() {
  TokenizerVocab v;
  v.kind = TokenizerKind::Bpe;
  v.pre = "gpt-2";
  v.tokens = {"<|end|>", "a", "b", "c", "\xc4\xa0", "ab", "abc", "Ġa", "\xc3\x83", "\xc2\xa9", "<tool>"};
  v.types = std::vector<TokenType>(v.tokens.size(), TokenType::Normal);
  v.types[0] = TokenType::Control;
  v.types[10] = TokenType::UserDefined;
  v.merges = {"a b", "ab c", "\xc4\xa0 a"};
  v.eos = 0;
  return v;
}

TEST(Bpe, MergesByRank) {
  const Tokenizer tok(small_bpe());
  // "abc" -> a b c -> ab c -> abc. " ab" -> Ġ a b: (a b) has rank 0, before (Ġ a) at rank 2 -> Ġ ab.
  EXPECT_EQ(tok.encode("abc ab"), (Ids{6, 4, 5}));
  EXPECT_EQ(tok.encode(" a"), (Ids{7}));
  EXPECT_EQ(tok.decode(Ids{6, 4, 5}), "abc ab");
  EXPECT_EQ(tok.encode(""), Ids{});
}

TEST(Bpe, SpecialTokens) {
  const Tokenizer tok(small_bpe());
  EXPECT_EQ(tok.encode("ab<|end|>c"), (Ids{5, 0, 3}));
  // Without parse_special the control token is text: its bytes have no tokens here ('<' '|' ...), so they drop.
  EXPECT_EQ(tok.encode("ab<|end|>c", true, false), (Ids{5, 3}));
  // User-defined tokens are always matched.
  EXPECT_EQ(tok.encode("a<tool>b", true, false), (Ids{1, 10, 2}));
  EXPECT_EQ(tok.decode(Ids{5, 0, 3}), "abc");
  EXPECT_EQ(tok.decode(Ids{5, 0, 3}, true), "ab<|end|>c");
  EXPECT_TRUE(tok.is_eog(0));
  EXPECT_EQ(tok.eog_ids(), Ids{0});  // <|end|> is the eos, and an end-of-generation text
  EXPECT_EQ(tok.bos(), kNoToken);
  EXPECT_FALSE(tok.add_bos());
}

TEST(Bpe, ByteLevelDecodeAndStreaming) {
  const Tokenizer tok(small_bpe());
  EXPECT_EQ(tok.encode("\xc3\xa9"), (Ids{8, 9}));  // é = C3 A9, one token per byte
  EXPECT_EQ(tok.decode(Ids{8, 9}), "\xc3\xa9");
  EXPECT_EQ(tok.token_to_piece(8), "\xc3");
  StreamDecoder s(tok);
  EXPECT_EQ(s.push(1), "a");
  EXPECT_EQ(s.push(8), "");
  EXPECT_EQ(s.pending(), 1U);
  EXPECT_EQ(s.push(9), "\xc3\xa9");
  EXPECT_EQ(s.push(0), "");  // a control token is not printed
  EXPECT_EQ(s.push(8), "");
  EXPECT_EQ(s.finish(), "\xef\xbf\xbd");  // the unfinished sequence as U+FFFD
  EXPECT_EQ(s.pending(), 0U);
}

TEST(Bpe, CompleteUtf8Prefix) {
  EXPECT_EQ(complete_utf8_prefix("abc"), 3U);
  EXPECT_EQ(complete_utf8_prefix("a\xe4\xbd"), 1U);
  EXPECT_EQ(complete_utf8_prefix("a\xe4\xbd\xa0"), 4U);
  EXPECT_EQ(complete_utf8_prefix("\xf0\x9f\x98"), 0U);
  EXPECT_EQ(complete_utf8_prefix("\x80\x80\x80\x80"), 4U);  // stray continuation bytes are not held back
}

TEST(Bpe, Errors) {
  const Tokenizer tok(small_bpe());
  EXPECT_EQ(error_of([&] { tok.decode(Ids{11}); }), "token id 11 is outside the vocabulary (11 tokens)");
  EXPECT_EQ(error_of([&] { (void)tok.token_to_piece(-3); }), "token id -3 is outside the vocabulary (11 tokens)");
  auto v = small_bpe();
  v.merges.push_back("abc");
  EXPECT_NE(error_of([&] { Tokenizer{v}; }).find("tokenizer.ggml.merges[3] 'abc'"), std::string::npos);
  v = small_bpe();
  v.bos = 99;
  EXPECT_EQ(error_of([&] { Tokenizer{v}; }), "tokenizer.ggml.bos_token_id = 99 is outside the vocabulary (11 tokens)");
  v = small_bpe();
  v.types.resize(3);
  EXPECT_EQ(error_of([&] { Tokenizer{v}; }), "tokenizer.ggml.token_type has 3 entries for 11 tokens");
  v = small_bpe();
  v.add_bos = true;
  EXPECT_NE(error_of([&] { Tokenizer{v}; }).find("tokenizer.ggml.add_bos_token"), std::string::npos);
}

TEST(Bpe, MetadataErrorsNameTheKey) {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", "gpt2");
  EXPECT_NE(error_of([&] { Tokenizer::from_metadata(m); }).find("tokenizer.ggml.tokens"), std::string::npos);
  m.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  EXPECT_NE(error_of([&] { Tokenizer::from_metadata(m); }).find("tokenizer.ggml.merges"), std::string::npos);
  m.set("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  m.set("tokenizer.ggml.token_type", std::vector<float>{1, 1});
  EXPECT_NE(error_of([&] { Tokenizer::from_metadata(m); }).find("tokenizer.ggml.token_type"), std::string::npos);
  m.erase("tokenizer.ggml.token_type");
  m.set("tokenizer.ggml.model", "bert");
  EXPECT_NE(error_of([&] { Tokenizer::from_metadata(m); }).find("tokenizer.ggml.model: 'bert'"), std::string::npos);
}

// ---- SentencePiece, through a GGUF file ----

std::vector<std::byte> small_spm_gguf() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<std::int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    static constexpr const char* kHex = "0123456789ABCDEF";
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    scores.push_back(0);
    types.push_back(6);
  }
  const std::vector<std::pair<std::string, float>> words = {{"\xe2\x96\x81", -10},
                                                            {"h", -11},
                                                            {"e", -12},
                                                            {"l", -13},
                                                            {"o", -14},
                                                            {"\xe2\x96\x81h", -4},
                                                            {"ll", -5},
                                                            {"\xe2\x96\x81he", -2},
                                                            {"llo", -3},
                                                            {"\xe2\x96\x81hello", -1},
                                                            {"w", -15}};
  for (const auto& [w, s] : words) {
    tokens.push_back(w);
    scores.push_back(s);
    types.push_back(1);
  }
  gguf::Writer w;
  w.metadata().set("general.architecture", "llama");
  w.metadata().set("tokenizer.ggml.model", "llama");
  w.metadata().set("tokenizer.ggml.tokens", tokens);
  w.metadata().set("tokenizer.ggml.scores", scores);
  w.metadata().set("tokenizer.ggml.token_type", types);
  w.metadata().set("tokenizer.ggml.bos_token_id", std::uint32_t{1});
  w.metadata().set("tokenizer.ggml.eos_token_id", std::uint32_t{2});
  w.metadata().set("tokenizer.ggml.unknown_token_id", std::uint32_t{0});
  return w.to_bytes();
}

class Spm : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = small_spm_gguf();
    file_ = std::make_unique<gguf::File>(gguf::File::view(bytes_));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  }
  std::int32_t id(const std::string& s) const { return *tok_->find_token(s); }
  std::vector<std::byte> bytes_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Spm, ReadsTheVocabulary) {
  EXPECT_EQ(tok_->kind(), TokenizerKind::Spm);
  EXPECT_EQ(tok_->vocab_size(), 3 + 256 + 11);
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_EQ(tok_->unk(), 0);
  EXPECT_TRUE(tok_->add_bos());  // SentencePiece's default
  EXPECT_FALSE(tok_->add_eos());
  EXPECT_TRUE(tok_->is_eog(2));
}

TEST_F(Spm, MergesByScore) {
  // "▁hello": ▁h (-4) and ll (-5) first, then ▁he (-2), llo (-3), and ▁hello (-1).
  EXPECT_EQ(tok_->encode("hello"), (Ids{1, id("\xe2\x96\x81hello")}));
  EXPECT_EQ(tok_->encode("hello", false), (Ids{id("\xe2\x96\x81hello")}));
  // "▁hello▁w": the second word has no ▁w token, so ▁ and w stay apart.
  EXPECT_EQ(tok_->encode("hello w", false), (Ids{id("\xe2\x96\x81hello"), id("\xe2\x96\x81"), id("w")}));
  EXPECT_EQ(tok_->encode("hell", false), (Ids{id("\xe2\x96\x81he"), id("ll")}));
  EXPECT_EQ(tok_->decode(tok_->encode("hello w")), "hello w");
}

TEST_F(Spm, ByteFallback) {
  // é has no token: its two UTF-8 bytes become <0xC3> <0xA9> (ids 3 + byte).
  EXPECT_EQ(tok_->encode("h\xc3\xa9", false), (Ids{id("\xe2\x96\x81h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok_->decode(Ids{id("\xe2\x96\x81h"), 3 + 0xC3, 3 + 0xA9}), "h\xc3\xa9");
  EXPECT_EQ(tok_->token_to_piece(3 + 0x0A), "\n");
}

TEST_F(Spm, SpecialTokensAndSpacePrefix) {
  // A space prefix at the start and after a special token, as llama.cpp's SPM path adds.
  EXPECT_EQ(tok_->encode("hello</s>hello", false), (Ids{id("\xe2\x96\x81hello"), 2, id("\xe2\x96\x81hello")}));
  EXPECT_EQ(tok_->decode(Ids{1, id("\xe2\x96\x81he"), id("ll")}), "hell");
  EXPECT_EQ(tok_->decode(Ids{1, id("\xe2\x96\x81he")}, true), "<s> he");
}

// ---- the real vocabulary ----

class SmolLM2Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    auto p = gguf::testing::smollm2_path(why);
    if (!p) {
      skip_ = new std::string(why);
      return;
    }
    auto file = gguf::File::open(*p);
    tok_ = new Tokenizer(Tokenizer::from_gguf(file));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete skip_;
    tok_ = nullptr;
    skip_ = nullptr;
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << *skip_;
  }
  static inline Tokenizer* tok_ = nullptr;
  static inline std::string* skip_ = nullptr;
};

TEST_F(SmolLM2Tokenizer, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->kind(), TokenizerKind::Bpe);
  EXPECT_EQ(tok_->pre_tokenizer(), "smollm");
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_EQ(tok_->eot(), 2);  // <|im_end|>
  EXPECT_FALSE(tok_->add_bos());
  // <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp takes it for a FIM repo token, which ends generation).
  EXPECT_EQ(tok_->eog_ids(), (Ids{0, 2, 4}));
  EXPECT_EQ(tok_->token_type(1), TokenType::Control);
  EXPECT_EQ(tok_->token_text(216), "\xc4\xa0");
}

TEST_F(SmolLM2Tokenizer, KnownIds) {
  // Ids from llama.cpp's llama-tokenize on this file.
  EXPECT_EQ(tok_->encode("Hello, world!"), (Ids{19556, 28, 905, 17}));
  EXPECT_EQ(tok_->encode("<|im_start|>user\nHello, world! 12345 \xe4\xbd\xa0\xe5\xa5\xbd"),
            (Ids{1, 4093, 198, 19556, 28, 905, 17, 216, 33, 34, 35, 36, 37, 216, 18645, 250, 48392, 138}));
  EXPECT_EQ(tok_->encode("<|im_start|>user", true, false), (Ids{44, 108, 306, 79, 3738, 108, 46, 4093}));
}

TEST_F(SmolLM2Tokenizer, EncodesTenKilobytesInMilliseconds) {
  std::string text;
  const std::string para =
      "The quick brown fox jumps over the lazy dog. Numbers like 3.14159 and 2,718 appear; so do "
      "\xe4\xbd\xa0\xe5\xa5\xbd, caf\xc3\xa9, \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 and code: "
      "for (int i = 0; i < n; ++i) { sum += a[i]; }\n";
  while (text.size() < 10240) text += para;
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->encode(text);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok_->decode(ids), text);
  std::printf("encode: %zu bytes -> %zu tokens in %.2f ms\n", text.size(), ids.size(), ms);
  EXPECT_LT(ms, 200.0);  // milliseconds in a Release build; generous for sanitizer and loaded machines
}

}  // namespace
}  // namespace rlx::llm
