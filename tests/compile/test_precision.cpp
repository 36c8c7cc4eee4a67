// The precision pass (auto-mixed precision, docs/precision.md): matmuls move to bf16 or f16 only where the
// backend lists them as faster than f32, the rest of the graph stays f32, the report says what happened to
// each op and why, and the mixed graph's values stay within bf16's tolerance of the f32 graph's.
#include <gtest/gtest.h>

#include <cmath>

#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/backend.hpp"
#include "support/testing.hpp"

namespace rlx::compile {
namespace {

ir::Graph small_encoder() {
  return models::encoder_block({.batch = 2, .seq = 8, .d_model = 32, .heads = 4, .d_ff = 64});
}

CompileResult compile_with(const ir::Graph& g, const BackendTraits& t, Precision p) {
  CompileOptions o;
  o.precision = p;
  return compile(g, t, o);
}

TEST(Precision, MatmulsRunInBf16WhereTheBackendIsFasterAndNothingElseDoes) {
  const auto r = compile_with(small_encoder(), backends::cuda::traits(), Precision::Bf16);
  EXPECT_EQ(r.precision.policy, Precision::Bf16);
  int lowered = 0;
  for (const auto& e : r.precision.entries) {
    if (e.op == ir::OpKind::Attention) {  // CUDA's own flash attention is f32 only: it stays, and says why
      EXPECT_EQ(e.dtype, ir::DType::F32);
      EXPECT_NE(e.reason.find("no bf16 attention faster"), std::string::npos) << e.reason;
      continue;
    }
    EXPECT_EQ(e.op, ir::OpKind::MatMul) << e.reason;
    EXPECT_EQ(e.dtype, ir::DType::BF16) << e.reason;
    lowered += e.dtype == ir::DType::BF16;
  }
  EXPECT_EQ(lowered, 6) << r.precision.to_text();  // q, k, v, o and the FFN's two
  // Reductions (the norms' and softmax's), exp and erf stay f32.
  for (const auto& n : r.mir.nodes()) {
    if (ir::op_info(n.op).cls == ir::OpClass::Reduce || n.op == ir::OpKind::Exp || n.op == ir::OpKind::Erf) {
      EXPECT_EQ(n.dtype, ir::DType::F32) << ir::op_name(n.op) << " %" << n.id;
    }
  }
  // Every matmul kernel reads bf16 operands as stored (the widening casts are its prologue).
  int kernels = 0;
  for (const auto& k : r.lir.kernels) {
    if (k.kind != KernelKind::MatMul) continue;
    ++kernels;
    for (const auto& n : k.body.nodes()) {
      if (n.op != ir::OpKind::MatMul) continue;
      for (auto operand : n.inputs) {
        const auto& c = k.body.node(operand);
        ASSERT_EQ(c.op, ir::OpKind::Cast) << k.name;
        EXPECT_EQ(k.body.node(c.inputs[0]).op, ir::OpKind::Input) << k.name;
        EXPECT_EQ(k.body.node(c.inputs[0]).dtype, ir::DType::BF16) << k.name;
      }
    }
  }
  EXPECT_EQ(kernels, 6);
}

// On the CPU with a bf16 GEMM that beats f32 (AMX), the weights are not cast per run: each weight's cast to bf16
// is in its matmul's kernel, which reads the f32 param and rounds it once as it packs it (matmul_narrowed_params).
TEST(Precision, TheCpusBf16MatmulsReadTheirF32WeightsWithNoCastKernel) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  if (!cpu.matmul_narrowed_params) GTEST_SKIP() << "this CPU has no bf16 GEMM (avx512_bf16 or AMX)";
  cpu.fast_low_precision.insert({ir::OpKind::MatMul, ir::DType::BF16});  // as on AMX
  cpu.low_precision_matmul_min_rows = 0;
  const auto r = compile_with(small_encoder(), cpu, Precision::Bf16);
  // A kernel's body reads its buffers as inputs: a weight narrowed in a matmul kernel is a cast to bf16 of an f32
  // input that is a param buffer.
  int narrowed = 0;
  for (const auto& k : r.lir.kernels) {
    if (k.kind != KernelKind::MatMul) continue;
    for (const auto& n : k.body.nodes()) {
      if (n.op != ir::OpKind::Cast || n.dtype != ir::DType::BF16) continue;
      const ir::Node& src = k.body.node(n.inputs[0]);
      narrowed += src.op == ir::OpKind::Input && src.dtype == ir::DType::F32;  // not the product's own rounding
    }
  }
  EXPECT_EQ(narrowed, 6) << r.lir.to_text();  // q, k, v, o and the FFN's two weights
  // Without the trait, each weight is cast by a kernel of its own, every run.
  cpu.matmul_narrowed_params = false;
  const auto per_run = compile_with(small_encoder(), cpu, Precision::Bf16);
  EXPECT_EQ(per_run.lir.kernels.size(), r.lir.kernels.size() + 6);
}

TEST(Precision, ABackendWithoutFasterKernelsKeepsF32AndSaysWhy) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu)->traits();
  cpu.fast_low_precision.erase({ir::OpKind::MatMul, ir::DType::BF16});  // the CPU without AMX
  const ir::Graph g = small_encoder();
  const auto mixed = compile_with(g, cpu, Precision::Bf16);
  const auto plain = compile_with(g, cpu, Precision::F32);
  ASSERT_FALSE(mixed.precision.entries.empty());
  for (const auto& e : mixed.precision.entries) {
    EXPECT_EQ(e.dtype, ir::DType::F32);
    EXPECT_NE(e.reason.find("backend 'cpu' has no bf16"), std::string::npos) << e.reason;
  }
  EXPECT_EQ(ir::to_text(mixed.mir), ir::to_text(plain.mir));  // never slower: the same graph
  EXPECT_TRUE(plain.precision.entries.empty());
  EXPECT_NE(mixed.precision.to_text().find("left in f32"), std::string::npos);
}

