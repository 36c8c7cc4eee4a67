#ifdef RLX_HAVE_CUDA
// The CUDA backend's figures for the cost model (runtime/calibration.hpp): the GEMM and the bandwidth timed on
// the device (events around the kernels), so that a graph's host I/O does not hide the device's speed; the
// round trip by the wall clock, host I/O included, since that is what every run pays.
#include "rlx/runtime/calibration.hpp"

#include <chrono>

#include "rlx/backends/cuda/cuda_backend.hpp"

namespace rlx::backends::cuda {

runtime::Calibration measure_device(runtime::Backend& backend) {
  runtime::Calibration c;
  c.backend = "cuda";
  c.device = backend.device_name();
  // f32 GEMM through RLX's own matmul (cuBLASLt, exact f32), the product left on the device.
  c.sgemm_gflops = runtime::measure_sgemm_gflops(backend, 4096, 3);
  c.memory_bw_gbps = copy_bandwidth_gbps(std::uint64_t(1) << 30, 3);
  c.roundtrip_overhead_ns = runtime::measure_roundtrip_ns(backend, 50);
  c.measured_at =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  c.source = "measured";
  return c;
}

}  // namespace rlx::backends::cuda
#endif
