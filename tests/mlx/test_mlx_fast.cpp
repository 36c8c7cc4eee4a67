// The composites the MLX backend claims (traits().native_ops): softmax, layer_norm, rms_norm, attention and the
// convolutions stay whole through the pipeline and run as MLX's own kernels (mx::softmax, mx::fast::layer_norm /
// rms_norm / scaled_dot_product_attention, mx::conv_general; lower.cpp) instead of their decompositions. Checked on the
// LIR (one native kernel holding the op, nothing on the host), and against the float64 reference through the
// conformance harness (fresh inputs into NaN-poisoned outputs, twice), then with NaN and -inf rows and fully masked
// attention rows, where the op table's contract (NaN in, NaN out; 0/0 for a row with nothing to attend to) must hold.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "conformance/harness.hpp"
#include "rlx/backends/mlx/mlx_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::mlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::OpKind;
using ir::Shape;
using runtime::Device;

struct Case {
  Graph graph;
  OpKind op;  // the composite that must stay whole
};

// Each claimed composite on its own, in the shapes its lowering treats differently: softmax along the last and a
// middle axis; layer_norm over one and two trailing axes (flattened for mx::fast), with and without gamma and
// beta; rms_norm with and without gamma; attention plain, causal with equal lengths (MLX's "causal" mode) and
// unequal ones (RLX's top-left mask, built here), with bool and float masks, grouped KV heads and a given scale;
// and f16 values (computed in f32 through the casts the traits ask for).
std::vector<Case> cases() {
  std::vector<Case> cs;
  auto one = [&](const char* name, OpKind op, Shape s, DType t, auto&& build) {
    Graph g(name);
    auto x = g.input("x", s, t);
    g.add_output(build(g, x), "y");
    cs.push_back({std::move(g), op});
  };
  one("softmax rows of 300", OpKind::Softmax, Shape{7, 300}, DType::F32, [](Graph& g, auto x) { return g.softmax(x); });
  one("softmax over a middle axis", OpKind::Softmax, Shape{3, 37, 40}, DType::F32,
      [](Graph& g, auto x) { return g.softmax(x, 1); });
  one("softmax f16", OpKind::Softmax, Shape{4, 50}, DType::F16, [](Graph& g, auto x) { return g.softmax(x); });
  one("layer_norm over two axes, gamma and beta", OpKind::LayerNorm, Shape{2, 3, 16, 12}, DType::F32,
      [](Graph& g, auto x) {
        return g.layer_norm(x, g.param("gamma", Shape{16, 12}), g.param("beta", Shape{16, 12}), 1e-5, -2);
      });
  one("layer_norm alone", OpKind::LayerNorm, Shape{5, 64}, DType::F32,
      [](Graph& g, auto x) { return g.layer_norm(x, std::nullopt, std::nullopt, 1e-3, -1); });
  one("layer_norm with gamma only", OpKind::LayerNorm, Shape{6, 33}, DType::F32,
      [](Graph& g, auto x) { return g.layer_norm(x, g.param("gamma", Shape{33}), std::nullopt); });
  one("rms_norm with gamma", OpKind::RmsNorm, Shape{6, 100}, DType::F32,
      [](Graph& g, auto x) { return g.rms_norm(x, g.param("gamma", Shape{100}), 1e-6); });
  one("rms_norm alone", OpKind::RmsNorm, Shape{2, 3, 17}, DType::F32,
      [](Graph& g, auto x) { return g.rms_norm(x, std::nullopt, 1e-5); });
  auto attn = [&](const char* name, Shape q, Shape kv, auto&& build) {
    Graph g(name);
    g.add_output(build(g, g.input("x", q), g.input("k", kv), g.input("v", kv)), "y");
    cs.push_back({std::move(g), OpKind::Attention});
  };
  attn("attention", Shape{2, 4, 16, 8}, Shape{2, 4, 16, 8},
       [](Graph& g, auto q, auto k, auto v) { return g.attention(q, k, v); });
  attn("attention, causal, equal lengths", Shape{1, 2, 12, 16}, Shape{1, 2, 12, 16},
       [](Graph& g, auto q, auto k, auto v) { return g.attention(q, k, v, std::nullopt, true); });
  attn("attention, causal, 5 queries over 9 keys", Shape{1, 2, 5, 8}, Shape{1, 2, 9, 8},
       [](Graph& g, auto q, auto k, auto v) { return g.attention(q, k, v, std::nullopt, true); });
  attn("attention, bool mask broadcast over heads", Shape{2, 3, 6, 8}, Shape{2, 3, 7, 8},
       [](Graph& g, auto q, auto k, auto v) {
         return g.attention(q, k, v, g.input("mask", Shape{2, 1, 6, 7}, DType::Bool));
       });
  attn("attention, float mask and causal, scale 0.2", Shape{1, 2, 6, 8}, Shape{1, 2, 6, 8},
       [](Graph& g, auto q, auto k, auto v) {
         return g.attention(q, k, v, g.input("mask", Shape{6, 6}), true, 0.2);
       });
  attn("attention, grouped KV heads", Shape{1, 4, 5, 8}, Shape{1, 2, 5, 8},
       [](Graph& g, auto q, auto k, auto v) { return g.attention(q, k, v); });
  {
    Graph g("attention f16");
    auto q = g.input("x", Shape{1, 2, 4, 8}, DType::F16);
    g.add_output(
        g.attention(q, g.input("k", Shape{1, 2, 4, 8}, DType::F16), g.input("v", Shape{1, 2, 4, 8}, DType::F16)), "y");
    cs.push_back({std::move(g), OpKind::Attention});
  }
  // Convolutions, channels-last in MLX through transposes: stride, padding, groups and a bias; dilation in 1D.
  {
    Graph g("conv2d, stride 2, padding 1, 2 groups, bias");
    auto x = g.input("x", Shape{2, 4, 9, 8});
    g.add_output(g.conv2d(x, g.param("w", Shape{6, 2, 3, 3}), g.param("b", Shape{6}), {2, 2}, {1, 1}, {1, 1}, 2), "y");
    cs.push_back({std::move(g), OpKind::Conv2d});
  }
  {
    Graph g("conv1d, dilation 2, no bias");
    auto x = g.input("x", Shape{3, 5, 20});
    g.add_output(g.conv1d(x, g.param("w", Shape{4, 5, 3}), std::nullopt, 1, 2, 2, 1), "y");
    cs.push_back({std::move(g), OpKind::Conv1d});
  }
  return cs;
}

