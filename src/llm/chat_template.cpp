// Chat templates by kind, rendered as llama.cpp's llm_chat_apply_template renders them, and detected from the
// template source by the markers llm_chat_detect_template looks for.
#include "rlx/llm/chat_template.hpp"

#include <array>
#include <cctype>
#include <sstream>
#include <utility>

#include "rlx/error.hpp"

namespace rlx::llm {
namespace {

constexpr std::array<std::pair<ChatTemplateKind, std::string_view>, 6> kNames = {{
    {ChatTemplateKind::ChatMl, "chatml"},
    {ChatTemplateKind::Llama3, "llama3"},
    {ChatTemplateKind::Llama2, "llama2"},
    {ChatTemplateKind::Llama2Sys, "llama2-sys"},
    {ChatTemplateKind::Llama2SysBos, "llama2-sys-bos"},
    {ChatTemplateKind::Llama2SysStrip, "llama2-sys-strip"},
}};

std::string trim(std::string_view s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string excerpt(std::string_view s) {
  std::string out(s.substr(0, 80));
  for (char& c : out)
    if (c == '\n') c = ' ';
  return s.size() > 80 ? out + "..." : out;
}

// A Jinja string literal starting at s[at] (a quote); its value, escapes resolved.
std::optional<std::string> jinja_literal(std::string_view s, std::size_t at) {
  const char quote = s[at];
  std::string out;
  for (std::size_t i = at + 1; i < s.size(); ++i) {
    const char c = s[i];
    if (c == quote) return out;
    if (c == '\\' && i + 1 < s.size()) {
      const char e = s[++i];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
    } else {
      out += c;
    }
  }
  return std::nullopt;
}

// The system message a ChatML template inserts when the first message is not a system one (SmolLM2's:
// {% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n...<|im_end|>\n' }}{% endif %}).
std::string chatml_default_system(std::string_view src) {
  std::size_t cond = std::string_view::npos;
  for (const std::string_view marker : {"messages[0]['role'] != 'system'", "messages[0][\"role\"] != \"system\"",
                                        "messages[0].role != 'system'", "messages[0]['role'] != \"system\""}) {
    cond = std::min(cond, src.find(marker));
  }
  if (cond == std::string_view::npos) return {};
  const std::size_t end_if = src.find("endif", cond);
  for (const std::string_view open : {"'<|im_start|>system", "\"<|im_start|>system"}) {
    const std::size_t at = src.find(open, cond);
    if (at == std::string_view::npos || at > end_if) continue;
    const auto literal = jinja_literal(src, at);
    if (!literal) continue;
    const std::string_view head = "<|im_start|>system\n";
    const std::size_t close = literal->find("<|im_end|>");
    if (literal->rfind(head, 0) != 0 || close == std::string::npos) continue;
    return literal->substr(head.size(), close - head.size());
  }
  return {};
}

}  // namespace

std::string_view chat_template_name(ChatTemplateKind kind) {
  for (const auto& [k, name] : kNames)
    if (k == kind) return name;
  return "unknown";
}

std::optional<ChatTemplateKind> chat_template_from_name(std::string_view name) {
  for (const auto& [k, n] : kNames)
    if (n == name) return k;
  return std::nullopt;
}

ChatTemplateKind detect_chat_template(std::string_view src) {
  if (const auto named = chat_template_from_name(src)) return *named;
  const auto has = [&](std::string_view marker) { return src.find(marker) != std::string_view::npos; };
  const auto unsupported = [&](std::string_view what) -> Error {
    return Error("tokenizer.chat_template looks like " + std::string(what) +
                 ", which RLX does not render (it renders chatml, llama3 and the llama2 forms; pass one "
                 "explicitly): \"" +
                 excerpt(src) + "\"");
  };
  if (src.empty())
    throw Error("the model has no tokenizer.chat_template: pass the template kind (chatml, llama3, llama2...)");
  if (has("<|im_start|>")) {
    if (has("<|im_sep|>")) throw unsupported("Phi-4");
    if (has("<end_of_utterance>")) throw unsupported("SmolVLM");
    return ChatTemplateKind::ChatMl;
  }
  if (src.rfind("mistral", 0) == 0 || has("[INST]")) {
    if (has("[SYSTEM_PROMPT]") || has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]"))
      throw unsupported("a Mistral template");
    if (has("content.strip()")) return ChatTemplateKind::Llama2SysStrip;
    if (has("bos_token + '[INST]")) return ChatTemplateKind::Llama2SysBos;
    if (has("<<SYS>>")) return ChatTemplateKind::Llama2Sys;
    return ChatTemplateKind::Llama2;
  }
  if (has("<|assistant|>") && has("<|end|>")) throw unsupported("Phi-3");
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatTemplateKind::Llama3;
  throw Error(
      "tokenizer.chat_template is not a template RLX recognizes (ChatML, Llama 3, Llama 2 [INST]); pass "
      "the kind explicitly (chatml, llama3, llama2...): \"" +
      excerpt(src) + "\"");
}

ChatTemplate::ChatTemplate(ChatTemplateKind kind, std::string default_system)
    : kind_(kind), default_system_(std::move(default_system)) {}

ChatTemplate ChatTemplate::from_source(std::string_view source) {
  const ChatTemplateKind kind = detect_chat_template(source);
  return ChatTemplate(kind, kind == ChatTemplateKind::ChatMl ? chatml_default_system(source) : std::string());
}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tokenizer, std::optional<ChatTemplateKind> kind) {
  if (!kind) return from_source(tokenizer.chat_template());
  const std::string& src = tokenizer.chat_template();
  return ChatTemplate(*kind, *kind == ChatTemplateKind::ChatMl ? chatml_default_system(src) : std::string());
}

std::string ChatTemplate::apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  std::ostringstream ss;
  switch (kind_) {
    case ChatTemplateKind::ChatMl: {
      if (!default_system_.empty() && (messages.empty() || messages.front().role != "system"))
        ss << "<|im_start|>system\n" << default_system_ << "<|im_end|>\n";
      for (const auto& m : messages) ss << "<|im_start|>" << m.role << "\n" << m.content << "<|im_end|>\n";
      if (add_generation_prompt) ss << "<|im_start|>assistant\n";
      break;
    }
    case ChatTemplateKind::Llama3: {
      for (const auto& m : messages)
        ss << "<|start_header_id|>" << m.role << "<|end_header_id|>\n\n" << trim(m.content) << "<|eot_id|>";
      if (add_generation_prompt) ss << "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatTemplateKind::Llama2:
    case ChatTemplateKind::Llama2Sys:
    case ChatTemplateKind::Llama2SysBos:
    case ChatTemplateKind::Llama2SysStrip: {
      const bool system = kind_ != ChatTemplateKind::Llama2;
      const bool bos_inside = kind_ == ChatTemplateKind::Llama2SysBos;
      const bool strip = kind_ == ChatTemplateKind::Llama2SysStrip;
      bool inside_turn = true;  // the first [INST] is written here, the BOS comes from the tokenizer
      ss << "[INST] ";
      for (const auto& m : messages) {
        const std::string content = strip ? trim(m.content) : m.content;
        if (!inside_turn) {
          inside_turn = true;
          ss << (bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (m.role == "system") {
          if (system) {
            ss << "<<SYS>>\n" << content << "\n<</SYS>>\n\n";
          } else {
            ss << content << "\n";
          }
        } else if (m.role == "user") {
          ss << content << " [/INST]";
        } else {
          ss << content << "</s>";
          inside_turn = false;
        }
      }
      break;  // the [/INST] already opens the assistant's turn
    }
  }
  return ss.str();
}

std::string apply_chat_template(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, std::optional<ChatTemplateKind> kind) {
  return ChatTemplate::from_tokenizer(tokenizer, kind).apply(messages, add_generation_prompt);
}

}  // namespace rlx::llm
