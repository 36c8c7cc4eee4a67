// KernelDispatchReport: every op of a graph gets a tier and a reason, as the
// backend's traits decide; RLX_DISPATCH_REPORT=1 prints it at compile.
#include <gtest/gtest.h>

#include <map>

#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/session.hpp"

using namespace rlx;
using compile::DispatchTier;
using ir::OpKind;

namespace {

// linear (decomposed on the CPU), softmax (a native composite), add, an f16
// matmul (computed in f32), unsqueeze (a reshape).
ir::Graph mixed() {
  ir::Graph g("mixed");
  auto x = g.input("x", {4, 8});
  auto h = g.linear(x, g.param("w", {8, 8}), g.param("b", {8}));
  auto s = g.softmax(g.add(h, x), -1);
  g.add_output(g.unsqueeze(s, {0}), "s");
  auto a = g.input("a", {4, 8}, ir::DType::F16);
  g.add_output(g.matmul(a, g.param("m", {8, 2}, ir::DType::F16)), "m");
  return g;
}

std::map<OpKind, compile::DispatchEntry> by_op(const compile::DispatchReport& r) {
  std::map<OpKind, compile::DispatchEntry> m;
  for (const auto& e : r.entries) m.emplace(e.op, e);
  return m;
}

TEST(DispatchReport, EveryOpHasATierAndAReason) {
  auto g = mixed();
  auto c = Session().compile(g);
  const auto& r = c.compile_result().dispatch;
  EXPECT_EQ(r.backend, "cpu");
  std::size_t ops = 0;
  for (const auto& n : g.nodes()) ops += n.op != OpKind::Input && n.op != OpKind::Param && n.op != OpKind::Constant;
  ASSERT_EQ(r.entries.size(), ops) << r.to_text();
  for (std::size_t i = 1; i < r.entries.size(); ++i) EXPECT_LT(r.entries[i - 1].hir_node, r.entries[i].hir_node);
  for (const auto& e : r.entries) EXPECT_FALSE(e.reason.empty()) << ir::op_name(e.op);

  auto m = by_op(r);
  EXPECT_EQ(m.at(OpKind::Linear).tier, DispatchTier::Decomposed);
  EXPECT_EQ(m.at(OpKind::Softmax).tier, DispatchTier::Native);
  EXPECT_EQ(m.at(OpKind::Add).tier, DispatchTier::Native);
  EXPECT_NE(m.at(OpKind::Add).reason.find("cpu has a kernel for add"), std::string::npos) << m.at(OpKind::Add).reason;
  EXPECT_EQ(m.at(OpKind::Unsqueeze).tier, DispatchTier::Rewritten);
  EXPECT_NE(m.at(OpKind::Unsqueeze).reason.find("reshape"), std::string::npos);
  EXPECT_EQ(m.at(OpKind::MatMul).tier, DispatchTier::Rewritten);
  EXPECT_NE(m.at(OpKind::MatMul).reason.find("in f32"), std::string::npos) << m.at(OpKind::MatMul).reason;
}

TEST(DispatchReport, HostFallbackAndDtypeLegalizationSayWhy) {
  ir::Graph g("narrow");
  auto x = g.input("x", {6}, ir::DType::BF16);
  g.add_output(g.add(g.unary(OpKind::Sin, x), x));
  compile::BackendTraits t;
  t.name = "narrow";
  t.native_ops = {OpKind::Add, OpKind::Cast};
  t.native_dtypes = {ir::DType::F32, ir::DType::Bool};
  t.host_fallback = true;
  auto result = compile::compile(g, t, {});
  auto m = by_op(runtime::kernel_dispatch_report(result, t));
  EXPECT_EQ(m.at(OpKind::Sin).tier, DispatchTier::HostFallback);
  EXPECT_NE(m.at(OpKind::Sin).reason.find("host"), std::string::npos) << m.at(OpKind::Sin).reason;
  EXPECT_EQ(m.at(OpKind::Add).tier, DispatchTier::Rewritten);
  EXPECT_NE(m.at(OpKind::Add).reason.find("bf16 is not native on narrow"), std::string::npos)
      << m.at(OpKind::Add).reason;
  EXPECT_EQ(runtime::dispatch_tier(OpKind::Sin, t), DispatchTier::HostFallback);
  t.host_fallback = false;
  EXPECT_EQ(runtime::dispatch_tier(OpKind::Sin, t), DispatchTier::Unsupported);
  EXPECT_EQ(runtime::dispatch_tier(OpKind::Softmax, t), DispatchTier::Decomposed);
}

TEST(DispatchReport, SupportedOpsFollowTheTiers) {
  auto cpu = runtime::make_backend(runtime::Device::Cpu);
  auto ops = cpu->supported_ops();
  for (auto op : ir::kAllOps)
    EXPECT_EQ(ops.contains(op), runtime::dispatch_tier(op, cpu->traits()) != DispatchTier::Unsupported)
        << ir::op_name(op);
  EXPECT_TRUE(ops.contains(OpKind::Attention));
}

TEST(DispatchReport, PrintedAtCompileWhenAsked) {
  auto g = mixed();
  {
    env::ScopedOverride on("RLX_DISPATCH_REPORT", "1");
    ::testing::internal::CaptureStderr();
    Session().compile(g);
    auto err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("dispatch on cpu"), std::string::npos) << err;
    EXPECT_NE(err.find("decomposed"), std::string::npos) << err;
  }
  env::ScopedOverride off("RLX_DISPATCH_REPORT", "0");
  ::testing::internal::CaptureStderr();
  Session().compile(g);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("dispatch on"), std::string::npos);
  env::ScopedOverride bad("RLX_DISPATCH_REPORT", "maybe");
  try {
    Session().compile(g);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RLX_DISPATCH_REPORT"), std::string::npos) << e.what();
  }
}

}  // namespace

// A formula op the CPU has a SIMD kernel for runs it in f32, and its op-table formula in f64.
TEST(DispatchReport, FormulaOpsAreNativeOnlyAtTheDtypesOfTheirKernels) {
  for (ir::DType t : {ir::DType::F32, ir::DType::F64}) {
    ir::Graph g("sigmoid");
    g.add_output(g.unary(OpKind::Sigmoid, g.input("x", {8}, t)), "y");
    auto c = Session().compile(g);
    auto m = by_op(c.compile_result().dispatch);
    EXPECT_EQ(m.at(OpKind::Sigmoid).tier, t == ir::DType::F32 ? DispatchTier::Native : DispatchTier::Decomposed)
        << ir::dtype_name(t) << ": " << m.at(OpKind::Sigmoid).reason;
    if (t == ir::DType::F64) EXPECT_NE(m.at(OpKind::Sigmoid).reason.find("its formula"), std::string::npos);
  }
}
