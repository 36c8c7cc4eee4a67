// Trainer: the step graph compiled once, with params and optimiser state as
// graph inputs. Each updated value has two host buffers; a step reads one and
// the graph writes the new value into the other, so nothing is copied and the
// buffers swap roles by flipping one parity bit. (set_param would copy every
// weight into the compiled graph each step: a full extra pass over them.)
#include <algorithm>
#include <cmath>
#include <set>

#include "rlx/error.hpp"
#include "rlx/train/train.hpp"

namespace rlx::train {

namespace {

std::string type_str(ir::DType t, const std::vector<std::int64_t>& shape) {
  std::string s = std::string(ir::dtype_name(t)) + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<std::string> default_trainable(const ir::Graph& model) {
  std::vector<std::string> out;
  for (auto id : model.param_ids())
    if (ir::is_float(model.node(id).dtype)) out.push_back(model.node(id).attrs.get_str("name"));
  return out;
}

ir::Tensor zeros(const StateSpec& s) {
  if (!s.shape.is_static()) throw Error("Trainer: state '" + s.name + "' has symbolic shape " + s.shape.str());
  return ir::Tensor(s.dtype, s.shape.extents());
}

bool accumulating(const TrainerOptions& o) { return o.micro_batches > 1 || o.data_parallel; }

// The loss scaling a Trainer uses: the one set, else the default one for f16 mixed precision (fused steps only).
std::optional<LossScaling> loss_scaling(const TrainerOptions& o) {
  if (!o.loss_scaling)
    return o.compile.precision == compile::Precision::F16 && !accumulating(o) ? std::optional(LossScaling{})
                                                                              : std::nullopt;
  const LossScaling& l = *o.loss_scaling;
  if (accumulating(o))
    throw Error("Trainer: loss_scaling needs the fused step; it is set with micro_batches=" +
                std::to_string(o.micro_batches) + (o.data_parallel ? " and data_parallel" : ""));
  if (!(l.init_scale > 0) || !std::isfinite(l.init_scale) || !(l.growth_factor >= 1) ||
      !std::isfinite(l.growth_factor) || !(l.backoff_factor > 0 && l.backoff_factor <= 1) || l.growth_interval < 0)
    throw Error(
        "Trainer: loss_scaling needs init_scale > 0 and finite, growth_factor >= 1, backoff_factor in "
        "(0, 1] and growth_interval >= 0; got " +
        std::to_string(l.init_scale) + ", " + std::to_string(l.growth_factor) + ", " +
        std::to_string(l.backoff_factor) + ", " + std::to_string(l.growth_interval));
  return l;
}

TrainStep make_step(const ir::Graph& model, const Optimizer& opt, const TrainerOptions& o) {
  if (o.micro_batches < 1) throw Error("Trainer: micro_batches must be >= 1, got " + std::to_string(o.micro_batches));
  const auto trainable = o.trainable.empty() ? default_trainable(model) : o.trainable;
  const bool scaled = loss_scaling(o).has_value();  // throws on a bad LossScaling before anything compiles
  if (!accumulating(o)) return train_step(model, trainable, opt, o.autodiff, scaled);
  for (const auto& name : trainable) {
    const ir::Node& n = model.node(model.find_param(name));
    if (n.dtype != ir::DType::F32 && n.dtype != ir::DType::F64)
      throw Error("Trainer: micro_batches and data_parallel sum gradients in f32 or f64, but param '" + name + "' is " +
                  std::string(ir::dtype_name(n.dtype)));
  }
  return apply_step(model, trainable, opt);
}

// acc[i] += x[i], in the param's dtype (f32 or f64).
void add_into(void* acc, const ir::Tensor& x) {
  const auto n = static_cast<std::size_t>(x.numel());
  if (x.dtype() == ir::DType::F64) {
    std::transform(x.data_as<double>(), x.data_as<double>() + n, static_cast<double*>(acc), static_cast<double*>(acc),
                   [](double b, double a) { return a + b; });
  } else {
    std::transform(x.data_as<float>(), x.data_as<float>() + n, static_cast<float*>(acc), static_cast<float*>(acc),
                   [](float b, float a) { return a + b; });
  }
}

template <class T>
void divide(T* acc, std::size_t count, std::int64_t parts) {
  const auto d = static_cast<T>(parts);
  for (std::size_t i = 0; i < count; ++i) acc[i] /= d;
}

}  // namespace

Trainer::Trainer(const ir::Graph& model, TensorMap params, const Optimizer& opt, const TrainerOptions& options)
    : step_(make_step(model, opt, options)),
      compiled_(runtime::Session(options.device).compile(params_to_inputs(step_.graph), options.compile)),
      micro_batches_(options.micro_batches) {
  if (options.data_parallel) comm_ = options.communicator ? *options.communicator : distributed::world();
  std::set<std::string, std::less<>> trained(step_.params.begin(), step_.params.end());
  std::string missing;
  for (auto id : model.param_ids()) {
    const ir::Node& n = model.node(id);
    const std::string& name = n.attrs.get_str("name");
    auto it = params.find(name);
    if (it == params.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    ir::Tensor& value = it->second;
    if (value.dtype() != n.dtype || !n.shape.is_static() || value.shape() != n.shape.extents())
      throw Error("Trainer: param '" + name + "' is declared " + std::string(ir::dtype_name(n.dtype)) + n.shape.str() +
                  ", got a value of " + type_str(value.dtype(), value.shape()));
    Slot s{name, {std::move(value), {}}, trained.contains(name)};
    if (s.updated) s.buf[1] = ir::Tensor(s.buf[0].dtype(), s.buf[0].shape());
    slots_.push_back(std::move(s));
    params.erase(it);
  }
  if (!missing.empty()) throw Error("Trainer: no initial value for param(s) " + missing);
  if (!params.empty()) {
    std::string known;
    for (auto id : model.param_ids()) known += (known.empty() ? "" : ", ") + model.node(id).attrs.get_str("name");
    throw Error("Trainer: graph '" + model.name() + "' has no param named '" + params.begin()->first +
                "' (params: " + known + ")");
  }
  lr_slot_ = slots_.size();
  slots_.push_back({step_.lr_input, {ir::Tensor::scalar(step_.scalar_dtype, learning_rate(opt)), {}}, false});
  for (const auto& spec : step_.state) {
    slots_.push_back({spec.name, {zeros(spec), zeros(spec)}, true});
  }

  // Outputs after the loss are new params in step_.params order, then the state.
  const auto find = [&](const std::string& name) {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].name == name) return i;
    throw Error("Trainer: internal: no slot '" + name + "'");
  };
  for (const auto& p : step_.params) out_slot_.push_back(find(p));
  for (const auto& s : step_.state) out_slot_.push_back(find(s.name));
  first_update_output_ = accumulating(options) ? 0 : 1;
  const auto& specs = compiled_.output_specs();
  if (const auto scaling = loss_scaling(options)) {
    Scaler sc{.config = *scaling, .scale = scaling->init_scale};
    const auto& ins = compiled_.input_specs();
    const auto in =
        std::find_if(ins.begin(), ins.end(), [&](const auto& i) { return i.name == step_.loss_scale_input; });
    if (in == ins.end()) throw Error("Trainer: internal: the step graph has no input '" + step_.loss_scale_input + "'");
    sc.input = ir::Tensor::scalar(in->dtype, sc.scale);
    sc.check = ir::Tensor(specs.back().dtype, specs.back().shape);
    scaler_.emplace(std::move(sc));
  }
  if (specs.size() != out_slot_.size() + first_update_output_ + (scaler_ ? 1 : 0))
    throw Error("Trainer: internal: the step graph has " + std::to_string(specs.size()) + " outputs");
  if (first_update_output_ == 1) loss_ = ir::Tensor(specs[0].dtype, specs[0].shape);
  for (const auto& s : slots_) named_.push_back({s.name, ir::view(s.buf[0])});
  out_ptrs_.resize(specs.size());
  if (!accumulating(options)) return;

