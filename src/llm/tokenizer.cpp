// The tokenizer: reading tokenizer.* metadata, the special tokens (found by type and, as llama.cpp does, by
// text), splitting text at special tokens before the BPE/SPM encoders run, and decoding.
#include "rlx/llm/tokenizer.hpp"

#include <algorithm>
#include <initializer_list>

#include "llm/tokenizer_impl.hpp"
#include "llm/unicode.hpp"
#include "rlx/error.hpp"

namespace rlx::llm {

struct Tokenizer::Impl : detail::TokenizerData {};

namespace {

using detail::TokenizerData;

const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  std::size_t pos = 0;
  while (true) {
    const std::size_t at = s.find(from, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(to);
    pos = at + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

bool special_type(TokenType t) {
  return t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0x0A>" -> 10; -1 for any other text.
int byte_of(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = hex_digit(text[3]);
  const int lo = hex_digit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string piece_of(const TokenizerData& d, std::int32_t id) {
  const std::string& text = d.tokens[id];
  const TokenType type = d.types[id];
  if (special_type(type)) return text;
  if (type == TokenType::Byte) {
    if (const int b = byte_of(text); b >= 0) return std::string(1, static_cast<char>(b));
  } else if (type != TokenType::Normal) {
    return {};  // unused and undefined tokens decode to nothing, as in llama.cpp
  }
  if (d.kind == TokenizerKind::Spm) return replace_all(text, kSpace, " ");
  std::string out;
  for (const std::uint32_t cpt : unicode::decode_utf8(text)) {
    const int b = unicode::unicode_to_byte(cpt);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      unicode::append_utf8(out, cpt);  // not a byte-encoded character: kept as it is
    }
  }
  return out;
}

std::int32_t find_first(const TokenizerData& d, std::initializer_list<std::string_view> texts) {
  for (const auto t : texts)
    if (const std::int32_t id = d.find(t); id != kNoToken) return id;
  return kNoToken;
}

// The end-of-turn and end-of-generation tokens llama.cpp recognizes by their text (llama_vocab::impl::load).
void find_special_by_text(TokenizerData& d) {
  if (d.eot == kNoToken) {
    d.eot = find_first(d, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                           "<EOT>", "_<EOT>", "[EOT]",
                           "<｜end▁of▁sentence｜>",  // DeepSeek's, in fullwidth bars and U+2581
                           "<end_of_utterance>"});
  }
  if (d.eom == kNoToken) d.eom = find_first(d, {"<|eom_id|>"});
  std::vector<std::int32_t> eog;
  const auto add = [&](std::int32_t id) {
    if (id == kNoToken) return;
    eog.push_back(id);
    // A token that ends generation is a control token, whatever the file says (llama.cpp overrides it too).
    if (d.types[id] == TokenType::Normal) d.types[id] = TokenType::Control;
  };
  add(find_first(d, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}));
  add(find_first(d, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}));
  add(find_first(d, {"<|file_sep|>"}));
  for (const std::string_view t : {"<|eot_id|>",
                                   "<|im_end|>",
                                   "<|end|>",
                                   "<|return|>",
                                   "<|call|>",
                                   "<|flush|>",
                                   "<|calls|>",
                                   "<end_of_turn>",
                                   "<|endoftext|>",
                                   "</s>",
                                   "<|eom_id|>",
                                   "<EOT>",
                                   "_<EOT>",
                                   "[EOT]",
                                   "[EOS]",
                                   "<|end_of_text|>",
                                   "<end_of_utterance>",
                                   "<eos>",
                                   "<turn|>",
                                   "<|tool_response>"}) {
    add(d.find(t));
  }
  add(d.eos);
  add(d.eot);
  add(d.eom);
  if (d.eot != kNoToken && d.types[d.eot] == TokenType::Normal) d.types[d.eot] = TokenType::Control;
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  d.eog = std::move(eog);
}

std::int32_t resolve_id(const std::optional<std::int32_t>& given, std::int32_t fallback, std::size_t n,
                        std::string_view key) {
  const std::int32_t id = given ? *given : fallback;
  if (id == kNoToken) return kNoToken;
  if (id < 0 || static_cast<std::size_t>(id) >= n) {
    if (!given) return kNoToken;  // a family default the vocabulary is too small for
    throw Error(std::string(key) + " = " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(n) +
                " tokens)");
  }
  return id;
}

template <class T>
const std::vector<T>* optional_array(const gguf::Metadata& m, std::string_view key) {
  if (!m.contains(key)) return nullptr;
  return &m.get_array_of<T>(key);
}

std::optional<bool> optional_bool(const gguf::Metadata& m, std::string_view key) {
  if (!m.contains(key)) return std::nullopt;
  return m.get_bool(key);
}

std::optional<std::int32_t> optional_id(const gguf::Metadata& m, std::string_view key) {
  const auto v = m.find_integer(key);
  if (!v) return std::nullopt;
  if (*v < -1 || *v > INT32_MAX) throw Error(std::string(key) + " = " + std::to_string(*v) + " is not a token id");
  return static_cast<std::int32_t>(*v);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const gguf::File& file) { return from_metadata(file.metadata()); }

Tokenizer Tokenizer::from_metadata(const gguf::Metadata& m) {
  TokenizerVocab v;
  const std::string& model = m.get_string("tokenizer.ggml.model");
  if (model == "gpt2") {
    v.kind = TokenizerKind::Bpe;
  } else if (model == "llama") {
    v.kind = TokenizerKind::Spm;
  } else {
    throw Error("tokenizer.ggml.model: '" + model + "' is not supported (RLX reads 'gpt2' (BPE) and 'llama' (SPM))");
  }
  v.tokens = m.get_array_of<std::string>("tokenizer.ggml.tokens");
  if (v.kind == TokenizerKind::Bpe) {
    v.merges = m.get_array_of<std::string>("tokenizer.ggml.merges");
    v.pre = m.find_string("tokenizer.ggml.pre").value_or("default");
  }
  if (m.contains("tokenizer.ggml.scores")) {
    const auto& a = m.get_array("tokenizer.ggml.scores");
    if (a.holds<float>()) {
      v.scores = a.as<float>();
    } else if (a.holds<std::int32_t>()) {
      for (const std::int32_t s : a.as<std::int32_t>()) v.scores.push_back(static_cast<float>(s));
    } else {
      throw Error("tokenizer.ggml.scores: expected an array of f32 (or i32), got " +
                  m.at("tokenizer.ggml.scores").type_name());
    }
  }
  if (const auto* types = optional_array<std::int32_t>(m, "tokenizer.ggml.token_type")) {
    for (const std::int32_t t : *types)
      v.types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::Undefined);
  }
  v.bos = optional_id(m, "tokenizer.ggml.bos_token_id");
  v.eos = optional_id(m, "tokenizer.ggml.eos_token_id");
  v.eot = optional_id(m, "tokenizer.ggml.eot_token_id");
  v.eom = optional_id(m, "tokenizer.ggml.eom_token_id");
  v.unk = optional_id(m, "tokenizer.ggml.unknown_token_id");
  v.sep = optional_id(m, "tokenizer.ggml.seperator_token_id");  // sic: the key as llama.cpp and gguf-py spell it
  v.pad = optional_id(m, "tokenizer.ggml.padding_token_id");
  v.add_bos = optional_bool(m, "tokenizer.ggml.add_bos_token");
  v.add_eos = optional_bool(m, "tokenizer.ggml.add_eos_token");
  v.add_space_prefix = optional_bool(m, "tokenizer.ggml.add_space_prefix");
  v.chat_template = m.find_string("tokenizer.chat_template").value_or("");
  return Tokenizer(std::move(v));
}

Tokenizer::Tokenizer(TokenizerVocab v) {
  auto d = std::make_shared<Impl>();
  const std::size_t n = v.tokens.size();
  if (n == 0) throw Error("tokenizer.ggml.tokens is empty");
  if (n > static_cast<std::size_t>(INT32_MAX)) throw Error("tokenizer.ggml.tokens has too many tokens");
  if (!v.scores.empty() && v.scores.size() < n)
    throw Error("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " + std::to_string(n) +
                " tokens");
  if (!v.types.empty() && v.types.size() < n)
    throw Error("tokenizer.ggml.token_type has " + std::to_string(v.types.size()) + " entries for " +
                std::to_string(n) + " tokens");
  d->kind = v.kind;
  d->tokens = std::move(v.tokens);
  d->scores = v.scores.empty() ? std::vector<float>(n, 0.0F) : std::move(v.scores);
  d->types = v.types.empty() ? std::vector<TokenType>(n, TokenType::Normal) : std::move(v.types);
  d->scores.resize(n);
  d->types.resize(n);
  d->token_to_id.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (d->tokens[i].empty()) d->tokens[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp names them
    d->token_to_id.insert_or_assign(d->tokens[i], static_cast<std::int32_t>(i));
  }

  if (d->kind == TokenizerKind::Bpe) {
    d->pre = pre::variant(v.pre);
    if (v.merges.empty()) throw Error("tokenizer.ggml.merges is missing or empty (a BPE vocabulary needs merges)");
    d->merge_rank.reserve(v.merges.size());
    std::string key;
    for (std::size_t i = 0; i < v.merges.size(); ++i) {
      const std::string& merge = v.merges[i];
      const std::size_t space = merge.find(' ', 1);
      if (space == std::string::npos)
        throw Error("tokenizer.ggml.merges[" + std::to_string(i) + "] '" + merge +
                    "' is not two parts separated by a space");
      detail::merge_key(key, std::string_view(merge).substr(0, space), std::string_view(merge).substr(space + 1));
      d->merge_rank.emplace(key, static_cast<std::int32_t>(i));  // the first (lowest) rank of a repeated pair
    }
  }
  const bool spm = d->kind == TokenizerKind::Spm;
  d->bos = resolve_id(v.bos, spm ? 1 : kNoToken, n, "tokenizer.ggml.bos_token_id");
  d->eos = resolve_id(v.eos, spm ? 2 : kNoToken, n, "tokenizer.ggml.eos_token_id");
  d->eot = resolve_id(v.eot, kNoToken, n, "tokenizer.ggml.eot_token_id");
  d->eom = resolve_id(v.eom, kNoToken, n, "tokenizer.ggml.eom_token_id");
  d->unk = resolve_id(v.unk, spm ? 0 : kNoToken, n, "tokenizer.ggml.unknown_token_id");
  d->sep = resolve_id(v.sep, kNoToken, n, "tokenizer.ggml.seperator_token_id");
  d->pad = resolve_id(v.pad, kNoToken, n, "tokenizer.ggml.padding_token_id");
  d->add_bos = v.add_bos.value_or(spm || d->pre.add_bos);
  d->add_eos = v.add_eos.value_or(false);
  d->add_space_prefix = v.add_space_prefix.value_or(spm);
  if (d->add_bos && d->bos == kNoToken)
    throw Error("tokenizer.ggml.add_bos_token is set but the vocabulary has no BOS token");
  if (d->add_eos && d->eos == kNoToken)
    throw Error("tokenizer.ggml.add_eos_token is set but the vocabulary has no EOS token");
  d->chat_template = std::move(v.chat_template);

  find_special_by_text(*d);
  for (std::size_t i = 0; i < n; ++i)
    if (special_type(d->types[i])) d->specials.push_back(static_cast<std::int32_t>(i));
  std::stable_sort(d->specials.begin(), d->specials.end(),
                   [&](std::int32_t a, std::int32_t b) { return d->tokens[a].size() > d->tokens[b].size(); });
  d->byte_token.fill(kNoToken);
  if (spm) {
    for (int b = 0; b < 256; ++b) {
      static constexpr const char* kHex = "0123456789ABCDEF";
      const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
      d->byte_token[b] = d->find(name);
    }
  }
  d->pieces.reserve(n);
  for (std::size_t i = 0; i < n; ++i) d->pieces.push_back(piece_of(*d, static_cast<std::int32_t>(i)));
  impl_ = std::move(d);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& d = *impl_;
  // The text split at special tokens, longest first and leftmost, as llama.cpp's tokenizer_st_partition.
  struct Fragment {
    std::int32_t token;  // kNoToken: raw text [offset, offset + length)
    std::size_t offset;
    std::size_t length;
  };
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  for (const std::int32_t id : d.specials) {
    const TokenType type = d.types[id];
    if (!parse_special && (type == TokenType::Control || type == TokenType::Unknown)) continue;
    const std::string& s = d.tokens[id];
    if (text.find(s) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::size_t pos = f.offset;
      const std::size_t end = f.offset + f.length;
      while (true) {
        const std::size_t at = text.substr(0, end).find(s, pos);
        if (at == std::string_view::npos) break;
        if (at > pos) next.push_back({kNoToken, pos, at - pos});
        next.push_back({id, at, s.size()});
        pos = at + s.size();
      }
      if (pos < end) next.push_back({kNoToken, pos, end - pos});
    }
    fragments.swap(next);
  }

  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && d.add_bos) out.push_back(d.bos);
  bool prev_special = true;  // SPM: a space prefix at the start and after each special token
  for (const Fragment& f : fragments) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.offset, f.length);
    if (d.kind == TokenizerKind::Bpe) {
      detail::encode_bpe(d, raw, out);
    } else {
      std::string escaped = d.add_space_prefix && prev_special ? " " : "";
      escaped.append(raw);
      detail::encode_spm(d, replace_all(escaped, " ", kSpace), out);
    }
    prev_special = false;
  }
  if (add_special && d.add_eos) out.push_back(d.eos);
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool render_special) const {
  const Impl& d = *impl_;
  std::string out;
  bool strip_space = d.kind == TokenizerKind::Spm && d.add_space_prefix;
  for (const std::int32_t id : ids) {
    check_id(id);
    const TokenType type = d.types[id];
    if (!render_special && (type == TokenType::Control || type == TokenType::Unknown)) continue;
    std::string_view piece = d.pieces[id];
    if (piece.empty()) continue;
    if (strip_space && piece.front() == ' ' && !special_type(type)) piece.remove_prefix(1);
    strip_space = false;
    out.append(piece);
  }
  return out;
}

