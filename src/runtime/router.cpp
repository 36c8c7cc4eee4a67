#include "rlx/runtime/router.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "rlx/error.hpp"

namespace rlx::runtime {

namespace {
double read_number(const std::filesystem::path& p) {
  std::ifstream f(p);
  double v = 0;
  return f >> v ? v : 0;
}
}  // namespace

HwSnapshot HwSnapshot::current() {
  namespace fs = std::filesystem;
  HwSnapshot s;
  double cur = 0, max = 0;
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const auto name = e.path().filename().string();
    if (!name.starts_with("cpu") || name.size() < 4 || !std::isdigit(static_cast<unsigned char>(name[3]))) continue;
    const double c = read_number(e.path() / "cpufreq" / "scaling_cur_freq"),
                 m = read_number(e.path() / "cpufreq" / "cpuinfo_max_freq");
    if (c <= 0 || m <= 0) continue;
    cur += c / 1000, max += m / 1000, ++n;  // kHz
  }
  if (n) return {cur / n, max / n, "/sys/devices/system/cpu/*/cpufreq"};
  // Virtual machines often hide cpufreq: the current clock alone says nothing about throttling.
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.starts_with("cpu MHz")) {
      cur += std::atof(line.substr(line.find(':') + 1).c_str());
      ++n;
    }
  return {n ? cur / n : 0, 0, n ? "/proc/cpuinfo" : "none"};
}

std::string HwSnapshot::describe() const {
  if (max_mhz <= 0)
    return fmt::format("cpu clock {:.0f} MHz, maximum unknown, from {}: throttling cannot be judged", cur_mhz, source);
  return fmt::format("cpu clock {:.0f} MHz of {:.0f} MHz max ({:.0f}%) from {}{}", cur_mhz, max_mhz,
                     100 * cur_mhz / max_mhz, source, is_throttled() ? ": throttled" : "");
}

DeviceRouter::DeviceRouter(ir::Graph graph, DevicePolicy policy, compile::CompileOptions options)
    : devices_(std::move(graph), std::move(policy), std::move(options)) {
  warmed_ = devices_.warm_all();
  if (warmed_.empty()) {
    std::string why;
    for (const auto& [d, e] : devices_.failures()) why += fmt::format("; {}: {}", device_label(d), e);
    throw Error(fmt::format("DeviceRouter: no device compiled graph '{}' (policy: {}){}", devices_.graph().name(),
                            devices_.policy().describe(), why.empty() ? "; no device is viable" : why));
  }
}

void DeviceRouter::set_rebench_on_throttle(bool on, std::chrono::milliseconds check_every) {
  rebench_on_throttle_ = on;
  check_every_ = check_every;
  last_check_ = {};
  if (on) last_throttled_ = snapshot_().is_throttled();
}

void DeviceRouter::maybe_rebench(std::span<const NamedTensor> inputs) {
  if (!rebench_on_throttle_) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_check_ != std::chrono::steady_clock::time_point{} && now - last_check_ < check_every_) return;
  last_check_ = now;
  const auto snap = snapshot_();
  if (snap.is_throttled() == last_throttled_) return;
  last_throttled_ = snap.is_throttled();
  const int runs = std::max(devices_.policy().strategy().runs, 3);
  devices_.benchmark(inputs, runs);
  if (auto w = devices_.benchmark_winner()) pick_ = w;
  ++rebenchmarks_;
  rebench_reason_ = fmt::format("{} -> benchmarked {} runs per device, picked {}", snap.describe(), runs,
                                pick_ ? device_label(*pick_) : "none");
}

std::pair<Device, std::vector<ir::Tensor>> DeviceRouter::run(std::span<const NamedTensor> inputs,
                                                             std::optional<Device> hint) {
  maybe_rebench(inputs);
  if (hint) return {*hint, devices_.run(*hint, inputs)};
  if (!pick_) {
    if (devices_.policy().strategy().kind == DevicePickStrategy::Kind::Benchmark && !devices_.benchmark_winner())
      devices_.benchmark(inputs, devices_.policy().strategy().runs);
    pick_ = devices_.resolve();
  }
  return {*pick_, devices_.run(*pick_, inputs)};
}

}  // namespace rlx::runtime