  // Every rank starts from rank 0's weights.
  if (comm_)
    for (std::size_t i = 0; i < lr_slot_; ++i)
      if (ir::is_float(slots_[i].buf[0].dtype()) && slots_[i].buf[0].dtype() != ir::DType::F16)
        comm_->broadcast(slots_[i].buf[0]);
  // One micro-batch's loss and gradients, from the same autodiff the fused step uses.
  GradPath gp{.compiled =
                  runtime::Session(options.device)
                      .compile(params_to_inputs(autodiff::value_and_grad(model, step_.params, options.autodiff)),
                               options.compile)};
  for (const auto& p : step_.params) {
    gp.param_slot.push_back(find(p));
    const ir::Tensor& v = slots_[gp.param_slot.back()].buf[0];
    gp.grad.emplace_back(v.dtype(), v.shape());
    gp.offset.push_back((gp.flat.size() + 7) / 8 * 8);  // f64 sums stay aligned after f32 ones
    gp.flat.resize(gp.offset.back() + v.nbytes());
    if (gp.grad.front().dtype() != v.dtype()) gp.one_dtype = false;
  }
  const auto& gspecs = gp.compiled.output_specs();
  if (gspecs.size() != step_.params.size() + 1)
    throw Error("Trainer: internal: the gradient graph has " + std::to_string(gspecs.size()) + " outputs");
  gp.loss = ir::Tensor(gspecs[0].dtype, gspecs[0].shape);
  gp.out_ptrs.resize(gspecs.size());
  grad_.emplace(std::move(gp));
}

double Trainer::accumulated_step(std::span<const runtime::NamedTensor> inputs) {
  GradPath& gp = *grad_;
  const auto m = static_cast<std::size_t>(micro_batches_);
  // Each input cut into m views along axis 0, each of the model's shape.
  std::vector<runtime::NamedTensor> micro(inputs.begin(), inputs.end());
  std::vector<std::size_t> stride(inputs.size(), 0);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    const runtime::CompiledGraph::IoSpec* spec = nullptr;
    for (const auto& s : gp.compiled.input_specs())
      if (s.name == in.name) spec = &s;
    if (!spec || spec->shape.empty() || m == 1) continue;  // unknown names: run_raw reports them
    const auto& d = in.value.shape;
    const bool fits = d.size() == spec->shape.size() && d[0] == static_cast<std::int64_t>(m) * spec->shape[0] &&
                      std::equal(d.begin() + 1, d.end(), spec->shape.begin() + 1) && in.value.nbytes % m == 0;
    if (!fits) {
      std::string got = "[";
      for (std::size_t k = 0; k < d.size(); ++k) got += (k ? "," : "") + std::to_string(d[k]);
      throw Error("Trainer: input '" + in.name + "' has shape " + got + "]; with micro_batches=" + std::to_string(m) +
                  " it must be the model's shape with its leading dim " + std::to_string(m) + " x " +
                  std::to_string(spec->shape[0]));
    }
    stride[i] = in.value.nbytes / m;
    micro[i].value = {in.value.dtype, spec->shape, in.value.data, stride[i]};
  }

