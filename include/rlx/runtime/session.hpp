#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rlx/run_control.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

struct NamedTensor {
  std::string name;
  ir::TensorView value;
};

// Thread safety: calls on one CompiledGraph from several threads are
// serialised (a run is a whole-graph job that uses the executable's one arena),
// so they are correct but do not overlap. For runs in parallel, give each thread
// its own clone(). Setting params while clones run is not synchronised: clones
// share the weights.
class CompiledGraph {
 public:
  // What a graph was compiled from, kept for set_active_extent: it compiles the graph again at other extents.
  struct Source {
    std::shared_ptr<Backend> backend;
    ir::Graph graph;
    compile::CompileOptions options;
  };
  CompiledGraph(std::shared_ptr<const compile::CompileResult> result, std::unique_ptr<ExecutableGraph> exe,
                Device device = Device::Cpu, std::shared_ptr<const Source> source = nullptr);
  CompiledGraph(const CompiledGraph&) = delete;
  CompiledGraph& operator=(const CompiledGraph&) = delete;
  CompiledGraph(CompiledGraph&&) noexcept = default;
  CompiledGraph& operator=(CompiledGraph&&) noexcept = default;

  // Params: checked against the declared dtype and shape (rlx::Error otherwise).
  void set_param(std::string_view name, const ir::TensorView& value);
  void set_param(std::string_view name, const ir::Tensor& value) { set_param(name, ir::view(value)); }
  // The param read from `value`'s memory in place where the backend can (capability shared_params),
  // which `owner` keeps alive as long as the graph and its clones need it; a copy elsewhere. For
  // weights mapped from a model file: every graph compiled from the file shares one copy, the OS's.
  void share_param(std::string_view name, const ir::TensorView& value, const std::shared_ptr<const void>& owner);
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
  const std::vector<IoSpec>& input_specs() const { return active_.inputs; }
  const std::vector<IoSpec>& param_specs() const { return params_; }
  const std::vector<IoSpec>& output_specs() const { return active_.outputs; }
  const compile::CompileResult& compile_result() const { return *active_.result; }
  std::string ir(std::string_view level) const;  // "hir" | "mir" | "lir"
  Device device() const { return device_; }
  const std::string& backend_name() const { return active_.exe->backend_name(); }

  // ---- the optional surface (ExecutableGraph): a method the backend does not
  // offer throws rlx::Error naming the method, the backend and the capability bit.
  ExecutableCapabilities capabilities() const { return active_.exe->capabilities(); }
  // typed_io: a value of the param's (input's) shape in any dtype, converted by the backend.
  void set_param_typed(std::string_view name, const ir::TensorView& value);
  std::vector<ir::Tensor> run_typed(std::span<const NamedTensor> inputs);
  // read_outputs: runs and returns only the outputs at `indices`, in that order.
  std::vector<ir::Tensor> run_read_outputs(std::span<const NamedTensor> inputs, std::span<const std::size_t> indices);
  // async_pipeline: starts a run; the inputs' memory must stay alive and
  // unchanged until sync_pending, which returns the outputs.
  void commit_no_wait(std::span<const NamedTensor> inputs);
  std::vector<ir::Tensor> sync_pending();
  std::vector<std::vector<ir::Tensor>> run_pipelined(std::span<const std::vector<NamedTensor>> input_sets);
  // persistent_handles: the input is kept by the executable between runs and
  // is left out of later runs' inputs.
  void bind_handle(std::string_view input, const ir::TensorView& value);
  ir::Tensor read_handle(std::string_view input) const;
  // kv_resident: after each run, `output` is written back into the handle of `input`.
  void feed_handle(std::string_view input, std::string_view output);
  // handle_addresses: where the bound handle of `input` lives in the GPU's memory, after the last run, for
  // libraries that take device addresses: a rlx::distributed collective reduces it in place (Memory::Device) with
  // nothing copied through the host, and the next run reads the result. docs/distributed.md shows it.
  DeviceAddress handle_address(std::string_view input) const;
  // active_extent: later runs use `extent` for a symbolic dim bound at compile time (CompileOptions::bind), from 1
  // up to its bound; nullopt (or the bound) restores the bound. Inputs and outputs then have that extent's shapes
  // (input_specs(), output_specs() and compile_result() describe the graph that runs). As XLA and TensorRT's
  // profiles do, the graph is compiled once per extent, on first use, and kept (its clones share the compile
  // results, and only make an extent executable for themselves): every extent's executable reads
  // the same params (ExecutableGraph::share_params_from: none is copied), and bound handles and their feeds move
  // with the extent (a handle's shape must not depend on the symbol). The first form needs the graph to bind one
  // symbol. rlx::Error for an extent out of range, an unknown symbol, or a backend without the capability.
  void set_active_extent(std::optional<std::int64_t> extent);
  void set_active_extent(std::string_view symbol, std::optional<std::int64_t> extent);
  // The extent runs use for `symbol` (empty: the one bound symbol).
  std::int64_t active_extent(std::string_view symbol = {}) const;
  void set_rng(const RngOptions& rng) {
    auto held = lock();
    active_.exe->set_rng(rng);
  }
  RngOptions rng() const {
    auto held = lock();
    return active_.exe->rng();
  }
  // kernel_times: each kernel's time in the last run (after set_profiling(true) where the backend needs it).
  void set_profiling(bool on) {
    auto held = lock();
    active_.exe->set_profiling(on);
    profiling_ = on;
  }
  std::vector<KernelTime> kernel_times() const {
    auto held = lock();
    return active_.exe->kernel_times();
  }
  // copy_params: every param's value from `src`, compiled from the same graph for the same backend.
  void copy_params_from(const CompiledGraph& src);

