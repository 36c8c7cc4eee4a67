#include "onnx_cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "npy.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/dim_expr.hpp"
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
      inputs.emplace(name, read_npy(file));
    }
    // The model is imported with its dims symbolic; each input's array binds the symbols of its shape.
    const auto m = onnx::import(model_, o);
    compile::CompileOptions co;
    for (auto id : m.graph.input_ids()) {
      const auto& n = m.graph.node(id);
      const auto& name = n.attrs.get_str("name");
      auto it = inputs.find(name);
      if (it == inputs.end()) continue;  // Session::run names the missing input
      const auto& ext = it->second.shape();
      if (ext.size() != n.shape.rank())
        throw Error(fmt::format("--input {}: the array is {}-D, the input is {}{}", name, ext.size(),
                                ir::dtype_name(n.dtype), n.shape.str()));
      for (std::size_t i = 0; i < ext.size(); ++i) {
        const auto e = ir::DimExpr::of(n.shape[i]);
        if (!e.is_symbol()) continue;  // static dims and expressions are checked when the graph runs
        std::set<std::string, std::less<>> names;
        e.symbols(names);
        const std::string sym = *names.begin();
        auto b = std::find_if(co.bind.begin(), co.bind.end(), [&](const auto& kv) { return kv.first == sym; });
        if (b == co.bind.end())
          co.bind.emplace_back(sym, ext[i]);
        else if (b->second != ext[i])
          throw Error(fmt::format("--input {}: dim {} is '{}', bound to {} by an earlier input but {} here", name, i,
                                  sym, b->second, ext[i]));
      }
    }
    auto cg = runtime::Session(runtime::parse_device(device_)).compile(m.graph, co);
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