// The compiled graph's LIR: one native kernel whose body holds `op` (not its decomposition: no reduction
// kernels), and the MLX lowering takes every kernel (profiled, none runs on the host).
void expect_native(const Case& c, runtime::CompiledGraph& exe, const reference::TensorMap& inputs) {
  const auto& lir = exe.compile_result().lir;
  std::size_t holding = 0;
  for (const auto& k : lir.kernels) {
    EXPECT_NE(k.kind, compile::KernelKind::Reduce) << k.name << ": decomposed";
    if (k.kind != compile::KernelKind::Native) continue;
    for (const auto& n : k.body.nodes()) holding += n.op == c.op;
  }
  EXPECT_EQ(holding, 1u) << ir::op_name(c.op) << " is not one native kernel";
  exe.set_profiling(true);
  std::vector<runtime::NamedTensor> named;
  for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
  exe.run(named);
  const auto times = exe.kernel_times();
  EXPECT_EQ(times.size(), lir.kernels.size());
  for (const auto& t : times) EXPECT_FALSE(t.host) << t.kernel << " ran on the host";
  exe.set_profiling(false);
}

class MlxFast : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
  // Random values for every input and param of `g` (masks: a coin per element).
  static reference::TensorMap values(const Graph& g, const std::vector<ir::NodeId>& ids, std::mt19937_64& rng) {
    reference::TensorMap m;
    for (auto id : ids) {
      const auto& n = g.node(id);
      m[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), rng, -3, 3);
    }
    return m;
  }
};

TEST(MlxFastTraits, TheClaimedCompositesStayWhole) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    const auto lir = compile::compile(c.graph, traits(), {}).lir;
    std::size_t native = 0;
    for (const auto& k : lir.kernels) {
      EXPECT_NE(k.kind, compile::KernelKind::Reduce) << k.name;
      native += k.kind == compile::KernelKind::Native;
    }
    EXPECT_EQ(native, 1u);
  }
  // Rope and log_softmax are decomposed: MLX's rope makes its own angles, and MLX has no log_softmax kernel.
  Graph g("log_softmax");
  g.add_output(g.log_softmax(g.input("x", Shape{4, 9})), "y");
  for (const auto& k : compile::compile(g, traits(), {}).lir.kernels) EXPECT_NE(k.kind, compile::KernelKind::Native);
}

