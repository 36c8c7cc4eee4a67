// Byte-level BPE, as llama.cpp's llm_tokenizer_bpe_session: the pre-tokenizer splits the text into pieces,
// each piece's bytes become GPT-2's printable code points, and the adjacent pair of lowest merge rank is merged
// until none is left (ties: the leftmost). The merged symbols are looked up as tokens; a symbol that is not one
// falls back to its single bytes, and a byte with no token is dropped, as llama.cpp does.
#include <queue>

#include "llm/tokenizer_impl.hpp"
#include "llm/unicode.hpp"

namespace rlx::llm::detail {
namespace {

using Symbol = MergeSymbol;

struct Bigram {
  int left;
  int right;
  std::int32_t rank;
  std::size_t size;  // the bytes of both symbols when queued: a merge since then changes it
};

struct Later {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

class Merger {
 public:
  explicit Merger(const TokenizerData& d) : d_(d) {}

  void encode(const std::string& piece, std::vector<std::int32_t>& out) {
    if (d_.pre.ignore_merges) {
      if (const std::int32_t id = d_.find(piece); id != kNoToken) {
        out.push_back(id);
        return;
      }
    }
    piece_ = &piece;
    queue_ = {};
    utf8_symbols(piece, symbols_);
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[b.left];
      Symbol& right = symbols_[b.right];
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // outdated
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = b.left;
      add_bigram(left.prev, b.left);
      add_bigram(b.left, left.next);
    }
    for (const Symbol& s : symbols_) {
      if (s.n == 0) continue;
      const std::string_view text = view(s);
      if (const std::int32_t id = d_.find(text); id != kNoToken) {
        out.push_back(id);
        continue;
      }
      for (const char c : text) {
        if (const std::int32_t id = d_.find(std::string_view(&c, 1)); id != kNoToken) out.push_back(id);
      }
    }
  }

 private:
  std::string_view view(const Symbol& s) const { return std::string_view(*piece_).substr(s.start, s.n); }

  void add_bigram(int left, int right) {
    if (left < 0 || right < 0) return;
    merge_key(key_, view(symbols_[left]), view(symbols_[right]));
    const auto it = d_.merge_rank.find(key_);
    if (it == d_.merge_rank.end()) return;
    queue_.push({left, right, it->second, symbols_[left].n + symbols_[right].n});
  }

  const TokenizerData& d_;
  const std::string* piece_ = nullptr;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, Later> queue_;
  std::string key_;
};

}  // namespace

void encode_bpe(const TokenizerData& d, std::string_view text, std::vector<std::int32_t>& out) {
  const auto pieces = pre::split(d.pre, unicode::decode_utf8(text));
  Merger merger(d);
  std::string encoded;
  for (const std::string& piece : pieces) {
    encoded.clear();
    for (const char c : piece) encoded += unicode::byte_to_unicode(static_cast<std::uint8_t>(c));
    merger.encode(encoded, out);
  }
}

}  // namespace rlx::llm::detail
