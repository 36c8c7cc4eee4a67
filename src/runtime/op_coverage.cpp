#include <string>

#include "rlx/error.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

namespace {
// The tier an op takes on a backend with these traits, as the pipeline
// decides it: composites decompose unless claimed; primitives run natively,
// fall back to the host, or are unsupported.
compile::DispatchTier tier_of(ir::OpKind op, const compile::BackendTraits& t) {
  // decompose always turns these into reshape, whatever the backend claims.
  if (op == ir::OpKind::Squeeze || op == ir::OpKind::Unsqueeze) return compile::DispatchTier::Rewritten;
  if (t.native_ops.count(op)) return compile::DispatchTier::Native;
  if (ir::op_info(op).cls == ir::OpClass::Composite) return compile::DispatchTier::Decomposed;
  return t.host_fallback ? compile::DispatchTier::HostFallback : compile::DispatchTier::Unsupported;
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
  static constexpr std::string_view kClass[] = {"leaf",     "unary",    "binary",   "elementwise",
                                                "reduce",   "matmul",   "movement", "composite"};
  for (auto op : ir::kAllOps) {
    s += "| `" + std::string(ir::op_name(op)) + "` | " +
         std::string(kClass[static_cast<std::size_t>(ir::op_info(op).cls)]) + " |";
    for (const auto& [name, traits] : backends) s += " " + std::string(compile::dispatch_tier_name(tier_of(op, traits))) + " |";
    s += "\n";
  }
  return s;
}

}  // namespace rlx::runtime
