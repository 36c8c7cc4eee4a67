#include "rlx/flow/flow.hpp"

#include <algorithm>
#include <set>

#include "rlx/error.hpp"

namespace rlx::flow {
namespace {

struct ActivationKind {
  std::string_view name;
  ir::OpKind op;
};
constexpr ActivationKind kActivations[] = {
    {"relu", ir::OpKind::Relu},         {"gelu", ir::OpKind::Gelu},       {"gelu_tanh", ir::OpKind::GeluTanh},
    {"silu", ir::OpKind::Silu},         {"sigmoid", ir::OpKind::Sigmoid}, {"tanh", ir::OpKind::Tanh},
    {"softplus", ir::OpKind::Softplus},
};

std::string type_str(ir::DType dtype, const ir::Shape& shape) {
  return std::string(ir::dtype_name(dtype)) + shape.str();
}
std::string type_str(const FlowValue& v) { return type_str(v.dtype(), v.shape()); }

}  // namespace

void FlowCtx::fail(const std::string& what) const { throw Error(stage_.empty() ? what : stage_ + ": " + what); }

FlowValue FlowCtx::value(ir::NodeId id) const {
  if (id >= graph_.size())
    fail("node %" + std::to_string(id) + " does not exist (graph has " + std::to_string(graph_.size()) + " nodes)");
  const ir::Node& n = graph_.node(id);
  return FlowValue(id, n.shape, n.dtype);
}

FlowValue FlowCtx::param(std::string_view name, ir::Shape shape, ir::DType dtype) {
  for (const ir::Node& n : graph_.nodes()) {
    if (n.op != ir::OpKind::Param || n.attrs.get_str("name") != name) continue;
    if (n.dtype != dtype || n.shape != shape)
      fail("param '" + std::string(name) + "' is already declared as " + type_str(n.dtype, n.shape) + ", requested " +
           type_str(dtype, shape));
    return value(n.id);
  }
  return value(graph_.param(std::string(name), std::move(shape), dtype));
}

FlowValue FlowCtx::input(std::string_view name) const { return value(graph_.find_input(name)); }

FlowValue FlowCtx::matmul(const FlowValue& a, const FlowValue& b) { return value(graph_.matmul(a.id(), b.id())); }
FlowValue FlowCtx::add(const FlowValue& a, const FlowValue& b) { return value(graph_.add(a.id(), b.id())); }
FlowValue FlowCtx::sub(const FlowValue& a, const FlowValue& b) { return value(graph_.sub(a.id(), b.id())); }
FlowValue FlowCtx::mul(const FlowValue& a, const FlowValue& b) { return value(graph_.mul(a.id(), b.id())); }
FlowValue FlowCtx::cast(const FlowValue& x, ir::DType to) { return value(graph_.cast(x.id(), to)); }

FlowValue FlowCtx::linear(const FlowValue& x, std::string_view name, std::int64_t out_features, bool bias) {
  const ir::Shape& s = x.shape();
  if (s.rank() == 0 || !s[s.rank() - 1].is_static())
    fail("linear '" + std::string(name) + "' needs an input with a static last dim, got " + type_str(x));
  if (out_features <= 0)
    fail("linear '" + std::string(name) + "' needs out_features >= 1, got " + std::to_string(out_features));
  std::string prefix(name);
  FlowValue w = param(prefix + ".weight", ir::Shape{s[s.rank() - 1].size, out_features}, x.dtype());
  std::optional<ir::NodeId> b;
  if (bias) b = param(prefix + ".bias", ir::Shape{out_features}, x.dtype()).id();
  return value(graph_.linear(x.id(), w.id(), b));
}

FlowValue FlowCtx::residual(const FlowValue& x, const FlowValue& fx) {
  if (x.shape() != fx.shape() || x.dtype() != fx.dtype())
    fail("residual: shape mismatch between x " + type_str(x) + " and f(x) " + type_str(fx));
  return add(x, fx);
}

FlowValue FlowCtx::activation(const FlowValue& x, std::string_view kind) {
  const auto* it = std::find_if(std::begin(kActivations), std::end(kActivations),
                                [&](const ActivationKind& a) { return a.name == kind; });
  if (it == std::end(kActivations)) {
    std::string known;
    for (const auto& a : kActivations) known += (known.empty() ? "" : ", ") + std::string(a.name);
    fail("unknown activation kind '" + std::string(kind) + "' (known: " + known + ")");
  }
  return value(graph_.unary(it->op, x.id()));
}

FlowValue FlowCtx::rms_norm(const FlowValue& x, std::string_view name, std::optional<double> eps) {
  const ir::Shape& s = x.shape();
  if (s.rank() == 0) fail("rms_norm needs an input of rank >= 1, got " + type_str(x));
  std::optional<ir::NodeId> gamma;
  if (!name.empty())
    gamma = param(std::string(name) + ".weight", ir::Shape(std::vector<ir::Dim>{s[s.rank() - 1]}), x.dtype()).id();
  return value(graph_.rms_norm(x.id(), gamma, eps));
}

void FlowCtx::publish_side_output(std::string name, const FlowValue& v) {
  if (name.empty()) fail("a side output needs a name");
  for (const auto& o : side_outputs_)
    if (o.name == name) fail("side output '" + name + "' is published twice");
  side_outputs_.push_back({value(v.id()).id(), std::move(name)});
}

ModelFlow& ModelFlow::input(std::string name, ir::Shape shape, ir::DType dtype) & {
  for (const auto& in : inputs_)
    if (in.name == name) throw Error("model '" + name_ + "': input '" + name + "' is declared twice");
  inputs_.push_back({std::move(name), std::move(shape), dtype});
  return *this;
}

ModelFlow& ModelFlow::layer_stage(std::unique_ptr<LayerStage> stage) & {
  if (!stage) throw Error("model '" + name_ + "': layer_stage got a null stage");
  stages_.push_back(std::move(stage));
  return *this;
}

ModelFlow& ModelFlow::output(std::string name) & {
  if (name.empty()) throw Error("model '" + name_ + "': the output needs a name");
  output_ = std::move(name);
  return *this;
}

BuiltModel ModelFlow::build() const {
  if (inputs_.empty()) throw Error("model '" + name_ + "': no input (call .input(name, shape) before build)");
  if (stages_.empty()) throw Error("model '" + name_ + "': no layer stage");
  BuiltModel m{ir::Graph(name_), {}};
  for (const auto& in : inputs_) m.graph.input(in.name, in.shape, in.dtype);
  FlowValue hidden = FlowCtx(m.graph).input(inputs_.front().name);
  std::set<std::string, std::less<>> output_names{output_};
  std::vector<ir::GraphOutput> sides;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const LayerStage& stage = *stages_[i];
    std::string label = "model '" + name_ + "', stage " + std::to_string(i) + " '" + std::string(stage.name()) + "'";
    FlowCtx ctx(m.graph, label);
    try {
      auto [out, artifacts] = stage.emit_layer(ctx, hidden);
      FlowValue actual = ctx.value(out.id());
      if (actual.shape() != out.shape() || actual.dtype() != out.dtype())
        ctx.fail("returned a value recorded as " + type_str(out) + " but its node %" + std::to_string(out.id()) +
                 " is " + type_str(actual));
      if (artifacts.hidden != out.shape())
        ctx.fail("artifacts declare the hidden shape " + artifacts.hidden.str() + " but the stage returned " +
                 type_str(out));
      for (const auto& o : ctx.side_outputs()) {
        if (!output_names.insert(o.name).second)
          ctx.fail("side output '" + o.name + "' clashes with another output of the model");
        sides.push_back(o);
      }
      m.stages.push_back({std::string(stage.name()), std::move(artifacts)});
      hidden = out;
    } catch (const Error& e) {
      if (std::string_view(e.what()).starts_with(label)) throw;
      throw Error(label + ": " + e.what());
    }
  }
  m.graph.add_output(hidden.id(), output_);
  for (auto& o : sides) m.graph.add_output(o.node, std::move(o.name));
  m.graph.verify();
  return m;
}

std::vector<std::string> BuiltModel::output_names() const {
  std::vector<std::string> names;
  for (const auto& o : graph.outputs()) names.push_back(o.name);
  return names;
}

}  // namespace rlx::flow
