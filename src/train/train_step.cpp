// Losses and the optimiser step as graph builders. The update is plain
// elementwise arithmetic on the gradients value_and_grad appends, so the
// pipeline fuses each param's update and its state's into one kernel (for
// plain SGD, one output, into the epilogue of the GEMM that makes the
// gradient), planned in the same arena as the rest of the step.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>

#include "rlx/error.hpp"
#include "rlx/train/train.hpp"

namespace rlx::train {

using ir::DType;
using ir::Graph;
using ir::NodeId;

namespace {

std::string type_str(const ir::Node& n) { return std::string(ir::dtype_name(n.dtype)) + n.shape.str(); }

std::vector<std::int64_t> all_axes(std::int64_t rank) {
  std::vector<std::int64_t> axes(static_cast<std::size_t>(rank));
  std::iota(axes.begin(), axes.end(), 0);
  return axes;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw Error("train: " + what);
}

void check_unit(double v, const char* opt, const char* key) {
  require(v >= 0 && v < 1, std::string(opt) + "." + key + " must be in [0, 1), got " + std::to_string(v));
}

void check(const Optimizer& opt) {
  std::visit(
      [](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        const char* name = std::is_same_v<T, Sgd> ? "Sgd" : std::is_same_v<T, Adam> ? "Adam" : "AdamW";
        require(o.lr >= 0 && std::isfinite(o.lr), std::string(name) + ".lr must be finite and >= 0");
        require(o.weight_decay >= 0, std::string(name) + ".weight_decay must be >= 0");
        if constexpr (std::is_same_v<T, Sgd>) {
          check_unit(o.momentum, name, "momentum");
        } else {
          check_unit(o.b1, name, "b1");
          check_unit(o.b2, name, "b2");
          require(o.eps > 0, std::string(name) + ".eps must be > 0");
        }
      },
      opt);
}

// Emits the update of each param into `g`, collecting the optimiser state
// inputs (specs) and their new values in the same order.
class Updater {
 public:
  Updater(Graph& g, DType scalar_dtype, NodeId lr, const Optimizer& opt)
      : g_(g), sdt_(scalar_dtype), lr_(lr), opt_(opt) {
    if (const auto* a = std::get_if<Adam>(&opt)) bias_correction(a->b1, a->b2);
    if (const auto* a = std::get_if<AdamW>(&opt)) bias_correction(a->b1, a->b2);
  }

  // The new value of param `p` (node) with gradient `grad`.
  NodeId update(const std::string& name, NodeId p, NodeId grad) {
    return std::visit([&](const auto& o) { return apply(name, p, grad, o); }, opt_);
  }

  std::vector<StateSpec> specs;
  std::vector<NodeId> new_state;

 private:
  NodeId s(double v, DType dt) { return g_.scalar(v, dt); }
  NodeId as(NodeId x, DType dt) { return g_.node(x).dtype == dt ? x : g_.cast(x, dt); }
  NodeId state(const std::string& name, DType dt, const ir::Shape& shape) {
    specs.push_back({name, dt, shape});
    return g_.input(name, shape, dt);
  }

  // Rank-0 math on the step count, shared by every param:
  // step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t).
  void bias_correction(double b1, double b2) {
    NodeId t = g_.add(state("opt_step", sdt_, ir::Shape{}), s(1, sdt_));
    new_state.push_back(t);
    NodeId bc1 = g_.sub(s(1, sdt_), g_.binary(ir::OpKind::Pow, s(b1, sdt_), t));
    NodeId bc2 = g_.sub(s(1, sdt_), g_.binary(ir::OpKind::Pow, s(b2, sdt_), t));
    step_size_ = g_.div(lr_, bc1);
    inv_sqrt_bc2_ = g_.unary(ir::OpKind::Rsqrt, bc2);
  }

  NodeId apply(const std::string& name, NodeId p, NodeId grad, const Sgd& o) {
    const DType dt = g_.node(p).dtype;
    if (o.weight_decay > 0) grad = g_.add(grad, g_.mul(s(o.weight_decay, dt), p));
    if (o.momentum > 0) {
      NodeId buf = state("opt_momentum_" + name, dt, ir::Shape(g_.node(p).shape));
      grad = g_.add(g_.mul(s(o.momentum, dt), buf), grad);
      new_state.push_back(grad);
    }
    return g_.sub(p, g_.mul(as(lr_, dt), grad));
  }
  NodeId apply(const std::string& name, NodeId p, NodeId grad, const Adam& o) {
    return adam(name, p, grad, o.b1, o.b2, o.eps, o.weight_decay, 0);
  }
  NodeId apply(const std::string& name, NodeId p, NodeId grad, const AdamW& o) {
    return adam(name, p, grad, o.b1, o.b2, o.eps, 0, o.weight_decay);
  }

