#pragma once
// The backend interface. A backend is small: it declares its traits
// (supported ops and dtypes) and compiles an LIR module into an executable.
// Everything shared (legalization, fusion, memory planning, input checking)
// lives once, in rlx::compile and rlx::runtime::CompiledGraph.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::runtime {

struct Calibration;  // rlx/runtime/calibration.hpp

enum class Device : std::uint8_t { Cpu, Cuda, Rocm, Metal, Mlx, Gpu, Vulkan, CoreMl, Tpu };
std::string_view device_label(Device d);     // "cpu", "cuda", ...
Device parse_device(std::string_view name);  // aliases nvidia->cuda, wgpu->gpu; throws rlx::Error

// The GPU this process runs the CUDA backend on, as cudaSetDevice and torch.cuda.set_device choose it: 0 until
// set. One process drives one GPU, and rlx::distributed::init() with the nccl engine sets it to its rank's GPU
// (LOCAL_RANK), so each rank's graphs run where its collectives do. The backend claims the GPU when it starts
// (claim_gpu); setting another one after that throws rlx::Error naming both, as does a negative ordinal.
void set_gpu(int ordinal);
int gpu();
int claim_gpu();  // what a backend calls as it starts: gpu(), fixed from now on

// What an executable offers beyond set_param and run. Each method below has a
// bit; a method whose bit is false throws rlx::Error naming the method, the
// backend and the bit (never a silent no-op). gpu_handles only describes where
// handles live. Confirm after compile: advisory_capabilities is only typical.
struct ExecutableCapabilities {
  bool clone = false;                           // clone(): shares params, owns its arena
  bool persistent_handles = false;              // bind_handle / read_handle
  bool gpu_handles = false;                     // handles live in device memory (no staging per run)
  bool kv_resident = false;                     // feed_handle: an output written back into a handle after each run
  bool typed_io = false;                        // set_param_typed / run_typed: values in another dtype, converted
  bool async_pipeline = false;                  // commit_no_wait / sync_pending / run_pipelined
  bool active_extent = false;                   // share_params_from, so CompiledGraph::set_active_extent
  bool read_outputs = false;                    // run_read_outputs: only the outputs asked for come back
  bool rng = false;                             // set_rng / rng
  bool copy_params = false;                     // copy_params_from
  bool kernel_times = false;                    // set_profiling / kernel_times: each kernel's time in the last run
  bool shared_params = false;                   // share_param reads the caller's memory in place (else it copies)
  bool handle_addresses = false;                // handle_address: a bound handle's CUDA device address
  std::vector<std::string_view> names() const;  // the bits that are set, in declaration order
  static const std::vector<std::string_view>& all_names();
  bool has(std::string_view name) const;  // by name; throws rlx::Error on an unknown name
  bool operator==(const ExecutableCapabilities&) const = default;
};

// Where a bound handle lives in a GPU's memory (ExecutableGraph::handle_address): a CUDA device address in the
// primary context of GPU `gpu`, `bytes` long.
struct DeviceAddress {
  void* data = nullptr;
  std::size_t bytes = 0;
  int gpu = -1;
};

// The run-time seed of a graph's random ops. seed 0 keeps the seeds written in
// the graph; otherwise a random op with seed s draws from effective_seed(s, rng),
// so one compiled graph yields fresh samples (e.g. dropout masks) per step.
struct RngOptions {
  std::uint64_t seed = 0;
  bool operator==(const RngOptions&) const = default;
};
std::uint64_t effective_seed(std::uint64_t graph_seed, const RngOptions& rng);

// One LIR kernel's time in a run (kernel_times). A GPU backend reports the
// device's time (timestamps); the CPU backend, wall time; `host` marks a
// kernel a device backend ran on the host instead.
struct KernelTime {
  std::string kernel;  // the LIR kernel's name, "k3_matmul: matmul+add"
  double micros = 0;
  bool host = false;
};

