#ifdef RLX_HAVE_CUDA
// The CUDA backend's figures for the cost model (runtime/calibration.hpp): the GEMM and the bandwidth timed on
// the device (events around the kernels), so that a graph's host I/O does not hide the device's speed; the
// round trip by the wall clock, host I/O included, since that is what every run pays.
#include "rlx/runtime/calibration.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "rlx/backends/cuda/cuda_backend.hpp"

namespace rlx::backends::cuda {

runtime::Calibration measure_device(runtime::Backend& backend) {
  runtime::Calibration c;
  c.backend = "cuda";
  c.device = backend.device_name();

  // f32 GEMM through RLX's own matmul (cuBLASLt, exact f32): the params stay on the device, the product too
  // (run_read_outputs with no outputs), and the kernels' device time is read back. Speed does not depend on
  // the values, so the params keep their zeros.
  constexpr std::int64_t n = 4096;
  ir::Graph mm("calib_sgemm");
  mm.add_output(mm.matmul(mm.param("a", ir::Shape{n, n}), mm.param("b", ir::Shape{n, n})));
  auto gemm = backend.compile(mm);
  gemm.exe->set_profiling(true);
  std::vector<void*> no_out(1, nullptr);
  double best = INFINITY;
  for (int r = 0; r < 4; ++r) {
    gemm.exe->run_read_outputs({}, no_out);
    double s = 0;
    for (const auto& k : gemm.exe->kernel_times()) s += k.micros * 1e-6;
    if (r > 0) best = std::min(best, s);  // the first run loads the module
  }
  c.sgemm_gflops = 2.0 * double(n) * double(n) * double(n) / best * 1e-9;

  c.memory_bw_gbps = copy_bandwidth_gbps(std::uint64_t(1) << 30, 3);

  // Round trip: one element in, one kernel, one element out.
  ir::Graph tiny("calib_roundtrip");
  tiny.add_output(tiny.add(tiny.input("x", ir::Shape{1}), tiny.scalar(1)));
  auto trip = backend.compile(tiny);
  float x = 0, y = 0;
  const void* in = &x;
  void* out = &y;
  std::vector<double> ns;
  for (int r = 0; r < 51; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    trip.exe->run({&in, 1}, {&out, 1});
    if (r > 0) ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + std::ptrdiff_t(ns.size() / 2), ns.end());
  c.roundtrip_overhead_ns = ns[ns.size() / 2];
  c.measured_at =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  c.source = "measured";
  return c;
}

}  // namespace rlx::backends::cuda
#endif
