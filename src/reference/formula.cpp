// Ops with a formula in the op table (sigmoid, gelu, silu, softplus, ...) and
// no reference rule of their own are evaluated from it, in float64.
#include "reference/value.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::reference::detail {

// The formula built over float64 operands of the values' extents, and each of
// its nodes evaluated in turn: no rounding until the dispatcher's, once.
Value eval_formula(const Ctx& c) {
  ir::Graph one(std::string(ir::op_name(c.n.op)) + " formula");
  std::vector<ir::NodeId> ins;
  for (std::size_t i = 0; i < c.in.size(); ++i)
    ins.push_back(one.input("x" + std::to_string(i), ir::Shape(c.x(i).ext), ir::DType::F64));
  ir::Node wide = c.n;
  wide.dtype = ir::DType::F64;
  const ir::NodeId result = ir::expand_op(one, wide, ins);
  std::vector<Value> vals(one.size());
  std::vector<const Value*> args;
  for (const ir::Node& m : one.nodes()) {
    if (m.id > result) break;
    if (m.op == ir::OpKind::Input) {
      vals[m.id] = c.x(m.id);  // the formula's operands come first
      continue;
    }
    args.clear();
    for (auto in : m.inputs) args.push_back(&vals[in]);
    vals[m.id] = evaluate(Ctx{one, m, args});
  }
  return std::move(vals[result]);
}

}  // namespace rlx::reference::detail
