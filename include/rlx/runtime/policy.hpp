#pragma once
// Which devices a process may use, and how one is picked among them.
// A policy is a value: the with_* methods return a changed copy.
//
//   auto policy = DevicePolicy::only({Device::Cpu, Device::Vulkan}).with_prefer({Device::Vulkan});
//   auto policy = DevicePolicy::from_env();   // RLX_DEVICES, RLX_DENY_DEVICES, ...
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

// How a device is picked among the viable ones.
struct DevicePickStrategy {
  enum class Kind : std::uint8_t { CostModel, Benchmark };
  Kind kind = Kind::CostModel;
  int runs = 0;  // Benchmark: timed runs per candidate

  static DevicePickStrategy cost_model() { return {}; }
  static DevicePickStrategy benchmark(int runs);  // throws rlx::Error unless runs > 0
  bool operator==(const DevicePickStrategy&) const = default;
};

class DevicePolicy {
 public:
  // Every backend built in (the default).
  static DevicePolicy all() { return {}; }
  // Only these devices.
  static DevicePolicy only(std::vector<Device> devices);
  DevicePolicy with_deny(const std::vector<Device>& devices) const;
  // Tie-break order when cost estimates are within 10% of each other.
  DevicePolicy with_prefer(std::vector<Device> devices) const;
  // Pick by timing `runs` runs per candidate (needs inputs when resolving).
  DevicePolicy with_benchmark_pick(int runs) const;
  // The hint resolved runs use when the caller gives none.
  DevicePolicy with_default_device(std::optional<Device> device) const;
  // The fallback order of run_chain when the caller gives none.
  DevicePolicy with_chain(std::vector<Device> devices) const;

  // RLX_DEVICES, RLX_DENY_DEVICES, RLX_PREFER_DEVICES, RLX_BENCHMARK_PICK,
  // RLX_DEVICE and RLX_DEVICE_CHAIN. A malformed value throws rlx::Error
  // naming the variable.
  static DevicePolicy from_env() { return from_env_key("RLX"); }
  // The same variables under another prefix: from_env_key("MYAPP") reads MYAPP_DEVICES, ...
  static DevicePolicy from_env_key(std::string_view prefix);

  // Empty when `d` is allowed; otherwise why not ("not in RLX_DEVICES (cpu)").
  std::string blocked_reason(Device d) const;
  bool allows(Device d) const { return blocked_reason(d).empty(); }

  const std::optional<std::vector<Device>>& allowed() const { return allow_; }
  const std::vector<Device>& denied() const { return deny_; }
  const std::vector<Device>& preferred() const { return prefer_; }
  const DevicePickStrategy& strategy() const { return strategy_; }
  const std::optional<Device>& default_device() const { return device_; }
  const std::vector<Device>& chain() const { return chain_; }
  // One line: "allow cpu,vulkan; deny -; prefer vulkan; pick cost model (from RLX_*)".
  std::string describe() const;

  bool operator==(const DevicePolicy&) const = default;

 private:
  std::optional<std::vector<Device>> allow_;  // nullopt: all
  std::vector<Device> deny_, prefer_, chain_;
  std::optional<Device> device_;
  DevicePickStrategy strategy_;
  std::string source_;  // "RLX" or the prefix it was read from; empty when built in code
};

// "cpu,vulkan" -> {Cpu, Vulkan}; `what` names the source in errors (a variable, an argument).
std::vector<Device> parse_device_list(std::span<const std::string> names, std::string_view what);
std::string device_list_str(std::span<const Device> devices);  // "cpu,vulkan" or "-"

}  // namespace rlx::runtime
