// Custom ops in the reference: through the extension's lowering when it has
// one (so the oracle checks the lowering's maths), else its own reference.
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/reference/interpreter.hpp"
#include "value.hpp"

namespace rlx::reference::detail {

Value eval_custom(const Ctx& c) {
  auto ext = ir::find_op_extension(c.attrs().get_str("op"));
  std::vector<ir::Tensor> ins;
  for (std::size_t i = 0; i < c.in.size(); ++i) {
    const ir::Node& src = c.g.node(c.n.inputs[i]);
    // Inputs travel in float64 so the lowering runs at the reference's precision.
    ins.push_back(ir::Tensor::from_f64(src.dtype, c.x(i).ext, c.x(i).v));
  }
  ir::Graph sub("custom_" + std::string(ext->name()));
  std::vector<ir::NodeId> ids;
  for (std::size_t i = 0; i < ins.size(); ++i)
    ids.push_back(sub.input("in" + std::to_string(i), ir::Shape(ins[i].shape()), ins[i].dtype()));
  std::optional<ir::Tensor> out;
  if (auto lowered = ext->lower(sub, ids, c.attrs())) {
    sub.add_output(*lowered);
    TensorMap feeds;
    for (std::size_t i = 0; i < ins.size(); ++i) feeds.emplace("in" + std::to_string(i), ins[i]);
    out = run(sub, feeds).at(0);
  } else {
    out = ext->reference(ins, c.attrs(), {c.n.dtype, c.n.shape});
  }
  if (!out)
    c.fail("custom op '" + std::string(ext->name()) + "' has neither a lowering nor a reference implementation");
  Value r(out->dtype(), out->shape());
  r.v = out->to_f64();
  return r;
}

}  // namespace rlx::reference::detail
