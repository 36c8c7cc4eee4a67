// Dispatch tiers: where each op of a graph runs on a backend and why. The
// compile pipeline records its own decisions (composites, custom ops); this
// completes the picture with every primitive, so a report names each op.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "rlx/ir/op_def.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

compile::DispatchTier dispatch_tier(ir::OpKind op, const compile::BackendTraits& t) {
  // decompose always turns these into reshape, whatever the backend claims.
  if (op == ir::OpKind::Squeeze || op == ir::OpKind::Unsqueeze) return compile::DispatchTier::Rewritten;
  if (t.native_ops.count(op)) return compile::DispatchTier::Native;
  if (ir::op_info(op).cls == ir::OpClass::Composite || ir::op_def(op).has_decomposition())
    return compile::DispatchTier::Decomposed;
  return t.host_fallback ? compile::DispatchTier::HostFallback : compile::DispatchTier::Unsupported;
}

namespace {

// The dtype an op computes in (the legalization passes' rule): the operands'
// for comparisons, arg-reductions and where, the result's otherwise.
ir::DType compute_dtype(const ir::Graph& g, const ir::Node& n) {
  if (ir::is_comparison(n.op) || n.op == ir::OpKind::ArgMax || n.op == ir::OpKind::ArgMin)
    return g.node(n.inputs[0]).dtype;
  if (n.op == ir::OpKind::Where) return g.node(n.inputs[1]).dtype;
  return n.dtype;
}

// Why a natively claimed op is rewritten with casts around it, if it is.
std::optional<std::string> dtype_rewrite(const ir::Graph& g, const ir::Node& n, const compile::BackendTraits& t) {
  if (n.op == ir::OpKind::Cast || ir::op_info(n.op).cls == ir::OpClass::Leaf) return std::nullopt;
  const ir::DType d = compute_dtype(g, n);
  const auto name = ir::dtype_name(d);
  if ((d == ir::DType::F16 || d == ir::DType::BF16) && t.f32_compute_ops.contains(n.op))
    return fmt::format("{} computes {} in f32: casts from {} around it (legalize_f32_compute)", t.name,
                       ir::op_name(n.op), name);
  if (ir::is_float(d) && d != ir::DType::F32 && !t.native_dtypes.contains(d))
    return fmt::format("{} is not native on {}: {} runs in f32 with casts around it (legalize_dtypes)", name, t.name,
                       ir::op_name(n.op));
  return std::nullopt;
}

std::string primitive_reason(compile::DispatchTier tier, ir::OpKind op, const compile::BackendTraits& t) {
  switch (tier) {
    case compile::DispatchTier::Native: return fmt::format("{} has a kernel for {}", t.name, ir::op_name(op));
    case compile::DispatchTier::Rewritten: return "rewritten as a reshape: a view, no kernel";
    case compile::DispatchTier::Decomposed: return "decomposed into primitives";
    case compile::DispatchTier::HostFallback:
      return fmt::format("{} has no kernel for {}: runs on the host with staging", t.name, ir::op_name(op));
    case compile::DispatchTier::Unsupported:
      return fmt::format("{} has no kernel for {} and no host fallback", t.name, ir::op_name(op));
  }
  return {};
}

}  // namespace

KernelDispatchReport kernel_dispatch_report(const compile::CompileResult& result, const compile::BackendTraits& t) {
  const ir::Graph& g = result.hir;
  KernelDispatchReport r{.backend = result.dispatch.backend, .entries = {}};
  std::set<ir::NodeId> covered;
  for (auto e : result.dispatch.entries) {
    covered.insert(e.hir_node);
    if (e.tier == compile::DispatchTier::Native && e.hir_node < g.size() && g.node(e.hir_node).op == e.op)
      if (auto why = dtype_rewrite(g, g.node(e.hir_node), t)) {
        e.tier = compile::DispatchTier::Rewritten;
        e.reason += "; " + *why;
      }
    r.entries.push_back(std::move(e));
  }
  for (const auto& n : g.nodes()) {
    if (covered.contains(n.id) || n.op == ir::OpKind::Input || n.op == ir::OpKind::Param ||
        n.op == ir::OpKind::Constant || n.op == ir::OpKind::Custom)
      continue;
    auto tier = dispatch_tier(n.op, t);
    auto reason = primitive_reason(tier, n.op, t);
    if (tier == compile::DispatchTier::Native)
      if (auto why = dtype_rewrite(g, n, t)) {
        tier = compile::DispatchTier::Rewritten;
        reason += "; " + *why;
      }
    r.entries.push_back({n.id, n.op, tier, std::move(reason)});
  }
  std::stable_sort(r.entries.begin(), r.entries.end(),
                   [](const auto& a, const auto& b) { return a.hir_node < b.hir_node; });
  return r;
}

}  // namespace rlx::runtime
