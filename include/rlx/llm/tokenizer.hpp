#pragma once
// The tokenizer of a GGUF language model, from its `tokenizer.*` metadata, tokenizing as llama.cpp does
// (docs/llm.md, "Tokenizer"):
//
//   auto file = rlx::gguf::File::open("SmolLM2-135M-Instruct.Q4_1.gguf");
//   auto tok = rlx::llm::Tokenizer::from_gguf(file);
//   std::vector<std::int32_t> ids = tok.encode("Hello, world!");   // [19556, 28, 905, 17]
//   std::string text = tok.decode(ids);                             // "Hello, world!"
//
// - "gpt2" vocabularies: byte-level BPE (GPT-2's byte-to-unicode mapping, merges by rank) after the
//   pre-tokenizer `tokenizer.ggml.pre` names (default, gpt-2, smollm, llama3, qwen2 and their aliases).
// - "llama" vocabularies: SentencePiece (scores, U+2581 for spaces, a space prefix, <0xXX> byte fallback).
// - Special tokens (CONTROL, USER_DEFINED and UNKNOWN types) are matched in the text before either, longest
//   first, when parse_special is set (USER_DEFINED ones always, as llama.cpp does).
//
// A Tokenizer is immutable and cheap to copy (the vocabulary is shared); encode and decode are thread-safe.
// Errors are rlx::Error: malformed metadata names the key, a bad token id names the id and the vocab size.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/gguf/gguf.hpp"

namespace rlx::llm {

// tokenizer.ggml.token_type: llama.cpp's llama_token_type.
enum class TokenType : std::int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

enum class TokenizerKind {
  Bpe,  // tokenizer.ggml.model "gpt2"
  Spm,  // tokenizer.ggml.model "llama"
};

inline constexpr std::int32_t kNoToken = -1;

// A vocabulary as plain data: what from_gguf reads, and what tests build by hand.
struct TokenizerVocab {
  TokenizerKind kind = TokenizerKind::Bpe;
  std::string pre = "default";      // tokenizer.ggml.pre (BPE only)
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens
  std::vector<float> scores;        // tokenizer.ggml.scores (SPM's merge priorities); empty: all 0
  std::vector<TokenType> types;     // tokenizer.ggml.token_type; empty: all Normal
  std::vector<std::string> merges;  // tokenizer.ggml.merges, "left right", rank = position (BPE)
  // Special ids; kNoToken for none. nullopt: the model family's default (SPM: bos 1, eos 2, unk 0; BPE: none).
  std::optional<std::int32_t> bos, eos, eot, eom, unk, sep, pad;
  // nullopt: the default for the kind and pre-tokenizer (SPM: add_bos true, add_space_prefix true; BPE: false,
  // except add_bos for llama3).
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;  // tokenizer.chat_template ("" when absent)
};

class Tokenizer {
 public:
  // rlx::Error naming the key when tokenizer metadata is missing, of the wrong type or inconsistent.
  static Tokenizer from_gguf(const gguf::File& file);
  static Tokenizer from_metadata(const gguf::Metadata& metadata);
  // rlx::Error when the vocabulary is inconsistent (array lengths, ids out of range, a merge without a space).
  explicit Tokenizer(TokenizerVocab vocab);

  // Token ids for UTF-8 text. add_special: BOS/EOS as the model asks (add_bos/add_eos). parse_special: special
  // tokens written in the text ("<|im_start|>") become their ids; otherwise they are tokenized as text.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = true) const;
  // The text of the ids, bytes reassembled. render_special: control tokens show as their text (else they are
  // left out, as llama.cpp's detokenizer does). SPM: the leading space the encoder added is removed.
  std::string decode(std::span<const std::int32_t> ids, bool render_special = false) const;
  // The bytes one token stands for (may be part of a UTF-8 sequence); a control token's text.
  const std::string& token_to_piece(std::int32_t id) const;
  // The token's string in the vocabulary (byte-encoded for BPE: "Ġthe").
  const std::string& token_text(std::int32_t id) const;
  TokenType token_type(std::int32_t id) const;
  // The id of a vocabulary string, if any.
  std::optional<std::int32_t> find_token(std::string_view text) const;

  std::int32_t vocab_size() const;
  TokenizerKind kind() const;
  // The pre-tokenizer in use ("smollm", "llama3", ...; "" for SPM).
  const std::string& pre_tokenizer() const;
  std::int32_t bos() const;  // kNoToken when the model has none
  std::int32_t eos() const;
  std::int32_t eot() const;  // end of turn: tokenizer.ggml.eot_token_id, or found by text (<|im_end|>, <|eot_id|>...)
  std::int32_t eom() const;
  std::int32_t unk() const;
  std::int32_t pad() const;
  bool add_bos() const;
  bool add_eos() const;
  // The tokens that end generation: eos, eot, eom and those llama.cpp recognizes by text, sorted.
  const std::vector<std::int32_t>& eog_ids() const;
  bool is_eog(std::int32_t id) const;
  const std::string& chat_template() const;

  // rlx::Error "token id X is outside the vocabulary (N tokens)" unless 0 <= id < vocab_size().
  void check_id(std::int32_t id) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Turns a stream of token ids into printable text: each push returns the text that is complete so far, holding
// back the bytes of a UTF-8 sequence that a later token finishes.
//
//   StreamDecoder out(tok);
//   for (auto id : generated) std::cout << out.push(id) << std::flush;
//   std::cout << out.finish();
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool render_special = false);
  // The text this token completes ("" when it only starts a multi-byte character).
  std::string push(std::int32_t id);
  // What is still held back, each incomplete sequence as U+FFFD; the decoder is then empty.
  std::string finish();
  // Bytes held back (0 to 3).
  std::size_t pending() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool render_special_;
  std::string pending_;
};

// The length of the longest prefix of `bytes` that is complete UTF-8 (an incomplete sequence at the end is left
// out; invalid bytes count as complete, so they are not held back forever).
std::size_t complete_utf8_prefix(std::string_view bytes);

}  // namespace rlx::llm