// A backend whose bf16 matmul pays only past some rows (one that casts a weight every run) keeps the smaller
// matmuls in f32 and says how many rows they have.
// The row floor is for a B cast every run: a weight the backend rounds and packs once (a static [K, N] f32 param,
// matmul_narrowed_params) goes to bf16 at any row count; a transposed one still needs the rows.
TEST(Precision, AWeightPackedOnceNeedsNoRows) {
  auto t = backends::cuda::traits();
  t.low_precision_matmul_min_rows = 32;
  t.matmul_narrowed_params = true;
  ir::Graph g("packed once");
  const auto x = g.input("x", {16, 16});
  g.add_output(g.matmul(x, g.param("w", {16, 16})));                     // 16 rows, a plain weight
  g.add_output(g.matmul(x, g.permute(g.param("v", {16, 16}), {1, 0})));  // 16 rows, a transposed weight
  const auto r = compile_with(g, t, Precision::Bf16);
  ASSERT_EQ(r.precision.entries.size(), 2u) << r.precision.to_text();
  EXPECT_EQ(r.precision.entries[0].dtype, ir::DType::BF16) << r.precision.entries[0].reason;
  EXPECT_EQ(r.precision.entries[1].dtype, ir::DType::F32) << r.precision.entries[1].reason;
  EXPECT_NE(r.precision.entries[1].reason.find("16 rows, below the 32"), std::string::npos)
      << r.precision.entries[1].reason;
  t.matmul_narrowed_params = false;  // without the trait both need the rows
  const auto without = compile_with(g, t, Precision::Bf16);
  ASSERT_EQ(without.precision.entries.size(), 2u);
  EXPECT_EQ(without.precision.entries[0].dtype, ir::DType::F32) << without.precision.entries[0].reason;
}

TEST(Precision, MatmulsWithTooFewRowsStayF32AndSayWhy) {
  auto t = backends::cuda::traits();
  t.low_precision_matmul_min_rows = 32;
  ir::Graph g("two matmuls");
  const auto w = g.param("w", {16, 16});
  g.add_output(g.matmul(g.input("few", {2, 8, 16}), w));   // 16 rows
  g.add_output(g.matmul(g.input("many", {4, 8, 16}), w));  // 32 rows
  const auto r = compile_with(g, t, Precision::Bf16);
  ASSERT_EQ(r.precision.entries.size(), 2u) << r.precision.to_text();
  EXPECT_EQ(r.precision.entries[0].dtype, ir::DType::F32);
  EXPECT_NE(r.precision.entries[0].reason.find("16 rows, below the 32"), std::string::npos)
      << r.precision.entries[0].reason;
  EXPECT_EQ(r.precision.entries[1].dtype, ir::DType::BF16) << r.precision.entries[1].reason;
}

TEST(Precision, TheMixedGraphStaysWithinBf16OfTheF32One) {
  const ir::Graph g = small_encoder();
  const auto r = compile_with(g, backends::cuda::traits(), Precision::Bf16);
  auto params = models::random_params(g, testing::test_seed());
  auto inputs = models::random_inputs(g, testing::test_seed() + 1);
  reference::TensorMap p(params.begin(), params.end()), in(inputs.begin(), inputs.end());
  const auto want = reference::run(g, in, p).at(0);
  const auto got = reference::run(r.mir, in, p).at(0);
  ASSERT_EQ(got.shape(), want.shape());
  double worst = 0, scale = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_FALSE(std::isnan(got.get(i))) << i;
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
    scale = std::max(scale, std::abs(want.get(i)));
  }
  EXPECT_LT(worst, 3e-2 * scale) << "bf16 has 8 bits of mantissa: about 0.4% per rounding";
  EXPECT_GT(worst, 1e-6 * scale) << "the mixed graph computed exactly the f32 values: nothing ran in bf16";
}

TEST(Precision, NamesParseAndAnUnknownOneIsAnError) {
  for (Precision p : {Precision::F32, Precision::Bf16, Precision::F16})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  try {
    parse_precision("fp8");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected f32, bf16 or f16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rlx::compile
