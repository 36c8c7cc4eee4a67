#include "onnx_cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "npy.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/onnx/onnx.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::tools {

namespace {

// "name=value" pairs, split at the last '='.
std::pair<std::string, std::string> split_pair(const std::string& s, const char* what) {
  const auto eq = s.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    throw Error(fmt::format("{} '{}' is not NAME=VALUE", what, s));
  return {s.substr(0, eq), s.substr(eq + 1)};
}

onnx::ImportOptions options_from(const std::vector<std::string>& dims) {
  onnx::ImportOptions o;
  for (const auto& d : dims) {
    auto [name, value] = split_pair(d, "--dim");
    try {
      o.dims[name] = std::stoll(value);
    } catch (const std::exception&) {
      throw Error(fmt::format("--dim {}: '{}' is not an integer", name, value));
    }
  }
  return o;
}

}  // namespace

OnnxCli::OnnxCli(CLI::App& app) {
  import_ = app.add_subcommand("import", "Import an ONNX model: its IR text (-o), or what each node became (--report)");
  import_->add_option("model", model_, "ONNX file")->required();
  import_->add_option("-o,--output", out_, "Write the graph as RLX IR text (weights stay in the model file)");
  import_->add_flag("--report", report_, "List the nodes mapped, folded and unsupported, per op");
  import_->add_option("--dim", dims_, "Bind a symbolic dim: NAME=N (repeatable)");

  run_ = app.add_subcommand("run", "Run an ONNX model on .npy inputs and print (or -o DIR: save) its outputs");
  run_->add_option("model", model_, "ONNX file")->required();
  run_->add_option("--input", inputs_, "NAME=FILE.npy for each graph input (its shape binds the dims)")->required();
  run_->add_option("--dim", dims_, "Bind a symbolic dim: NAME=N (repeatable)");
  run_->add_option("-o,--output", out_, "Folder to write each output to as NAME.npy");
  run_->add_option("--device", device_, "Device to run on (cpu, vulkan, ...)");
}

bool OnnxCli::dispatch() {
  if (*import_) {
    auto o = options_from(dims_);
    if (report_) {
      fmt::print("{}", onnx::report_text(onnx::import_report(model_, o)));
      return true;
    }
    const auto m = onnx::import(model_, o);
    if (out_.empty()) {
      fmt::print("{}", ir::to_text(m.graph));
    } else {
      std::ofstream(out_) << ir::to_text(m.graph);
      fmt::print("wrote {} ({} nodes, {} params)\n", out_, m.graph.size(), m.params.size());
    }
    return true;
  }
  if (*run_) {
    auto o = options_from(dims_);
    std::map<std::string, ir::Tensor, std::less<>> inputs;
    for (const auto& in : inputs_) {
      auto [name, file] = split_pair(in, "--input");
      auto t = read_npy(file);
      o.input_shapes[name] = t.shape();
      inputs.emplace(name, std::move(t));
    }
    const auto m = onnx::import(model_, o);
    auto cg = runtime::Session(runtime::parse_device(device_)).compile(m.graph);
    for (const auto& [name, value] : m.params) cg.set_param(name, value);
    const auto outs = cg.run(inputs);
    if (!out_.empty()) std::filesystem::create_directories(out_);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const auto& name = m.graph.outputs()[i].name;
      const auto& t = outs[i];
      std::vector<double> head;
      for (std::int64_t j = 0; j < std::min<std::int64_t>(t.numel(), 6); ++j) head.push_back(t.get(j));
      fmt::print("{}: {}[{}] {:.6g}{}\n", name, ir::dtype_name(t.dtype()), fmt::join(t.shape(), ","),
                 fmt::join(head, " "), t.numel() > 6 ? " ..." : "");
      if (out_.empty()) continue;
      std::string file = name;  // an ONNX name may hold slashes
      std::replace(file.begin(), file.end(), '/', '_');
      write_npy(std::filesystem::path(out_) / (file + ".npy"), t);
    }
    return true;
  }
  return false;
}

}  // namespace rlx::tools
