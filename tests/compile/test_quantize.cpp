// Post-training quantization (compile/quantize.hpp): calibration, int8 matmuls only where the backend lists
// them as faster, the values they give against the f32 graph, and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "conformance/harness.hpp"
#include "distributed/digits_mlp.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/passes_extra.hpp"
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
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = cpu.int8_matmul_min_row_macs =
      0;  // this small classifier, quantized anyway
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
  // The worst of 320 outputs: within 5% for nearly every seed, 5.8% of the largest output at the worst seen
  // (RLX_TEST_SEED=1583104348).
  EXPECT_LT(worst, 8e-2 * scale) << "int8 against f32";
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
// The 128 -> 10 layer alone (its own f32 input to quantize) gains from int8 on no CPU table: too few
// multiply-adds, a row too thin, or narrower than the panels; the report says which.
TEST(Quantize, MatmulsTooSmallToGainStayF32) {
  const auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  if (!cpu.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8}))
    GTEST_SKIP() << "this CPU has no int8 GEMM";
  std::mt19937_64 rng(testing::test_seed() + 4);
  ir::Graph g("head");
  auto x = g.input("x", {256, 128});
  g.add_output(g.linear(x, g.param("w2", {128, 10}), g.param("b2", {10})), "logits");
  const auto p = classifier_params(rng);
  const std::vector<reference::TensorMap> calib{{{"x", testing::random_tensor(ir::DType::F32, {256, 128}, rng)}}};
  const auto q = quantize(g, {{"w2", p.at("w2")}, {"b2", p.at("b2")}}, calib, cpu);
  ASSERT_EQ(q.report.size(), 1u);
  EXPECT_EQ(q.report[0].dtype, ir::DType::F32) << q.report[0].reason;
  EXPECT_TRUE(q.report[0].reason.find("at which backend 'cpu' gains from int8") != std::string::npos ||
              q.report[0].reason.find("narrower than backend 'cpu''s int8 panels") != std::string::npos)
      << q.report[0].reason;
}

// int8_matmul_min_row_macs leaves a layer whose K·N is below it in f32 at any batch, and says why, when the
// layer quantizes its own input (here: without quant_propagate, which would requantize it in the first layer).
TEST(Quantize, ThinLayersStayF32AtAnyBatch) {
  auto traits = runtime::make_backend(runtime::Device::Cpu)->traits();
  traits.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});
  traits.int8_matmul_min_macs = traits.int8_matmul_min_n = 0;
  traits.int8_matmul_min_row_macs = 4096;
  for (std::int64_t batch : {16, 4096}) {
    std::mt19937_64 rng(testing::test_seed() + 6);
    const auto q =
        quantize(classifier(batch), classifier_params(rng), batches(batch, 1, rng), traits, {.propagate = false});
    ASSERT_EQ(q.report.size(), 2u);
    EXPECT_EQ(q.report[0].dtype, ir::DType::I8) << q.report[0].reason;  // 64 x 128 = 8192 a row
    EXPECT_EQ(q.report[1].dtype, ir::DType::F32);                       // 128 x 10 = 1280 a row
    EXPECT_NE(q.report[1].reason.find("1280 multiply-adds a row (128 x 10), below the 4096"), std::string::npos)
        << q.report[1].reason;
  }
}

