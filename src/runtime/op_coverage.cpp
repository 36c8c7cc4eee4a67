#include <fmt/format.h>

#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

std::string op_coverage_markdown() {
  std::vector<std::pair<std::string, compile::BackendTraits>> backends;
  // Every registered backend, available here or not: the file describes the build, not the machine it runs on
  // (a sanitizer build's MLX, a GPU backend without its device, claim what they would).
  for (auto d : registered_devices())
    if (auto b = registered_backend(d)) backends.emplace_back(std::string(device_label(d)), b->traits());
  std::string s =
      "# Op coverage\n\n"
      "Generated from the op table (`src/ops/`) and the backends' supported-op lists by `rlx ops --markdown`; "
      "`tests/docs/test_generated_docs.cpp` fails when this file drifts.\n\n"
      "Tiers: **native** (a kernel for the op), **decomposed** (lowered to primitives the backend claims: a "
      "composite's decomposition, or an elementwise op's formula), **rewritten** (turned into an equivalent "
      "primitive), **host_fallback**, **unsupported**. Operands marked `?` are optional; attributes with a "
      "default show it.\n\n| op | class | operands {attributes} | semantics |";
  for (const auto& [name, traits] : backends) s += " " + name + " |";
  s += "\n|---|---|---|---|";
  for (std::size_t i = 0; i < backends.size(); ++i) s += "---|";
  s += "\n";
  for (auto op : ir::kAllOps) {
    const ir::OpDef& def = ir::op_def(op);
    std::string signature;
    for (auto o : def.operands) signature += (signature.empty() ? "" : ", ") + std::string(o);
    std::string attrs;
    for (const auto& a : def.attrs) {
      attrs += (attrs.empty() ? "" : ", ") + std::string(a.key);
      if (const auto* d = a.default_value ? std::get_if<double>(&*a.default_value) : nullptr)
        attrs += fmt::format("={}", *d);  // the shortest form that reads back: 1e-05
      else if (a.default_value)
        attrs += "=" + ir::attr_value_str(*a.default_value);
      else if (!a.required)
        attrs += "?";
    }
    if (!attrs.empty()) signature += (signature.empty() ? "{" : " {") + attrs + "}";
    s += "| `" + std::string(ir::op_name(op)) + "` | " + std::string(ir::op_class_name(ir::op_info(op).cls)) + " | " +
         signature + " | " + std::string(def.doc) + (def.formula ? " (formula)" : "") + " |";
    for (const auto& [name, traits] : backends)
      s += " " + std::string(compile::dispatch_tier_name(dispatch_tier(op, traits))) + " |";
    s += "\n";
  }
  return s;
}

}  // namespace rlx::runtime
