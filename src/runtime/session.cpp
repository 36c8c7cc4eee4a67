#include "rlx/runtime/session.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"

namespace rlx::runtime {

namespace {
std::string type_str(ir::DType t, std::span<const std::int64_t> shape) {
  std::string s = std::string(ir::dtype_name(t)) + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::size_t spec_bytes(const CompiledGraph::IoSpec& s) { return ir::storage_bytes(s.dtype, s.shape); }

void check_value(std::string_view what, const CompiledGraph::IoSpec& spec, const ir::TensorView& v) {
  if (v.dtype != spec.dtype || !std::equal(v.shape.begin(), v.shape.end(), spec.shape.begin(), spec.shape.end()))
    throw Error(std::string(what) + " '" + spec.name + "' expects " + type_str(spec.dtype, spec.shape) + ", got " +
                type_str(v.dtype, v.shape));
  if (v.nbytes != spec_bytes(spec))
    throw Error(std::string(what) + " '" + spec.name + "' expects " + std::to_string(spec_bytes(spec)) +
                " bytes, got " + std::to_string(v.nbytes));
  if (v.data == nullptr && v.nbytes != 0) throw Error(std::string(what) + " '" + spec.name + "' has no data");
}
}  // namespace

namespace {
struct IoSpecs {
  std::vector<CompiledGraph::IoSpec> inputs, params, outputs;
};
IoSpecs io_specs(const compile::LirModule& lir) {
  auto spec = [&](compile::BufferId id, std::string name) {
    const auto& b = lir.buffer(id);
    return CompiledGraph::IoSpec{std::move(name), b.dtype, b.shape};
  };
  IoSpecs s;
  for (auto id : lir.inputs) s.inputs.push_back(spec(id, lir.buffer(id).name));
  for (auto id : lir.params) s.params.push_back(spec(id, lir.buffer(id).name));
  for (std::size_t i = 0; i < lir.outputs.size(); ++i)
    s.outputs.push_back(spec(lir.outputs[i], i < lir.output_names.size() && !lir.output_names[i].empty()
                                                 ? lir.output_names[i]
                                                 : "output" + std::to_string(i)));
  return s;
}

bool same_specs(const std::vector<CompiledGraph::IoSpec>& a, const std::vector<CompiledGraph::IoSpec>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.name == y.name && x.dtype == y.dtype && x.shape == y.shape;
  });
}
}  // namespace

CompiledGraph::CompiledGraph(std::shared_ptr<const compile::CompileResult> result, std::unique_ptr<ExecutableGraph> exe,
                             Device device, std::shared_ptr<const Source> source)
    : active_{std::move(result), std::move(exe), {}, {}}, source_(std::move(source)), device_(device) {
  auto specs = io_specs(active_.result->lir);
  active_.inputs = std::move(specs.inputs);
  params_ = std::move(specs.params);
  active_.outputs = std::move(specs.outputs);
  if (source_) {
    for (const auto& [symbol, bound] : source_->options.bind) extents_.push_back(bound);
    compiled_extents_ = std::make_shared<CompiledExtents>();
    compiled_extents_->results.emplace(extents_, active_.result);
  }
  params_set_ = std::make_shared<std::vector<bool>>(params_.size(), false);
  handles_.assign(active_.inputs.size(), false);
  for (const auto& [name, value] : active_.result->promoted_params) set_param(name, value);
}

std::size_t CompiledGraph::param_index(std::string_view name, const char* method) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return i;
  std::string known;
  for (const auto& p : params_) known += (known.empty() ? "" : ", ") + p.name;
  throw Error(std::string(method) + ": the graph has no param named '" + std::string(name) + "' (" +
              (known.empty() ? "it has none" : "params: " + known) + ")");
}

void CompiledGraph::set_param(std::string_view name, const ir::TensorView& value) {
  const std::size_t i = param_index(name, "set_param");
  check_value("param", params_[i], value);
  auto held = lock();
  active_.exe->set_param(i, value.data, value.nbytes);
  (*params_set_)[i] = true;
}

