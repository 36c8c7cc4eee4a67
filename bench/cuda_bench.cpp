// The CUDA backend's headline figures (docs/backends/cuda.md), in the keys of
// vulkan_bench so that bench/gpu_peers.py puts them next to PyTorch's: f32
// GEMM, the fused 8-op elementwise chain against a device-to-device copy, a
// 3x3 conv and the encoder block. Kernel figures are GPU time from the events
// the executable records around each kernel (kernel_times); the encoder also
// reports wall time per run (staging copies, graph launch and sync included).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "gpu_common.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"

using namespace rlx;
namespace cu = backends::cuda;
using namespace rlx::bench;

int main() {
  try {
    if (auto why = cu::unavailable_reason(); !why.empty()) {
      fmt::print(stderr, "cuda is unavailable: {}\n", why);
      return 2;
    }
    auto dev = cu::selected_device();
    fmt::print("# device '{}' ({}, {} SMs, driver {})\n", dev.name, dev.arch, dev.multiprocessors, dev.driver_version);
    auto backend = cu::make_cuda_backend();

    const std::int64_t n = 4096;
    ir::Graph mm("gemm");
    mm.add_output(mm.matmul(mm.param("a", ir::Shape{n, n}), mm.param("b", ir::Shape{n, n})), "c");
    auto gemm = prepare(*backend, mm);
    auto tg = time_runs(*gemm.compiled.exe, gemm.in, gemm.out, 1, 3);
    report(fmt::format("gemm_f32_{}_tflops", n), 2.0 * double(n * n * n) / tg.gpu_s * 1e-12, "TFLOP/s");

    const std::int64_t m = std::int64_t(1) << 28;
    ir::Graph ch("chain8");
    ch.add_output(chain8(ch, ch.param("x", ir::Shape{m})), "y");
    auto chain = prepare(*backend, ch);
    const double bytes = 8.0 * double(m);
    auto tc = time_runs(*chain.compiled.exe, chain.in, chain.out, 2, 10);
    const double copy = cu::copy_bandwidth_gbps(std::uint64_t(4 * m));
    report("chain8_kernels", double(chain.compiled.result->lir.kernels.size()), "kernels");
    report("chain8_gbps", bytes / tc.gpu_s * 1e-9, "GB/s");
    report("copy_d2d_gbps", copy, "GB/s");
    report("bench_copy_memcpy_gbps", copy, "GB/s");
    report("chain8_vs_copy", bytes / tc.gpu_s * 1e-9 / copy, "x");

    {
      ir::Graph cv("conv2d");
      cv.add_output(cv.conv2d(cv.param("x", ir::Shape{8, 256, 14, 14}), cv.param("w", ir::Shape{256, 256, 3, 3}),
                              std::nullopt, {1, 1}, {1, 1}),
                    "y");
      auto conv = prepare(*backend, cv);
      auto tv = time_runs(*conv.compiled.exe, conv.in, conv.out, 1, 5);
      report("conv2d_8x256x14x14_k3_tflops", 2.0 * 8 * 256 * 196 * 256 * 9 / tv.gpu_s * 1e-12, "TFLOP/s");
      print_kernels(*conv.compiled.exe);
    }

    for (auto [name, cfg] : {std::pair<const char*, models::EncoderConfig>{"encoder", {}},
                             {"encoder_large", {8, 512, 1024, 16, 4096, 1e-5}}}) {
      auto enc = prepare(*backend, models::encoder_block(cfg));
      auto te = time_runs(*enc.compiled.exe, enc.in, enc.out, 2, 10);
      report(std::string(name) + "_wall_us", te.wall_s * 1e6, "us");
      report(std::string(name) + "_gpu_us", te.gpu_s * 1e6, "us");
      report(std::string(name) + "_kernels", double(enc.compiled.result->lir.kernels.size()), "kernels");
      report(std::string(name) + "_host_kernels", double(te.host_kernels), "kernels");
      print_kernels(*enc.compiled.exe);
    }
  } catch (const Error& e) {
    fmt::print(stderr, "cuda_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
