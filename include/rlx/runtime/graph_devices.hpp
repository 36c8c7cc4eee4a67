#pragma once
// Picking and switching backends for one graph (docs/backend-selection.md).
//
//   Device d = fastest_device_for(g);                       // cost model + calibration caches
//   Device d = resolve_device(g, std::nullopt, policy);     // hint -> RLX_DEVICE -> pick
//   GraphDevices runner(g, policy);                         // lazy per-device compile cache
//   runner.set_param("w", w);                               // mirrored to every device
//   auto out = runner.run(Device::Cpu, inputs);
//   auto [device, out] = runner.run_chain(std::nullopt, inputs);   // RLX_DEVICE_CHAIN or best first
//
// Every pick explains itself: device_report(g, policy) lists each device with
// what blocks it, its cost estimate and why the recommended one won.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/policy.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::runtime {

// Registered devices whose backend is available here.
std::vector<Device> available_devices();
// Available devices that can run every op of `graph` (no policy applied).
std::vector<Device> devices_for(const ir::Graph& graph);

struct DeviceCandidate {
  Device device = Device::Cpu;
  std::string label;
  bool available = false;
  std::string unavailable_reason;         // why not, when !available
  std::string policy_block;               // why the policy excludes it; empty when allowed
  std::vector<std::string> blockers;      // ops it cannot run: "fft (%3): unsupported on vulkan"
  std::vector<std::string> capabilities;  // advisory_capabilities(device), by name
  std::optional<CostEstimate> estimate;   // for viable devices
  std::string calibration_source;         // where the estimate's figures came from
  bool recommended = false;
  std::string why;  // one line: blocked by what, or where it ranks and why
  bool viable() const { return available && policy_block.empty() && blockers.empty(); }
};

struct DeviceReport {
  std::string graph;
  std::string policy;                       // DevicePolicy::describe()
  std::vector<DeviceCandidate> candidates;  // viable ones best first, then the others in Device order
  std::optional<Device> recommended;
  std::string why;              // why that one, or why none
  std::string to_text() const;  // a table, as `rlx devices` prints it
};

// The cost-model view of `graph` on every device. `bind` binds symbolic dims.
DeviceReport device_report(const ir::Graph& graph, const DevicePolicy& policy = DevicePolicy::all(),
                           const std::vector<std::pair<std::string, std::int64_t>>& bind = {});
// The cost-model winner; throws rlx::Error (with the report's reasons) when no device is viable.
Device fastest_device_for(const ir::Graph& graph, const DevicePolicy& policy = DevicePolicy::all());
// The hint, else the policy's default device, else RLX_DEVICE, else the cost-model
// winner. A hint the policy blocks or that cannot run the graph throws rlx::Error saying why.
Device resolve_device(const ir::Graph& graph, std::optional<Device> hint, const DevicePolicy& policy);

struct DeviceBenchResult {
  Device device = Device::Cpu;
  std::string label;
  int runs = 0;
  double median_ms = 0, min_ms = 0;
  bool ok = false;
  std::string error;  // why it could not be measured, when !ok
};

// One graph, a lazy per-device compile cache, and params mirrored to every
// cached executable (and to those compiled later).
class GraphDevices {
 public:
  explicit GraphDevices(ir::Graph graph, DevicePolicy policy = DevicePolicy::all(),
                        compile::CompileOptions options = {});
  static GraphDevices with_policy(ir::Graph graph, DevicePolicy policy) {
    return GraphDevices(std::move(graph), std::move(policy));
  }
  GraphDevices(const GraphDevices&) = delete;  // compiled graphs are not copied; clone them
  GraphDevices& operator=(const GraphDevices&) = delete;
  GraphDevices(GraphDevices&&) noexcept = default;
  GraphDevices& operator=(GraphDevices&&) noexcept = default;

  // Checked against the graph's param (name, dtype, shape), then set on every cached device.
  void set_param(std::string_view name, const ir::Tensor& value);
  // The value may have another dtype: converted by the backend where it offers
  // typed_io, on the host otherwise.
  void set_param_typed(std::string_view name, const ir::Tensor& value);
  // Pushes the mirrored params to every cached device again (after direct changes to one).
  void sync_params_to_all();