void CompiledGraph::share_param(std::string_view name, const ir::TensorView& value,
                                const std::shared_ptr<const void>& owner) {
  const std::size_t i = param_index(name, "share_param");
  check_value("param", params_[i], value);
  auto held = lock();
  active_.exe->share_param(i, value.data, value.nbytes, owner);
  (*params_set_)[i] = true;
}

void CompiledGraph::bind_inputs(std::span<const NamedTensor> inputs) {
  if (pending_) throw Error("run: a commit_no_wait is pending; call sync_pending first");
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!(*params_set_)[i]) throw Error("run: param '" + params_[i].name + "' has not been set (call set_param first)");
  auto& ptrs = in_ptrs_;
  ptrs.assign(active_.inputs.size(), nullptr);
  for (const auto& in : inputs) {
    std::size_t i = 0;
    while (i < active_.inputs.size() && active_.inputs[i].name != in.name) ++i;
    if (i == active_.inputs.size()) {
      std::string known;
      for (const auto& s : active_.inputs) known += (known.empty() ? "" : ", ") + s.name;
      throw Error("run: the graph has no input named '" + in.name + "' (inputs: " + known + ")");
    }
    if (ptrs[i]) throw Error("run: input '" + in.name + "' is given twice");
    if (handles_[i]) throw Error("run: input '" + in.name + "' is bound to a handle (bind_handle); leave it out");
    check_value("input", active_.inputs[i], in.value);
    ptrs[i] = in.value.data ? in.value.data : this;  // any non-null pointer for zero-size inputs
  }
  for (std::size_t i = 0; i < active_.inputs.size(); ++i)
    if (!ptrs[i] && !handles_[i]) throw Error("run: input '" + active_.inputs[i].name + "' is missing");
}

void CompiledGraph::run_into(std::span<const NamedTensor> inputs, std::span<ir::Tensor> outputs) {
  auto held = lock();
  bind_inputs(inputs);
  if (outputs.size() != active_.outputs.size())
    throw Error("run_into: expected " + std::to_string(active_.outputs.size()) + " outputs, got " +
                std::to_string(outputs.size()));
  out_ptrs_.resize(outputs.size());
  for (std::size_t j = 0; j < outputs.size(); ++j) {
    check_value("output", active_.outputs[j], ir::view(outputs[j]));
    out_ptrs_[j] = outputs[j].data();
  }
  {
    RunControl::Scope scope(*control_);
    active_.exe->run(in_ptrs_, out_ptrs_);
  }
}

void CompiledGraph::run_raw(std::span<const NamedTensor> inputs, std::span<void* const> outputs) {
  auto held = lock();
  bind_inputs(inputs);
  if (outputs.size() != active_.outputs.size())
    throw Error("run: expected " + std::to_string(active_.outputs.size()) + " outputs, got " +
                std::to_string(outputs.size()));
  {
    RunControl::Scope scope(*control_);
    active_.exe->run(in_ptrs_, outputs);
  }
}

std::vector<ir::Tensor> CompiledGraph::run(std::span<const NamedTensor> inputs) {
  std::vector<ir::Tensor> outs;
  outs.reserve(active_.outputs.size());
  for (const auto& s : active_.outputs) outs.emplace_back(s.dtype, s.shape);
  run_into(inputs, outs);
  return outs;
}

std::vector<ir::Tensor> CompiledGraph::run(const std::map<std::string, ir::Tensor, std::less<>>& inputs) {
  std::vector<NamedTensor> named;
  named.reserve(inputs.size());
  for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
  return run(named);
}

CompiledGraph CompiledGraph::clone() const {
  auto held = lock();
  CompiledGraph c(active_.result, active_.exe->clone(), device_, source_);
  c.params_set_ = params_set_;
  c.extents_ = extents_;  // at the same extent; others are made executable from the shared results on demand
  c.compiled_extents_ = compiled_extents_;
  return c;
}

