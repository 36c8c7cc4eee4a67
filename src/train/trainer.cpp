// Trainer: the step graph compiled once, with params and optimiser state as
// graph inputs. Each updated value has two host buffers; a step reads one and
// the graph writes the new value into the other, so nothing is copied and the
// buffers swap roles by flipping one parity bit. (set_param would copy every
// weight into the compiled graph each step: a full extra pass over them.)
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

}  // namespace

Trainer::Trainer(const ir::Graph& model, TensorMap params, const Optimizer& opt, const TrainerOptions& options)
    : step_(train_step(model, options.trainable.empty() ? default_trainable(model) : options.trainable, opt,
                       options.autodiff)),
      compiled_(runtime::Session(options.device).compile(params_to_inputs(step_.graph), options.compile)) {
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
  const auto& specs = compiled_.output_specs();
  if (specs.size() != out_slot_.size() + 1)
    throw Error("Trainer: internal: the step graph has " + std::to_string(specs.size()) + " outputs");
  loss_ = ir::Tensor(specs[0].dtype, specs[0].shape);
  for (const auto& s : slots_) named_.push_back({s.name, ir::view(s.buf[0])});
  out_ptrs_.resize(specs.size());
}

double Trainer::step(std::span<const runtime::NamedTensor> inputs) {
  named_.resize(slots_.size());
  for (std::size_t i = 0; i < slots_.size(); ++i) named_[i].value = ir::view(slots_[i].current(parity_));
  named_.insert(named_.end(), inputs.begin(), inputs.end());
  out_ptrs_[0] = loss_.data();
  for (std::size_t j = 0; j < out_slot_.size(); ++j) out_ptrs_[j + 1] = slots_[out_slot_[j]].buf[parity_ ^ 1].data();
  compiled_.run_raw(named_, out_ptrs_);
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
