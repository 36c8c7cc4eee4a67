// The derivative of one node: its rules from the op table (OpDef::partial,
// vjp, jvp, written beside each op in src/ops/), else the general routes: a
// custom op's extension rules, a control-flow op's bodies, and the op's
// formula or decomposition, inlined and differentiated.
#include "autodiff/control_flow.hpp"
#include "autodiff/engine.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::autodiff::detail {

std::vector<Maybe> vjp_rule(const Site& s, NodeId ct, const std::vector<bool>& want) {
  const ir::Node& n = s.n;
  const ir::OpDef& def = ir::op_def(n.op);
  if (def.partial) {
    std::vector<Maybe> d(n.inputs.size());
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (want[k]) d[k] = unbroadcast(s.g, def.partial(s, k, ct), s.in(k).shape);
    return d;
  }
  if (def.vjp) {
    std::vector<Maybe> d = def.vjp(s, ct, want);
    if (d.size() != n.inputs.size()) s.fail("its vjp rule returned the wrong number of cotangents");
    return d;
  }
  if (n.op == ir::OpKind::Custom) {  // the extension's own rule, else through its lowering
    auto ext = ir::find_op_extension(n.attrs.get_str("op"));
    if (auto rule = ext->vjp(s.g, s.x, s.y, ct, n.attrs)) {
      if (rule->size() != n.inputs.size()) s.fail("its vjp rule returned the wrong number of cotangents");
      return *rule;
    }
    return vjp_decomposed(s, ct, want);
  }
  if (ir::is_control_flow(n.op)) return control_flow_vjp(s, ct, want);
  if (def.has_decomposition()) return vjp_decomposed(s, ct, want);
  s.fail("no VJP rule for this op");
}

Maybe jvp_rule(const Site& s, std::span<const Maybe> t) {
  const ir::Node& n = s.n;
  const ir::OpDef& def = ir::op_def(n.op);
  if (def.partial) {
    std::vector<NodeId> terms;
    for (std::size_t k = 0; k < t.size(); ++k)
      if (t[k]) terms.push_back(def.partial(s, k, *t[k]));
    return ir::sum_terms(s.g, terms, n.shape);
  }
  if (def.jvp) return def.jvp(s, t);
  if (n.op == ir::OpKind::Custom) {
    auto ext = ir::find_op_extension(n.attrs.get_str("op"));
    if (auto rule = ext->jvp(s.g, s.x, t, s.y, n.attrs)) return rule;
    return jvp_decomposed(s, t);
  }
  if (ir::is_control_flow(n.op)) return control_flow_jvp(s, t);
  if (def.has_decomposition()) return jvp_decomposed(s, t);
  s.fail("no JVP rule for this op");
}

}  // namespace rlx::autodiff::detail