  // Stopping runs (rlx/run_control.hpp). cancel() may be called from any thread and takes no lock: the run
  // in flight stops at its next loop step with rlx::Error ("the run was cancelled"). A timeout bounds every
  // later run the same way; nullopt (the default) is none. Kernels are not interrupted, loops are: a while
  // whose condition never turns false is what needs it.
  void cancel() noexcept { control_->cancel(); }
  void set_run_timeout(std::optional<std::chrono::steady_clock::duration> timeout) {
    auto held = lock();
    control_->set_timeout(timeout);
  }

 private:
  std::size_t input_index(std::string_view name, std::string_view method) const;
  // Every call that reads or writes the run state below (the scratch vectors,
  // the pending outputs, the handles, and the executable's arena and params)
  // holds this lock.
  std::unique_lock<std::mutex> lock() const { return std::unique_lock(*mutex_); }
  // The index of param `name`; rlx::Error naming `method` and the params otherwise.
  std::size_t param_index(std::string_view name, const char* method) const;
  // Checks inputs and fills in_ptrs_; the caller holds the lock. One call runs
  // at a time, so the scratch vectors make runs allocation-free.
  void bind_inputs(std::span<const NamedTensor> inputs);
  // The index of `symbol` in source_->options.bind, for `method`'s errors.
  std::size_t bound_symbol(std::string_view symbol, std::string_view method) const;
  // Makes the graph compiled at `extents` (one per bound symbol) the one that runs; the caller holds the lock.
  void activate(const std::vector<std::int64_t>& extents);

  // The graph compiled at one set of extents (one per bound symbol of source_->options.bind): its compile
  // result, its executable, and its inputs' and outputs' specs (the params' are every extent's, params_).
  struct Variant {
    std::shared_ptr<const compile::CompileResult> result;
    std::unique_ptr<ExecutableGraph> exe;
    std::vector<IoSpec> inputs, outputs;
  };
  Variant active_;  // the one that runs, compiled at extents_
  std::vector<IoSpec> params_;
  std::shared_ptr<const Source> source_;  // null: the graph is not compiled again (no active extents)
  std::vector<std::int64_t> extents_;
  // The other extents compiled so far (set_active_extent), the bound's among them while another runs.
  std::map<std::vector<std::int64_t>, Variant> variants_;
  // Every extent's compile result, shared by a compiled graph and its clones: an extent one of them compiled is
  // only made executable again by the others (Backend::executable), not compiled again.
  struct CompiledExtents {
    std::mutex mutex;
    std::map<std::vector<std::int64_t>, std::shared_ptr<const compile::CompileResult>> results;
  };
  std::shared_ptr<CompiledExtents> compiled_extents_;
  std::vector<std::pair<std::size_t, std::size_t>> feeds_;  // (input, output) given to feed_handle
  bool profiling_ = false;
  std::shared_ptr<std::vector<bool>> params_set_;  // shared by clones, like the weights
  std::vector<const void*> in_ptrs_;
  std::vector<void*> out_ptrs_;
  Device device_ = Device::Cpu;
  std::vector<bool> handles_;                       // per input: bound with bind_handle
  std::optional<std::vector<ir::Tensor>> pending_;  // outputs of a commit_no_wait
  // On the heap so that CompiledGraph stays movable (a moved-from one is not used again).
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  std::unique_ptr<RunControl> control_ = std::make_unique<RunControl>();  // per clone: cancel one, not all
};

class Session {
 public:
  explicit Session(Device device = Device::Cpu);
  // RLX_DISPATCH_REPORT=1 prints the dispatch report (kernel_dispatch_report) to stderr.
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
