#pragma once
// `rlx import MODEL.onnx` and `rlx run MODEL.onnx` (docs/onnx.md): the ONNX subcommands, kept out of
// rlx_main.cpp.
#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rlx::tools {

class OnnxCli {
 public:
  explicit OnnxCli(CLI::App& app);
  // Runs the subcommand the command line chose, if it is one of these; false otherwise.
  bool dispatch();

 private:
  CLI::App* import_ = nullptr;
  CLI::App* run_ = nullptr;
  std::string model_, out_;
  std::vector<std::string> dims_, inputs_;
  bool report_ = false;
  std::string device_ = "cpu";
};

}  // namespace rlx::tools