// A layer whose input the int8 layer before it requantizes (bias and relu between them, quant_propagate on)
// pays no quantize of its own: the per-row and width thresholds don't apply to it, the total-work one still
// does, and the report says why. Its activation is u8 between the layers.
TEST(Quantize, ALayerFedRequantizedInputsSkipsTheQuantizeThresholds) {
  auto traits = runtime::make_backend(runtime::Device::Cpu)->traits();
  traits.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});
  traits.int8_matmul_min_macs = 0;
  traits.int8_matmul_min_row_macs = 4096;
  traits.int8_matmul_min_n = 16;
  std::mt19937_64 rng(testing::test_seed() + 7);
  const auto params = classifier_params(rng);
  const auto calib = batches(64, 1, rng);
  const auto q = quantize(classifier(64), params, calib, traits);
  ASSERT_EQ(q.report.size(), 2u);
  EXPECT_EQ(q.report[0].dtype, ir::DType::I8) << q.report[0].reason;
  EXPECT_EQ(q.report[1].dtype, ir::DType::I8) << q.report[1].reason;
  EXPECT_NE(q.report[1].reason.find("its input is requantized to u8 in matmul %"), std::string::npos)
      << q.report[1].reason;
  EXPECT_EQ(q.report[0].reason.find("requantized"), std::string::npos) << q.report[0].reason;
  EXPECT_EQ(q.propagated.size(), 1u) << "the first layer's epilogue writes the second's u8 input";
  // The total-work threshold still applies: the second layer's 64 x 128 x 10 = 81920 multiply-adds are below
  // 100000, the first layer's 64 x 64 x 128 are not.
  traits.int8_matmul_min_macs = 100000;
  const auto small = quantize(classifier(64), params, calib, traits);
  EXPECT_EQ(small.report[0].dtype, ir::DType::I8) << small.report[0].reason;
  EXPECT_EQ(small.report[1].dtype, ir::DType::F32) << small.report[1].reason;
  EXPECT_NE(small.report[1].reason.find("81920 multiply-adds, below the 100000"), std::string::npos)
      << small.report[1].reason;
  // And the first layer stays f32 where it does not gain: the second then quantizes its own input.
  traits.int8_matmul_min_macs = 0;
  traits.int8_matmul_min_row_macs = 10000;
  const auto first_f32 = quantize(classifier(64), params, calib, traits);
  EXPECT_EQ(first_f32.report[0].dtype, ir::DType::F32) << first_f32.report[0].reason;
  EXPECT_EQ(first_f32.report[1].dtype, ir::DType::F32) << first_f32.report[1].reason;
}

TEST(Quantize, PercentileCalibrationClipsAnOutlier) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  cpu.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});  // the rewrite, on any CPU
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = cpu.int8_matmul_min_row_macs = 0;
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
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = cpu.int8_matmul_min_row_macs = 0;
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

// ---- quant_propagate ---------------------------------------------------------------------------------------

std::int64_t argmax_row(const ir::Tensor& t, std::int64_t r, std::int64_t classes) {
  std::int64_t best = 0;
  for (std::int64_t c = 1; c < classes; ++c)
    if (t.get(r * classes + c) > t.get(r * classes + best)) best = c;
  return best;
}

bool has_substr(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(), [&](const auto& l) { return l.find(text) != std::string::npos; });
}

// Between the two int8 matmuls, the dequantize -> bias -> relu -> quantize folds into a requantize: the first
// matmul's kernel writes u8, which the second reads as stored; the values stay those of the graph without the
// fold, up to a rare rounding flip (the folded constants round differently).
TEST(QuantPropagate, TheHiddenActivationStaysU8BetweenInt8Matmuls) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  if (!cpu.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8}))
    GTEST_SKIP() << "this CPU has no int8 GEMM (no AVX-512 VNNI)";
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = cpu.int8_matmul_min_row_macs = 0;
  std::mt19937_64 rng(testing::test_seed() + 6);
  const ir::Graph g = classifier(32);
  const auto params = classifier_params(rng);
  const auto calib = batches(32, 4, rng);
  const auto q = quantize(g, params, calib, cpu);
  const auto plain = quantize(g, params, calib, cpu, {.propagate = false});
  EXPECT_TRUE(has_substr(q.propagated, "requantized to u8 in its epilogue (dequantize, bias, relu")) << q.report_text();
  EXPECT_NE(q.report_text().find("quant_propagate: 1 rewrites"), std::string::npos) << q.report_text();
  EXPECT_TRUE(plain.propagated.empty());
  EXPECT_FALSE(q.params.contains("b1")) << "the bias folded into the requantize's offsets";
  for (const auto& n : q.graph.nodes()) EXPECT_FALSE(n.op == ir::OpKind::Relu) << "relu became the requantize's clamp";

  auto compiled = runtime::Session(runtime::Device::Cpu).compile(q.graph);
  for (const auto& [name, value] : q.params) compiled.set_param(name, value);
  const auto& lir = compiled.compile_result().lir;
  std::vector<ir::DType> matmul_out;
  for (const auto& k : lir.kernels)
    if (k.kind == KernelKind::MatMul) matmul_out.push_back(lir.buffers.at(std::size_t(k.outputs.at(0))).dtype);
  ASSERT_EQ(matmul_out.size(), 2u) << lir.to_text();
  EXPECT_EQ(matmul_out[0], ir::DType::U8) << "the first matmul's kernel writes the u8 activation\n" << lir.to_text();
  for (const auto& buf : lir.buffers)
    EXPECT_FALSE(buf.dtype == ir::DType::F32 && buf.shape == std::vector<std::int64_t>({32, 128}))
        << "an f32 hidden activation: " << buf.name;

  const auto fresh = batches(32, 1, rng).at(0);
  const auto got = compiled.run(fresh).at(0);
  const auto want_q = reference::run(q.graph, fresh, q.params).at(0);
  const auto want_plain = reference::run(plain.graph, fresh, plain.params).at(0);
  double scale = 0, worst_q = 0;
  int moved = 0, same_class = 0;
  for (std::int64_t i = 0; i < want_q.numel(); ++i) {
    ASSERT_FALSE(std::isnan(got.get(i))) << i;
    scale = std::max(scale, std::abs(want_q.get(i)));
    worst_q = std::max(worst_q, std::abs(got.get(i) - want_q.get(i)));
  }
  for (std::int64_t i = 0; i < want_q.numel(); ++i) moved += std::abs(want_q.get(i) - want_plain.get(i)) > 1e-6 * scale;
  for (std::int64_t r = 0; r < 32; ++r) same_class += argmax_row(want_q, r, 10) == argmax_row(want_plain, r, 10);
  EXPECT_LT(worst_q, 1e-4 * scale) << "the CPU's requantizing kernels against the reference of the same graph";
  EXPECT_LE(moved, 20) << "of 320 outputs moved by the fold's rounding (a rare flip of one hidden u8 step each)";
  EXPECT_GE(same_class, 31) << "rows classified as without the fold, of 32";
}

