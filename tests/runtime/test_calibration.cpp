// Calibration caches: where they live (through the env catalog), what makes a
// file untrustworthy (missing, corrupt, another version, too old, nonsense
// figures), and that such a file is measured again; plus the cost model.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "runtime/test_backends.hpp"

using namespace rlx;
using runtime::Device;

namespace {

class Calibration : public rlx::testing::MultiBackendTest {
 protected:
  void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }
  std::string reason(const std::filesystem::path& p) {
    std::string why;
    EXPECT_FALSE(runtime::load_calibration(p, &why).has_value()) << p;
    return why;
  }
  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

TEST_F(Calibration, CacheDirFollowsTheCatalog) {
  EXPECT_EQ(runtime::cache_dir(), dir_);  // RLX_CACHE_DIR, set by the fixture
  env::ScopedOverride no_dir("RLX_CACHE_DIR", std::nullopt);
  env::ScopedOverride xdg("XDG_CACHE_HOME", "/x/cache");
  env::ScopedOverride home("HOME", "/home/someone");
  EXPECT_EQ(runtime::cache_dir(), std::filesystem::path("/x/cache/rlx"));
  env::ScopedOverride no_xdg("XDG_CACHE_HOME", std::nullopt);
  EXPECT_EQ(runtime::cache_dir(), std::filesystem::path("/home/someone/.cache/rlx"));
  EXPECT_EQ(runtime::calibration_path("vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", "/c"),
            std::filesystem::path("/c/vulkan-calib-llvmpipe__LLVM_15.0.6__256_bits_.json"));
}

TEST_F(Calibration, RoundTripAndEveryUntrustworthyFile) {
  runtime::Calibration c;
  c.backend = "cpu";
  c.device = "test";
  c.sgemm_gflops = 50;
  c.roundtrip_overhead_ns = 2000;
  c.memory_bw_gbps = 12;
  c.measured_at = now();
  auto p = dir_ / "cpu-calib-test.json";
  runtime::save_calibration(c, p);
  auto back = runtime::load_calibration(p);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->sgemm_gflops, 50);
  EXPECT_EQ(back->roundtrip_overhead_ns, 2000);
  EXPECT_EQ(back->memory_bw_gbps, 12);
  EXPECT_EQ(back->device, "test");
  EXPECT_NE(back->source.find("cache"), std::string::npos);

  EXPECT_NE(reason(dir_ / "absent.json").find("no cache file"), std::string::npos);
  write(p, "{\"version\": 1, \"sgemm_gfl");
  EXPECT_NE(reason(p).find("corrupt"), std::string::npos);
  write(p, "[1, 2]");
  EXPECT_NE(reason(p).find("corrupt"), std::string::npos);
  auto file = [&](int version, std::int64_t at, double gflops, bool with_version = true) {
    return fmt::format(
        "{{{}\"measured_at\": {}, \"sgemm_gflops\": {}, \"roundtrip_overhead_ns\": 100, "
        "\"memory_bw_gbps\": 5}}",
        with_version ? fmt::format("\"version\": {}, ", version) : "", at, gflops);
  };
  write(p, file(1, now(), 10, false));
  EXPECT_NE(reason(p).find("no version field"), std::string::npos);
  write(p, file(runtime::kCalibrationVersion + 1, now(), 10));
  EXPECT_NE(reason(p).find("version"), std::string::npos);
  write(p, file(1, now() - 86400 * (runtime::kCalibrationMaxAgeDays + 1), 10));
  EXPECT_NE(reason(p).find("days ago"), std::string::npos);
  write(p, file(1, now(), -3));
  EXPECT_NE(reason(p).find("must be positive"), std::string::npos);
  write(p,
        "{\"version\": 1, \"measured_at\": \"yesterday\", \"sgemm_gflops\": 1, \"roundtrip_overhead_ns\": 1, "
        "\"memory_bw_gbps\": 1}");
  EXPECT_NE(reason(p).find("corrupt"), std::string::npos);
  write(p, file(1, now(), 10));
  EXPECT_TRUE(runtime::load_calibration(p));
}

