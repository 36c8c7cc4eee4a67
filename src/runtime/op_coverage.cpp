#include <string>

#include "rlx/error.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

namespace {
// A switch, so that a new OpClass fails the build (-Wswitch) instead of reading past a table.
std::string_view class_name(ir::OpClass c) {
  switch (c) {
    case ir::OpClass::Leaf: return "leaf";
    case ir::OpClass::Unary: return "unary";
    case ir::OpClass::Binary: return "binary";
    case ir::OpClass::Elementwise: return "elementwise";
    case ir::OpClass::Reduce: return "reduce";
    case ir::OpClass::MatMul: return "matmul";
    case ir::OpClass::Movement: return "movement";
    case ir::OpClass::Composite: return "composite";
    case ir::OpClass::Custom: return "custom";
    case ir::OpClass::ControlFlow: return "control_flow";
  }
  return "?";
}
}  // namespace

std::string op_coverage_markdown() {
  std::vector<std::pair<std::string, compile::BackendTraits>> backends;
  for (auto d : registered_devices()) {
    auto b = [&]() -> std::unique_ptr<Backend> {
      try {
        return make_backend(d);
      } catch (const Error&) {
        return nullptr;
      }
    }();
    if (b) backends.emplace_back(std::string(device_label(d)), b->traits());
  }
  std::string s =
      "# Op coverage\n\n"
      "Generated from the backends' supported-op lists by `rlx ops --markdown`; "
      "`tests/docs/test_generated_docs.cpp` fails when this file drifts.\n\n"
      "Tiers: **native** (a kernel for the op), **decomposed** (lowered to primitives the backend claims), "
      "**rewritten** (turned into an equivalent primitive), **host_fallback**, **unsupported**.\n\n| op | class |";
  for (const auto& [name, traits] : backends) s += " " + name + " |";
  s += "\n|---|---|";
  for (std::size_t i = 0; i < backends.size(); ++i) s += "---|";
  s += "\n";
  for (auto op : ir::kAllOps) {
    s += "| `" + std::string(ir::op_name(op)) + "` | " + std::string(class_name(ir::op_info(op).cls)) + " |";
    for (const auto& [name, traits] : backends)
      s += " " + std::string(compile::dispatch_tier_name(dispatch_tier(op, traits))) + " |";
    s += "\n";
  }
  return s;
}

}  // namespace rlx::runtime
