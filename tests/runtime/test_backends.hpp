#pragma once
// Test-only backends for the multi-backend runtime tests: the CPU backend
// under another Device value, with knobs to fail, to be slow, or to offer
// none of the optional ExecutableGraph surface. They are registered on
// devices no real backend uses here (never Vulkan, so the real Vulkan backend
// stays in the registry), and a fixture points the calibration cache at a
// temp dir through the env catalog's override, never through setenv.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/graph_devices.hpp"

namespace rlx::testing {

struct TwinOptions {
  std::string name = "twin";
  bool forward_optional = true;  // false: only set_param/run/clone, so every other optional method throws
  bool fail_compile = false;
  bool fail_run = false;
  std::chrono::milliseconds delay{0};   // per run
  std::vector<ir::OpKind> unsupported;  // removed from the CPU's native ops (no host fallback)
  double own_sgemm_gflops = 0;          // > 0: calibrate() returns these figures instead of timing graphs
  std::shared_ptr<std::atomic<int>> runs = std::make_shared<std::atomic<int>>(0);
};

class TwinExecutable final : public runtime::ExecutableGraph {
 public:
  TwinExecutable(std::unique_ptr<runtime::ExecutableGraph> inner, TwinOptions o)
      : inner_(std::move(inner)), o_(std::move(o)) {}
  void set_param(std::size_t i, const void* data, std::size_t n) override { inner_->set_param(i, data, n); }
  void run(std::span<const void* const> in, std::span<void* const> out) override {
    if (o_.fail_run) throw Error(o_.name + ": injected run failure");
    if (o_.delay.count()) std::this_thread::sleep_for(o_.delay);
    ++*o_.runs;
    inner_->run(in, out);
  }
  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    auto c = std::make_unique<TwinExecutable>(inner_->clone(), o_);
    c->set_backend_name(backend_name());
    return c;
  }
  runtime::ExecutableCapabilities capabilities() const override {
    return o_.forward_optional ? inner_->capabilities() : runtime::ExecutableCapabilities{.clone = true};
  }
  // Forwarded only when forward_optional; otherwise the base class's refusals stand.
#define RLX_TWIN_FORWARD(call)                            \
  if (!o_.forward_optional) return ExecutableGraph::call; \
  return inner_->call
  void set_param_typed(std::size_t i, const ir::TensorView& v) override { RLX_TWIN_FORWARD(set_param_typed(i, v)); }
  std::vector<ir::Tensor> run_typed(std::span<const ir::TensorView> in) override { RLX_TWIN_FORWARD(run_typed(in)); }
  void run_read_outputs(std::span<const void* const> in, std::span<void* const> out) override {
    RLX_TWIN_FORWARD(run_read_outputs(in, out));
  }
  void commit_no_wait(std::span<const void* const> in, std::span<void* const> out) override {
    RLX_TWIN_FORWARD(commit_no_wait(in, out));
  }
  void sync_pending() override { RLX_TWIN_FORWARD(sync_pending()); }
  void run_pipelined(std::span<const std::vector<const void*>> in, std::span<const std::vector<void*>> out) override {
    RLX_TWIN_FORWARD(run_pipelined(in, out));
  }
  void bind_handle(std::size_t i, const void* d, std::size_t n) override { RLX_TWIN_FORWARD(bind_handle(i, d, n)); }
  void read_handle(std::size_t i, void* d, std::size_t n) const override { RLX_TWIN_FORWARD(read_handle(i, d, n)); }
  void feed_handle(std::size_t i, std::size_t j) override { RLX_TWIN_FORWARD(feed_handle(i, j)); }
  void share_params_from(const runtime::ExecutableGraph& src) override {
    const auto* twin = dynamic_cast<const TwinExecutable*>(&src);
    RLX_TWIN_FORWARD(share_params_from(twin ? *twin->inner_ : src));
  }
  void set_rng(const runtime::RngOptions& r) override { RLX_TWIN_FORWARD(set_rng(r)); }
  runtime::RngOptions rng() const override { RLX_TWIN_FORWARD(rng()); }
  void set_profiling(bool on) override { RLX_TWIN_FORWARD(set_profiling(on)); }
  std::vector<runtime::KernelTime> kernel_times() const override { RLX_TWIN_FORWARD(kernel_times()); }
  void copy_params_from(const runtime::ExecutableGraph& src) override {
    const auto* twin = dynamic_cast<const TwinExecutable*>(&src);
    RLX_TWIN_FORWARD(copy_params_from(twin ? *twin->inner_ : src));
  }
#undef RLX_TWIN_FORWARD

 private:
  std::unique_ptr<runtime::ExecutableGraph> inner_;
  TwinOptions o_;
};

class TwinBackend final : public runtime::Backend {
 public:
  explicit TwinBackend(TwinOptions o) : o_(std::move(o)) {}
  std::string_view name() const override { return o_.name; }
  compile::BackendTraits traits() const override {
    auto t = cpu_->traits();
    t.name = o_.name;
    for (auto op : o_.unsupported) t.native_ops.erase(op);
    return t;
  }
  runtime::Calibration calibrate() override {
    if (o_.own_sgemm_gflops <= 0) return Backend::calibrate();
    runtime::Calibration c;
    c.backend = o_.name;
    c.sgemm_gflops = o_.own_sgemm_gflops;
    c.roundtrip_overhead_ns = 5;
    c.memory_bw_gbps = 6;
    c.measured_at =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    return c;
  }
  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    if (o_.fail_compile) throw Error(o_.name + ": injected compile failure");
    auto inner = cpu_->compile_lir(lir, options);
    inner->set_backend_name(o_.name);  // refusals forwarded from the CPU executable name the twin
    return std::make_unique<TwinExecutable>(std::move(inner), o_);
  }

 private:
  std::unique_ptr<runtime::Backend> cpu_ = backends::cpu::make_cpu_backend();
  TwinOptions o_;
};

// Registers twins for the test's lifetime (unregistered afterwards) and points
// the calibration cache at a fresh temp dir, where calibrate() writes figures
// so that estimates are chosen by the test instead of measured.
class MultiBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = std::filesystem::temp_directory_path() / ("rlx-rt-test-" + std::to_string(rd()));
    std::filesystem::create_directories(dir_);
    cache_.emplace("RLX_CACHE_DIR", dir_.string());
    for (const char* v : {"RLX_DEVICE", "RLX_DEVICE_CHAIN"})
      cleared_.emplace_back(std::make_unique<env::ScopedOverride>(v, std::nullopt));
  }
  void TearDown() override {
    for (auto d : registered_) runtime::register_backend(d, {});
    cleared_.clear();
    cache_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TwinOptions twin(runtime::Device d, TwinOptions o = {}) {
    if (o.name == "twin") o.name = "twin-" + std::string(runtime::device_label(d));
    runtime::register_backend(d, [o] { return std::make_unique<TwinBackend>(o); });
    registered_.push_back(d);
    return o;
  }
  void calibrate(runtime::Device d, double gflops, double roundtrip_ns = 1000, double bw_gbps = 10) {
    runtime::Calibration c;
    c.backend = std::string(runtime::device_label(d));
    c.sgemm_gflops = gflops;
    c.roundtrip_overhead_ns = roundtrip_ns;
    c.memory_bw_gbps = bw_gbps;
    c.measured_at =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    runtime::save_calibration(c, runtime::calibration_path_for(d, dir_));
  }
  std::filesystem::path dir_;
  std::optional<env::ScopedOverride> cache_;
  std::vector<std::unique_ptr<env::ScopedOverride>> cleared_;
  std::vector<runtime::Device> registered_;
};

}  // namespace rlx::testing