void Tokenizer::check_id(std::int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(vocab_size()) +
                " tokens)");
}

const std::string& Tokenizer::token_to_piece(std::int32_t id) const {
  check_id(id);
  return impl_->pieces[id];
}
const std::string& Tokenizer::token_text(std::int32_t id) const {
  check_id(id);
  return impl_->tokens[id];
}
TokenType Tokenizer::token_type(std::int32_t id) const {
  check_id(id);
  return impl_->types[id];
}
std::optional<std::int32_t> Tokenizer::find_token(std::string_view text) const {
  const std::int32_t id = impl_->find(text);
  if (id == kNoToken) return std::nullopt;
  return id;
}
std::int32_t Tokenizer::vocab_size() const { return static_cast<std::int32_t>(impl_->tokens.size()); }
TokenizerKind Tokenizer::kind() const { return impl_->kind; }
const std::string& Tokenizer::pre_tokenizer() const { return impl_->pre.name; }
std::int32_t Tokenizer::bos() const { return impl_->bos; }
std::int32_t Tokenizer::eos() const { return impl_->eos; }
std::int32_t Tokenizer::eot() const { return impl_->eot; }
std::int32_t Tokenizer::eom() const { return impl_->eom; }
std::int32_t Tokenizer::unk() const { return impl_->unk; }
std::int32_t Tokenizer::pad() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
const std::vector<std::int32_t>& Tokenizer::eog_ids() const { return impl_->eog; }
bool Tokenizer::is_eog(std::int32_t id) const { return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id); }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