  double loss_sum = 0;
  for (std::size_t k = 0; k < m; ++k) {
    gp.named.clear();
    for (std::size_t i = 0; i < lr_slot_; ++i)
      gp.named.push_back({slots_[i].name, ir::view(slots_[i].current(parity_))});
    for (std::size_t i = 0; i < micro.size(); ++i) {
      gp.named.push_back(micro[i]);
      if (stride[i]) gp.named.back().value.data = static_cast<const std::byte*>(inputs[i].value.data) + k * stride[i];
    }
    gp.out_ptrs[0] = gp.loss.data();
    // The first micro-batch writes its gradients straight into the sums.
    for (std::size_t j = 0; j < gp.grad.size(); ++j)
      gp.out_ptrs[j + 1] = k == 0 ? static_cast<void*>(gp.flat.data() + gp.offset[j]) : gp.grad[j].data();
    gp.compiled.run_raw(gp.named, gp.out_ptrs);
    loss_sum += gp.loss.get(0);
    if (k > 0)
      for (std::size_t j = 0; j < gp.grad.size(); ++j) add_into(gp.flat.data() + gp.offset[j], gp.grad[j]);
  }
  std::int64_t parts = micro_batches_;
  if (comm_) {
    // One all-reduce for every gradient when they share a dtype (elementwise, so the same sums as one per param).
    const ir::DType dt = gp.grad.front().dtype();
    if (gp.one_dtype) {
      comm_->all_reduce(distributed::Buffer{gp.flat.data(), gp.flat.size() / ir::dtype_size(dt), dt});
    } else {
      for (std::size_t j = 0; j < gp.grad.size(); ++j)
        comm_->all_reduce(distributed::Buffer{gp.flat.data() + gp.offset[j],
                                              static_cast<std::size_t>(gp.grad[j].numel()), gp.grad[j].dtype()});
    }
    comm_->all_reduce(std::span<double>(&loss_sum, 1));
    parts *= comm_->world_size();
  }
  for (std::size_t j = 0; j < gp.grad.size(); ++j) {
    const auto n = static_cast<std::size_t>(gp.grad[j].numel());
    if (gp.grad[j].dtype() == ir::DType::F64) {
      divide(reinterpret_cast<double*>(gp.flat.data() + gp.offset[j]), n, parts);
    } else {
      divide(reinterpret_cast<float*>(gp.flat.data() + gp.offset[j]), n, parts);
    }
  }

