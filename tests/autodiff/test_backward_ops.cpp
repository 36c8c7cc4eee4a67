// The backward ops: the VJP rules emit them, decompose_backward_ops_except
// turns the unsupported ones into primitives (same values), and the CPU runs
// softmax_backward, layer_norm_backward and rms_norm_backward natively while
// log_softmax_backward is decomposed. Their values and derivatives are
// checked in test_op_parity.cpp and test_autodiff.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;

// A small attention-free transformer-ish loss using all four forward composites.
Graph block(DType t) {
  Graph g("block");
  NodeId x = g.input("x", {6, 16}, t);
  NodeId gamma = g.param("gamma", Shape{16}, t), beta = g.param("beta", Shape{16}, t);
  NodeId w = g.param("w", Shape{16, 16}, t);
  NodeId h = g.layer_norm(x, gamma, beta);
  h = g.rms_norm(g.matmul(h, w), gamma);
  NodeId p = g.softmax(h, 0);
  NodeId logp = g.log_softmax(g.mul(h, p), -1);
  g.add_output(g.mean(g.mul(logp, logp), {0, 1}), "loss");
  return g;
}

std::size_t count(const Graph& g, OpKind op) {
  return std::size_t(std::count_if(g.nodes().begin(), g.nodes().end(), [op](const ir::Node& n) { return n.op == op; }));
}

TEST(BackwardOps, VjpRulesEmitThem) {
  Graph grads = autodiff::grad(block(DType::F64), {"x", "gamma", "beta", "w"});
  for (OpKind op : autodiff::backward_ops()) EXPECT_EQ(count(grads, op), 1u) << ir::op_name(op);
}

TEST(BackwardOps, DecomposeExceptKeepsTheSupportedOnes) {
  Graph grads = autodiff::grad(block(DType::F64), {"x", "gamma", "beta", "w"});
  std::set<OpKind> supported{OpKind::SoftmaxBackward, OpKind::RmsNormBackward};
  Graph d = autodiff::decompose_backward_ops_except(grads, supported);
  for (OpKind op : autodiff::backward_ops())
    EXPECT_EQ(count(d, op), supported.contains(op) ? 1u : 0u) << ir::op_name(op);
  // Forward composites stay: a backend still decides about those.
  EXPECT_EQ(count(d, OpKind::LayerNorm), count(grads, OpKind::LayerNorm));
  EXPECT_EQ(count(d, OpKind::Softmax), 1u);
  Graph none = autodiff::decompose_backward_ops_except(grads, {});
  for (OpKind op : autodiff::backward_ops()) EXPECT_EQ(count(none, op), 0u) << ir::op_name(op);

  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap in{{"x", testing::random_tensor(DType::F64, {6, 16}, rng)}};
  reference::TensorMap pa{{"gamma", testing::random_tensor(DType::F64, {16}, rng, 0.5, 1.5)},
                          {"beta", testing::random_tensor(DType::F64, {16}, rng)},
                          {"w", testing::random_tensor(DType::F64, {16, 16}, rng, -0.5, 0.5)}};
  auto want = reference::run(grads, in, pa);
  for (const Graph* g : {&d, &none}) {
    auto got = reference::run(*g, in, pa);
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i])) << i;
  }
}

TEST(BackwardOps, CpuRunsThreeNativelyAndDecomposesLogSoftmaxBackward) {
  Graph grads = autodiff::grad(block(DType::F32), {"x", "gamma", "beta", "w"});
  auto compiled = runtime::Session().compile(grads);
  const auto& report = compiled.compile_result().dispatch;
  for (OpKind op : autodiff::backward_ops()) {
    auto it = std::find_if(report.entries.begin(), report.entries.end(),
                           [op](const compile::DispatchEntry& e) { return e.op == op; });
    ASSERT_NE(it, report.entries.end()) << ir::op_name(op);
    EXPECT_EQ(it->tier,
              op == OpKind::LogSoftmaxBackward ? compile::DispatchTier::Decomposed : compile::DispatchTier::Native)
        << ir::op_name(op);
  }
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap in{{"x", testing::random_tensor(DType::F32, {6, 16}, rng)}};
  reference::TensorMap pa{{"gamma", testing::random_tensor(DType::F32, {16}, rng, 0.5, 1.5)},
                          {"beta", testing::random_tensor(DType::F32, {16}, rng)},
                          {"w", testing::random_tensor(DType::F32, {16, 16}, rng, -0.5, 0.5)}};
  for (const auto& [k, v] : pa) compiled.set_param(k, v);
  auto got = compiled.run(in);
  auto want = reference::run(grads, in, pa);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i], {1e-5, 1e-3})) << i;
}

}  // namespace
}  // namespace rlx