TEST_F(Calibration, CorruptFileIsMeasuredAgainNotTrusted) {
  const auto p = runtime::calibration_path_for(Device::Cpu, dir_);
  // Valid JSON with a nonsense figure, then plain garbage: neither may be used.
  write(p, fmt::format("{{\"version\": 1, \"measured_at\": {}, \"sgemm_gflops\": 0, \"roundtrip_overhead_ns\": 1, "
                       "\"memory_bw_gbps\": 1}}",
                       now()));
  auto c = runtime::calibration_for(Device::Cpu, dir_);
  EXPECT_NE(c.source.find("measured now"), std::string::npos) << c.source;
  EXPECT_GT(c.sgemm_gflops, 0);
  write(p, "\x01garbage{{");
  c = runtime::calibration_for(Device::Cpu, dir_);
  EXPECT_NE(c.source.find("measured now (corrupt"), std::string::npos) << c.source;
  EXPECT_GT(c.sgemm_gflops, 0);
  EXPECT_GT(c.roundtrip_overhead_ns, 0);
  EXPECT_GT(c.memory_bw_gbps, 0);
  EXPECT_EQ(c.backend, "cpu");
  // The measurement replaced the file, and the next read trusts it.
  auto saved = runtime::load_calibration(p);
  ASSERT_TRUE(saved);
  EXPECT_EQ(saved->sgemm_gflops, c.sgemm_gflops);
  EXPECT_NE(runtime::calibration_for(Device::Cpu, dir_).source.find("cache"), std::string::npos);
}

TEST_F(Calibration, AValidFileIsUsedAsIs) {
  calibrate(Device::Cpu, 1234.5, 777, 42);
  auto c = runtime::calibration_for(Device::Cpu);  // the default dir: RLX_CACHE_DIR
  EXPECT_EQ(c.sgemm_gflops, 1234.5);
  EXPECT_EQ(c.roundtrip_overhead_ns, 777);
  EXPECT_EQ(c.memory_bw_gbps, 42);
  EXPECT_NE(c.source.find(runtime::calibration_path_for(Device::Cpu).string()), std::string::npos) << c.source;
  EXPECT_THROW(runtime::calibration_for(Device::Metal), Error);  // unavailable: nothing to measure
}

// A backend with instruments of its own (device timers: CUDA, Vulkan) measures itself; calibration_for caches what
// it returns like any measurement.
TEST_F(Calibration, ABackendMayMeasureItself) {
  rlx::testing::TwinOptions o;
  o.own_sgemm_gflops = 777;
  twin(Device::Gpu, o);
  auto c = runtime::calibration_for(Device::Gpu, dir_);
  EXPECT_EQ(c.sgemm_gflops, 777);
  EXPECT_EQ(c.roundtrip_overhead_ns, 5);
  EXPECT_EQ(c.memory_bw_gbps, 6);
  EXPECT_NE(c.source.find("measured now"), std::string::npos) << c.source;
  auto saved = runtime::load_calibration(runtime::calibration_path_for(Device::Gpu, dir_));
  ASSERT_TRUE(saved);
  EXPECT_EQ(saved->sgemm_gflops, 777);
}

TEST_F(Calibration, MeasuredFiguresArePositive) {
  auto cpu = runtime::make_backend(Device::Cpu);
  auto c = runtime::measure_calibration(*cpu);
  EXPECT_GT(c.sgemm_gflops, 0);
  EXPECT_GT(c.roundtrip_overhead_ns, 0);
  EXPECT_GT(c.memory_bw_gbps, 0);
  EXPECT_EQ(c.backend, "cpu");
  EXPECT_GT(c.measured_at, 0);
}

// The shared pieces the GPU backends' own calibrate() use (runtime/calibration.hpp), on the CPU: the GEMM timed by
// kernel_times (outputs left behind through read_outputs), the round trip by the wall clock.
TEST_F(Calibration, SharedMeasurementsArePositiveOnAnyBackendWithKernelTimes) {
  auto cpu = runtime::make_backend(Device::Cpu);
  EXPECT_GT(runtime::measure_sgemm_gflops(*cpu, 64, 2), 0);
  const double ns = runtime::measure_roundtrip_ns(*cpu, 9);
  EXPECT_GT(ns, 0);
  EXPECT_TRUE(std::isfinite(ns));
}

