#pragma once
// The Vulkan compute backend ("vulkan", Device::Vulkan). It registers itself
// when librlx loads; when this RLX was built without Vulkan, or the machine has
// no loader or no usable device, make_backend(Device::Vulkan) throws with the
// reason. This header is for code that wants more than the Backend interface:
// device listing and selection, the SPIR-V cache, calibration and per-kernel
// timings. See docs/backends/vulkan.md.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/runtime/backend.hpp"
#include "rlx/runtime/calibration.hpp"

namespace rlx::backends::vulkan {

std::unique_ptr<runtime::Backend> make_vulkan_backend();
// Empty when the backend can run here; otherwise why not.
std::string unavailable_reason();

// A physical device as the loader lists it.
struct DeviceInfo {
  std::uint32_t index = 0;  // in the loader's order
  std::string name;
  std::string type;         // "discrete", "integrated", "virtual", "cpu", "other"
  std::string api_version;  // "1.3.230"
  bool usable = false;      // has what RLX needs (Vulkan 1.2, 8/16-bit storage, int64...)
  std::string why_not;      // when not usable
};
// All devices (empty when there is no loader or no device).
std::vector<DeviceInfo> list_devices();
// The selection rule: `request` (RLX_VULKAN_DEVICE) is an index or a
// case-insensitive name substring; empty picks the first usable device of the
// best type: discrete, integrated, virtual, other, cpu. Throws rlx::Error
// naming the request and the devices when nothing fits.
std::size_t pick_device(std::span<const DeviceInfo> devices, std::string_view request);
// The device the backend runs on (throws when unavailable).
DeviceInfo selected_device();

// The on-disk SPIR-V cache (<cache>/vulkan-spirv/<hash>.spv): counts since the
// process started. A hit is a shader whose SPIR-V came from disk or memory.
struct SpirvCacheStats {
  std::uint64_t compiled = 0;  // compiled with shaderc
  std::uint64_t disk_hits = 0;
  std::uint64_t memory_hits = 0;
};
SpirvCacheStats spirv_cache_stats();
std::string spirv_cache_dir();

// One-time device measurements (f32 GEMM GFLOP/s and bandwidth from GPU
// timestamps, a tiny graph's round trip from the wall clock), kept in the
// runtime's calibration cache, <cache>/vulkan-calib-<device>.json, where the
// cost model (rlx/runtime/calibration.hpp) reads them. A missing, corrupt or
// stale file is measured again (about a second), never trusted; `force`
// always measures.
runtime::Calibration calibrate(bool force = false);
std::string calibration_path();
// The measurements alone, uncached: what the backend's Backend::calibrate() returns.
runtime::Calibration measure_device();

// Device-to-device copy bandwidth (vkCmdCopyBuffer of `bytes` between two
// device-local buffers, GPU-timed, best of `reps`), counting bytes read plus
// written, in GB/s: the device's practical memory ceiling.
double copy_bandwidth_gbps(std::uint64_t bytes, int reps = 5);

// GPU time of each kernel in an executable's last run, from timestamp queries
// (kernels that ran on the host report their wall time): the executable's
// kernel_times(), for code that holds a Vulkan executable.
using runtime::KernelTime;
std::vector<KernelTime> last_run_times(const runtime::ExecutableGraph& exe);

}  // namespace rlx::backends::vulkan
