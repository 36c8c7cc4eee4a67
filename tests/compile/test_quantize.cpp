// Post-training quantization (compile/quantize.hpp): calibration, int8 matmuls only where the backend lists
// them as faster, the values they give against the f32 graph, and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/quantize.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/backend.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::compile {
namespace {

// A two-layer classifier: x[B,64] -> relu(x W1 + b1) -> W2 + b2 -> [B,10].
ir::Graph classifier(std::int64_t batch) {
  ir::Graph g("classifier");
  auto x = g.input("x", {batch, 64});
  auto h = g.relu(g.linear(x, g.param("w1", {64, 128}), g.param("b1", {128})));
  g.add_output(g.linear(h, g.param("w2", {128, 10}), g.param("b2", {10})), "logits");
  return g;
}

reference::TensorMap classifier_params(std::mt19937_64& rng) {
  reference::TensorMap p;
  p["w1"] = testing::random_tensor(ir::DType::F32, {64, 128}, rng);
  p["b1"] = testing::random_tensor(ir::DType::F32, {128}, rng);
  p["w2"] = testing::random_tensor(ir::DType::F32, {128, 10}, rng);
  p["b2"] = testing::random_tensor(ir::DType::F32, {10}, rng);
  return p;
}

std::vector<reference::TensorMap> batches(std::int64_t batch, int n, std::mt19937_64& rng) {
  std::vector<reference::TensorMap> out;
  for (int i = 0; i < n; ++i) out.push_back({{"x", testing::random_tensor(ir::DType::F32, {batch, 64}, rng)}});
  return out;
}

TEST(Quantize, TheCpuRunsInt8MatmulsCloseToF32) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  if (!cpu.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8}))
    GTEST_SKIP() << "this CPU has no int8 GEMM (no AVX-512 VNNI)";
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = 0;  // this small classifier, quantized anyway
  std::mt19937_64 rng(testing::test_seed());
  const ir::Graph g = classifier(32);
  const auto params = classifier_params(rng);
  const auto calib = batches(32, 4, rng);
  const auto q = quantize(g, params, calib, cpu);
  ASSERT_EQ(q.report.size(), 2u) << q.report_text();
  for (const auto& e : q.report) EXPECT_EQ(e.dtype, ir::DType::I8) << e.reason;
  EXPECT_TRUE(q.params.contains("w1.int8") && q.params.contains("w2.int8") && !q.params.contains("w1"));
  EXPECT_EQ(q.params.at("w1.int8").dtype(), ir::DType::I8);

  auto compiled = runtime::Session(runtime::Device::Cpu).compile(q.graph);
  for (const auto& [name, value] : q.params) compiled.set_param(name, value);
  // Both matmul kernels read their operands as stored: u8 activations, s8 weights.
  int int8_kernels = 0;
  for (const auto& k : compiled.compile_result().lir.kernels) {
    if (k.kind != KernelKind::MatMul) continue;
    for (const auto& n : k.body.nodes())
      if (n.op == ir::OpKind::MatMul)
        int8_kernels += k.body.node(k.body.node(n.inputs[0]).inputs.at(0)).dtype == ir::DType::U8 &&
                        k.body.node(k.body.node(n.inputs[1]).inputs.at(0)).dtype == ir::DType::I8;
  }
  EXPECT_EQ(int8_kernels, 2);

  // Fresh inputs: the int8 graph on the CPU against its own reference (the integer products are exact), and
  // against the f32 graph (within int8's error, and the same class for nearly every row).
  const auto fresh = batches(32, 1, rng).at(0);
  const auto got = compiled.run(fresh).at(0);
  const auto want_q = reference::run(q.graph, fresh, q.params).at(0);
  const auto want = reference::run(g, fresh, params).at(0);
  double scale = 0, worst = 0, worst_q = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_FALSE(std::isnan(got.get(i))) << i;
    scale = std::max(scale, std::abs(want.get(i)));
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
    worst_q = std::max(worst_q, std::abs(got.get(i) - want_q.get(i)));
  }
  EXPECT_LT(worst_q, 1e-4 * scale) << "the CPU's int8 matmuls against the reference of the same graph";
  EXPECT_LT(worst, 5e-2 * scale) << "int8 against f32";
  EXPECT_GT(worst, 1e-6 * scale) << "the same values as f32: nothing was quantized";
  int agree = 0;
  for (std::int64_t r = 0; r < 32; ++r) {
    auto argmax = [&](const ir::Tensor& t) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < 10; ++c)
        if (t.get(r * 10 + c) > t.get(r * 10 + best)) best = c;
      return best;
    };
    agree += argmax(got) == argmax(want);
  }
  EXPECT_GE(agree, 30) << "rows classified as the f32 graph does, of 32";
}

