// custom_fn as an OpExtension: the body is its lowering, the derivative
// bodies its vjp/jvp rules. One mechanism (the custom-op registry) serves both.
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"

namespace rlx::ir {

namespace {

std::string type_str(const Node& n) { return std::string(dtype_name(n.dtype)) + n.shape.str(); }

class BodyFn final : public OpExtension {
 public:
  explicit BodyFn(CustomFn fn) : fn_(std::move(fn)) {
    auto where = "custom_fn '" + fn_.name + "'";
    fn_.body.verify();
    ins_ = fn_.body.input_ids();
    if (fn_.body.outputs().size() != 1) throw Error(where + ": the body needs exactly one output");
    if (!fn_.body.param_ids().empty()) throw Error(where + ": the body may not have params; pass them as inputs");
    const Node& out = fn_.body.node(fn_.body.outputs()[0].node);
    auto expect_inputs = [&](const Graph& g, const char* what, std::size_t extra, const auto& extra_type) {
      g.verify();
      auto ids = g.input_ids();
      if (ids.size() != ins_.size() + extra)
        throw Error(where + ": the " + what + " body takes " + std::to_string(ids.size()) + " inputs, expected " +
                    std::to_string(ins_.size() + extra));
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const Node& want = i < ins_.size() ? fn_.body.node(ins_[i]) : extra_type(i - ins_.size());
        const Node& got = g.node(ids[i]);
        if (got.dtype != want.dtype || got.shape != want.shape)
          throw Error(where + ": input " + std::to_string(i) + " of the " + what + " body is " + type_str(got) +
                      ", expected " + type_str(want));
      }
    };
    if (fn_.vjp) {
      expect_inputs(*fn_.vjp, "vjp", 1, [&](std::size_t) -> const Node& { return out; });
      if (fn_.vjp->outputs().size() != ins_.size())
        throw Error(where + ": the vjp body needs one output (a cotangent) per input");
      for (std::size_t i = 0; i < ins_.size(); ++i) {
        const Node &got = fn_.vjp->node(fn_.vjp->outputs()[i].node), &want = fn_.body.node(ins_[i]);
        if (got.dtype != want.dtype || got.shape != want.shape)
          throw Error(where + ": cotangent " + std::to_string(i) + " of the vjp body is " + type_str(got) +
                      ", expected " + type_str(want));
      }
    }
    if (fn_.jvp) {
      expect_inputs(*fn_.jvp, "jvp", ins_.size(), [&](std::size_t k) -> const Node& { return fn_.body.node(ins_[k]); });
      if (fn_.jvp->outputs().size() != 1) throw Error(where + ": the jvp body needs exactly one output");
      const Node& got = fn_.jvp->node(fn_.jvp->outputs()[0].node);
      if (got.dtype != out.dtype || got.shape != out.shape)
        throw Error(where + ": the jvp body's output is " + type_str(got) + ", expected " + type_str(out));
    }
  }

  std::string_view name() const override { return fn_.name; }
  int num_inputs() const override { return static_cast<int>(ins_.size()); }
  TypeInfo infer(std::span<const TypeInfo> in, const Attrs&) const override {
    for (std::size_t i = 0; i < in.size(); ++i) {
      const Node& want = fn_.body.node(ins_[i]);
      if (in[i].dtype != want.dtype || in[i].shape != want.shape)
        throw Error("custom_fn '" + fn_.name + "': argument " + std::to_string(i) + " is " +
                    std::string(dtype_name(in[i].dtype)) + in[i].shape.str() + ", the body takes " + type_str(want));
    }
    const Node& out = fn_.body.node(fn_.body.outputs()[0].node);
    return {out.dtype, out.shape};
  }
  std::optional<NodeId> lower(Graph& g, std::span<const NodeId> in, const Attrs&) const override {
    return g.inline_graph(fn_.body, in).at(0);
  }
  std::optional<std::vector<std::optional<NodeId>>> vjp(Graph& g, std::span<const NodeId> in, NodeId, NodeId ct,
                                                        const Attrs&) const override {
    if (!fn_.vjp) return std::nullopt;
    std::vector<NodeId> args(in.begin(), in.end());
    args.push_back(ct);
    auto outs = g.inline_graph(*fn_.vjp, args);
    return std::vector<std::optional<NodeId>>(outs.begin(), outs.end());
  }
  std::optional<NodeId> jvp(Graph& g, std::span<const NodeId> in, std::span<const std::optional<NodeId>> t, NodeId,
                            const Attrs&) const override {
    if (!fn_.jvp) return std::nullopt;
    std::vector<NodeId> args(in.begin(), in.end());
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i]) {
        args.push_back(*t[i]);
        continue;
      }
      // No tangent: a zero of the argument's type (copied first: adding the scalar may move g's nodes).
      const ir::DType dtype = g.node(in[i]).dtype;
      Shape shape = g.node(in[i]).shape;
      args.push_back(g.expand(g.scalar(0.0, dtype), std::move(shape)));
    }
    return g.inline_graph(*fn_.jvp, args).at(0);
  }

 private:
  CustomFn fn_;
  std::vector<NodeId> ins_;
};

}  // namespace

void register_custom_fn(CustomFn fn) {
  if (fn.name.empty()) throw Error("custom_fn needs a name");
  register_op(std::make_shared<BodyFn>(std::move(fn)));
}

NodeId call_custom_fn(Graph& g, const CustomFn& fn, std::vector<NodeId> args) {
  register_custom_fn(fn);
  return g.custom_op(fn.name, {}, std::move(args));
}

}  // namespace rlx::ir
