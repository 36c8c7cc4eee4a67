#pragma once
// Shared by the bench_* executables: interleaved timing and the one raw
// record format (JSON lines, one per workload x impl) that bench/report.py
// aggregates together with the Python peers' records.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlx/ir/random.hpp"
#include "rlx/ir/tensor.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Impl {
  std::string name;
  std::function<void()> fn;
};

struct Samples {
  std::string impl;
  std::vector<double> seconds;  // per call
  int iters = 1;                // calls averaged into each sample
};

struct Timing {
  int reps = 5;
  int warmup = 1;              // untimed calls before calibrating
  double min_sample_s = 0.05;  // short calls repeat until a sample spans this
  // Peers' worker threads spin-wait after a call (ONNX Runtime's burn ~40 ms
  // of CPU after a run; OpenBLAS's spin too), stealing cores from whatever runs
  // next; a pause after every sample lets them park, so no impl is timed
  // against another's spin.
  double settle_s = 0.1;
};

// Warm-up, then `reps` rounds in which every impl runs once; the order
// rotates each round so no impl always runs on caches the other left warm or
// cold. Short calls are repeated `iters` times per sample (calibrated on the
// warm-up calls) so timer noise stays small; warm-up ends with one untimed
// sample, so the first timed one sees the steady state, not first-call effects.
inline std::vector<Samples> interleave(const std::vector<Impl>& impls, const Timing& timing) {
  const auto settle = [&] { std::this_thread::sleep_for(std::chrono::duration<double>(timing.settle_s)); };
  std::vector<Samples> out(impls.size());
  for (std::size_t i = 0; i < impls.size(); ++i) {
    double t = 0;
    for (int w = 0; w < std::max(timing.warmup, 1); ++w) {
      double t0 = now_s();
      impls[i].fn();
      t = now_s() - t0;
    }
    out[i].impl = impls[i].name;
    out[i].iters = std::max(1, static_cast<int>(std::ceil(timing.min_sample_s / std::max(t, 1e-9))));
    for (int it = 0; it < out[i].iters; ++it) impls[i].fn();
    settle();
  }
  for (int r = 0; r < timing.reps; ++r) {
    for (std::size_t k = 0; k < impls.size(); ++k) {
      std::size_t i = (k + static_cast<std::size_t>(r)) % impls.size();
      double t0 = now_s();
      for (int it = 0; it < out[i].iters; ++it) impls[i].fn();
      out[i].seconds.push_back((now_s() - t0) / out[i].iters);
      settle();
    }
  }
  return out;
}

// Work per call, so the report can derive GFLOP/s or GB/s from a median time.
struct Work {
  double flops = 0;
  double bytes = 0;
};

inline nlohmann::json work_json(std::string_view workload, const Work& work) {
  nlohmann::json j{{"workload", workload}};
  if (work.flops > 0) j["flops"] = work.flops;
  if (work.bytes > 0) j["bytes"] = work.bytes;
  return j;
}

inline void emit_work(std::string_view workload, const Work& work) {
  std::printf("%s\n", work_json(workload, work).dump().c_str());
}

// One JSON line per impl on stdout: {"workload", "impl", "samples_s", "iters", "flops"?, "bytes"?}.
inline void emit(std::string_view workload, const Work& work, const std::vector<Samples>& samples) {
  for (const auto& s : samples) {
    auto j = work_json(workload, work);
    j.update({{"impl", s.impl}, {"samples_s", s.seconds}, {"iters", s.iters}});
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
}

// Progress goes to stderr so stdout stays pure JSON lines.
inline void progress(std::string_view workload, const std::vector<Samples>& samples) {
  std::fprintf(stderr, "  %-28s", std::string(workload).c_str());
  for (const auto& s : samples) {
    auto v = s.seconds;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    std::fprintf(stderr, "  %s %.3f ms", s.impl.c_str(), v[v.size() / 2] * 1e3);
  }
  std::fprintf(stderr, "\n");
}

// Uniform [-1, 1) f32 values, deterministic; faster than Tensor::set for the 64 MB inputs.
inline ir::Tensor random_f32(std::vector<std::int64_t> shape, std::uint64_t seed) {
  ir::Tensor t(ir::DType::F32, std::move(shape));
  float* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = 2.0f * ir::rng_uniform01(seed, static_cast<std::uint64_t>(i)) - 1.0f;
  return t;
}

// A compiled graph bound to fixed inputs and preallocated outputs, so the
// timed call is run_into alone (allocation-free).
class Runner {
 public:
  Runner(runtime::CompiledGraph graph, const std::map<std::string, ir::Tensor, std::less<>>& params,
         std::map<std::string, ir::Tensor, std::less<>> inputs)
      : graph_(std::move(graph)), inputs_(std::move(inputs)) {
    for (const auto& [name, t] : params) graph_.set_param(name, t);
    for (const auto& [name, t] : inputs_) named_.push_back({name, ir::view(t)});
    for (const auto& spec : graph_.output_specs()) outputs_.emplace_back(spec.dtype, spec.shape);
  }
  void operator()() { graph_.run_into(named_, outputs_); }
  const std::vector<ir::Tensor>& outputs() const { return outputs_; }
  const runtime::CompiledGraph& graph() const { return graph_; }
  const ir::Tensor& input(const std::string& name) const { return inputs_.at(name); }

 private:
  runtime::CompiledGraph graph_;
  std::map<std::string, ir::Tensor, std::less<>> inputs_;
  std::vector<runtime::NamedTensor> named_;
  std::vector<ir::Tensor> outputs_;
};

inline unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// The largest |t| and the largest |a - b| over f32 tensors of one size: a benchmark's own check of its output.
inline double max_abs(const ir::Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.data_as<float>()[i])));
  return m;
}
inline double max_abs_diff(const ir::Tensor& a, const ir::Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(double(a.data_as<float>()[i]) - double(b.data_as<float>()[i])));
  return m;
}

// memcpy split over all cores: both the copy-bandwidth limit and the peer of
// the (multi-threaded) fused elementwise kernel.
inline void parallel_memcpy(void* dst, const void* src, std::size_t n) {
  const unsigned t = cores();
  const std::size_t chunk = (n / t + 63) / 64 * 64;
  std::vector<std::jthread> pool;
  for (unsigned i = 0; i < t; ++i) {
    std::size_t off = std::min(n, i * chunk), len = std::min(chunk, n - off);
    pool.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len); });
  }
}

// "--key value" lookup over argv; `fallback` when absent.
inline std::string arg(int argc, char** argv, std::string_view key, std::string fallback = {}) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == key) return argv[i + 1];
  return fallback;
}

}  // namespace rlx::bench
