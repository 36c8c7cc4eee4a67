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

#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"

using namespace rlx;
namespace cu = backends::cuda;
using Clock = std::chrono::steady_clock;

namespace {

void report(const std::string& key, double value, const std::string& unit) {
  fmt::print("{} {:.6g} {}\n", key, value, unit);
}

struct Timing {
  double gpu_s = 1e30, wall_s = 1e30;
  int host_kernels = 0;
};

Timing time_runs(runtime::ExecutableGraph& exe, std::span<const void* const> in, std::span<void* const> out, int warmup,
                 int reps) {
  Timing t;
  for (int r = 0; r < warmup + reps; ++r) {
    auto t0 = Clock::now();
    exe.run(in, out);
    double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r < warmup) continue;
    double gpu = 0;
    t.host_kernels = 0;
    try {
      for (const auto& k : exe.kernel_times()) {
        gpu += k.micros * 1e-6;
        t.host_kernels += k.host;
      }
    } catch (const Error& e) {  // say so, and count the wall time (an upper bound) instead
      static bool said = false;
      if (!said) fmt::print("# kernel_times failed ({}): GPU figures are wall time\n", e.what());
      said = true;
      gpu = wall;
    }
    t.gpu_s = std::min(t.gpu_s, gpu);
    t.wall_s = std::min(t.wall_s, wall);
  }
  return t;
}

struct Prepared {
  runtime::Backend::Compiled compiled;
  std::vector<std::vector<std::byte>> inputs, outputs;
  std::vector<const void*> in;
  std::vector<void*> out;
};

Prepared prepare(runtime::Backend& backend, const ir::Graph& g) {
  Prepared p{backend.compile(g), {}, {}, {}, {}};
  const auto& lir = p.compiled.result->lir;
  auto params = models::random_params(g, 7);
  for (std::size_t i = 0; i < lir.params.size(); ++i) {
    const auto& t = params.at(lir.buffer(lir.params[i]).name);
    p.compiled.exe->set_param(i, t.data(), t.nbytes());
  }
  auto inputs = models::random_inputs(g, 11);
  for (auto id : lir.inputs) {
    const auto& t = inputs.at(lir.buffer(id).name);
    p.inputs.emplace_back(t.data(), t.data() + t.nbytes());
    p.in.push_back(p.inputs.back().data());
  }
  for (auto id : lir.outputs) {
    p.outputs.emplace_back(std::size_t(lir.buffer(id).nbytes()));
    p.out.push_back(p.outputs.back().data());
  }
  return p;
}

void print_kernels(const runtime::ExecutableGraph& exe) {
  try {
    for (const auto& kt : exe.kernel_times())
      fmt::print("#   {:9.1f} us{}  {}\n", kt.micros, kt.host ? " (host)" : "", kt.kernel);
  } catch (const Error&) {
  }
}

}  // namespace

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
    {
      auto x = ch.param("x", ir::Shape{m});
      auto s = [&](double v) { return ch.scalar(v); };
      auto y = ch.mul(x, s(1.5));
      y = ch.add(y, s(0.25));
      y = ch.mul(y, y);
      y = ch.sub(y, s(0.5));
      y = ch.binary(ir::OpKind::Max, y, s(-1.0));
      y = ch.add(y, x);
      y = ch.mul(y, s(0.75));
      ch.add_output(ch.binary(ir::OpKind::Min, y, s(4.0)), "y");
    }
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
