#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

struct NamedTensor {
  std::string name;
  ir::TensorView value;
};

class CompiledGraph {
 public:
  CompiledGraph(std::shared_ptr<const compile::CompileResult> result, std::unique_ptr<ExecutableGraph> exe);
  CompiledGraph(const CompiledGraph&) = delete;
  CompiledGraph& operator=(const CompiledGraph&) = delete;
  CompiledGraph(CompiledGraph&&) noexcept = default;
  CompiledGraph& operator=(CompiledGraph&&) noexcept = default;

  // Params: checked against the declared dtype and shape (rlx::Error otherwise).
  void set_param(std::string_view name, const ir::TensorView& value);
  void set_param(std::string_view name, const ir::Tensor& value) { set_param(name, ir::view(value)); }
  // Runs with named inputs; returns the outputs as new tensors.
  std::vector<ir::Tensor> run(std::span<const NamedTensor> inputs);
  std::vector<ir::Tensor> run(const std::map<std::string, ir::Tensor, std::less<>>& inputs);
  // Allocation-free form: outputs are written into caller-owned tensors of
  // the right dtype and shape (see output_specs()).
  void run_into(std::span<const NamedTensor> inputs, std::span<ir::Tensor> outputs);
  // Lowest level: outputs[j] points at caller memory holding output_specs()[j]'s
  // bytes (used by language bindings that allocate their own arrays).
  void run_raw(std::span<const NamedTensor> inputs, std::span<void* const> outputs);

  // A clone sharing the weights with its own arena, for concurrent runs.
  CompiledGraph clone() const;

  struct IoSpec {
    std::string name;
    ir::DType dtype;
    std::vector<std::int64_t> shape;
  };
  const std::vector<IoSpec>& input_specs() const { return inputs_; }
  const std::vector<IoSpec>& param_specs() const { return params_; }
  const std::vector<IoSpec>& output_specs() const { return outputs_; }
  const compile::CompileResult& compile_result() const { return *result_; }
  std::string ir(std::string_view level) const;  // "hir" | "mir" | "lir"

 private:
  // Checks inputs and fills in_ptrs_. A CompiledGraph runs one call at a time
  // (clones run concurrently), so the scratch vectors make runs allocation-free.
  void bind_inputs(std::span<const NamedTensor> inputs);
  std::shared_ptr<const compile::CompileResult> result_;
  std::unique_ptr<ExecutableGraph> exe_;
  std::vector<IoSpec> inputs_, params_, outputs_;
  std::shared_ptr<std::vector<bool>> params_set_;  // shared by clones, like the weights
  std::vector<const void*> in_ptrs_;
  std::vector<void*> out_ptrs_;
};

class Session {
 public:
  explicit Session(Device device = Device::Cpu);
  CompiledGraph compile(const ir::Graph& graph, const compile::CompileOptions& options = {}) const;
  Device device() const { return device_; }
  const Backend& backend() const { return *backend_; }

 private:
  Device device_;
  std::shared_ptr<Backend> backend_;
};

}  // namespace rlx::runtime

namespace rlx {
using runtime::CompiledGraph;
using runtime::Device;
using runtime::Session;
}  // namespace rlx