// A compiled graph on one backend. Inputs and outputs are in LIR order
// (LirModule::inputs / outputs); CompiledGraph maps names and checks them.
class ExecutableGraph {
 public:
  virtual ~ExecutableGraph() = default;
  // Writes a param (already checked against the LIR buffer's dtype and shape).
  virtual void set_param(std::size_t param_index, const void* data, std::size_t nbytes) = 0;
  // Like set_param, but the executable may read `data` in place for as long as it lives, holding
  // `owner` (a model file's mapping) to keep it valid: weights shared by every graph compiled from
  // one file, and never copied. The default copies (shared_params says which one happens).
  virtual void share_param(std::size_t param_index, const void* data, std::size_t nbytes,
                           const std::shared_ptr<const void>& /*owner: a copy needs no owner*/) {
    set_param(param_index, data, nbytes);
  }
  // Runs once. `inputs[i]` points at LIR input i's bytes; `outputs[j]` at a
  // caller-owned buffer of LIR output j's size. Must not allocate.
  virtual void run(std::span<const void* const> inputs, std::span<void* const> outputs) = 0;
  // A copy that shares params (weights) but owns its arena, so that clones
  // can run concurrently from different threads.
  virtual std::unique_ptr<ExecutableGraph> clone() const = 0;

  // ---- optional surface: each default throws naming the capability bit ----
  virtual ExecutableCapabilities capabilities() const { return {}; }
  // typed_io: `value` has the param's shape in any dtype; converted to the declared one.
  virtual void set_param_typed(std::size_t param_index, const ir::TensorView& value);
  // typed_io: inputs in LIR order with their shapes, in any dtype; outputs in their declared dtypes.
  virtual std::vector<ir::Tensor> run_typed(std::span<const ir::TensorView> inputs);
  // read_outputs: like run, but only outputs[j] != nullptr are written back.
  virtual void run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs);
  // async_pipeline: starts a run and returns; the pointers must stay valid and
  // untouched until sync_pending, which waits and rethrows the run's error.
  // Any other call while a run is pending throws.
  virtual void commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs);
  virtual void sync_pending();
  // async_pipeline: runs input set k into output set k, overlapping where the backend can.
  virtual void run_pipelined(std::span<const std::vector<const void*>> inputs,
                             std::span<const std::vector<void*>> outputs);
  // persistent_handles: input `input_index` is read from a buffer the executable
  // keeps between runs (a KV cache, a state); run ignores inputs[input_index].
  virtual void bind_handle(std::size_t input_index, const void* data, std::size_t nbytes);
  virtual void read_handle(std::size_t input_index, void* dst, std::size_t nbytes) const;
  // persistent_handles: binds this executable's handle of input `input_index` (`nbytes` bytes) to the same input
  // of `dst`, the graph compiled at another extent (CompiledGraph::set_active_extent moves handles with it). The
  // default goes through the host (read_handle, then dst.bind_handle); a backend copies in device memory, or
  // shares an immutable value, where it can.
  virtual void copy_handle_to(std::size_t input_index, ExecutableGraph& dst, std::size_t nbytes) const;
  // kv_resident: after every run, output `output_index` is copied into the
  // bound handle of `input_index` (same dtype and shape), without a host round trip.
  virtual void feed_handle(std::size_t input_index, std::size_t output_index);
  // handle_addresses: where the bound handle of input `input_index` lives, for libraries that take device
  // addresses (rlx::distributed's collectives on Memory::Device: an all-reduce of a handle in place, with no copy
  // through the host). Waits for the last run first. The address is the executable's for its lifetime; later runs
  // read whatever was written there.
  virtual DeviceAddress handle_address(std::size_t input_index) const;
  // active_extent: from now on this executable reads every param from `src`'s storage, without a copy, so that
  // a write through either is seen by both. `src` is an executable of the same backend whose params have the
  // same number, dtypes and shapes: the graph compiled at another extent of a symbolic dim.
  // CompiledGraph::set_active_extent builds its per-extent variants on it.
  virtual void share_params_from(const ExecutableGraph& src);
  // rng: see RngOptions.
  virtual void set_rng(const RngOptions& rng);
  virtual RngOptions rng() const;
  // kernel_times: with profiling on (a backend may always be on), each run
  // records every kernel's time; kernel_times() returns the last run's, in
  // LIR kernel order (empty before the first run).
  virtual void set_profiling(bool on);
  virtual std::vector<KernelTime> kernel_times() const;
  // copy_params: takes every param's value from `src`, an executable of the
  // same backend compiled from the same graph.
  virtual void copy_params_from(const ExecutableGraph& src);

  // The backend's name in errors; Backend::compile and Session set it.
  const std::string& backend_name() const { return backend_name_; }
  void set_backend_name(std::string name) { backend_name_ = std::move(name); }

 protected:
  // Throws: "<method>: backend '<name>' does not offer it (capability '<bit>' is false)".
  [[noreturn]] void not_offered(std::string_view method, std::string_view bit) const;

 private:
  std::string backend_name_ = "unnamed";
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual compile::BackendTraits traits() const = 0;
  // Empty when available; otherwise the reason it is not.
  virtual std::string unavailable_reason() const { return {}; }
  virtual std::unique_ptr<ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                       const compile::CompileOptions& options) = 0;
  // Which device of its kind this backend drives ("llvmpipe (LLVM 15, 256 bits)"):
  // names its calibration cache. Defaults to the backend's name.
  virtual std::string device_name() const { return std::string(name()); }
  // Figures for the cost model (calibration.hpp), measured now; calibration_for caches them. By default three
  // small graphs timed through run() (measure_calibration); a backend with device timers overrides it to time
  // large kernels on the device itself, where a small graph's host I/O would hide its speed.
  virtual Calibration calibrate();

  // The shared pipeline against traits(), then compile_lir.
  struct Compiled {
    std::shared_ptr<compile::CompileResult> result;
    std::unique_ptr<ExecutableGraph> exe;
  };
  Compiled compile(const ir::Graph& graph, const compile::CompileOptions& options = {});
  // compile's second half: an executable of a result compile() made before (for this backend, with `options`).
  std::unique_ptr<ExecutableGraph> executable(const compile::CompileResult& result,
                                              const compile::CompileOptions& options);
  // Ops a graph may use here: every op whose dispatch tier is not unsupported.
  std::set<ir::OpKind> supported_ops() const;
};