std::size_t CompiledGraph::bound_symbol(std::string_view symbol, std::string_view method) const {
  const auto* bind = source_ ? &source_->options.bind : nullptr;
  std::string known;
  if (bind)
    for (const auto& [name, bound] : *bind) known += (known.empty() ? "" : ", ") + name + "=" + std::to_string(bound);
  if (!bind || bind->empty())
    throw Error(fmt::format(
        "{}: the graph was compiled with no bound symbolic dim (bind one with CompileOptions::bind)", method));
  if (symbol.empty()) {
    if (bind->size() == 1) return 0;
    throw Error(fmt::format("{}: the graph binds {} symbols ({}); name the one to set", method, bind->size(), known));
  }
  for (std::size_t i = 0; i < bind->size(); ++i)
    if ((*bind)[i].first == symbol) return i;
  throw Error(fmt::format("{}: the graph binds no symbol '{}' (it binds {})", method, symbol, known));
}

void CompiledGraph::set_active_extent(std::optional<std::int64_t> extent) { set_active_extent({}, extent); }

void CompiledGraph::set_active_extent(std::string_view symbol, std::optional<std::int64_t> extent) {
  auto held = lock();
  if (!active_.exe->capabilities().active_extent)
    throw Error(fmt::format("set_active_extent: backend '{}' does not offer it (capability 'active_extent' is false)",
                            active_.exe->backend_name()));
  if (pending_) throw Error("set_active_extent: a commit_no_wait is pending; call sync_pending first");
  const std::size_t s = bound_symbol(symbol, "set_active_extent");
  const auto& [name, bound] = source_->options.bind[s];
  const std::int64_t want = extent.value_or(bound);
  if (want < 1 || want > bound)
    throw Error(fmt::format("set_active_extent: symbol '{}' is bound to {}; its extent must be in [1, {}], got {}",
                            name, bound, bound, want));
  auto extents = extents_;
  extents[s] = want;
  activate(extents);
}

std::int64_t CompiledGraph::active_extent(std::string_view symbol) const {
  auto held = lock();
  return extents_[bound_symbol(symbol, "active_extent")];
}

