// The pre-tokenizers of llama.cpp's BPE vocabularies (src/llama-vocab.cpp, llm_tokenizer_bpe), written out by
// hand. The three regexes llama.cpp itself matches by hand (GPT-2's, Llama 3's and Qwen 2's, in
// src/unicode.cpp) follow its code step for step, quirks included, since the point is to split exactly as it
// does; the short ones it runs through std::regex over category-collapsed text (\p{N}, [0-9]{3}, ...) are
// the equivalent scans over code point categories.
#include "llm/pretokenize.hpp"

#include <cstddef>
#include <functional>

#include "llm/unicode.hpp"
#include "rlx/error.hpp"

namespace rlx::llm::pre {
namespace {

using unicode::Flag;
using Offsets = std::vector<std::size_t>;  // piece lengths in code points
constexpr std::uint32_t kOutOfRange = 0xFFFFFFFF;

// One piece [ini, end) of the code points, with the accessors llama.cpp's custom splitters use: past the
// piece, a code point reads as kOutOfRange and its flags as 0.
struct Span {
  const std::vector<std::uint32_t>& cpts;
  std::size_t ini;
  std::size_t end;
  std::uint32_t cpt(std::size_t pos) const { return pos >= ini && pos < end ? cpts[pos] : kOutOfRange; }
  std::uint16_t flags(std::size_t pos) const { return pos >= ini && pos < end ? unicode::flags(cpts[pos]) : 0; }
};

bool has(std::uint16_t f, std::uint16_t bits) { return (f & bits) != 0; }
constexpr std::uint16_t kWsLetterNumber = Flag::kWhitespace | Flag::kLetter | Flag::kNumber;

std::uint32_t ascii_lower(std::uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Emits pieces as llama.cpp's _add_token does: a piece ends at `end`; empty pieces are dropped.
struct Emitter {
  Offsets& out;
  std::size_t prev;
  std::size_t add(std::size_t end) {
    const std::size_t len = end - prev;
    if (len > 0) out.push_back(len);
    prev = end;
    return len;
  }
};

// 's|'t|'re|'ve|'m|'ll|'d (case-insensitive for Llama 3 and Qwen 2): the contraction's length at pos, or 0.
std::size_t contraction(const Span& s, std::size_t pos, bool any_case) {
  if (s.cpt(pos) != '\'' || pos + 1 >= s.end) return 0;
  const auto lower = [&](std::uint32_t c) { return any_case ? ascii_lower(c) : c; };
  const std::uint32_t next = lower(s.cpt(pos + 1));
  if (next == 's' || next == 't' || next == 'm' || next == 'd') return 2;
  if (pos + 2 < s.end) {
    const std::uint32_t next2 = lower(s.cpt(pos + 2));
    if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') || (next == 'l' && next2 == 'l')) return 3;
  }
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  (unicode_regex_split_custom_gpt2)
void split_gpt2(const Span& s, Offsets& out) {
  Emitter e{out, s.ini};
  for (std::size_t pos = s.ini; pos < s.end;) {
    const std::uint32_t cpt = s.cpt(pos);
    const std::uint16_t flags = s.flags(pos);
    if (const std::size_t n = contraction(s, pos, false)) {
      pos += e.add(pos + n);
      continue;
    }
    std::uint16_t flags2 = cpt == ' ' ? s.flags(pos + 1) : flags;
    if (has(flags2, Flag::kLetter)) {
      pos += cpt == ' ' ? 1 : 0;
      while (has(flags2, Flag::kLetter)) flags2 = s.flags(++pos);
      e.add(pos);
      continue;
    }
    if (has(flags2, Flag::kNumber)) {
      pos += cpt == ' ' ? 1 : 0;
      while (has(flags2, Flag::kNumber)) flags2 = s.flags(++pos);
      e.add(pos);
      continue;
    }
    if (!has(flags2, kWsLetterNumber) && flags2 != 0) {
      pos += cpt == ' ' ? 1 : 0;
      while (!has(flags2, kWsLetterNumber) && flags2 != 0) flags2 = s.flags(++pos);
      e.add(pos);
      continue;
    }
    std::size_t spaces = 0;
    while (has(s.flags(pos + spaces), Flag::kWhitespace)) ++spaces;
    if (spaces > 1 && s.cpt(pos + spaces) != kOutOfRange) {  // \s+(?!\S)
      pos += spaces - 1;
      e.add(pos);
      continue;
    }
    if (spaces > 0) {  // \s+
      pos += spaces;
      e.add(pos);
      continue;
    }
    e.add(++pos);  // no match: one code point alone
  }
}

// Llama 3's regex (max_digits 3) and Qwen 2's (max_digits 1): unicode_regex_split_custom_llama3 / _qwen2.
void split_llama3(const Span& s, Offsets& out, std::size_t max_digits) {
  Emitter e{out, s.ini};
  for (std::size_t pos = s.ini; pos < s.end;) {
    const std::uint32_t cpt = s.cpt(pos);
    const std::uint16_t flags = s.flags(pos);
    if (const std::size_t n = contraction(s, pos, true)) {
      pos += e.add(pos + n);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!(cpt == '\r' || cpt == '\n' || has(flags, Flag::kNumber))) {
      if (has(flags, Flag::kLetter) || has(s.flags(pos + 1), Flag::kLetter)) {
        ++pos;
        while (has(s.flags(pos), Flag::kLetter)) ++pos;
        e.add(pos);
        continue;
      }
    }
    // \p{N}{1,3} (or \p{N})
    if (has(flags, Flag::kNumber)) {
      std::size_t ini = pos;
      while (has(s.flags(pos), Flag::kNumber)) {
        if (++pos - ini >= max_digits) {
          e.add(pos);
          ini = pos;
        }
      }
      e.add(pos);
      continue;
    }
    // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the first code point's flags, not flags2, for "any")
    std::uint16_t flags2 = cpt == ' ' ? s.flags(pos + 1) : flags;
    if (!has(flags2, kWsLetterNumber) && flags != 0) {
      pos += cpt == ' ' ? 1 : 0;
      while (!has(flags2, kWsLetterNumber) && flags2 != 0) flags2 = s.flags(++pos);
      std::uint32_t cpt2 = s.cpt(pos);
      while (cpt2 == '\r' || cpt2 == '\n') cpt2 = s.cpt(++pos);
      e.add(pos);
      continue;
    }
    std::size_t spaces = 0;
    std::size_t last_newline_end = 0;
    while (has(s.flags(pos + spaces), Flag::kWhitespace)) {
      const std::uint32_t c = s.cpt(pos + spaces);
      if (c == '\r' || c == '\n') last_newline_end = pos + spaces + 1;
      ++spaces;
    }
    if (last_newline_end > 0) {  // \s*[\r\n]+
      pos = last_newline_end;
      e.add(pos);
      continue;
    }
    if (spaces > 1 && s.cpt(pos + spaces) != kOutOfRange) {  // \s+(?!\S)
      pos += spaces - 1;
      e.add(pos);
      continue;
    }
    if (spaces > 0) {  // \s+
      pos += spaces;
      e.add(pos);
      continue;
    }
    e.add(++pos);
  }
}

// A regex that is a character class, alone or repeated ("\p{N}", "\p{N}+"), as std::regex_iterator splits
// with it: each match a piece, and the text between matches a piece.
void split_class(const Span& s, Offsets& out, const std::function<bool(std::uint32_t)>& in_class, bool runs) {
  Emitter e{out, s.ini};
  std::size_t pos = s.ini;
  while (pos < s.end) {
    if (!in_class(s.cpts[pos])) {
      ++pos;
      continue;
    }
    e.add(pos);  // the text before the match
    ++pos;
    while (runs && pos < s.end && in_class(s.cpts[pos])) ++pos;
    e.add(pos);
  }
  e.add(s.end);
}

// [0-9][0-9][0-9]: the leftmost non-overlapping runs of three ASCII digits.
void split_ascii_triples(const Span& s, Offsets& out) {
  Emitter e{out, s.ini};
  const auto digit = [&](std::size_t p) { return p < s.end && s.cpts[p] >= '0' && s.cpts[p] <= '9'; };
  std::size_t pos = s.ini;
  while (pos < s.end) {
    if (digit(pos) && digit(pos + 1) && digit(pos + 2)) {
      e.add(pos);
      pos += 3;
      e.add(pos);
    } else {
      ++pos;
    }
  }
  e.add(s.end);
}

bool punct_class(std::uint32_t c) {
  // [\p{P}\$\+<=>\^~\|]
  return has(unicode::flags(c), Flag::kPunctuation) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
         c == '^' || c == '~' || c == '|';
}

Offsets apply(Rule rule, const std::vector<std::uint32_t>& cpts, const Offsets& in) {
  Offsets out;
  out.reserve(in.size() * 2);
  std::size_t start = 0;
  for (const std::size_t len : in) {
    const Span s{cpts, start, start + len};
    start += len;
    switch (rule) {
      case Rule::IsolateNumbers: split_class(s, out, unicode::is_number, false); break;
      case Rule::NumberRuns: split_class(s, out, unicode::is_number, true); break;
      case Rule::AsciiTriples: split_ascii_triples(s, out); break;
      case Rule::PunctRuns: split_class(s, out, punct_class, true); break;
      case Rule::Gpt2: split_gpt2(s, out); break;
      case Rule::Llama3: split_llama3(s, out, 3); break;
      case Rule::Qwen2: split_llama3(s, out, 1); break;
    }
  }
  return out;
}

bool one_of(std::string_view s, std::initializer_list<std::string_view> names) {
  for (auto n : names)
    if (s == n) return true;
  return false;
}

}  // namespace

Variant variant(std::string_view pre) {
  // The names and their regex lists as llama.cpp's llama_vocab::impl::load and llm_tokenizer_bpe set them.
  if (pre.empty() || pre == "default")
    return {"default", {Rule::PunctRuns, Rule::Gpt2, Rule::NumberRuns, Rule::AsciiTriples}};
  if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}))
    return {"llama3", {Rule::Llama3}, true, true};
  if (one_of(pre, {"dbrx", "smaug-bpe"})) return {"llama3", {Rule::Llama3}};
  if (one_of(pre, {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"}))
    return {"smollm", {Rule::IsolateNumbers, Rule::Gpt2}};
  if (one_of(pre, {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                   "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling"}))
    return {"gpt-2", {Rule::Gpt2}};
  if (one_of(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open"}))
    return {"qwen2", {Rule::Qwen2}};
  throw Error("tokenizer.ggml.pre: pre-tokenizer '" + std::string(pre) +
              "' is not implemented (RLX has default, gpt-2, smollm, llama3 and qwen2 and their aliases)");
}

std::vector<std::string> split(const Variant& v, const std::vector<std::uint32_t>& cpts) {
  if (cpts.empty()) return {};
  Offsets offsets{cpts.size()};
  for (const Rule r : v.rules) offsets = apply(r, cpts, offsets);
  std::vector<std::string> pieces;
  pieces.reserve(offsets.size());
  std::size_t start = 0;
  for (const std::size_t len : offsets) {
    std::string& p = pieces.emplace_back();
    for (std::size_t i = start; i < start + len; ++i) unicode::append_utf8(p, cpts[i]);
    start += len;
  }
  return pieces;
}

}  // namespace rlx::llm::pre