// A backend built without its dependencies: named, with `traits` (what it would claim), unavailable for
// `why`; compile_lir throws "device '<name>' is unavailable: <why>". Registered in their place so that
// device listings and errors say why.
std::unique_ptr<Backend> make_unavailable_backend(std::string name, compile::BackendTraits traits, std::string why);

using BackendFactory = std::function<std::unique_ptr<Backend>()>;
// Registers (or replaces) the backend for a device.
void register_backend(Device device, BackendFactory factory);
// The backend for `device`; throws rlx::Error saying why it is unavailable.
std::unique_ptr<Backend> make_backend(Device device);
bool is_available(Device device);
// The backend registered for `device`, available or not (an unavailable one still declares the traits it would
// claim); nullptr when none is. For what describes the build rather than the machine: docs/op-coverage.md.
std::unique_ptr<Backend> registered_backend(Device device);
// Devices with a registered backend (available or not).
std::vector<Device> registered_devices();
inline constexpr Device kAllDevices[] = {Device::Cpu, Device::Cuda,   Device::Rocm,   Device::Metal, Device::Mlx,
                                         Device::Gpu, Device::Vulkan, Device::CoreMl, Device::Tpu};

// The tier `op` takes on a backend with `traits`, as the pipeline decides it
// (docs/op-coverage.md and the dispatch report both use this).
compile::DispatchTier dispatch_tier(ir::OpKind op, const compile::BackendTraits& traits);
// The tier of every op of `hir` and why, in HIR node order: the compile's own
// entries (composites, custom ops) plus one per primitive, including dtype
// rewrites around ops the backend computes in f32 or does not compute natively.
using KernelDispatchReport = compile::DispatchReport;
KernelDispatchReport kernel_dispatch_report(const compile::CompileResult& result, const compile::BackendTraits& traits);
// Capability bits typical of a device's backend, before anything is compiled.
ExecutableCapabilities advisory_capabilities(Device device);

// docs/op-coverage.md, generated from the registered backends' traits (available
// here or not, so the file depends on the build only): each op's dispatch tier
// per backend. A test fails when the checked-in file drifts.
std::string op_coverage_markdown();

}  // namespace rlx::runtime
