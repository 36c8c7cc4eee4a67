#pragma once
// BPE pre-tokenizers (internal to src/llm): the splitting regexes of llama.cpp's llm_tokenizer_bpe, per
// `tokenizer.ggml.pre`, written out by hand over code point categories (std::regex has no \p{L}). Each
// variant is a list of rules applied in turn, each one splitting every piece the rule before left, as
// llama.cpp's unicode_regex_split does.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::llm::pre {

enum class Rule : std::uint8_t {
  IsolateNumbers,  // \p{N}: every number its own piece
  NumberRuns,      // \p{N}+
  AsciiTriples,    // [0-9][0-9][0-9]
  PunctRuns,       // [\p{P}\$\+<=>\^~\|]+
  Gpt2,            // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Llama3,          // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                   // ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,           // Llama3's with \p{N} for \p{N}{1,3}
};

struct Variant {
  std::string name;  // the canonical name: "default", "gpt-2", "smollm", "llama3", "qwen2"
  std::vector<Rule> rules;
  bool ignore_merges = false;  // a piece that is a whole token is taken as is (llama.cpp's ignore_merges)
  bool add_bos = false;        // the default of tokenizer.ggml.add_bos_token (true for Llama 3)
};

// The variant a `tokenizer.ggml.pre` value names ("" is "default", as in llama.cpp); rlx::Error naming the key
// and the value for one that is not implemented.
Variant variant(std::string_view pre);

// Splits text into pieces (UTF-8, in order; their concatenation is the text, with invalid UTF-8 replaced by
// U+FFFD). The code points are decoded once by the caller.
std::vector<std::string> split(const Variant& v, const std::vector<std::uint32_t>& cpts);

}  // namespace rlx::llm::pre
