#include "rlx/runtime/session.hpp"

#include <cstring>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"

namespace rlx::runtime {

namespace {
std::string type_str(ir::DType t, std::span<const std::int64_t> shape) {
  std::string s = std::string(ir::dtype_name(t)) + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::size_t spec_bytes(const CompiledGraph::IoSpec& s) {
  std::size_t n = ir::dtype_size(s.dtype);
  for (auto d : s.shape) n *= static_cast<std::size_t>(d);
  return n;
}

void check_value(std::string_view what, const CompiledGraph::IoSpec& spec, const ir::TensorView& v) {
  if (v.dtype != spec.dtype || !std::equal(v.shape.begin(), v.shape.end(), spec.shape.begin(), spec.shape.end()))
    throw Error(std::string(what) + " '" + spec.name + "' expects " + type_str(spec.dtype, spec.shape) + ", got " +
                type_str(v.dtype, v.shape));
  if (v.nbytes != spec_bytes(spec))
    throw Error(std::string(what) + " '" + spec.name + "' expects " + std::to_string(spec_bytes(spec)) + " bytes, got " +
                std::to_string(v.nbytes));
  if (v.data == nullptr && v.nbytes != 0) throw Error(std::string(what) + " '" + spec.name + "' has no data");
}
}  // namespace

CompiledGraph::CompiledGraph(std::shared_ptr<const compile::CompileResult> result, std::unique_ptr<ExecutableGraph> exe)
    : result_(std::move(result)), exe_(std::move(exe)) {
  const auto& lir = result_->lir;
  auto spec = [&](compile::BufferId id, std::string name) {
    const auto& b = lir.buffer(id);
    return IoSpec{std::move(name), b.dtype, b.shape};
  };
  for (auto id : lir.inputs) inputs_.push_back(spec(id, lir.buffer(id).name));
  for (auto id : lir.params) params_.push_back(spec(id, lir.buffer(id).name));
  for (std::size_t i = 0; i < lir.outputs.size(); ++i)
    outputs_.push_back(spec(lir.outputs[i], i < lir.output_names.size() && !lir.output_names[i].empty()
                                                ? lir.output_names[i]
                                                : "output" + std::to_string(i)));
  params_set_ = std::make_shared<std::vector<bool>>(params_.size(), false);
  for (const auto& [name, value] : result_->promoted_params) set_param(name, value);
}

void CompiledGraph::set_param(std::string_view name, const ir::TensorView& value) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name != name) continue;
    check_value("param", params_[i], value);
    exe_->set_param(i, value.data, value.nbytes);
    (*params_set_)[i] = true;
    return;
  }
  std::string known;
  for (const auto& p : params_) known += (known.empty() ? "" : ", ") + p.name;
  throw Error("set_param: the graph has no param named '" + std::string(name) + "' (" +
              (known.empty() ? "it has none" : "params: " + known) + ")");
}

void CompiledGraph::bind_inputs(std::span<const NamedTensor> inputs) {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!(*params_set_)[i])
      throw Error("run: param '" + params_[i].name + "' has not been set (call set_param first)");
  auto& ptrs = in_ptrs_;
  ptrs.assign(inputs_.size(), nullptr);
  for (const auto& in : inputs) {
    std::size_t i = 0;
    while (i < inputs_.size() && inputs_[i].name != in.name) ++i;
    if (i == inputs_.size()) {
      std::string known;
      for (const auto& s : inputs_) known += (known.empty() ? "" : ", ") + s.name;
      throw Error("run: the graph has no input named '" + in.name + "' (inputs: " + known + ")");
    }
    if (ptrs[i]) throw Error("run: input '" + in.name + "' is given twice");
    check_value("input", inputs_[i], in.value);
    ptrs[i] = in.value.data ? in.value.data : this;  // any non-null pointer for zero-size inputs
  }
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (!ptrs[i]) throw Error("run: input '" + inputs_[i].name + "' is missing");
}

void CompiledGraph::run_into(std::span<const NamedTensor> inputs, std::span<ir::Tensor> outputs) {
  bind_inputs(inputs);
  if (outputs.size() != outputs_.size())
    throw Error("run_into: expected " + std::to_string(outputs_.size()) + " outputs, got " + std::to_string(outputs.size()));
  out_ptrs_.resize(outputs.size());
  for (std::size_t j = 0; j < outputs.size(); ++j) {
    check_value("output", outputs_[j], ir::view(outputs[j]));
    out_ptrs_[j] = outputs[j].data();
  }
  exe_->run(in_ptrs_, out_ptrs_);
}

void CompiledGraph::run_raw(std::span<const NamedTensor> inputs, std::span<void* const> outputs) {
  bind_inputs(inputs);
  if (outputs.size() != outputs_.size())
    throw Error("run: expected " + std::to_string(outputs_.size()) + " outputs, got " + std::to_string(outputs.size()));
  exe_->run(in_ptrs_, outputs);
}

std::vector<ir::Tensor> CompiledGraph::run(std::span<const NamedTensor> inputs) {
  std::vector<ir::Tensor> outs;
  outs.reserve(outputs_.size());
  for (const auto& s : outputs_) outs.emplace_back(s.dtype, s.shape);
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
  CompiledGraph c(result_, exe_->clone());
  c.params_set_ = params_set_;
  return c;
}

std::string CompiledGraph::ir(std::string_view level) const {
  if (level == "hir") return ir::to_text(result_->hir);
  if (level == "mir") return ir::to_text(result_->mir);
  if (level == "lir") return result_->lir.to_text();
  throw Error("ir: unknown level '" + std::string(level) + "' (expected hir, mir or lir)");
}

Session::Session(Device device) : device_(device), backend_(make_backend(device)) {}

CompiledGraph Session::compile(const ir::Graph& graph, const compile::CompileOptions& options) const {
  auto result = std::make_shared<compile::CompileResult>(compile::compile(graph, backend_->traits(), options));
  auto exe = backend_->compile_lir(result->lir, options);
  return CompiledGraph(std::move(result), std::move(exe));
}

}  // namespace rlx::runtime
