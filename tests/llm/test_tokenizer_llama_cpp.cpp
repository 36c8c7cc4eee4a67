// Acceptance: RLX's tokenizer gives llama.cpp's ids on SmolLM2's GGUF, for 200+ varied strings (unicode,
// emoji with ZWJ sequences and flags, code, whitespace runs, CRLF, digits, contractions, special tokens,
// empty and invalid text), and decode(encode(s)) == s. The same vocabulary is also written out with
// tokenizer.ggml.pre set to gpt-2, llama3 (llama-bpe), qwen2 and default, so each pre-tokenizer is checked
// against llama.cpp's too, and a small SentencePiece vocabulary written here is checked the same way.
//
// The reference is llama.cpp's llama-tokenize, built by `scripts/build_llama_cpp.sh tokenize` into
// <build>/llama.cpp/build/bin (minutes on 2 cores, so `make test` does not build it): with the tool absent the
// tests skip, saying so, unless RLX_BUILD_LLAMA_CPP=1 asks them to build it first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gguf/gguf_test_util.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/llm/tokenizer.hpp"

namespace rlx::llm {
namespace {

namespace fs = std::filesystem;
using gguf::testing::run_capture;
using gguf::testing::shell_quote;
using Ids = std::vector<std::int32_t>;

fs::path build_dir() { return fs::canonical("/proc/self/exe").parent_path().parent_path(); }

// llama-tokenize, or "" with the reason.
std::string llama_tokenize(std::string& why) {
  const fs::path exe = build_dir() / "llama.cpp" / "build" / "bin" / "llama-tokenize";
  if (fs::exists(exe)) return exe.string();
  const char* build = std::getenv("RLX_BUILD_LLAMA_CPP");
  if (build != nullptr && std::string(build) == "1") {
    const std::string cmd = "bash " + shell_quote(std::string(RLX_SOURCE_DIR) + "/scripts/build_llama_cpp.sh") +
                            " --build-dir " + shell_quote(build_dir().string()) + " tokenize 2>&1";
    const auto out = run_capture(cmd);
    if (out && fs::exists(exe)) return exe.string();
    why = "scripts/build_llama_cpp.sh tokenize failed" + (out ? ": " + *out : std::string());
    return {};
  }
  why = "llama.cpp's llama-tokenize is not built (" + exe.string() + "): run `scripts/build_llama_cpp.sh --build-dir " +
        build_dir().string() + " tokenize`, or set RLX_BUILD_LLAMA_CPP=1";
  return {};
}

std::vector<std::string> test_strings() {
  std::vector<std::string> s = {
      // English, contractions
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.",
      "I'm",
      "don't",
      "we're",
      "they've",
      "I'll",
      "she'd",
      "It's mine, isn't it?",
      "DON'T SHOUT",
      "I'M HERE",
      "'s",
      "''",
      "rock'n'roll",
      "o'clock",
      "He said 'hello' and left.",
      "It's 5 o'clock's end",
      "You'RE",
      "we'Ve",
      "x'll'd",
      // whitespace
      " ",
      "  ",
      "   ",
      "    ",
      "\t",
      "\n",
      "\n\n",
      "\n\n\n",
      "\r\n",
      "\r\n\r\n",
      " \r\n ",
      "a  b",
      "a   b",
      "a\tb",
      "a\n\nb",
      "  leading",
      "trailing  ",
      "trailing\n",
      "\t\tindent",
      "line1\r\nline2\r\n",
      "\n \n",
      "  \n  ",
      "a\u00a0b",
      "a\u3000b",
      "\u2003em space",
      " \t \n",
      "word \n",
      "a \r\n b",
      "end.  \n\n  Start",
      // digits and numbers
      "0",
      "7",
      "42",
      "123",
      "1234",
      "12345",
      "123456",
      "1234567",
      "12345678901234567890",
      "3.14159",
      "1,000,000",
      "2024-01-15",
      "-17",
      "+3e10",
      "0x1F",
      "v1.2.3",
      "a1b2c3",
      "٠١٢٣٤",
      "५६७",
      "½ cup",
      "x² + y²",
      "Ⅻ",
      "①②③",
      " 42",
      "  42",
      "abc123def",
      "12:30pm",
      "$9.99",
      "100%",
      // scripts
      "你好，世界！",
      "日本語のテキストです。",
      "한국어 문장입니다",
      "مرحبا بالعالم",
      "שלום עולם",
      "नमस्ते दुनिया",
      "สวัสดีครับ",
      "Привет, мир!",
      "Γειά σου Κόσμε",
      "café naïve résumé",
      "e\u0301",
      "n\u0303o",
      "Z̴͑a̷l̶g̸o̵",
      "Tiếng Việt có dấu",
      "İstanbul ılık",
      "Straße Größe",
      "Ærøskøbing",
      "ǅungla",
      "中文English混合",
      "Ελληνικά123",
      "Ünïcödé",
      "ﬁ ligature",
      "Ａｂｃ fullwidth",
      "ครับ",
      "ภาษาไทย",
      "বাংলা",
      "தமிழ்",
      "ગુજરાતી",
      "ᎣᏏᏲ",
      "ꦗꦮ",
      "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
      "𐍈",
      // emoji and symbols
      "😀",
      "👍🏽",
      "👨‍👩‍👧‍👦",
      "🇫🇷🇯🇵",
      "❤️",
      "🏳️‍🌈",
      "a😀b",
      "😀😀😀",
      "I ❤️ NY",
      "🤖 robots",
      "∑∫√∞≠≤",
      "→←↑↓",
      "€£¥₹$",
      "™©®",
      "┌─┐│└┘",
      "a\u200bb",
      "\ufeffBOM",
      "\ue000",
      "☃☂☀",
      "♠♥♦♣",
      "🧑🏿‍🚀",
      "👩‍💻 coding",
      "✅ done",
      "1️⃣",
      "#️⃣",
      // code
      "def f(x):\n    return x**2\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
      "#include <stdio.h>",
      "<div class=\"a\">Hi</div>",
      "SELECT * FROM t WHERE id=1;",
      "x => x * 2",
      "a != b && c == d",
      "std::vector<int> v{1,2,3};",
      "{\"key\": [1, 2.5, null, true]}",
      "$ ls -la | grep foo",
      "^\\d+$",
      "https://example.com/path?q=1&r=2",
      "user@example.com",
      "# Title\n\n- item\n- item",
      "```python\nprint('hi')\n```",
      "    indented code",
      "camelCaseName",
      "snake_case_name",
      "SCREAMING_CASE",
      "__init__",
      "i++",
      "...",
      "!!!",
      "???",
      "?!",
      "--",
      "—",
      "–",
      "“quoted”",
      "‘single’",
      "«guillemets»",
      "(parens)",
      "[brackets]",
      "{braces}",
      "fn main() -> i32 { 0 }",
      "if x:\n\tpass\nelse:\n\tpass",
      "<?php echo $x; ?>",
      "// comment\n/* block */",
      "a=b;c=d",
      "@decorator\ndef g(): ...",
      "0.1 + 0.2 == 0.30000000000000004",
      "#!/bin/bash\nset -euo pipefail\n",
      "key: value\nlist:\n  - a\n",
      // special tokens in text
      "<|im_start|>",
      "<|im_end|>",
      "<|endoftext|>",
      "<|im_start|>user\nHi<|im_end|>\n",
      "text<|im_end|>more",
      "<|im_start|><|im_end|>",
      "< |im_start| >",
      "<|im_start",
      "<repo_name>x<file_sep>",
      "<|im_start|>assistant\n",
      "<jupyter_code>print(1)<jupyter_output>1",
      " <|im_start|> ",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n",
      "<|endoftext|><|endoftext|>",
      "<|im_end|>\n\n",
      "<issue_start>bug<issue_closed>",
      // edge cases
      "",
      "a",
      "A",
      ".",
      "'",
      "\"",
      "\\",
      "supercalifragilisticexpialidocious",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "ababababababab",
      "\x01\x02\x03",
      "\x7f",
      "tab\tseparated\tvalues",
      "a.b.c.d",
      "x--y",
      "Mr. Smith's dog's bone",
  };
  s.push_back(
      "Large language models tokenize text into subword units. A tokenizer that disagrees with the one the "
      "model was trained with, even on one token, changes the model's input. This paragraph is long, with "
      "commas, semicolons; colons: and numbers such as 1984, 2001 and 65536, so that the merges are exercised "
      "over many words.\n\nA second paragraph follows, after a blank line.");
  // Generated: digit runs, and each kind of whitespace repeated between two words.
  for (int k = 1; k <= 12; ++k) s.push_back(std::string(static_cast<std::size_t>(k), '9'));
  for (const std::string ws : {" ", "\t", "\n", "\r\n"})
    for (int k = 1; k <= 4; ++k) {
      std::string w;
      for (int i = 0; i < k; ++i) w += ws;
      s.push_back("a" + w + "b");
    }
  return s;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const std::size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

Ids parse_ids(const std::string& out) {
  // "[1, 2, 3]\n" (the last line; llama-tokenize prints nothing else with --log-disable)
  const auto open = out.rfind('[');
  const auto close = out.rfind(']');
  Ids ids;
  if (open == std::string::npos || close == std::string::npos || close < open) {
    ADD_FAILURE() << "unexpected llama-tokenize output: " << out;
    return ids;
  }
  std::stringstream ss(out.substr(open + 1, close - open - 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    ids.push_back(std::stoi(item));
  }
  return ids;
}

class LlamaCppTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    auto model = gguf::testing::smollm2_path(why);
    if (!model) GTEST_SKIP() << why;
    model_ = *model;
    tool_ = llama_tokenize(why);
    if (tool_.empty()) GTEST_SKIP() << why;
    dir_ = fs::temp_directory_path() / ("rlx_tok_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // llama-tokenize's ids for a text (read from a file, bytes exact: --no-escape).
  Ids reference(const fs::path& model, const std::string& text, bool parse_special) {
    const fs::path f = dir_ / "input.txt";
    std::ofstream(f, std::ios::binary) << text;
    const std::string cmd = shell_quote(tool_) + " -m " + shell_quote(model.string()) + " -f " +
                            shell_quote(f.string()) + " --ids --log-disable --no-escape" +
                            (parse_special ? "" : " --no-parse-special") + " 2>/dev/null";
    const auto out = run_capture(cmd);
    if (!out) {
      ADD_FAILURE() << "llama-tokenize failed: " << cmd;
      return {};
    }
    return parse_ids(*out);
  }

  // Many texts in one llama-tokenize run: joined by a control token no text contains, which splits them into
  // fragments llama.cpp tokenizes independently; the ids are split back at it.
  std::vector<Ids> reference_batch(const fs::path& model, const std::vector<std::string>& texts, std::int32_t sep_id,
                                   const std::string& sep) {
    std::string joined;
    for (const auto& t : texts) {
      EXPECT_EQ(t.find(sep), std::string::npos);
      joined += t + sep;
    }
    const Ids all = reference(model, joined, true);
    std::vector<Ids> out(1);
    for (const std::int32_t id : all) {
      if (id == sep_id) {
        out.emplace_back();
      } else {
        out.back().push_back(id);
      }
    }
    out.pop_back();  // after the last separator
    EXPECT_EQ(out.size(), texts.size());
    out.resize(texts.size());
    return out;
  }

  fs::path model_;
  std::string tool_;
  fs::path dir_;
};

std::string show(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

TEST_F(LlamaCppTokenizer, SmolLM2IdsMatchOneByOne) {
  const auto file = gguf::File::open(model_);
  const auto tok = Tokenizer::from_gguf(file);
  const auto texts = test_strings();
  ASSERT_GE(texts.size(), 200U);
  std::size_t matched = 0;
  std::size_t round_trips = 0;
  for (const auto& t : texts) {
    const Ids want = reference(model_, t, true);
    const Ids got = tok.encode(t);
    EXPECT_EQ(got, want) << "text: \"" << show(t) << "\"";
    matched += got == want ? 1 : 0;
    if (valid_utf8(t)) {
      EXPECT_EQ(tok.decode(got, true), t) << "round trip of \"" << show(t) << "\"";
      ++round_trips;
    }
  }
  // Without special-token parsing, for the texts that hold special tokens, and a few others.
  std::size_t unparsed = 0;
  for (const auto& t : texts) {
    if (t.find('<') == std::string::npos && t.find("Hello") == std::string::npos) continue;
    const Ids want = reference(model_, t, false);
    EXPECT_EQ(tok.encode(t, true, false), want) << "parse_special off: \"" << show(t) << "\"";
    EXPECT_EQ(tok.decode(tok.encode(t, true, false)), t);
    ++unparsed;
  }
  std::printf("smollm: %zu of %zu texts give llama.cpp's ids (%zu round trips; %zu more with parse_special off)\n",
              matched, texts.size(), round_trips, unparsed);
}

TEST_F(LlamaCppTokenizer, InvalidUtf8MatchesToo) {
  const auto file = gguf::File::open(model_);
  const auto tok = Tokenizer::from_gguf(file);
  for (const std::string t : {"\xff", "abc\xc3", "\x80\x80 x", "ok\xe4\xbd", "\xc3\x28"}) {
    EXPECT_EQ(tok.encode(t), reference(model_, t, true)) << "text: \"" << show(t) << "\"";
  }
}

// The SmolLM2 vocabulary under each of the other pre-tokenizers: a copy of its metadata (no tensors; llama.cpp
// loads only the vocabulary) with tokenizer.ggml.pre replaced.
TEST_F(LlamaCppTokenizer, EveryPreTokenizerMatches) {
  const auto file = gguf::File::open(model_);
  auto texts = test_strings();
  std::erase_if(texts, [](const std::string& t) { return t.empty() || t.find("<empty_output>") != std::string::npos; });
  const std::string sep = "<empty_output>";  // a control token of this vocabulary
  std::vector<Ids> smollm_ids;  // llama.cpp's ids under "smollm", to show each variant file changes its split
  for (const std::string pre : {"smollm", "gpt-2", "llama-bpe", "qwen2", "default"}) {
    gguf::Writer w(file.metadata());
    w.metadata().set("tokenizer.ggml.pre", pre);
    const fs::path path = dir_ / ("vocab-" + pre + ".gguf");
    w.write(path);
    const auto tok = Tokenizer::from_gguf(gguf::File::open(path));
    const std::int32_t sep_id = *tok.find_token(sep);
    const auto want = reference_batch(path, texts, sep_id, sep);
    std::size_t matched = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const Ids got = tok.encode(texts[i]);
      EXPECT_EQ(got, want[i]) << "pre " << pre << ", text: \"" << show(texts[i]) << "\"";
      matched += got == want[i] ? 1 : 0;
    }
    std::printf("%s: %zu of %zu texts give llama.cpp's ids\n", pre.c_str(), matched, texts.size());
    if (pre == "smollm") {
      smollm_ids = want;
    } else {
      std::size_t differ = 0;
      for (std::size_t i = 0; i < texts.size(); ++i) differ += want[i] != smollm_ids[i] ? 1 : 0;
      EXPECT_GE(differ, 1U) << "llama.cpp split the texts alike under " << pre << " and smollm";
      std::printf("  (%zu texts tokenize differently from smollm in llama.cpp)\n", differ);
    }
  }
}

// SentencePiece, which no real file here uses: a small vocabulary (words with scores, <0xXX> byte tokens,
// control tokens) in a GGUF file that also carries SmolLM2's llama.* hyperparameters, which llama.cpp's loader
// wants even for the vocabulary alone. Every string goes through the byte fallback, the space prefix (also after
// special tokens) and the score-ordered merges.
TEST_F(LlamaCppTokenizer, SentencePieceMatches) {
  const auto file = gguf::File::open(model_);
  gguf::Writer w;
  for (const auto& kv : file.metadata().entries())
    if (kv.key.rfind("tokenizer.", 0) != 0) w.metadata().set(kv.key, kv.value);
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<sep>"};
  std::vector<float> scores = {0, 0, 0, 0};
  std::vector<std::int32_t> types = {2, 3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    static constexpr const char* kHex = "0123456789ABCDEF";
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    scores.push_back(0);
    types.push_back(6);
  }
  const std::vector<std::string> words = {
      "▁",    "e",    "t",      "a",   "o",   "i",  "n",  "s",  "h",    "r",  "l",   "d",     "▁t",
      "he",   "▁the", "▁a",     "in",  "er",  "▁w", "or", "an", "▁h",   "ll", "▁he", "llo",   "▁hello",
      "▁wor", "ld",   "▁world", "▁is", "re",  "on", "at", "▁▁", "▁▁▁▁", "你", "好",  "▁你好", "😀",
      "1",    "2",    "3",      "12",  "123", ",",  ".",  "!",  "▁(",   ")",  "\n",  "é",     "ca"};
  for (std::size_t i = 0; i < words.size(); ++i) {
    tokens.push_back(words[i]);
    scores.push_back(-static_cast<float>(i));  // earlier words score higher
    types.push_back(1);
  }
  w.metadata().set("tokenizer.ggml.model", "llama");
  w.metadata().set("tokenizer.ggml.tokens", tokens);
  w.metadata().set("tokenizer.ggml.scores", scores);
  w.metadata().set("tokenizer.ggml.token_type", types);
  w.metadata().set("tokenizer.ggml.bos_token_id", std::uint32_t{1});
  w.metadata().set("tokenizer.ggml.eos_token_id", std::uint32_t{2});
  w.metadata().set("tokenizer.ggml.unknown_token_id", std::uint32_t{0});
  w.metadata().set("tokenizer.ggml.add_bos_token", false);  // so the batch's first text has no BOS either
  const fs::path path = dir_ / "spm.gguf";
  w.write(path);
  const auto tok = Tokenizer::from_gguf(gguf::File::open(path));
  auto texts = test_strings();
  std::erase_if(texts, [](const std::string& t) { return t.empty() || t.find("<sep>") != std::string::npos; });
  const auto want = reference_batch(path, texts, 3, "<sep>");
  std::size_t matched = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const Ids got = tok.encode(texts[i]);
    EXPECT_EQ(got, want[i]) << "SentencePiece, text: \"" << show(texts[i]) << "\"";
    matched += got == want[i] ? 1 : 0;
  }
  std::printf("SentencePiece: %zu of %zu texts give llama.cpp's ids\n", matched, texts.size());
  // And one by one, with the BOS llama.cpp adds by default for SentencePiece.
  w.metadata().erase("tokenizer.ggml.add_bos_token");
  w.write(path);
  const auto tok_bos = Tokenizer::from_gguf(gguf::File::open(path));
  for (const std::string t : {"hello world", " hello", "hello</s>hello", "h\xc3\xa9", "", "  two  spaces "})
    EXPECT_EQ(tok_bos.encode(t), reference(path, t, true)) << "text: \"" << show(t) << "\"";
}

}  // namespace
}  // namespace rlx::llm
