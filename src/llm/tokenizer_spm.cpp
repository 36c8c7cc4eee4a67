// SentencePiece (BPE over scores), as llama.cpp's llm_tokenizer_spm_session: the text is split into UTF-8
// characters, the adjacent pair whose concatenation is the highest-scoring token is merged until none is left
// (ties: the leftmost), and each final symbol is emitted as its token, or split back along the merges that
// built it, or as <0xXX> byte tokens when no piece of it is a token.
#include <queue>
#include <utility>

#include "llm/tokenizer_impl.hpp"
#include "llm/unicode.hpp"
#include "rlx/error.hpp"

namespace rlx::llm::detail {
namespace {

using Symbol = MergeSymbol;

struct Bigram {
  int left;
  int right;
  float score;
  std::size_t size;
};

struct Lower {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

class Session {
 public:
  Session(const TokenizerData& d, std::string_view text) : d_(d), text_(text) {}

  void encode(std::vector<std::int32_t>& out) {
    utf8_symbols(text_, symbols_);
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[b.left];
      Symbol& right = symbols_[b.right];
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = b.left;
      add_bigram(left.prev, b.left);
      add_bigram(b.left, left.next);
    }
    if (symbols_.empty()) return;
    for (int i = 0; i != -1; i = symbols_[i].next) resegment(symbols_[i].start, symbols_[i].n, out);
  }

 private:
  void resegment(std::size_t start, std::size_t n, std::vector<std::int32_t>& out) {
    const std::string_view text = text_.substr(start, n);
    if (const std::int32_t id = d_.find(text); id != kNoToken) {
      out.push_back(id);
      return;
    }
    const auto it = rev_merge_.find(text);
    if (it == rev_merge_.end()) {
      for (const char c : text) out.push_back(byte_token(static_cast<std::uint8_t>(c)));
      return;
    }
    const auto [l, r] = it->second;
    resegment(symbols_[l].start, symbols_[r].start - symbols_[l].start, out);
    resegment(symbols_[r].start, start + n - symbols_[r].start, out);
  }

  std::int32_t byte_token(std::uint8_t b) const {
    if (d_.byte_token[b] != kNoToken) return d_.byte_token[b];
    const char c = static_cast<char>(b);
    if (const std::int32_t id = d_.find(std::string_view(&c, 1)); id != kNoToken) return id;
    if (d_.unk != kNoToken) return d_.unk;
    throw Error("tokenizer.ggml.tokens: the SentencePiece vocabulary has no token for byte 0x" +
                std::string(1, "0123456789ABCDEF"[b >> 4]) + std::string(1, "0123456789ABCDEF"[b & 15]) +
                " (no <0xXX> byte fallback and no unknown token)");
  }

  void add_bigram(int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[left];
    const Symbol& r = symbols_[right];
    const std::string_view text = text_.substr(l.start, l.n + r.n);
    const std::int32_t id = d_.find(text);
    if (id == kNoToken) return;
    queue_.push({left, right, d_.scores[id], text.size()});
    rev_merge_.insert_or_assign(std::string(text), std::pair{left, right});
  }

  const TokenizerData& d_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue_;
  std::unordered_map<std::string, std::pair<int, int>, StringHash, std::equal_to<>> rev_merge_;
};

}  // namespace

void encode_spm(const TokenizerData& d, std::string_view text, std::vector<std::int32_t>& out) {
  Session(d, text).encode(out);
}

}  // namespace rlx::llm::detail
