#pragma once
// What the GPU backends' benchmarks (vulkan_bench, cuda_bench) share: the
// `key value unit` lines bench/gpu_peers.py reads, preparing a compiled graph
// with deterministic params and inputs, best-of timing from the executable's
// kernel_times (device time) and the wall clock, and the 8-op chain.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::bench {

inline void report(const std::string& key, double value, const std::string& unit) {
  fmt::print("{} {:.6g} {}\n", key, value, unit);
}

struct Timing {
  double gpu_s = 1e30, wall_s = 1e30;
  int host_kernels = 0;
};

// Best of `reps` runs after `warmup`: wall time with profiling off (how the executable runs by default), then
// device time (the sum of kernel_times) with profiling on. If kernel_times fails, it says so once and counts
// the wall time (an upper bound) instead.
inline Timing time_runs(runtime::ExecutableGraph& exe, std::span<const void* const> in, std::span<void* const> out,
                        int warmup, int reps) {
  using Clock = std::chrono::steady_clock;
  Timing t;
  exe.set_profiling(false);
  for (int r = 0; r < warmup + reps; ++r) {
    const auto t0 = Clock::now();
    exe.run(in, out);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r >= warmup) t.wall_s = std::min(t.wall_s, wall);
  }
  exe.set_profiling(true);
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    exe.run(in, out);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    double gpu = 0;
    t.host_kernels = 0;
    try {
      for (const auto& k : exe.kernel_times()) {
        gpu += k.micros * 1e-6;
        t.host_kernels += k.host;
      }
    } catch (const Error& e) {
      static bool said = false;
      if (!said) fmt::print("# kernel_times failed ({}): GPU figures are wall time\n", e.what());
      said = true;
      gpu = wall;
    }
    t.gpu_s = std::min(t.gpu_s, gpu);
  }
  return t;
}

// The median wall time of `reps` runs after `warmup` (the function runs one).
template <class Run>
double median_wall_s(Run&& run, int warmup, int reps) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> walls;
  for (int r = 0; r < warmup + reps; ++r) {
    const auto t0 = Clock::now();
    run();
    if (r >= warmup) walls.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(walls.begin(), walls.begin() + std::ptrdiff_t(walls.size() / 2), walls.end());
  return walls[walls.size() / 2];
}

inline void print_kernels(const runtime::ExecutableGraph& exe) {
  for (const auto& kt : exe.kernel_times())
    fmt::print("#   {:9.1f} us{}  {}\n", kt.micros, kt.host ? " (host)" : "", kt.kernel);
}

// Params get deterministic values; outputs land in vectors the caller keeps.
struct Prepared {
  runtime::Backend::Compiled compiled;
  std::vector<std::vector<std::byte>> inputs, outputs;
  std::vector<const void*> in;
  std::vector<void*> out;
};

inline Prepared prepare(runtime::Backend& backend, const ir::Graph& g, const compile::CompileOptions& options = {}) {
  Prepared p{backend.compile(g, options), {}, {}, {}, {}};
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

// The fused 8-op elementwise chain (bench/gpu_peers.py's chain(), in order) on x.
inline ir::NodeId chain8(ir::Graph& g, ir::NodeId x) {
  auto s = [&](double v) { return g.scalar(v); };
  auto y = g.mul(x, s(1.5));
  y = g.add(y, s(0.25));
  y = g.mul(y, y);
  y = g.sub(y, s(0.5));
  y = g.binary(ir::OpKind::Max, y, s(-1.0));
  y = g.add(y, x);
  y = g.mul(y, s(0.75));
  return g.binary(ir::OpKind::Min, y, s(4.0));
}

}  // namespace rlx::bench
