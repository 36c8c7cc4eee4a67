#pragma once
// DeviceRouter: the serving wrapper over GraphDevices. Every viable device is
// compiled at construction (no first-request compile on any device); runs go
// to the picked device, with run_chain as the fallback path; optionally, a
// hardware snapshot that shows throttling (or that it ended) triggers a new
// benchmark and possibly a new pick.
#include <chrono>
#include <functional>

#include "rlx/runtime/graph_devices.hpp"

namespace rlx::runtime {

// The CPU's clock now: the mean current and maximum frequency over its cores,
// from /sys/devices/system/cpu/cpu*/cpufreq, else /proc/cpuinfo (current only).
struct HwSnapshot {
  double cur_mhz = 0;
  double max_mhz = 0;  // 0: unknown, so never throttled
  std::string source;
  // Current clock below 85% of the maximum.
  bool is_throttled() const { return max_mhz > 0 && cur_mhz > 0 && cur_mhz < 0.85 * max_mhz; }
  std::string describe() const;
  static HwSnapshot current();
};

class DeviceRouter {
 public:
  // Compiles every viable device now; throws rlx::Error when none compiles.
  explicit DeviceRouter(ir::Graph graph, DevicePolicy policy = DevicePolicy::all(),
                        compile::CompileOptions options = {});
  static DeviceRouter from_env(ir::Graph graph) { return DeviceRouter(std::move(graph), DevicePolicy::from_env()); }

  void set_param(std::string_view name, const ir::Tensor& value) { devices_.set_param(name, value); }
  void set_param_typed(std::string_view name, const ir::Tensor& value) { devices_.set_param_typed(name, value); }

  // When on, run() takes a snapshot at most every `check_every` and
  // re-benchmarks whenever its throttled state differs from the last one seen.
  void set_rebench_on_throttle(bool on, std::chrono::milliseconds check_every = std::chrono::seconds(1));
  // Where snapshots come from (HwSnapshot::current by default); tests inject their own.
  void set_snapshot_source(std::function<HwSnapshot()> source) { snapshot_ = std::move(source); }

  // On the hint, else the current pick (resolved on the first run, with these
  // inputs when the policy benchmarks).
  std::pair<Device, std::vector<ir::Tensor>> run(std::span<const NamedTensor> inputs,
                                                 std::optional<Device> hint = std::nullopt);
  std::pair<Device, std::vector<ir::Tensor>> run_chain(std::span<const NamedTensor> inputs) {
    return devices_.run_chain(std::nullopt, inputs);
  }
  std::vector<ir::Tensor> run_on(Device device, std::span<const NamedTensor> inputs) {
    return devices_.run(device, inputs);
  }

  std::optional<Device> current() const { return pick_; }
  int rebenchmarks() const { return rebenchmarks_; }
  const std::string& last_rebench_reason() const { return rebench_reason_; }
  GraphDevices& devices() { return devices_; }
  const std::vector<Device>& warmed() const { return warmed_; }

 private:
  void maybe_rebench(std::span<const NamedTensor> inputs);

  GraphDevices devices_;
  std::vector<Device> warmed_;
  std::optional<Device> pick_;
  bool rebench_on_throttle_ = false;
  std::chrono::milliseconds check_every_{1000};
  std::chrono::steady_clock::time_point last_check_{};
  bool last_throttled_ = false;
  std::function<HwSnapshot()> snapshot_ = &HwSnapshot::current;
  int rebenchmarks_ = 0;
  std::string rebench_reason_;
};

}  // namespace rlx::runtime
