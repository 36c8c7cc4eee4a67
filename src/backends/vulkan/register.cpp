// Registers the Vulkan backend at load time. Built without the Vulkan headers
// or shaderc, the backend still registers, as unavailable with that reason.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "backends/vulkan/spirv.hpp"
#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::vulkan {

namespace {
std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

std::size_t pick_device(std::span<const DeviceInfo> devices, std::string_view request) {
  auto listing = [&] {
    std::string s;
    for (const auto& d : devices)
      s += fmt::format("{}{} '{}' ({}{})", s.empty() ? "" : ", ", d.index, d.name, d.type,
                       d.usable ? "" : ", " + d.why_not);
    return s.empty() ? std::string("none") : s;
  };
  if (!request.empty()) {
    std::string req(request);
    bool numeric =
        std::all_of(req.begin(), req.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    for (std::size_t i = 0; i < devices.size(); ++i) {
      bool match = numeric ? std::to_string(devices[i].index) == req
                           : lower(devices[i].name).find(lower(req)) != std::string::npos;
      if (!match) continue;
      if (!devices[i].usable)
        throw Error(fmt::format("RLX_VULKAN_DEVICE='{}' selects device {} '{}', which RLX cannot use: it {}", req,
                                devices[i].index, devices[i].name, devices[i].why_not));
      return i;
    }
    throw Error(fmt::format("RLX_VULKAN_DEVICE='{}' matches no Vulkan device (devices: {})", req, listing()));
  }
  static constexpr std::string_view kOrder[] = {"discrete", "integrated", "virtual", "other", "cpu"};
  for (auto type : kOrder)
    for (std::size_t i = 0; i < devices.size(); ++i)
      if (devices[i].usable && devices[i].type == type) return i;
  throw Error(devices.empty()
                  ? std::string("no Vulkan device found (is a driver such as mesa-vulkan-drivers installed?)")
                  : "no usable Vulkan device (devices: " + listing() + ")");
}

#ifndef RLX_HAVE_VULKAN
namespace {
constexpr const char* kNotBuilt =
    "built without Vulkan support (RLX_VULKAN=OFF, or no Vulkan headers or shaderc at build time)";
}  // namespace

std::unique_ptr<runtime::Backend> make_vulkan_backend() {
  compile::BackendTraits t;
  t.name = "vulkan";
  return runtime::make_unavailable_backend("vulkan", t, kNotBuilt);
}
std::string unavailable_reason() { return kNotBuilt; }
std::vector<DeviceInfo> list_devices() { return {}; }
DeviceInfo selected_device() { throw Error(std::string("vulkan: ") + kNotBuilt); }
SpirvCacheStats spirv_cache_stats() { return {}; }
void forget_compiled_shaders() {}
std::string spirv_cache_dir() { return {}; }
runtime::Calibration calibrate(bool) { throw Error(std::string("vulkan: ") + kNotBuilt); }
std::string calibration_path() { return {}; }
runtime::Calibration measure_device() { throw Error(std::string("vulkan: ") + kNotBuilt); }
std::vector<KernelTime> last_run_times(const runtime::ExecutableGraph&) {
  throw Error(std::string("vulkan: ") + kNotBuilt);
}
double copy_bandwidth_gbps(std::uint64_t, int) { throw Error(std::string("vulkan: ") + kNotBuilt); }
#endif

namespace {
[[maybe_unused]] const bool registered =
    (runtime::register_backend(runtime::Device::Vulkan, [] { return make_vulkan_backend(); }), true);
}  // namespace

}  // namespace rlx::backends::vulkan