  std::vector<Device> devices() const;  // viable under the policy, best estimate first
  DeviceReport report() const;
  Device fastest() const;  // the cost-model winner; compiles nothing
  // hint -> policy default -> RLX_DEVICE -> benchmark winner (when the policy
  // benchmarks and one was measured) -> cost model.
  Device resolve(std::optional<Device> hint = std::nullopt) const;
  CompiledGraph& compile(Device device);  // cached; throws rlx::Error naming the device and why

  std::vector<ir::Tensor> run(Device device, std::span<const NamedTensor> inputs);
  // resolve(hint); with a benchmark policy and nothing measured yet, benchmarks with these inputs first.
  std::vector<ir::Tensor> run_resolved_with_inputs(std::optional<Device> hint, std::span<const NamedTensor> inputs);
  // The chain (else the policy's, else RLX_DEVICE_CHAIN, else devices()) through run_try.
  std::pair<Device, std::vector<ir::Tensor>> run_chain(std::optional<std::vector<Device>> chain,
                                                       std::span<const NamedTensor> inputs);
  // The first device in `order` that compiles and runs; throws rlx::Error listing each failure.
  std::pair<Device, std::vector<ir::Tensor>> run_try(std::span<const Device> order,
                                                     std::span<const NamedTensor> inputs);
  // What failed in the last run_try/run_chain/warm_all, in order: (device, error).
  const std::vector<std::pair<Device, std::string>>& failures() const { return failures_; }

  // Compiles every viable device; returns those that compiled (failures()).
  std::vector<Device> warm_all();
  // Times `runs` runs (after one warm-up) on every viable device; remembers the winner.
  std::vector<DeviceBenchResult> benchmark(std::span<const NamedTensor> inputs, int runs);
  std::optional<Device> benchmark_winner() const { return bench_winner_; }
  void invalidate_cache();

  const ir::Graph& graph() const { return graph_; }
  const DevicePolicy& policy() const { return policy_; }
  std::vector<Device> cached_devices() const;

 private:
  struct Param {
    ir::Tensor value;
    bool typed = false;
  };
  void push(CompiledGraph& c, const std::string& name, const Param& p) const;
  const ir::Node& param_node(std::string_view name) const;

  ir::Graph graph_;
  DevicePolicy policy_;
  compile::CompileOptions options_;
  std::map<Device, CompiledGraph> cache_;
  std::map<std::string, Param, std::less<>> params_;
  std::optional<Device> bench_winner_;
  std::vector<std::pair<Device, std::string>> failures_;
};

// Like Session, with the device chosen per compile by a policy and a hint.
class FlexibleSession {
 public:
  explicit FlexibleSession(DevicePolicy policy = DevicePolicy::all()) : policy_(std::move(policy)) {}
  static FlexibleSession from_env() { return FlexibleSession(DevicePolicy::from_env()); }
  Device resolve(const ir::Graph& graph, std::optional<Device> hint = std::nullopt) const {
    return resolve_device(graph, hint, policy_);
  }
  CompiledGraph compile_resolved(const ir::Graph& graph, std::optional<Device> hint = std::nullopt,
                                 const compile::CompileOptions& options = {}) const;
  // On `device`, which the policy must allow.
  CompiledGraph compile_on(const ir::Graph& graph, Device device, const compile::CompileOptions& options = {}) const;
  const DevicePolicy& policy() const { return policy_; }

 private:
  DevicePolicy policy_;
};

// What is built in and what runs here, for deploy checks (`rlx devices`, pyrlx.backends_manifest()).
struct BackendsManifest {
  struct Entry {
    Device device = Device::Cpu;
    std::string label;
    bool built_in = false;  // a backend is registered for it
    bool available = false;
    std::string reason;   // why unavailable
    std::string backend;  // the backend's name, when available
    std::string device_name;
    std::vector<std::string> advisory_capabilities;
  };
  std::vector<Entry> backends;  // every Device value, in order
  static BackendsManifest current();
  std::string to_json() const;
  std::string to_text() const;
};

}  // namespace rlx::runtime
