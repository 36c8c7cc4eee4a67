#ifdef RLX_HAVE_VULKAN
// One-time device measurements for the cost model. GEMM and bandwidth are
// timed with GPU timestamps (kernel time only); the round trip is wall-clock
// time for a one-element graph, staging and fences included.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "backends/vulkan/context.hpp"
#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::vulkan {

double copy_bandwidth_gbps(std::uint64_t bytes, int reps) {
  auto ctx = Context::get();
  Context& c = *ctx;
  if (!c.caps.timestamps) throw Error("vulkan: '" + c.info.name + "' has no timestamps on its compute queue");
  GpuBuffer src(c, bytes, false, "a bandwidth probe"), dst(c, bytes, false, "a bandwidth probe");
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = 2;
  VkQueryPool qp = VK_NULL_HANDLE;
  c.check(c.vk.vkCreateQueryPool(c.device, &qi, nullptr, &qp), "vkCreateQueryPool");
  double best = INFINITY;
  for (int r = 0; r < reps; ++r) {
    c.run_once(
        [&](VkCommandBuffer cb) {
          c.vk.vkCmdResetQueryPool(cb, qp, 0, 2);
          c.vk.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
          VkBufferCopy region{0, 0, bytes};
          c.vk.vkCmdCopyBuffer(cb, src.get(), dst.get(), 1, &region);
          c.vk.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
        },
        "timing a copy");
    std::uint64_t ts[2];
    c.check(c.vk.vkGetQueryPoolResults(c.device, qp, 0, 2, sizeof ts, ts, 8,
                                       VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
            "vkGetQueryPoolResults");
    best = std::min(best, double(ts[1] - ts[0]) * c.caps.timestamp_period_ns * 1e-9);
  }
  c.vk.vkDestroyQueryPool(c.device, qp, nullptr);
  return 2.0 * double(bytes) / best * 1e-9;
}

std::string calibration_path() { return runtime::calibration_path("vulkan", Context::get()->info.name).string(); }

runtime::Calibration calibrate(bool force) {
  const std::string device = Context::get()->info.name;
  const auto path = runtime::calibration_path("vulkan", device);
  std::string why = "forced";
  if (!force) {
    auto c = runtime::load_calibration(path, &why);
    if (c && c->backend == "vulkan" && c->device == device) return *c;
    if (c) why = "the file describes another device";
  }
  runtime::Calibration c = measure_device();
  c.source = "measured (" + why + ")";
  try {
    runtime::save_calibration(c, path);
  } catch (const Error& e) {
    c.source += "; not saved: " + std::string(e.what());
  }
  return c;
}

runtime::Calibration measure_device() {
  auto ctx = Context::get();
  const std::string device = ctx->info.name;
  const bool cpu_device = ctx->info.type == "cpu";
  runtime::Calibration c;
  c.backend = "vulkan";
  c.device = device;
  auto backend = make_vulkan_backend();
  // f32 GEMM through RLX's own matmul kernel, timed by GPU timestamps; then a copy's bandwidth and the round trip
  // (upload, one dispatch, fence, download).
  c.sgemm_gflops = runtime::measure_sgemm_gflops(*backend, cpu_device ? 512 : 4096, 3);
  c.memory_bw_gbps = copy_bandwidth_gbps(cpu_device ? (std::uint64_t(16) << 20) : (std::uint64_t(1) << 30), 3);
  c.roundtrip_overhead_ns = runtime::measure_roundtrip_ns(*backend, 50);
  c.measured_at =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  c.source = "measured";
  return c;
}

}  // namespace rlx::backends::vulkan
#endif
