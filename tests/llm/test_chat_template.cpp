// Chat templates: detection from template sources, each kind's rendering against hand-written prompts (the forms
// llama.cpp's llm_chat_apply_template produces), SmolLM2's default system prompt from its real template.
#include <gtest/gtest.h>

#include "gguf/gguf_test_util.hpp"
#include "rlx/error.hpp"
#include "rlx/llm/chat_template.hpp"

namespace rlx::llm {
namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"}};

// SmolLM2-135M-Instruct's tokenizer.chat_template (its Jinja literals hold real newlines).
const std::string kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% "
    "endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor "
    "%}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, Detection) {
  EXPECT_EQ(detect_chat_template(kSmolTemplate), ChatTemplateKind::ChatMl);
  EXPECT_EQ(detect_chat_template("{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}"), ChatTemplateKind::Llama3);
  EXPECT_EQ(detect_chat_template("{{ '[INST] ' + content + ' [/INST]' }}"), ChatTemplateKind::Llama2);
  EXPECT_EQ(detect_chat_template("[INST] <<SYS>>\\n{{ system }}\\n<</SYS>>"), ChatTemplateKind::Llama2Sys);
  EXPECT_EQ(detect_chat_template("<<SYS>> {{ bos_token + '[INST] ' }}"), ChatTemplateKind::Llama2SysBos);
  EXPECT_EQ(detect_chat_template("[INST] {{ content.strip() }}"), ChatTemplateKind::Llama2SysStrip);
  EXPECT_EQ(detect_chat_template("chatml"), ChatTemplateKind::ChatMl);  // a kind's name is accepted too
  EXPECT_EQ(chat_template_from_name("llama2-sys-bos"), ChatTemplateKind::Llama2SysBos);
  EXPECT_EQ(chat_template_name(ChatTemplateKind::Llama3), "llama3");
  EXPECT_EQ(chat_template_from_name("zephyr"), std::nullopt);
}

TEST(ChatTemplate, UnknownTemplatesAreErrors) {
  const std::string msg = error_of([] { detect_chat_template("{{ '<|user|>' + message['content'] }}"); });
  EXPECT_NE(msg.find("not a template RLX recognizes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<|user|>"), std::string::npos) << msg;  // it quotes the template
  EXPECT_NE(error_of([] { detect_chat_template("<|im_start|>{{ x }}<|im_sep|>"); }).find("Phi-4"), std::string::npos);
  EXPECT_NE(error_of([] { detect_chat_template(""); }).find("no tokenizer.chat_template"), std::string::npos);
}

TEST(ChatTemplate, ChatMlWithSmolLM2sDefaultSystemPrompt) {
  const auto t = ChatTemplate::from_source(kSmolTemplate);
  EXPECT_EQ(t.kind(), ChatTemplateKind::ChatMl);
  EXPECT_EQ(t.default_system(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(t.apply({{"user", "Hi!"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  // A conversation that starts with its own system message gets no default one.
  EXPECT_EQ(t.apply(kChat, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
  // The same template with escaped newlines in its literals (as most tokenizer_config.json files hold).
  std::string escaped = kSmolTemplate;
  for (std::size_t at = escaped.find('\n'); at != std::string::npos; at = escaped.find('\n', at))
    escaped.replace(at, 1, "\\n");
  EXPECT_EQ(ChatTemplate::from_source(escaped).default_system(), t.default_system());
  // Plain ChatML has no default system prompt.
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::ChatMl).apply({{"user", "Hi!"}}, true),
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  const ChatTemplate t(ChatTemplateKind::Llama3);
  EXPECT_EQ(t.apply({{"system", " Be brief. "}, {"user", "Hi!\n"}}, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2Forms) {
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::Llama2).apply(kChat, true),
            "[INST] Be brief.\nHi! [/INST]Hello.</s>[INST] 2+2? [/INST]");
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::Llama2Sys).apply(kChat, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]Hello.</s>[INST] 2+2? [/INST]");
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::Llama2SysBos).apply(kChat, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]Hello.</s><s>[INST] 2+2? [/INST]");
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::Llama2SysStrip).apply({{"user", "  Hi!  "}}, true), "[INST] Hi! [/INST]");
}

TEST(ChatTemplate, FromTheModel) {
  std::string why;
  auto p = gguf::testing::smollm2_path(why);
  if (!p) GTEST_SKIP() << why;
  const auto file = gguf::File::open(*p);
  const auto tok = Tokenizer::from_gguf(file);
  EXPECT_EQ(tok.chat_template(), kSmolTemplate);
  const std::vector<ChatMessage> chat = {{"user", "What is 2+2?"}};
  const std::string prompt = apply_chat_template(tok, chat, true);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  // An explicit kind overrides detection.
  EXPECT_EQ(apply_chat_template(tok, chat, true, ChatTemplateKind::Llama2), "[INST] What is 2+2? [/INST]");
  // The prompt's markers are single control tokens.
  const auto ids = tok.encode(prompt);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
}

}  // namespace
}  // namespace rlx::llm