// A reshape between the relu and the next layer: the quantize moves above both reshapes, then folds.
TEST(QuantPropagate, AQuantizeMovesAboveReshapesAndThenFolds) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  if (!cpu.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8}))
    GTEST_SKIP() << "this CPU has no int8 GEMM (no AVX-512 VNNI)";
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = cpu.int8_matmul_min_row_macs = 0;
  std::mt19937_64 rng(testing::test_seed() + 7);
  ir::Graph g("reshaped");
  auto x = g.input("x", {16, 64});
  auto h = g.relu(g.linear(x, g.param("w1", {64, 128}), g.param("b1", {128})));
  using Dims = std::vector<std::int64_t>;
  h = g.reshape(g.reshape(h, Dims{16, 2, 64}), Dims{16, 128});
  g.add_output(g.linear(h, g.param("w2", {128, 10}), g.param("b2", {10})), "logits");
  const auto params = classifier_params(rng);
  const auto q = quantize(g, params, batches(16, 2, rng), cpu);
  EXPECT_EQ(std::count_if(q.propagated.begin(), q.propagated.end(),
                          [](const auto& l) { return l.find("reshape: moves u8") != std::string::npos; }),
            2)
      << q.report_text();
  EXPECT_TRUE(has_substr(q.propagated, "requantized to u8")) << q.report_text();
  for (const auto& n : q.graph.nodes())
    if (n.op == ir::OpKind::Reshape) {
      EXPECT_EQ(n.dtype, ir::DType::U8) << "%" << n.id;
    }
  auto compiled = runtime::Session(runtime::Device::Cpu).compile(q.graph);
  for (const auto& [name, value] : q.params) compiled.set_param(name, value);
  const auto fresh = batches(16, 1, rng).at(0);
  const auto got = compiled.run(fresh).at(0);
  const auto want = reference::run(q.graph, fresh, q.params).at(0);
  double scale = 0, worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::abs(want.get(i)));
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
  }
  EXPECT_LT(worst, 1e-4 * scale);
}

