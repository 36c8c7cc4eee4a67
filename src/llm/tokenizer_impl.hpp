#pragma once
// The tokenizer's state (internal to src/llm), shared by tokenizer.cpp (loading, special tokens, decoding) and
// the two encoders, tokenizer_bpe.cpp and tokenizer_spm.cpp.
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "llm/pretokenize.hpp"
#include "llm/unicode.hpp"
#include "rlx/llm/tokenizer.hpp"

namespace rlx::llm::detail {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

struct TokenizerData {
  TokenizerKind kind = TokenizerKind::Bpe;
  pre::Variant pre;  // BPE
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<TokenType> types;
  StringMap token_to_id;  // a string that appears twice maps to its last id, as in llama.cpp
  // BPE merges: merge_key(left, right) -> rank.
  StringMap merge_rank;
  // What each token decodes to (control tokens: their text).
  std::vector<std::string> pieces;
  // Tokens matched in the text before tokenizing (control, user-defined, unknown), longest first.
  std::vector<std::int32_t> specials;
  std::array<std::int32_t, 256> byte_token{};  // SPM: the <0xXX> token of each byte, or kNoToken
  std::int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken, sep = kNoToken,
               pad = kNoToken;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::vector<std::int32_t> eog;  // sorted
  std::string chat_template;

  std::int32_t find(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? kNoToken : it->second;
  }
};

// The merge table's key of a pair: the left part's length, then both parts (unambiguous for any strings).
inline void merge_key(std::string& key, std::string_view left, std::string_view right) {
  key.clear();
  const auto n = static_cast<std::uint32_t>(left.size());
  key.append(reinterpret_cast<const char*>(&n), sizeof n);
  key.append(left);
  key.append(right);
}

// Appends the ids of one piece of raw text (no special tokens in it).
void encode_bpe(const TokenizerData& d, std::string_view text, std::vector<std::int32_t>& out);
// text: the fragment with spaces already replaced by U+2581 (and the prefix added).
void encode_spm(const TokenizerData& d, std::string_view text, std::vector<std::int32_t>& out);

// One symbol of a merge (BPE and SentencePiece alike): a byte range of the text, linked to its neighbours.
struct MergeSymbol {
  int prev;
  int next;
  std::size_t start;  // into the text being merged
  std::size_t n;      // 0 once merged into its left neighbour
};

// `text` as one symbol per UTF-8 character (a truncated sequence at the end is one symbol), linked in order,
// into `out` (cleared; its storage is reused from piece to piece).
inline void utf8_symbols(std::string_view text, std::vector<MergeSymbol>& out) {
  out.clear();
  for (std::size_t off = 0; off < text.size();) {
    const std::size_t n =
        std::min(text.size() - off, unicode::utf8_sequence_length(static_cast<unsigned char>(text[off])));
    const int index = static_cast<int>(out.size());
    out.push_back({index - 1, off + n == text.size() ? -1 : index + 1, off, n});
    off += n;
  }
}

}  // namespace rlx::llm::detail