void CompiledGraph::activate(const std::vector<std::int64_t>& extents) {
  if (extents == extents_) return;
  auto at = [&] {
    std::string s;
    for (std::size_t i = 0; i < extents.size(); ++i)
      s += fmt::format("{}{}={}", i ? ", " : "", source_->options.bind[i].first, extents[i]);
    return s;
  };
  auto found = variants_.find(extents);
  Variant next;
  if (found != variants_.end()) {
    next = std::move(found->second);
    variants_.erase(found);
  } else {
    auto options = source_->options;
    for (std::size_t i = 0; i < extents.size(); ++i) options.bind[i].second = extents[i];
    // Compiled once for the graph and its clones: a result one of them made is only made executable here.
    std::shared_ptr<const compile::CompileResult> result;
    std::unique_ptr<ExecutableGraph> exe;
    try {
      std::lock_guard family(compiled_extents_->mutex);
      auto& shared = compiled_extents_->results[extents];
      if (!shared) {
        auto compiled = source_->backend->compile(source_->graph, options);
        exe = std::move(compiled.exe);
        shared = std::move(compiled.result);
      } else {
        exe = source_->backend->executable(*shared, options);
      }
      result = shared;
    } catch (const Error& e) {
      throw Error(fmt::format("set_active_extent: compiling the graph at {}: {}", at(), e.what()));
    }
    auto specs = io_specs(result->lir);
    // Every extent reads the same params, so they must not depend on the symbol (nor may promoted constants).
    if (!same_specs(specs.params, params_)) {
      std::string why = "a different number of params";
      for (std::size_t i = 0; i < std::min(specs.params.size(), params_.size()); ++i)
        if (specs.params[i].shape != params_[i].shape || specs.params[i].dtype != params_[i].dtype) {
          why = fmt::format("param '{}' is {} there but {} here", params_[i].name,
                            type_str(specs.params[i].dtype, specs.params[i].shape),
                            type_str(params_[i].dtype, params_[i].shape));
          break;
        }
      throw Error(
          fmt::format("set_active_extent: at {} {}; every extent shares the params, so their shapes must not "
                      "depend on the symbol",
                      at(), why));
    }
    // The same graph, so the same inputs and outputs in the same order (the loops below index them alike).
    auto names = [](const std::vector<IoSpec>& v) {
      std::vector<std::string> n;
      for (const auto& x : v) n.push_back(x.name);
      return n;
    };
    if (names(specs.inputs) != names(active_.inputs) || names(specs.outputs) != names(active_.outputs))
      throw Error(
          fmt::format("set_active_extent: at {} the compiled graph's inputs or outputs differ from the bound's", at()));
    for (const auto& [pname, value] : result->promoted_params) {
      auto mine = active_.result->promoted_params.find(pname);
      if (mine == active_.result->promoted_params.end() || mine->second.nbytes() != value.nbytes() ||
          std::memcmp(mine->second.data(), value.data(), value.nbytes()) != 0)
        throw Error(
            fmt::format("set_active_extent: at {} the promoted constant '{}' differs from the bound's; compile "
                        "with CompileOptions::promote_constants_over_bytes = 0",
                        at(), pname));
    }
    exe->share_params_from(*active_.exe);
    next = Variant{std::move(result), std::move(exe), std::move(specs.inputs), std::move(specs.outputs)};
  }
  // Bound handles and their feeds move to the executable that runs next (copy_handle_to); a handle whose shape
  // changes with the extent cannot. A refusal keeps the extent compiled, for later.
  auto refuse = [&](const std::string& why) {
    variants_.emplace(extents, std::move(next));
    throw Error("set_active_extent: " + why);
  };
  for (std::size_t i = 0; i < active_.inputs.size(); ++i)
    if (handles_[i] && next.inputs[i].shape != active_.inputs[i].shape)
      refuse(
          fmt::format("input '{}' is bound to a handle of shape {}, which depends on the symbol (at {} it is {}); "
                      "a handle keeps its shape across extents",
                      active_.inputs[i].name, type_str(active_.inputs[i].dtype, active_.inputs[i].shape), at(),
                      type_str(next.inputs[i].dtype, next.inputs[i].shape)));
  for (const auto& [i, j] : feeds_)
    if (next.outputs[j].shape != active_.inputs[i].shape)
      refuse(fmt::format("output '{}' feeds the handle of input '{}', but at {} it is {}", active_.outputs[j].name,
                         active_.inputs[i].name, at(), type_str(next.outputs[j].dtype, next.outputs[j].shape)));
  try {
    for (std::size_t i = 0; i < active_.inputs.size(); ++i)
      if (handles_[i]) active_.exe->copy_handle_to(i, *next.exe, spec_bytes(active_.inputs[i]));
    for (const auto& [i, j] : feeds_) next.exe->feed_handle(i, j);
    if (active_.exe->capabilities().rng) next.exe->set_rng(active_.exe->rng());
    if (next.exe->capabilities().kernel_times) next.exe->set_profiling(profiling_);
  } catch (...) {
    variants_.emplace(extents, std::move(next));  // this extent still runs
    throw;
  }
  variants_.emplace(extents_, std::move(active_));
  active_ = std::move(next);
  extents_ = extents;
}

std::string CompiledGraph::ir(std::string_view level) const {
  if (level == "hir") return ir::to_text(active_.result->hir);
  if (level == "mir") return ir::to_text(active_.result->mir);
  if (level == "lir") return active_.result->lir.to_text();
  throw Error("ir: unknown level '" + std::string(level) + "' (expected hir, mir or lir)");
}

std::size_t CompiledGraph::input_index(std::string_view name, std::string_view method) const {
  for (std::size_t i = 0; i < active_.inputs.size(); ++i)
    if (active_.inputs[i].name == name) return i;
  std::string known;
  for (const auto& s : active_.inputs) known += (known.empty() ? "" : ", ") + s.name;
  throw Error(std::string(method) + ": the graph has no input named '" + std::string(name) +
              "' (inputs: " + (known.empty() ? "none" : known) + ")");
}