// The MLX backend is measured through the generic path (its own compile path, MLX's default device) into its own
// file, which the device report then reads for MLX's estimate.
TEST_F(Calibration, MlxIsMeasuredIntoItsFileAndEstimatedInTheDeviceReport) {
  if (!runtime::is_available(Device::Mlx)) GTEST_SKIP() << "mlx is not available here";
  const auto p = runtime::calibration_path_for(Device::Mlx, dir_);
  EXPECT_EQ(p.filename().string().rfind("mlx-calib-mlx-", 0), 0u) << p;  // mlx-cpu, or mlx-gpu with a GPU wheel
  EXPECT_FALSE(std::filesystem::exists(p));
  const auto c = runtime::calibration_for(Device::Mlx, dir_);
  EXPECT_TRUE(std::filesystem::exists(p));
  EXPECT_EQ(c.backend, "mlx");
  EXPECT_NE(c.source.find("measured now"), std::string::npos) << c.source;
  EXPECT_GT(c.sgemm_gflops, 0);
  EXPECT_GT(c.roundtrip_overhead_ns, 0);
  EXPECT_GT(c.memory_bw_gbps, 0);
  const auto saved = runtime::load_calibration(p);
  ASSERT_TRUE(saved);
  EXPECT_EQ(saved->sgemm_gflops, c.sgemm_gflops);

  ir::Graph g("mm");
  g.add_output(g.matmul(g.input("x", {64, 64}), g.param("w", {64, 64})), "y");
  const auto report = runtime::device_report(g);
  const auto mlx = std::find_if(report.candidates.begin(), report.candidates.end(),
                                [](const runtime::DeviceCandidate& d) { return d.device == Device::Mlx; });
  ASSERT_NE(mlx, report.candidates.end());
  EXPECT_TRUE(mlx->viable()) << mlx->why;
  ASSERT_TRUE(mlx->estimate.has_value()) << mlx->why;
  EXPECT_GT(mlx->estimate->seconds, 0);
  EXPECT_NE(mlx->calibration_source.find(p.string()), std::string::npos) << mlx->calibration_source;
  EXPECT_DOUBLE_EQ(mlx->estimate->seconds, runtime::estimate_cost(runtime::graph_cost(g), c).seconds);

  // Figures planted in that file are what the estimate is made of: a second of overhead per run puts MLX last.
  calibrate(Device::Mlx, 5, 1e9, 3);
  const auto planted = runtime::calibration_for(Device::Mlx, dir_);
  ASSERT_EQ(planted.roundtrip_overhead_ns, 1e9);
  const auto again = runtime::device_report(g);
  const auto slow = std::find_if(again.candidates.begin(), again.candidates.end(),
                                 [](const runtime::DeviceCandidate& d) { return d.device == Device::Mlx; });
  ASSERT_NE(slow, again.candidates.end());
  ASSERT_TRUE(slow->estimate.has_value()) << slow->why;
  EXPECT_DOUBLE_EQ(slow->estimate->seconds, runtime::estimate_cost(runtime::graph_cost(g), planted).seconds);
  EXPECT_GE(slow->estimate->seconds, 1.0);
  EXPECT_FALSE(slow->recommended) << slow->why;
}

TEST(CostModel, CountsFlopsAndBytesOfPrimitives) {
  ir::Graph g("cost");
  auto x = g.input("x", {4, 8});
  auto y = g.matmul(x, g.param("w", {8, 16}));
  g.add_output(g.add(y, y));
  auto c = runtime::graph_cost(g);
  EXPECT_EQ(c.matmul_flops, 2.0 * 4 * 16 * 8);
  EXPECT_EQ(c.flops, c.matmul_flops + 4 * 16);
  EXPECT_EQ(c.bytes, 4.0 * (32 + 128 + 64) + 4.0 * (64 + 64 + 64));
  EXPECT_EQ(c.ops, 2u);

  // Composites are costed through their decomposition; symbolic dims through `bind`.
  ir::Graph s("sym");
  auto xs = s.input("x", ir::Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(8)}));
  s.add_output(s.linear(xs, s.param("w", {8, 8})));
  EXPECT_EQ(runtime::graph_cost(s, {{"B", 10}}).matmul_flops, 2.0 * 10 * 8 * 8);
  EXPECT_EQ(runtime::graph_cost(s).matmul_flops, 2.0 * 1 * 8 * 8);
}

TEST(CostModel, EstimateIsARooflineAndSaysWhatBoundsIt) {
  runtime::GraphCost cost{.flops = 2e9, .matmul_flops = 2e9, .bytes = 1e6, .ops = 1};
  runtime::Calibration cal;
  cal.sgemm_gflops = 100;
  cal.memory_bw_gbps = 10;
  cal.roundtrip_overhead_ns = 5000;
  auto e = runtime::estimate_cost(cost, cal);
  EXPECT_DOUBLE_EQ(e.compute_s, 0.02);
  EXPECT_DOUBLE_EQ(e.memory_s, 1e-4);
  EXPECT_DOUBLE_EQ(e.seconds, 0.02 + 5e-6);
  EXPECT_NE(e.explain.find("compute bound"), std::string::npos) << e.explain;
  cost = {.flops = 1e3, .matmul_flops = 0, .bytes = 1e9, .ops = 1};
  e = runtime::estimate_cost(cost, cal);
  EXPECT_DOUBLE_EQ(e.compute_s, 1e3 / 25e9);  // non-GEMM work at a quarter of GEMM speed
  EXPECT_NE(e.explain.find("memory bound"), std::string::npos) << e.explain;
  EXPECT_EQ(runtime::seconds_str(12.3e-6), "12.3 us");
}

}  // namespace