// dequantize -> reduce_max -> permute -> reshape -> slice -> concat (with a second dequantized input) ->
// quantize, at one scale and zero point: every op moves u8, both quantize-of-dequantize pairs vanish, and no f32
// value is left; the values are exactly the original graph's, on the reference and on the CPU.
TEST(QuantPropagate, MovementOpsCarryU8AndQuantizeOfDequantizeVanishes) {
  constexpr double kScale = 0.05, kZero = 7;
  ir::Graph g("qdq movement");
  auto dq = [&](ir::NodeId q) { return g.mul(g.sub(g.cast(q, ir::DType::F32), g.scalar(kZero)), g.scalar(kScale)); };
  auto a = dq(g.input("a", {2, 4, 6, 6}, ir::DType::U8));
  auto b = dq(g.input("b", {2, 4}, ir::DType::U8));
  auto y = g.reduce(ir::OpKind::ReduceMax, a, {3});                          // [2, 4, 6]
  y = g.reshape(g.permute(y, {0, 2, 1}), std::vector<std::int64_t>{2, 24});  // [2, 24]
  y = g.concat({g.slice(y, {1}, {4}, {24}), b}, 1);                          // [2, 24]
  auto q = g.cast(g.clamp(g.unary(ir::OpKind::Round, g.add(g.mul(y, g.scalar(1 / kScale)), g.scalar(kZero))), 0, 255),
                  ir::DType::U8);
  g.add_output(q, "q");
  std::vector<std::string> report;
  const ir::Graph p = passes::dce(passes::quant_propagate(g, {}, &report));
  for (const char* op :
       {"reduce_max: moves u8", "permute: moves u8", "reshape: moves u8", "slice: moves u8", "concat: moves u8"})
    EXPECT_TRUE(has_substr(report, op)) << op;
  EXPECT_EQ(
      std::count_if(report.begin(), report.end(), [](const auto& l) { return l.find("removed") != std::string::npos; }),
      2);
  for (const auto& n : p.nodes()) EXPECT_NE(n.dtype, ir::DType::F32) << "%" << n.id << " " << ir::op_name(n.op);

  std::mt19937_64 rng(testing::test_seed() + 8);
  std::uniform_int_distribution<int> byte(0, 255);
  reference::TensorMap in{{"a", ir::Tensor(ir::DType::U8, {2, 4, 6, 6})}, {"b", ir::Tensor(ir::DType::U8, {2, 4})}};
  for (auto& [name, t] : in)
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, byte(rng));
  EXPECT_TRUE(testing::tensors_close(reference::run(p, in).at(0), reference::run(g, in).at(0), {0, 0}));
  conformance::Check c;
  c.seed = testing::test_seed() + 8;
  c.label = "u8 movement after quant_propagate";
  c.gens["a"] = conformance::ints_in(0, 255);
  c.gens["b"] = conformance::ints_in(0, 255);
  EXPECT_TRUE(conformance::matches_reference(runtime::Device::Cpu, p, c));
}