  // The update: trained params, their mean gradients, the lr, the state.
  named_.clear();
  for (std::size_t j = 0; j < gp.param_slot.size(); ++j) {
    const Slot& s = slots_[gp.param_slot[j]];
    named_.push_back({s.name, ir::view(s.current(parity_))});
    const ir::Tensor& g = gp.grad[j];  // its dtype and shape; the values are in flat
    named_.push_back({"grad_" + s.name, {g.dtype(), g.shape(), gp.flat.data() + gp.offset[j], g.nbytes()}});
  }
  for (std::size_t i = lr_slot_; i < slots_.size(); ++i)
    named_.push_back({slots_[i].name, ir::view(slots_[i].current(parity_))});
  for (std::size_t j = 0; j < out_slot_.size(); ++j) out_ptrs_[j] = slots_[out_slot_[j]].buf[parity_ ^ 1].data();
  compiled_.run_raw(named_, out_ptrs_);
  parity_ ^= 1;
  ++steps_;
  return loss_sum / static_cast<double>(parts);
}

double Trainer::step(std::span<const runtime::NamedTensor> inputs) {
  if (grad_) return accumulated_step(inputs);
  named_.resize(slots_.size());
  for (std::size_t i = 0; i < slots_.size(); ++i) named_[i].value = ir::view(slots_[i].current(parity_));
  if (scaler_) named_.push_back({step_.loss_scale_input, ir::view(scaler_->input)});
  named_.insert(named_.end(), inputs.begin(), inputs.end());
  out_ptrs_[0] = loss_.data();
  for (std::size_t j = 0; j < out_slot_.size(); ++j) out_ptrs_[j + 1] = slots_[out_slot_[j]].buf[parity_ ^ 1].data();
  if (scaler_) out_ptrs_.back() = scaler_->check.data();
  compiled_.run_raw(named_, out_ptrs_);
  if (scaler_) {
    // The new values went to the other buffers; a skipped step leaves the parity, so they are never read.
    Scaler& s = *scaler_;
    if (!std::isfinite(s.check.get(0))) {
      s.scale *= s.config.backoff_factor;
      s.good = 0;
      ++s.skipped;
      s.input.set(0, s.scale);
      return loss_.get(0);
    }
    if (s.config.growth_interval > 0 && ++s.good >= s.config.growth_interval) {
      s.scale *= s.config.growth_factor;
      s.good = 0;
      s.input.set(0, s.scale);
    }
  }
  parity_ ^= 1;
  ++steps_;
  return loss_.get(0);
}

double Trainer::step(const TensorMap& inputs) {
  std::vector<runtime::NamedTensor> named;
  named.reserve(inputs.size());
  for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
  return step(named);
}

const Trainer::Slot& Trainer::slot(std::string_view name, std::string_view what) const {
  const bool want_param = what == "param";
  const std::size_t lo = want_param ? 0 : lr_slot_ + 1, hi = want_param ? lr_slot_ : slots_.size();
  std::string known;
  for (std::size_t i = lo; i < hi; ++i) {
    if (slots_[i].name == name) return slots_[i];
    known += (known.empty() ? "" : ", ") + slots_[i].name;
  }
  throw Error("Trainer: no " + std::string(what) + " named '" + std::string(name) + "' (" +
              (known.empty() ? "there are none" : std::string(what) + "s: " + known) + ")");
}

const ir::Tensor& Trainer::param(std::string_view name) const { return slot(name, "param").current(parity_); }
const ir::Tensor& Trainer::state(std::string_view name) const { return slot(name, "state").current(parity_); }

TensorMap Trainer::params() const {
  TensorMap out;
  for (std::size_t i = 0; i < lr_slot_; ++i) out.emplace(slots_[i].name, slots_[i].current(parity_));
  return out;
}

double Trainer::lr() const { return slots_[lr_slot_].buf[0].get(0); }

void Trainer::set_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error("Trainer: the learning rate must be finite and >= 0, got " + std::to_string(lr));
  slots_[lr_slot_].buf[0].set(0, lr);
}

}  // namespace rlx::train