  NodeId adam(const std::string& name, NodeId p, NodeId grad, double b1, double b2, double eps, double l2,
              double decoupled) {
    const DType dt = g_.node(p).dtype;
    const ir::Shape shape = g_.node(p).shape;
    if (l2 > 0) grad = g_.add(grad, g_.mul(s(l2, dt), p));
    NodeId m = state("opt_m_" + name, dt, shape), v = state("opt_v_" + name, dt, shape);
    NodeId m1 = g_.add(g_.mul(s(b1, dt), m), g_.mul(s(1 - b1, dt), grad));
    NodeId v1 = g_.add(g_.mul(s(b2, dt), v), g_.mul(s(1 - b2, dt), g_.mul(grad, grad)));
    new_state.push_back(m1);
    new_state.push_back(v1);
    if (decoupled > 0) p = g_.mul(p, g_.sub(s(1, dt), g_.mul(as(lr_, dt), s(decoupled, dt))));
    NodeId denom = g_.add(g_.mul(g_.unary(ir::OpKind::Sqrt, v1), as(inv_sqrt_bc2_, dt)), s(eps, dt));
    return g_.sub(p, g_.mul(as(step_size_, dt), g_.div(m1, denom)));
  }

  Graph& g_;
  DType sdt_;
  NodeId lr_;
  const Optimizer& opt_;
  NodeId step_size_ = 0, inv_sqrt_bc2_ = 0;
};

}  // namespace

NodeId cross_entropy(Graph& g, NodeId logits, NodeId labels) {
  const ir::Node& l = g.node(logits);
  const ir::Node& y = g.node(labels);
  const auto bad = [&](const std::string& why) {
    return Error("cross_entropy: " + why + " (logits " + ir::describe_node(g, l) + " -> " + type_str(l) + "; labels " +
                 ir::describe_node(g, y) + " -> " + type_str(y) + ")");
  };
  if (!ir::is_float(l.dtype) || l.shape.rank() < 1) throw bad("logits must be a float tensor [..., classes]");
  if (!ir::is_integer(y.dtype)) throw bad("labels must be integer class ids");
  if (y.shape.rank() + 1 != l.shape.rank() ||
      !std::equal(y.shape.dims().begin(), y.shape.dims().end(), l.shape.dims().begin()))
    throw bad("labels must have the shape of logits without its last (class) dim");
  // gather picks each row's label: no one-hot of [..., C] is materialized, and its VJP is a scatter.
  const auto axis = static_cast<std::int64_t>(y.shape.rank());
  NodeId picked = g.gather(g.log_softmax(logits, axis), g.unsqueeze(labels, {axis}), axis);
  return g.unary(ir::OpKind::Neg, g.mean(picked, all_axes(axis + 1)));
}

NodeId mse(Graph& g, NodeId pred, NodeId target) {
  const ir::Node& p = g.node(pred);
  const ir::Node& t = g.node(target);
  if (!ir::is_float(p.dtype) || p.dtype != t.dtype || !(p.shape == t.shape))
    throw Error("mse: pred and target must be float tensors of the same dtype and shape, got pred " +
                ir::describe_node(g, p) + " -> " + type_str(p) + " and target " + ir::describe_node(g, t) + " -> " +
                type_str(t));
  const auto rank = static_cast<std::int64_t>(p.shape.rank());
  NodeId d = g.sub(pred, target);  // invalidates p and t
  return g.mean(g.mul(d, d), all_axes(rank));
}

double learning_rate(const Optimizer& opt) {
  return std::visit([](const auto& o) { return o.lr; }, opt);
}

TrainStep train_step(const Graph& model, std::span<const std::string> params, const Optimizer& opt,
                     const autodiff::Options& options, bool loss_scaled) {
  check(opt);
  require(!model.outputs().empty(), "graph '" + model.name() + "' has no outputs; the first must be the scalar loss");
  const ir::Node& loss = model.node(model.outputs()[0].node);
  require(loss.shape.rank() == 0 && ir::is_float(loss.dtype),
          "the first output of graph '" + model.name() + "' must be a float scalar loss, but " +
              ir::describe_node(model, loss) + " gives " + type_str(loss));
  require(!params.empty(), "no params to train");
  std::set<std::string, std::less<>> seen;
  DType sdt = DType::F32;
  for (const auto& name : params) {
    const ir::Node& p = model.node(model.find_param(name));  // throws listing the params
    require(seen.insert(name).second, "param '" + name + "' is listed twice");
    require(ir::is_float(p.dtype), "param '" + name + "' is " + type_str(p) + "; only float params can be trained");
    if (p.dtype == DType::F64) sdt = DType::F64;
  }

  // Loss scaling: the model's loss times the scale input is what the backward pass differentiates.
  const std::string scale_name = loss_scaled ? "opt_loss_scale" : "";
  Graph scaled = model;
  if (loss_scaled) {
    for (auto id : model.input_ids())
      require(model.node(id).attrs.get_str("name") != scale_name,
              "the loss scale input '" + scale_name + "' clashes with an input of graph '" + model.name() + "'");
    const auto& outs = model.outputs();
    NodeId l = scaled.mul(outs[0].node, scaled.input(scale_name, ir::Shape{}, loss.dtype));
    scaled.clear_outputs();
    scaled.add_output(l, outs[0].name);
    for (std::size_t i = 1; i < outs.size(); ++i) scaled.add_output(outs[i].node, outs[i].name);
  }
  TrainStep out{autodiff::value_and_grad(scaled, params, options),
                {params.begin(), params.end()},
                {},
                "opt_lr",
                sdt,
                scale_name,
                loss_scaled ? "grad_abs_sum" : ""};
  Graph& g = out.graph;
  g.set_name(model.name() + "_train_step");
  const auto vg_outputs = g.outputs();  // loss, grad_<p>...
  NodeId loss_out = vg_outputs[0].node;
  std::vector<NodeId> grads;
  for (std::size_t i = 0; i < params.size(); ++i) grads.push_back(vg_outputs[i + 1].node);
  std::optional<NodeId> check;
  if (loss_scaled) {
    // The loss reported is the model's own, unscaled (value_and_grad keeps the forward graph's node ids):
    // loss × scale / scale would be inf whenever the scaled loss overflows though the gradients, and the
    // step, stay finite. The gradients are divided by the scale (exact for a power of two), and the sum of
    // every gradient's |values| is an inf or a NaN when one of them holds one.
    loss_out = model.outputs()[0].node;
    const NodeId sc = g.find_input(scale_name);
    const DType ldt = g.node(sc).dtype;
    const NodeId inv = g.div(g.scalar(1, ldt), sc);
    for (auto& grad : grads) {
      const DType dt = g.node(grad).dtype;
      grad = g.mul(grad, dt == ldt ? inv : g.cast(inv, dt));
      const auto rank = static_cast<std::int64_t>(g.node(grad).shape.rank());
      NodeId part = g.sum(g.unary(ir::OpKind::Abs, grad), all_axes(rank));
      if (g.node(part).dtype != sdt) part = g.cast(part, sdt);
      check = check ? g.add(*check, part) : part;
    }
  }
  NodeId lr = g.input(out.lr_input, ir::Shape{}, sdt);
  Updater up(g, sdt, lr, opt);
  std::vector<NodeId> new_params;
  for (std::size_t i = 0; i < params.size(); ++i)
    new_params.push_back(up.update(params[i], model.find_param(params[i]), grads[i]));
  g.clear_outputs();
  g.add_output(loss_out, vg_outputs[0].name);
  for (std::size_t i = 0; i < params.size(); ++i) g.add_output(new_params[i], "new_" + params[i]);
  for (std::size_t i = 0; i < up.specs.size(); ++i) g.add_output(up.new_state[i], "new_" + up.specs[i].name);
  if (check) g.add_output(*check, out.grad_check_output);
  out.state = std::move(up.specs);
  return out;
}

TrainStep apply_step(const Graph& model, std::span<const std::string> params, const Optimizer& opt) {
  check(opt);
  require(!params.empty(), "no params to train");
  std::set<std::string, std::less<>> seen;
  DType sdt = DType::F32;
  for (const auto& name : params) {
    const ir::Node& p = model.node(model.find_param(name));  // throws listing the params
    require(seen.insert(name).second, "param '" + name + "' is listed twice");
    require(ir::is_float(p.dtype), "param '" + name + "' is " + type_str(p) + "; only float params can be trained");
    if (p.dtype == DType::F64) sdt = DType::F64;
  }
  TrainStep out{Graph(model.name() + "_apply_step"), {params.begin(), params.end()}, {}, "opt_lr", sdt};
  Graph& g = out.graph;
  std::vector<NodeId> ps, grads;
  for (const auto& name : params) {
    const ir::Node& p = model.node(model.find_param(name));
    ps.push_back(g.param(name, p.shape, p.dtype));
  }
  for (const auto& name : params) {
    const ir::Node& p = model.node(model.find_param(name));
    require(!seen.contains("grad_" + name), "the gradient input 'grad_" + name + "' clashes with a param of that name");
    grads.push_back(g.input("grad_" + name, p.shape, p.dtype));
  }
  NodeId lr = g.input(out.lr_input, ir::Shape{}, sdt);
  Updater up(g, sdt, lr, opt);
  std::vector<NodeId> new_params;
  for (std::size_t i = 0; i < params.size(); ++i) new_params.push_back(up.update(params[i], ps[i], grads[i]));
  for (std::size_t i = 0; i < params.size(); ++i) g.add_output(new_params[i], "new_" + params[i]);
  for (std::size_t i = 0; i < up.specs.size(); ++i) g.add_output(up.new_state[i], "new_" + up.specs[i].name);
  out.state = std::move(up.specs);
  return out;
}

Graph params_to_inputs(const Graph& g) {
  Graph out(g.name());
  for (ir::Node n : g.nodes()) {
    if (n.op == ir::OpKind::Param) n.op = ir::OpKind::Input;
    out.add_raw(std::move(n));
  }
  for (const auto& o : g.outputs()) out.add_output(o.node, o.name);
  out.verify();
  return out;
}

}  // namespace rlx::train