// The compile pipeline runs quant_propagate on a graph that quantizes: here PTQ's graph without it, with a
// channel shuffle (reshape, permute, reshape) between the layers. The quantize moves above all three, then the
// first layer's dequantize, bias (a param, unknown to the pipeline: a run-time offset), relu and quantize fold
// into a requantize, so the shuffle moves u8 and the first matmul's kernel writes u8. With the option off, none
// of that happens. The values stay within int8's error of the f32 graph on the float64 reference.
TEST(QuantPropagate, ThePipelineMovesAQuantizeThroughAPermuteAndFoldsIt) {
  auto traits = runtime::make_backend(runtime::Device::Cpu)->traits();
  const bool int8_cpu = traits.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8});
  traits.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});  // the graph, on any CPU
  traits.int8_matmul_min_macs = traits.int8_matmul_min_n = traits.int8_matmul_min_row_macs = 0;
  std::mt19937_64 rng(testing::test_seed() + 9);
  constexpr std::int64_t kB = 16;
  ir::Graph g("shuffled");
  auto x = g.input("x", {kB, 64});
  auto h = g.relu(g.linear(x, g.param("w1", {64, 128}), g.param("b1", {128})));
  using Dims = std::vector<std::int64_t>;
  h = g.reshape(g.permute(g.reshape(h, Dims{kB, 2, 64}), {0, 2, 1}), Dims{kB, 128});
  g.add_output(g.linear(h, g.param("w2", {128, 10}), g.param("b2", {10})), "logits");
  const auto params = classifier_params(rng);
  const auto plain = quantize(g, params, batches(kB, 8, rng), traits, {.propagate = false});
  ASSERT_TRUE(plain.propagated.empty());
  ASSERT_TRUE(passes::has_quantize(plain.graph));

  const auto on = compile::compile(plain.graph, traits, {});
  const auto off = compile::compile(plain.graph, traits, {.quant_propagate = false});
  auto ran = [](const CompileResult& r) {
    return std::any_of(r.passes.begin(), r.passes.end(), [](const auto& p) { return p.name == "quant_propagate"; });
  };
  EXPECT_TRUE(ran(on));
  EXPECT_FALSE(ran(off));
  const auto& lines = on.precision.quant_propagate;
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const auto& l) { return l.find("reshape: moves u8") != std::string::npos; }),
            2)
      << on.precision.to_text();
  EXPECT_TRUE(has_substr(lines, "permute: moves u8")) << on.precision.to_text();
  EXPECT_TRUE(has_substr(lines, "requantized to u8 in its epilogue (dequantize, bias (a run-time [N] offset), relu"))
      << on.precision.to_text();
  EXPECT_NE(on.precision.to_text().find("quant_propagate: 4 rewrites"), std::string::npos) << on.precision.to_text();
  EXPECT_TRUE(off.precision.quant_propagate.empty());
  auto permute_dtype = [](const ir::Graph& mir) {
    for (const auto& n : mir.nodes())
      if (n.op == ir::OpKind::Permute) return n.dtype;
    return ir::DType::Bool;
  };
  EXPECT_EQ(permute_dtype(on.mir), ir::DType::U8) << ir::to_text(on.mir);
  EXPECT_EQ(permute_dtype(off.mir), ir::DType::F32);
  for (const auto& n : on.mir.nodes()) EXPECT_FALSE(n.op == ir::OpKind::Relu) << "relu became the requantize's clamp";
  auto first_matmul_out = [](const LirModule& lir) {
    for (const auto& k : lir.kernels)
      if (k.kind == KernelKind::MatMul) return lir.buffers.at(std::size_t(k.outputs.at(0))).dtype;
    return ir::DType::Bool;
  };
  EXPECT_EQ(first_matmul_out(on.lir), ir::DType::U8) << on.lir.to_text();
  EXPECT_EQ(first_matmul_out(off.lir), ir::DType::F32) << off.lir.to_text();

  // Values: the pipeline's graph against the float64 reference of the f32 graph (int8's error), and against
  // the graph without the pass (one u8 step of the hidden activation, rarely).
  const auto fresh = batches(kB, 1, rng).at(0);
  const auto want = reference::run(g, fresh, params).at(0);
  const auto got = reference::run(on.mir, fresh, plain.params).at(0);
  const auto got_off = reference::run(off.mir, fresh, plain.params).at(0);
  double scale = 0, worst = 0, worst_off = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::abs(want.get(i)));
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
    worst_off = std::max(worst_off, std::abs(got_off.get(i) - want.get(i)));
  }
  EXPECT_LT(worst, 0.1 * scale) << "int8's error against f32 (fresh values may fall outside the calibrated range)";
  EXPECT_LT(worst, worst_off + 0.01 * scale) << "the fold adds at most a rounding flip's error";
  if (int8_cpu) {
    // The CPU's kernels (the session runs the same pipeline) against the reference of the same graph.
    auto compiled = runtime::Session(runtime::Device::Cpu).compile(plain.graph);
    for (const auto& [name, value] : plain.params) compiled.set_param(name, value);
    EXPECT_FALSE(compiled.compile_result().precision.quant_propagate.empty());
    const auto cpu = compiled.run(fresh).at(0);
    double worst_cpu = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) worst_cpu = std::max(worst_cpu, std::abs(cpu.get(i) - got.get(i)));
    EXPECT_LT(worst_cpu, 1e-4 * scale);
  }
}

