#include "rlx/runtime/policy.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::runtime {

DevicePickStrategy DevicePickStrategy::benchmark(int runs) {
  if (runs <= 0) throw Error(fmt::format("with_benchmark_pick: runs must be positive, got {}", runs));
  return {Kind::Benchmark, runs};
}

std::vector<Device> parse_device_list(std::span<const std::string> names, std::string_view what) {
  std::vector<Device> out;
  for (const auto& n : names) {
    try {
      auto d = parse_device(n);
      if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", what, e.what()));
    }
  }
  return out;
}

std::string device_list_str(std::span<const Device> devices) {
  std::string s;
  for (auto d : devices) s += (s.empty() ? "" : ",") + std::string(device_label(d));
  return s.empty() ? "-" : s;
}

DevicePolicy DevicePolicy::only(std::vector<Device> devices) {
  DevicePolicy p;
  p.allow_ = std::move(devices);
  return p;
}

DevicePolicy DevicePolicy::with_deny(const std::vector<Device>& devices) const {
  auto p = *this;
  for (auto d : devices)
    if (std::find(p.deny_.begin(), p.deny_.end(), d) == p.deny_.end()) p.deny_.push_back(d);
  return p;
}

DevicePolicy DevicePolicy::with_prefer(std::vector<Device> devices) const {
  auto p = *this;
  p.prefer_ = std::move(devices);
  return p;
}

DevicePolicy DevicePolicy::with_benchmark_pick(int runs) const {
  auto p = *this;
  p.strategy_ = DevicePickStrategy::benchmark(runs);
  return p;
}

DevicePolicy DevicePolicy::with_default_device(std::optional<Device> device) const {
  auto p = *this;
  p.device_ = device;
  return p;
}

DevicePolicy DevicePolicy::with_chain(std::vector<Device> devices) const {
  auto p = *this;
  p.chain_ = std::move(devices);
  return p;
}

DevicePolicy DevicePolicy::from_env_key(std::string_view prefix) {
  auto var = [&](std::string_view name) { return std::string(prefix) + std::string(name.substr(3)); };
  auto list = [&](std::string_view name) { return parse_device_list(env::get_list(name, prefix), var(name)); };
  DevicePolicy p;
  p.source_ = std::string(prefix);
  if (env::get("RLX_DEVICES", prefix)) p.allow_ = list("RLX_DEVICES");
  p.deny_ = list("RLX_DENY_DEVICES");
  p.prefer_ = list("RLX_PREFER_DEVICES");
  p.chain_ = list("RLX_DEVICE_CHAIN");
  if (auto d = env::get("RLX_DEVICE", prefix)) p.device_ = parse_device_list(std::vector{*d}, var("RLX_DEVICE")).at(0);
  if (auto n = env::get_int("RLX_BENCHMARK_PICK", prefix)) {
    if (*n < 0)
      throw Error(fmt::format("environment variable {}={} must be a run count >= 0", var("RLX_BENCHMARK_PICK"), *n));
    if (*n > 0) p.strategy_ = DevicePickStrategy::benchmark(int(std::min<long long>(*n, 1 << 20)));
  }
  return p;
}

std::string DevicePolicy::blocked_reason(Device d) const {
  if (allow_ && std::find(allow_->begin(), allow_->end(), d) == allow_->end())
    return source_.empty() ? fmt::format("not in the policy's allow-list ({})", device_list_str(*allow_))
                           : fmt::format("not in {}_DEVICES ({})", source_, device_list_str(*allow_));
  if (std::find(deny_.begin(), deny_.end(), d) != deny_.end())
    return source_.empty() ? "denied by the policy" : fmt::format("denied by {}_DENY_DEVICES", source_);
  return {};
}

std::string DevicePolicy::describe() const {
  std::string s = fmt::format("allow {}; deny {}; prefer {}; pick {}", allow_ ? device_list_str(*allow_) : "all",
                              device_list_str(deny_), device_list_str(prefer_),
                              strategy_.kind == DevicePickStrategy::Kind::Benchmark
                                  ? fmt::format("benchmark ({} runs)", strategy_.runs)
                                  : std::string("cost model"));
  if (device_) s += fmt::format("; default {}", device_label(*device_));
  if (!chain_.empty()) s += fmt::format("; chain {}", device_list_str(chain_));
  if (!source_.empty()) s += fmt::format(" (from {}_*)", source_);
  return s;
}

}  // namespace rlx::runtime
