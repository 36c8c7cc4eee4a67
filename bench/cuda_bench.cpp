// The CUDA backend's headline figures (docs/backends/cuda.md), in the keys of
// vulkan_bench so that bench/gpu_peers.py puts them next to PyTorch's: f32
// GEMM, the fused 8-op elementwise chain against a device-to-device copy, a
// 3x3 conv and the encoder block. Kernel figures are GPU time from the events
// the executable records around each kernel (kernel_times); the encoder also
// reports wall time per run (staging copies, graph launch and sync included).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_common.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/graph_devices.hpp"

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

    {
      // bf16 operands with f32 accumulation (the bf16 GEMM figure).
      const std::int64_t nb = 8192;
      ir::Graph mb("gemm_bf16");
      mb.add_output(mb.matmul(mb.param("a", ir::Shape{nb, nb}, ir::DType::BF16),
                              mb.param("b", ir::Shape{nb, nb}, ir::DType::BF16)),
                    "c");
      auto g16 = prepare(*backend, mb);
      auto t16 = time_runs(*g16.compiled.exe, g16.in, g16.out, 1, 3);
      report(fmt::format("gemm_bf16_{}_tflops", nb), 2.0 * double(nb * nb * nb) / t16.gpu_s * 1e-12, "TFLOP/s");
      print_kernels(*g16.compiled.exe);
    }

    {
      // Host overhead: the median wall time of a run of a tiny 3-kernel graph (staging, graph launch, sync).
      ir::Graph small("overhead");
      auto x = small.input("x", ir::Shape{256});
      auto s1 = small.sum(x, {0}, true);                 // kernel 1
      auto s2 = small.sum(small.mul(x, s1), {0}, true);  // kernel 2 reads kernel 1's sum
      small.add_output(small.sum(small.mul(x, s2), {0}), "y");
      auto o = prepare(*backend, small);
      auto& exe = *o.compiled.exe;
      report("overhead_3k_kernels", double(o.compiled.result->lir.kernels.size()), "kernels");
      report("overhead_3k_us", median_wall_s([&] { exe.run(o.in, o.out); }, 500, 2000) * 1e6, "us");
      // Without the copies in and out (the input a handle, the output left on the device): launch and sync.
      exe.bind_handle(0, o.in[0], o.inputs[0].size());
      std::vector<const void*> no_in(o.in.size(), nullptr);
      std::vector<void*> no_out(o.out.size(), nullptr);
      report("overhead_3k_resident_us", median_wall_s([&] { exe.run_read_outputs(no_in, no_out); }, 500, 2000) * 1e6,
             "us");
      exe.set_profiling(true);
      exe.run_read_outputs(no_in, no_out);
      double busy = 0;
      for (const auto& k : exe.kernel_times()) busy += k.micros;
      report("overhead_3k_kernels_us", busy, "us");
    }

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
      // The chain's result against the host, every 4097th element and the last ones (a wrong unrolled or
      // vectorized loop shows up here, in elements the small conformance shapes never reach).
      auto params = models::random_params(ch, 7);
      const ir::Tensor& xt = params.at("x");
      const auto* ys = reinterpret_cast<const float*>(chain.out[0]);
      double worst = 0;
      auto check = [&](std::int64_t i) {
        const float x = xt.data_as<float>()[i];
        float y = x * 1.5f;
        y = y + 0.25f;
        y = y * y;
        y = y - 0.5f;
        y = std::max(y, -1.0f);
        y = y + x;
        y = y * 0.75f;
        y = std::min(y, 4.0f);
        worst = std::max(worst, double(std::abs(ys[i] - y)));
      };
      for (std::int64_t i = 0; i < m; i += 4097) check(i);
      for (std::int64_t i = m - 4096; i < m; ++i) check(i);
      report("chain8_max_abs_err", worst, "");
    }
    // The chain compiled under the environment's current settings: its best device time over 5 runs, the param
    // resident and the output left on the device.
    auto resident_chain_s = [&] {
      auto v = prepare(*backend, ch);
      auto& exe = *v.compiled.exe;
      std::vector<const void*> no_in(v.in.size(), nullptr);
      std::vector<void*> no_out(v.out.size(), nullptr);
      exe.set_profiling(true);
      double best = 1e30;
      for (int r = 0; r < 6; ++r) {
        exe.run_read_outputs(no_in, no_out);
        double s = 0;
        for (const auto& k : exe.kernel_times()) s += k.micros * 1e-6;
        if (r > 0) best = std::min(best, s);
      }
      return best;
    };
    // The same chain as the scalar grid-stride loop (RLX_CUDA_VECTOR_BYTES=0) and with 16-byte accesses at each
    // unrolling of the loop (RLX_CUDA_VECTOR_UNROLL; 0 is NVRTC's choice).
    for (auto [vb, unroll] : {std::pair{0, 0}, {16, 1}, {16, 2}, {16, 4}, {16, 0}}) {
      env::ScopedOverride width("RLX_CUDA_VECTOR_BYTES", std::to_string(vb));
      env::ScopedOverride steps("RLX_CUDA_VECTOR_UNROLL", std::to_string(unroll));
      report(vb ? fmt::format("chain8_vector{}_unroll{}_gbps", vb, unroll) : "chain8_scalar_gbps",
             bytes / resident_chain_s() * 1e-9, "GB/s");
    }
    // The grid's size: at most RLX_CUDA_BLOCKS_PER_SM blocks per multiprocessor, each thread looping over the
    // rest, or (0, the default) one step per thread, as torch.compile's kernels run.
    for (int per_sm : {8, 16, 32, 64, 0}) {
      env::ScopedOverride blocks("RLX_CUDA_BLOCKS_PER_SM", std::to_string(per_sm));
      report(fmt::format("chain8_blocks_per_sm{}_gbps", per_sm), bytes / resident_chain_s() * 1e-9, "GB/s");
    }

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
      // As PyTorch runs it: the input already on the device (a handle), the output left there.
      auto& exe = *enc.compiled.exe;
      exe.set_profiling(false);
      exe.bind_handle(0, enc.in[0], enc.inputs[0].size());
      std::vector<const void*> no_in(enc.in.size(), nullptr);
      std::vector<void*> no_out(enc.out.size(), nullptr);
      report(std::string(name) + "_resident_wall_us",
             median_wall_s([&] { exe.run_read_outputs(no_in, no_out); }, 3, 20) * 1e6, "us");
    }
    {
      // The large encoder in bf16 auto-mixed precision against its f32 form: resident wall time, and the
      // largest difference of the outputs relative to the f32 output's largest magnitude.
      const auto g = models::encoder_block({8, 512, 1024, 16, 4096, 1e-5});
      compile::CompileOptions bf16;
      bf16.precision = compile::Precision::Bf16;
      auto f32 = prepare(*backend, g), mixed = prepare(*backend, g, bf16);
      int lowered = 0;
      for (const auto& e : mixed.compiled.result->precision.entries) lowered += e.dtype == ir::DType::BF16;
      double resident[2] = {0, 0};
      for (int i = 0; i < 2; ++i) {
        auto& p = i ? mixed : f32;
        p.compiled.exe->run(p.in, p.out);  // outputs read back once, to compare
        auto& exe = *p.compiled.exe;
        exe.bind_handle(0, p.in[0], p.inputs[0].size());
        std::vector<const void*> no_in(p.in.size(), nullptr);
        std::vector<void*> no_out(p.out.size(), nullptr);
        resident[i] = median_wall_s([&] { exe.run_read_outputs(no_in, no_out); }, 3, 20);
      }
      const auto* a = reinterpret_cast<const float*>(f32.outputs[0].data());
      const auto* b = reinterpret_cast<const float*>(mixed.outputs[0].data());
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < f32.outputs[0].size() / sizeof(float); ++i) {
        worst = std::max(worst, double(std::abs(a[i] - b[i])));
        scale = std::max(scale, double(std::abs(a[i])));
      }
      report("encoder_large_amp_bf16_matmuls", lowered, "matmuls");
      report("encoder_large_amp_bf16_resident_us", resident[1] * 1e6, "us");
      report("encoder_large_amp_f32_resident_us", resident[0] * 1e6, "us");
      report("encoder_large_amp_speedup", resident[0] / resident[1], "x");
      report("encoder_large_amp_max_rel_err", worst / scale, "");
      auto& m = *mixed.compiled.exe;
      m.set_profiling(true);
      m.run_read_outputs(std::vector<const void*>(mixed.in.size(), nullptr),
                         std::vector<void*>(mixed.out.size(), nullptr));
      print_kernels(m);
    }

    // The cost model's view of this GPU: its calibration (measured now, or read from the cache) and the large
    // encoder's device report, which ranks CUDA against Vulkan on the same GPU and the CPU, each with its reason.
    {
      const runtime::Calibration c = runtime::calibration_for(runtime::Device::Cuda);
      report("calib_sgemm_gflops", c.sgemm_gflops, "GFLOP/s");
      report("calib_memory_bw_gbps", c.memory_bw_gbps, "GB/s");
      report("calib_roundtrip_us", c.roundtrip_overhead_ns * 1e-3, "us");
      fmt::print("# calibration: {} ({})\n", runtime::calibration_path_for(runtime::Device::Cuda).string(), c.source);
      const auto devices = runtime::device_report(models::encoder_block({8, 512, 1024, 16, 4096, 1e-5}));
      std::string text = devices.to_text();
      for (std::size_t at = 0; at < text.size();) {  // as comments: gpu_peers.py reads the other lines
        const std::size_t end = std::min(text.find('\n', at), text.size());
        fmt::print("# {}\n", text.substr(at, end - at));
        at = end + 1;
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "cuda_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
