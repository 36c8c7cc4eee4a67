// The `inline` pass: custom ops become their lowering (so they fuse with their
// neighbours and run on every backend), unless the backend has its own kernel.
#include <algorithm>
#include <string>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"

namespace rlx::compile::passes {

ir::Graph inline_custom(const ir::Graph& g, const std::set<std::string, std::less<>>& native, DispatchReport* report) {
  auto record = [&](const ir::Node& n, DispatchTier tier, std::string why) {
    if (report) report->entries.push_back({n.id, n.op, tier, std::move(why)});
  };
  return rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    if (n.op != ir::OpKind::Custom) return std::nullopt;
    const auto& name = n.attrs.get_str("op");
    std::string backend = report ? report->backend : "the backend";
    if (native.count(name)) {
      record(n, DispatchTier::Native, backend + " has a kernel for custom op '" + name + "'");
      return std::nullopt;
    }
    auto ext = ir::find_op_extension(name);
    auto first = static_cast<ir::NodeId>(r.out().size());
    auto ins = r.mapped_inputs(n);
    std::optional<ir::NodeId> out;
    try {
      out = ext->lower(r.out(), ins, n.attrs);
    } catch (const Error& e) {
      throw Error(ir::describe_node(g, n) + ": lowering of custom op '" + name + "' failed: " + e.what());
    }
    if (!out) {
      record(n, DispatchTier::Unsupported,
             "custom op '" + name + "' has no lowering and " + backend + " has no kernel");
      throw Error(ir::describe_node(g, n) + ": custom op '" + name + "' has no lowering and backend '" + backend +
                  "' has no kernel for it (register one with rlx::runtime::register_host_kernel)");
    }
    // The result must be a node the lowering made, or one of its inputs: any other id names a node it
    // never saw (from another graph, or the caller's), and would silently compute something else.
    if (*out < first && std::find(ins.begin(), ins.end(), *out) == ins.end())
      throw Error(ir::describe_node(g, n) + ": the lowering of custom op '" + name + "' returned node %" +
                  std::to_string(*out) +
                  ", which is neither one of its inputs nor a node it added (a node of "
                  "another graph?)");
    if (*out >= r.out().size())
      throw Error(ir::describe_node(g, n) + ": the lowering of custom op '" + name + "' returned node %" +
                  std::to_string(*out) + ", which does not exist (a node of another graph?)");
    const ir::Node& res = r.out().node(*out);
    if (res.dtype != n.dtype || res.shape != n.shape)
      throw Error(ir::describe_node(g, n) + ": custom op '" + name + "' lowers to " +
                  std::string(ir::dtype_name(res.dtype)) + res.shape.str() + " but infers " +
                  std::string(ir::dtype_name(n.dtype)) + n.shape.str());
    r.out().tag_origin(first, "custom:" + name);
    record(
        n, DispatchTier::Decomposed,
        "inlined the lowering of custom op '" + name + "' (" + std::to_string(r.out().size() - first) + " primitives)");
    return out;
  });
}

}  // namespace rlx::compile::passes