void CompiledGraph::set_param_typed(std::string_view name, const ir::TensorView& value) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name != name) continue;
    check_value("param", {params_[i].name, value.dtype, params_[i].shape}, value);
    auto held = lock();
    active_.exe->set_param_typed(i, value);
    (*params_set_)[i] = true;
    return;
  }
  set_param(name, value);  // names the known params
}

std::vector<ir::Tensor> CompiledGraph::run_typed(std::span<const NamedTensor> inputs) {
  auto held = lock();
  if (pending_) throw Error("run_typed: a commit_no_wait is pending; call sync_pending first");
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!(*params_set_)[i]) throw Error("run_typed: param '" + params_[i].name + "' has not been set");
  std::vector<ir::TensorView> views(active_.inputs.size());
  std::vector<bool> given(active_.inputs.size(), false);
  for (const auto& in : inputs) {
    auto i = input_index(in.name, "run_typed");
    if (given[i]) throw Error("run_typed: input '" + in.name + "' is given twice");
    if (handles_[i]) throw Error("run_typed: input '" + in.name + "' is bound to a handle (bind_handle); leave it out");
    check_value("input", {active_.inputs[i].name, in.value.dtype, active_.inputs[i].shape}, in.value);
    views[i] = in.value;
    given[i] = true;
  }
  for (std::size_t i = 0; i < active_.inputs.size(); ++i)
    if (!given[i] && !handles_[i]) throw Error("run_typed: input '" + active_.inputs[i].name + "' is missing");
  RunControl::Scope scope(*control_);
  return active_.exe->run_typed(views);
}

std::vector<ir::Tensor> CompiledGraph::run_read_outputs(std::span<const NamedTensor> inputs,
                                                        std::span<const std::size_t> indices) {
  auto held = lock();
  bind_inputs(inputs);
  std::vector<ir::Tensor> outs;
  out_ptrs_.assign(active_.outputs.size(), nullptr);
  for (auto j : indices) {
    if (j >= active_.outputs.size())
      throw Error("run_read_outputs: output index " + std::to_string(j) + " out of range (" +
                  std::to_string(active_.outputs.size()) + " outputs)");
    outs.emplace_back(active_.outputs[j].dtype, active_.outputs[j].shape);
  }
  // Every index gets its own tensor; a repeated index is filled by a copy after the run.
  for (std::size_t k = 0; k < indices.size(); ++k)
    if (!out_ptrs_[indices[k]]) out_ptrs_[indices[k]] = outs[k].data();
  {
    RunControl::Scope scope(*control_);
    active_.exe->run_read_outputs(in_ptrs_, out_ptrs_);
  }
  for (std::size_t k = 0; k < indices.size(); ++k)
    if (out_ptrs_[indices[k]] != outs[k].data()) std::memcpy(outs[k].data(), out_ptrs_[indices[k]], outs[k].nbytes());
  return outs;
}

void CompiledGraph::commit_no_wait(std::span<const NamedTensor> inputs) {
  auto held = lock();
  bind_inputs(inputs);
  std::vector<ir::Tensor> outs;
  for (const auto& s : active_.outputs) outs.emplace_back(s.dtype, s.shape);
  out_ptrs_.resize(outs.size());
  for (std::size_t j = 0; j < outs.size(); ++j) out_ptrs_[j] = outs[j].data();
  {
    RunControl::Scope scope(*control_);  // a synchronous backend runs here
    active_.exe->commit_no_wait(in_ptrs_, out_ptrs_);
  }
  pending_ = std::move(outs);  // the tensors' heap buffers do not move with the vector
}

std::vector<ir::Tensor> CompiledGraph::sync_pending() {
  auto held = lock();
  active_.exe->sync_pending();
  auto outs = pending_ ? std::move(*pending_) : std::vector<ir::Tensor>{};
  pending_.reset();
  return outs;
}

