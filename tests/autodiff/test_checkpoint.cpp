// Gradient checkpointing: the same gradients as without it (bit for bit on
// the reference, which recomputes the same operations), and a smaller arena
// for a deep MLP compiled for the CPU, because cse keeps the recomputed
// forward values apart from the forward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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

// A deep MLP (linear + relu per layer) under loss = mean(y^2).
Graph deep_mlp(DType t, int layers = 16, std::int64_t batch = 256, std::int64_t width = 64) {
  Graph g("deep_mlp");
  NodeId h = g.input("x", {batch, width}, t);
  for (int l = 0; l < layers; ++l) {
    auto w = g.param("w" + std::to_string(l), ir::Shape{width, width}, t);
    auto b = g.param("b" + std::to_string(l), ir::Shape{width}, t);
    h = g.linear(h, w, b);
    if (l + 1 < layers) h = g.relu(h);
  }
  g.add_output(g.mean(g.mul(h, h), {0, 1}), "loss");
  return g;
}

// He-scaled weights keep the activations O(1) through the layers.
std::pair<reference::TensorMap, reference::TensorMap> values(const Graph& g, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  reference::TensorMap in, pa;
  for (const auto& n : g.nodes()) {
    if (n.op != OpKind::Input && n.op != OpKind::Param) continue;
    double a = n.op == OpKind::Input ? 1.0 : std::sqrt(6.0 / double(n.shape[0].size));
    (n.op == OpKind::Input ? in : pa)[n.attrs.get_str("name")] =
        testing::random_tensor(n.dtype, n.shape.extents(), rng, -a, a);
  }
  return {in, pa};
}

std::vector<std::string> wrt_all(const Graph& g) {
  std::vector<std::string> w{"x"};
  for (auto id : g.param_ids()) w.push_back(g.node(id).attrs.get_str("name"));
  return w;
}

autodiff::Options every(std::int64_t n) {
  autodiff::Options o;
  o.checkpoint.every = n;
  return o;
}

TEST(Checkpoint, SameGradientsOnTheReference) {
  Graph g = deep_mlp(DType::F64, 6, 4, 8);
  auto [inputs, params] = values(g, testing::test_seed());
  auto wrt = wrt_all(g);
  auto plain = reference::run(autodiff::value_and_grad(g, wrt), inputs, params);
  autodiff::Options named;  // every other relu ends a segment
  int relus = 0;
  for (const auto& n : g.nodes())
    if (n.op == OpKind::Relu && relus++ % 2) named.checkpoint.boundaries.insert(n.id);
  ASSERT_FALSE(named.checkpoint.boundaries.empty());
  for (const auto& options : {every(1), every(2), every(5), every(1000), named}) {
    Graph cg = autodiff::value_and_grad(g, wrt, options);
    EXPECT_TRUE(std::any_of(cg.nodes().begin(), cg.nodes().end(), [](const ir::Node& n) {
                  return n.origin == "recompute";
                }) == (options.checkpoint.every != 1000));
    auto got = reference::run(cg, inputs, params);
    ASSERT_EQ(got.size(), plain.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], plain[i]) << cg.outputs()[i].name;
  }
}

// Selectors (where's condition, indices) and composites with dedicated
// backward ops are recomputed too.
TEST(Checkpoint, SelectorsAndCompositesAreRecomputed) {
  Graph g("mixed");
  NodeId x = g.input("x", {4, 6}, DType::F64);
  NodeId w = g.param("w", ir::Shape{6, 6}, DType::F64);
  NodeId h = g.layer_norm(g.matmul(x, w), std::nullopt, std::nullopt);
  NodeId leaky = g.where(g.binary(OpKind::Gt, h, g.scalar(0, DType::F64)), h, g.mul(h, g.scalar(0.1, DType::F64)));
  NodeId p = g.softmax(g.matmul(leaky, w), -1);
  NodeId picked = g.gather(p, g.argmax(p, 1, true), 1);
  g.add_output(g.sum(g.unary(OpKind::Log, picked), {0, 1}), "loss");
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap in{{"x", testing::random_tensor(DType::F64, {4, 6}, rng)}};
  reference::TensorMap pa{{"w", testing::random_tensor(DType::F64, {6, 6}, rng, -1, 1)}};
  auto plain = reference::run(autodiff::grad(g, {"w", "x"}), in, pa);
  for (std::int64_t n : {1, 2, 3}) {
    auto got = reference::run(autodiff::grad(g, {"w", "x"}, every(n)), in, pa);
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], plain[i]) << "every " << n;
  }
}

compile::CompileResult compile_cpu(const Graph& g) { return runtime::Session().compile(g).compile_result(); }

std::size_t recomputed_nodes(const Graph& mir) {
  return std::size_t(std::count_if(mir.nodes().begin(), mir.nodes().end(),
                                   [](const ir::Node& n) { return n.origin.starts_with("recompute"); }));
}

TEST(CheckpointCompiled, DeepMlpArenaShrinksAndGradientsMatch) {
  Graph g = deep_mlp(DType::F32);
  auto wrt = wrt_all(g);
  auto [inputs, params] = values(g, testing::test_seed());
  Graph plain = autodiff::grad(g, wrt);
  auto base = compile_cpu(plain);
  EXPECT_EQ(recomputed_nodes(base.mir), 0u);
  auto run = [&](const Graph& grads) {
    auto compiled = runtime::Session().compile(grads);
    for (const auto& [k, v] : params) compiled.set_param(k, v);
    return compiled.run(inputs);
  };
  auto want = run(plain);
  for (std::int64_t n : {4, 8, 16}) {
    SCOPED_TRACE("every " + std::to_string(n));
    Graph cg = autodiff::grad(g, wrt, every(n));
    auto res = compile_cpu(cg);
    EXPECT_GT(recomputed_nodes(res.mir), 0u) << "cse merged the recomputation back into the forward pass";
    EXPECT_LT(res.lir.memory.arena_bytes, base.lir.memory.arena_bytes);
    auto got = run(cg);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(testing::tensors_close(got[i], want[i], {1e-6, 1e-5})) << cg.outputs()[i].name;
  }
}

}  // namespace
}  // namespace rlx