TEST(Quantize, ABackendWithoutAFasterInt8MatmulKeepsF32AndSaysWhy) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  const ir::Graph g = classifier(8);
  const auto params = classifier_params(rng);
  const auto q = quantize(g, params, batches(8, 1, rng), backends::cuda::traits());
  ASSERT_EQ(q.report.size(), 2u);
  for (const auto& e : q.report) {
    EXPECT_EQ(e.dtype, ir::DType::F32);
    EXPECT_NE(e.reason.find("backend 'cuda' has no int8 matmul"), std::string::npos) << e.reason;
  }
  EXPECT_EQ(q.params.size(), params.size());
  const auto x = batches(8, 1, rng).at(0);
  EXPECT_TRUE(testing::tensors_close(reference::run(q.graph, x, q.params).at(0), reference::run(g, x, params).at(0)));
}

// Where int8 would be slower (the input's quantization costing more than the GEMM saves), the CPU keeps f32.
TEST(Quantize, MatmulsTooSmallToGainStayF32) {
  const auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  if (!cpu.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8}))
    GTEST_SKIP() << "this CPU has no int8 GEMM (no AVX-512 VNNI)";
  std::mt19937_64 rng(testing::test_seed() + 4);
  const auto q = quantize(classifier(256), classifier_params(rng), batches(256, 1, rng), cpu);
  ASSERT_EQ(q.report.size(), 2u);
  for (const auto& e : q.report) {
    EXPECT_EQ(e.dtype, ir::DType::F32);
    EXPECT_NE(e.reason.find("at which backend 'cpu' gains from int8"), std::string::npos) << e.reason;
  }
}

TEST(Quantize, PercentileCalibrationClipsAnOutlier) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  cpu.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});  // the rewrite, on any CPU
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = 0;
  std::mt19937_64 rng(testing::test_seed() + 2);
  const ir::Graph g = classifier(64);
  const auto params = classifier_params(rng);
  auto calib = batches(64, 1, rng);
  calib[0]["x"].set(5, 1000.0);  // one huge activation
  const auto minmax = quantize(g, params, calib, cpu);
  const auto pct = quantize(g, params, calib, cpu, {.calibration = Calibration::Percentile, .percentile = 99.0});
  EXPECT_NE(minmax.report.at(0).reason.find("1000]"), std::string::npos) << minmax.report.at(0).reason;
  EXPECT_EQ(pct.report.at(0).reason.find("1000]"), std::string::npos) << pct.report.at(0).reason;
}

// MSE calibration clips a sparse tail where rounding everything else finer pays for it: one value of 2.3 among
// 65536 in [-2, 2] is clipped (min-max keeps it), the lower end stays whole, and a huge outlier is kept (at 8
// bits, clipping it costs more than the coarser rounding of the rest).
TEST(Quantize, MseCalibrationClipsASparseTailOnly) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  cpu.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = 0;
  std::mt19937_64 rng(testing::test_seed() + 5);
  const ir::Graph g = classifier(64);
  const auto params = classifier_params(rng);
  auto calib = batches(64, 16, rng);
  calib[0]["x"].set(5, 2.3);
  const auto minmax = quantize(g, params, calib, cpu);
  const auto mse = quantize(g, params, calib, cpu, {.calibration = Calibration::Mse});
  const std::string& kept = minmax.report.at(0).reason;
  const std::string& clipped = mse.report.at(0).reason;
  EXPECT_NE(kept.find("2.3]"), std::string::npos) << kept;
  EXPECT_EQ(clipped.find("2.3]"), std::string::npos) << clipped;
  EXPECT_TRUE(clipped.find("[-2,") != std::string::npos || clipped.find("[-1.99") != std::string::npos) << clipped;
  calib[0]["x"].set(5, 1000.0);
  const auto huge = quantize(g, params, calib, cpu, {.calibration = Calibration::Mse});
  EXPECT_NE(huge.report.at(0).reason.find("1000]"), std::string::npos) << huge.report.at(0).reason;
}

TEST(Quantize, BadArgumentsAreErrors) {
  std::mt19937_64 rng(testing::test_seed() + 3);
  const ir::Graph g = classifier(4);
  auto params = classifier_params(rng);
  const auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  auto expect_error = [](const auto& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { quantize(g, params, {}, cpu); }, "no calibration batch");
  const auto one = batches(4, 1, rng);
  expect_error([&] { quantize(g, params, one, cpu, {.calibration = Calibration::Percentile, .percentile = 0}); },
               "percentile 0 is not in (0, 100]");
  params.erase("w2");
  expect_error([&] { quantize(g, params, one, cpu); }, "param 'w2' has no value");
}

}  // namespace
}  // namespace rlx::compile