std::vector<std::vector<ir::Tensor>> CompiledGraph::run_pipelined(
    std::span<const std::vector<NamedTensor>> input_sets) {
  auto held = lock();
  std::vector<std::vector<const void*>> ins;
  std::vector<std::vector<void*>> outs_ptrs;
  std::vector<std::vector<ir::Tensor>> outs(input_sets.size());
  for (std::size_t k = 0; k < input_sets.size(); ++k) {
    bind_inputs(input_sets[k]);
    ins.push_back(in_ptrs_);
    auto& p = outs_ptrs.emplace_back();
    outs[k].reserve(active_.outputs.size());
    for (const auto& s : active_.outputs) p.push_back(outs[k].emplace_back(s.dtype, s.shape).data());
  }
  {
    RunControl::Scope scope(*control_);
    active_.exe->run_pipelined(ins, outs_ptrs);
  }
  return outs;
}

void CompiledGraph::bind_handle(std::string_view input, const ir::TensorView& value) {
  auto i = input_index(input, "bind_handle");
  check_value("input", active_.inputs[i], value);
  auto held = lock();
  active_.exe->bind_handle(i, value.data, value.nbytes);
  handles_[i] = true;
}

ir::Tensor CompiledGraph::read_handle(std::string_view input) const {
  auto i = input_index(input, "read_handle");
  ir::Tensor t(active_.inputs[i].dtype, active_.inputs[i].shape);
  auto held = lock();
  active_.exe->read_handle(i, t.data(), t.nbytes());
  return t;
}

DeviceAddress CompiledGraph::handle_address(std::string_view input) const {
  auto i = input_index(input, "handle_address");
  auto held = lock();
  if (!handles_[i] && active_.exe->capabilities().handle_addresses)  // a backend without the bit says so itself
    throw Error("handle_address: input '" + active_.inputs[i].name +
                "' is not bound to a handle (bind_handle it first)");
  return active_.exe->handle_address(i);
}

void CompiledGraph::feed_handle(std::string_view input, std::string_view output) {
  auto i = input_index(input, "feed_handle");
  std::size_t j = 0;
  while (j < active_.outputs.size() && active_.outputs[j].name != output) ++j;
  if (j == active_.outputs.size())
    throw Error("feed_handle: the graph has no output named '" + std::string(output) + "'");
  if (active_.outputs[j].dtype != active_.inputs[i].dtype || active_.outputs[j].shape != active_.inputs[i].shape)
    throw Error("feed_handle: output '" + active_.outputs[j].name + "' is " +
                type_str(active_.outputs[j].dtype, active_.outputs[j].shape) + " but input '" + active_.inputs[i].name +
                "' is " + type_str(active_.inputs[i].dtype, active_.inputs[i].shape));
  auto held = lock();
  active_.exe->feed_handle(i, j);
  auto fed = std::find_if(feeds_.begin(), feeds_.end(), [&](const auto& f) { return f.first == i; });
  if (fed != feeds_.end())
    fed->second = j;
  else
    feeds_.emplace_back(i, j);
}

void CompiledGraph::copy_params_from(const CompiledGraph& src) {
  if (!same_specs(params_, src.params_))
    throw Error("copy_params_from: the source graph's params differ from this graph's (compile both from one graph)");
  if (&src == this) return;
  std::scoped_lock held(*mutex_, *src.mutex_);  // both at once, in an order that cannot deadlock
  active_.exe->copy_params_from(*src.active_.exe);
  *params_set_ = *src.params_set_;
}

Session::Session(Device device) : device_(device), backend_(make_backend(device)) {}

CompiledGraph Session::compile(const ir::Graph& graph, const compile::CompileOptions& options) const {
  auto [result, exe] = backend_->compile(graph, options);
  if (env::get_bool("RLX_DISPATCH_REPORT")) std::fputs(result->dispatch.to_text().c_str(), stderr);
  // A graph with bound symbols keeps what it was compiled from, for set_active_extent.
  auto source = options.bind.empty() || !exe->capabilities().active_extent
                    ? nullptr
                    : std::make_shared<const CompiledGraph::Source>(CompiledGraph::Source{backend_, graph, options});
  return CompiledGraph(std::move(result), std::move(exe), device_, std::move(source));
}

}  // namespace rlx::runtime