// Through the conformance harness: fresh random inputs into NaN-poisoned outputs, twice, against float64.
TEST_F(MlxFast, MatchTheReferenceIntoPoisonedOutputs) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    conformance::Check check;
    check.seed = testing::test_seed();
    check.label = c.graph.name();
    check.gens["mask"] = [](DType t, const conformance::Ints& s, std::mt19937_64& rng) {
      // Bool masks keep at least the first key of every row (a fully masked row is the next test's).
      ir::Tensor m = t == DType::Bool ? conformance::bools(0.6)(t, s, rng) : conformance::uniform(-1, 1)(t, s, rng);
      if (t == DType::Bool)
        for (std::int64_t i = 0; i < m.numel(); i += s.back()) m.set(i, 1.0);
      return m;
    };
    if (c.graph.node(c.graph.input_ids()[0]).dtype == DType::F16) check.tol = testing::Tolerance{1e-2, 1e-2};
    EXPECT_TRUE(conformance::matches_reference(Device::Mlx, c.graph, check));
  }
}

// NaN in a row, a row of -inf and a fully masked attention row keep the op table's results: NaN where the
// reference has NaN (tensors_close lets NaN pass only there), every other element close, none left poisoned.
TEST_F(MlxFast, SpecialRowsKeepTheContract) {
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases()) {
    if (c.op == OpKind::Conv1d || c.op == OpKind::Conv2d) continue;  // the row ops' and attention's contract
    SCOPED_TRACE(c.graph.name());
    const Graph& g = c.graph;
    auto inputs = values(g, g.input_ids(), rng);
    const auto params = values(g, g.param_ids(), rng);
    ir::Tensor& x = inputs.at("x");
    const std::int64_t row = x.shape().back();
    if (c.op == OpKind::Attention) {
      // Query 0 of every head sees NaN; with a bool mask, query 1 of batch 0 sees no key at all.
      for (std::int64_t i = 0; i < x.numel(); i += x.shape()[2] * row) x.set(i, std::nan(""));
      if (auto m = inputs.find("mask"); m != inputs.end() && m->second.dtype() == DType::Bool)
        for (std::int64_t j = 0; j < m->second.shape().back(); ++j) m->second.set(m->second.shape().back() + j, 0.0);
    } else {
      x.set(1, std::nan(""));
      for (std::int64_t j = 0; j < row && row + j < x.numel(); ++j)
        x.set(row + j, -std::numeric_limits<double>::infinity());
    }
    const auto want = reference::run(g, inputs, params);
    auto exe = runtime::Session(Device::Mlx).compile(g);
    for (const auto& [name, t] : params) exe.set_param(name, t);
    std::vector<ir::Tensor> got{conformance::poisoned(want[0].dtype(), want[0].shape())};
    std::vector<runtime::NamedTensor> named;
    for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
    exe.run_into(named, got);
    const auto tol =
        want[0].dtype() == DType::F16 ? testing::Tolerance{1e-2, 1e-2} : testing::tolerance_for(DType::F32);
    EXPECT_TRUE(testing::tensors_close(got[0], want[0], tol));
    std::int64_t nan = 0;
    for (std::int64_t i = 0; i < want[0].numel(); ++i) nan += std::isnan(want[0].get(i));
    EXPECT_GT(nan, 0) << "the special rows reach the output";
    EXPECT_LT(nan, want[0].numel()) << "and not all of it";
  }
}

TEST_F(MlxFast, RunAsMlxKernelsNotOnTheHost) {
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    auto exe = runtime::Session(Device::Mlx).compile(c.graph);
    for (const auto& [name, t] : values(c.graph, c.graph.param_ids(), rng)) exe.set_param(name, t);
    expect_native(c, exe, values(c.graph, c.graph.input_ids(), rng));
  }
}

}  // namespace
}  // namespace rlx::backends::mlx