// ONNX's forms (src/onnx/ops_nn.cpp): DequantizeLinear (cast, minus a cast zero point, times the scale), a
// transpose, then QuantizeLinear (round(x / s) + zp, clamped), per tensor to u8; and s8 without a zero point.
// Each quantize moves above the transpose and meets its dequantize: both graphs become one transpose of the
// quantized input, exactly.
TEST(QuantPropagate, OnnxQdqFormsMoveThroughATransposeAndVanish) {
  for (const ir::DType qt : {ir::DType::U8, ir::DType::I8}) {
    const bool u8 = qt == ir::DType::U8;
    const double scale = 0.037, lo = u8 ? 0 : -128, hi = u8 ? 255 : 127;
    ir::Graph g("onnx qdq");
    auto q_in = g.input("q", {3, 5}, qt);
    auto zp = g.constant(ir::Tensor::scalar(qt, u8 ? 9 : 0));
    auto dq = g.cast(q_in, ir::DType::F32);
    if (u8) dq = g.sub(dq, g.cast(zp, ir::DType::F32));
    dq = g.mul(dq, g.scalar(scale));
    auto t = g.transpose(dq);
    auto r = g.unary(ir::OpKind::Round, g.div(t, g.scalar(scale)));
    if (u8) r = g.add(r, g.cast(zp, ir::DType::F32));
    g.add_output(g.cast(g.clamp(r, lo, hi), qt), "q_t");
    std::vector<std::string> report;
    const ir::Graph p = passes::quant_propagate(g, {}, &report);
    EXPECT_TRUE(has_substr(report, std::string("permute: moves ") + std::string(ir::dtype_name(qt)))) << ir::to_text(p);
    EXPECT_TRUE(has_substr(report, "removed")) << ir::to_text(p);
    const auto& out = p.node(p.output_ids().at(0));
    EXPECT_EQ(out.op, ir::OpKind::Permute) << ir::to_text(p);
    EXPECT_EQ(p.node(out.inputs.at(0)).op, ir::OpKind::Input) << ir::to_text(p);
    reference::TensorMap in{{"q", ir::Tensor(qt, {3, 5})}};
    for (std::int64_t i = 0; i < 15; ++i) in["q"].set(i, lo + double((i * 37) % int(hi - lo + 1)));
    EXPECT_TRUE(testing::tensors_close(reference::run(p, in).at(0), reference::run(g, in).at(0), {0, 0}));
  }
}

// The acceptance figure's test: the digits classifier, trained in f32 on sklearn's digits, quantized by PTQ as
// the CPU decides (both layers forced to int8 where the CPU has no int8 kernel that pays at this size, so the
// accuracy is always the int8 one's), classifies the held-out images within 1 point of f32.
TEST(QuantPropagate, TheDigitsClassifierInInt8IsWithinOnePointOfF32) {
  const auto data = test::load_digits(1797);
  if (data.source.rfind("sklearn", 0) != 0) GTEST_SKIP() << "no sklearn digits in .venv: " << data.source;
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  cpu.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::I8});  // the graph on the reference, on any CPU
  cpu.int8_matmul_min_macs = cpu.int8_matmul_min_n = cpu.int8_matmul_min_row_macs = 0;
  const std::int64_t n_train = data.n - 359, b = 256;
  const auto params = test::train_digits(data, n_train, 30);
  const ir::Graph g = test::digits_classifier(b);
  std::vector<reference::TensorMap> calib;
  for (std::int64_t lo = 0; lo < n_train; lo += b)
    calib.push_back({{"x", test::digits_x(data, lo, std::min(b, n_train - lo), b)}});
  const auto q = quantize(g, params, calib, cpu);
  ASSERT_EQ(q.report.size(), 2u);
  for (const auto& e : q.report) EXPECT_EQ(e.dtype, ir::DType::I8) << e.reason;
  auto accuracy = [&](const ir::Graph& graph, const reference::TensorMap& p) {
    return test::digits_accuracy(data, n_train, b, [&](const ir::Tensor& x) {
      return reference::run(graph, {{"x", x}}, p).at(0);
    });
  };
  const double f32 = accuracy(g, params), i8 = accuracy(q.graph, q.params);
  std::printf("digits test accuracy: f32 %.2f%%, int8 %.2f%% (%s)\n", 100 * f32, 100 * i8, data.source.c_str());
  EXPECT_GT(f32, 0.9) << "the f32 classifier did not learn";
  EXPECT_LE(std::abs(i8 - f32), 0.01) << "f32 " << f32 << ", int8 " << i8;
  // On a CPU with an int8 GEMM, its kernels classify as the reference does (up to one image: a rounding flip).
  if (runtime::make_backend(runtime::Device::Cpu)
          ->traits()
          .fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8})) {
    auto compiled = runtime::Session(runtime::Device::Cpu).compile(q.graph);
    for (const auto& [name, value] : q.params) compiled.set_param(name, value);
    const double cpu_i8 = test::digits_accuracy(data, n_train, b, [&](const ir::Tensor& x) {
      return compiled.run({{"x", x}}).at(0);
    });
    EXPECT_LE(std::abs(cpu_i8 - i8), 1.0 / 359 + 1e-9) << "the CPU's int8 kernels against the reference";
  }
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
