// Passes that move values between the graph and its interface:
// param_specialize, const_fold, promote_params.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "rlx/compile/passes_extra.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::compile::passes {

namespace {

// Folding stops growing the graph past this size: a fold may always produce
// a result no larger than its largest input (casts, transposes of a weight),
// but not blow a small constant up into a big one (expand, pad).
constexpr std::size_t kFoldLimitBytes = std::size_t{1} << 20;

std::string type_str(ir::DType t, const ir::Shape& s) { return std::string(ir::dtype_name(t)) + s.str(); }

}  // namespace

ir::Graph param_specialize(const ir::Graph& g, const std::map<std::string, ir::Tensor, std::less<>>& bindings) {
  std::set<std::string, std::less<>> names;
  for (auto id : g.param_ids()) names.insert(g.node(id).attrs.get_str("name"));
  for (const auto& [name, t] : bindings)
    if (!names.contains(name))  // most likely a typo: silently ignoring it would leave the param unbound
      throw Error(fmt::format("param_specialize: binding '{}' names no param of graph '{}' (params: {})", name,
                              g.name(), fmt::join(names, ", ")));
  return rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    if (n.op != ir::OpKind::Param) return std::nullopt;
    const auto& name = n.attrs.get_str("name");
    auto it = bindings.find(name);
    if (it == bindings.end()) return std::nullopt;
    const ir::Tensor& t = it->second;
    ir::Shape ts(t.shape());
    if (t.dtype() != n.dtype || ts != n.shape)
      throw Error(fmt::format("param_specialize: {}: param '{}' is {} but its binding is {}", ir::describe_node(g, n),
                              name, type_str(n.dtype, n.shape), type_str(t.dtype(), ts)));
    return r.out().constant(t);
  });
}

ir::Graph const_fold(const ir::Graph& g) {
  return rewrite(g, [](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    // Leaves (random ops included) have no inputs to fold: random ops stay
    // random nodes so backends generate them where they are consumed. Loops
    // are not run at compile time: a long one in the reference would stall it.
    auto cls = ir::op_info(n.op).cls;
    if (cls == ir::OpClass::Leaf || cls == ir::OpClass::ControlFlow || !n.shape.is_static()) return std::nullopt;
    auto& out = r.out();
    ir::Node m = n;
    m.inputs = r.mapped_inputs(n);
    std::vector<const ir::Tensor*> vals;
    std::size_t largest = 0;
    for (auto id : m.inputs) {
      const auto& in = out.node(id);
      if (in.op != ir::OpKind::Constant) return std::nullopt;
      vals.push_back(in.value.get());
      largest = std::max(largest, in.value->nbytes());
    }
    auto bytes = ir::storage_bytes(n.dtype, n.shape.extents());
    if (bytes > kFoldLimitBytes && bytes > largest) return std::nullopt;
    ir::Tensor v;
    try {
      v = reference::eval_node(out, m, vals);
    } catch (const Error&) {
      // E.g. an out-of-range constant gather index in a branch dce is about to
      // drop: leave the node for the runtime, which reports it if it runs.
      return std::nullopt;
    }
    return out.constant(std::move(v));
  });
}

Promotion promote_params_with_values(const ir::Graph& g, std::int64_t min_bytes) {
  Promotion p{g, {}};
  if (min_bytes <= 0) return p;
  std::set<std::string, std::less<>> taken;
  for (const auto& n : g.nodes())
    if (n.op == ir::OpKind::Input || n.op == ir::OpKind::Param) taken.insert(n.attrs.get_str("name"));
  p.graph = rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    if (n.op != ir::OpKind::Constant || std::int64_t(n.value->nbytes()) < min_bytes) return std::nullopt;
    auto name = fmt::format("const_{}", n.id);
    while (taken.contains(name)) name += '_';  // a user param may already be called const_<id>
    taken.insert(name);
    p.values.emplace(name, *n.value);
    return r.out().param(name, n.shape, n.dtype);
  });
  return p;
}

// The runtime must feed the promoted params their values: callers that compile
// the result use promote_params_with_values to get them.
ir::Graph promote_params(const ir::Graph& g, std::int64_t min_bytes) {
  return promote_params_with_values(g, min_bytes).graph;
}

}  // namespace rlx::compile::passes
