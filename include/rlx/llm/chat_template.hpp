#pragma once
// Chat templates: a conversation as the prompt text a model was trained on (docs/llm.md, "Chat template").
// The template's kind is detected from markers in `tokenizer.chat_template`, as llama.cpp's
// llm_chat_detect_template does, and each kind is rendered by code (no Jinja interpreter):
//
//   auto tmpl = rlx::llm::ChatTemplate::from_tokenizer(tok);       // ChatML for SmolLM2
//   std::string prompt = tmpl.apply({{"user", "Hi!"}}, true);
//   // "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
//   // "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
//
// The prompt holds special tokens as text: encode it with parse_special (the default).
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/llm/tokenizer.hpp"

namespace rlx::llm {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatTemplateKind {
  ChatMl,          // <|im_start|>role\ncontent<|im_end|>\n
  Llama3,          // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  Llama2,          // [INST] user [/INST]assistant</s>, a system message inlined
  Llama2Sys,       // Llama 2 with <<SYS>>\n...\n<</SYS>>\n\n
  Llama2SysBos,    // ... and <s> before each later [INST]
  Llama2SysStrip,  // ... with each message's content trimmed
};

// "chatml", "llama3", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip" (llama.cpp's names).
std::string_view chat_template_name(ChatTemplateKind kind);
std::optional<ChatTemplateKind> chat_template_from_name(std::string_view name);
// The kind of a template's source (or of one of the names above); rlx::Error quoting the template's start when
// it is none RLX renders.
ChatTemplateKind detect_chat_template(std::string_view source);

class ChatTemplate {
 public:
  // For ChatML, default_system is the system message put first when the conversation does not start with one
  // (SmolLM2's template does this); empty for none.
  explicit ChatTemplate(ChatTemplateKind kind, std::string default_system = {});
  // Detects the kind and, for ChatML, the default system prompt a template inserts.
  static ChatTemplate from_source(std::string_view source);
  // From the tokenizer's tokenizer.chat_template; `kind` overrides detection (needed when the model has no
  // template or one RLX does not recognize).
  static ChatTemplate from_tokenizer(const Tokenizer& tokenizer, std::optional<ChatTemplateKind> kind = std::nullopt);

  // The prompt for the messages; add_generation_prompt opens the assistant's turn.
  std::string apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  std::string apply(std::initializer_list<ChatMessage> messages, bool add_generation_prompt) const {
    return apply(std::span<const ChatMessage>(messages.begin(), messages.size()), add_generation_prompt);
  }

  ChatTemplateKind kind() const { return kind_; }
  const std::string& default_system() const { return default_system_; }

 private:
  ChatTemplateKind kind_;
  std::string default_system_;
};

// ChatTemplate::from_tokenizer(tokenizer, kind).apply(messages, add_generation_prompt).
std::string apply_chat_template(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, std::optional<ChatTemplateKind> kind = std::nullopt);

}  // namespace rlx::llm