// ---- streaming ----

std::size_t complete_utf8_prefix(std::string_view bytes) {
  // Only the last 3 bytes can be the start of an unfinished sequence.
  const std::size_t n = bytes.size();
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, n); ++back) {
    const auto b = static_cast<unsigned char>(bytes[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    std::size_t need = 0;
    if ((b & 0xE0) == 0xC0)
      need = 2;
    else if ((b & 0xF0) == 0xE0)
      need = 3;
    else if ((b & 0xF8) == 0xF0)
      need = 4;
    // An ASCII or invalid lead byte, or a sequence already complete, ends nothing early.
    return need > back ? n - back : n;
  }
  return n;
}

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool render_special)
    : tokenizer_(std::move(tokenizer)), render_special_(render_special) {}

std::string StreamDecoder::push(std::int32_t id) {
  const TokenType type = tokenizer_.token_type(id);
  if (!render_special_ && (type == TokenType::Control || type == TokenType::Unknown)) return {};
  pending_ += tokenizer_.token_to_piece(id);
  const std::size_t done = complete_utf8_prefix(pending_);
  std::string out = pending_.substr(0, done);
  pending_.erase(0, done);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  if (!pending_.empty()) unicode::append_utf8(out, unicode::kReplacement);
  pending_.clear();
  return out;
}

}  // namespace rlx::llm
