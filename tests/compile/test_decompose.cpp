// decompose must turn every composite into primitives that compute exactly
// what the reference computes for the composite itself.
#include <algorithm>
#include <functional>
#include <optional>
#include <random>

#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::DispatchTier;
using compile::passes::decompose;
using ir::Dim;
using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using ir::Tensor;
using Ints = std::vector<std::int64_t>;

// Builds the graph under test in the given float dtype.
using Build = std::function<void(Graph&, DType)>;
// Makes the value of one input node.
using Gen = std::function<Tensor(const ir::Node&, std::mt19937_64&)>;

Tensor uniform(const ir::Node& n, std::mt19937_64& rng) {
  return testing::random_tensor(n.dtype, n.shape.extents(), rng);
}

bool is_hir_only(OpKind k) {
  return ir::op_info(k).cls == ir::OpClass::Composite || k == OpKind::Squeeze || k == OpKind::Unsqueeze;
}

std::size_t count_ops(const Graph& g, OpKind k) {
  std::size_t c = 0;
  for (const auto& n : g.nodes()) c += n.op == k;
  return c;
}

reference::TensorMap make_inputs(const Graph& g, const Gen& gen) {
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap inputs;
  for (NodeId id : g.input_ids()) inputs[g.node(id).attrs.get_str("name")] = gen(g.node(id), rng);
  return inputs;
}

void expect_same_results(const Graph& got_graph, const Graph& want_graph, const reference::TensorMap& inputs) {
  auto want = reference::run(want_graph, inputs);
  auto got = reference::run(got_graph, inputs);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i])) << "output " << i;
}

// In f32 and f64: decomposes with nothing kept, checks that no HIR-only op is
// left, and that the primitives agree with the composites on random inputs.
void expect_decomposes(const Build& build, const Gen& gen = uniform) {
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(std::string(ir::dtype_name(dt)));
    Graph g;
    build(g, dt);
    ASSERT_TRUE(std::any_of(g.nodes().begin(), g.nodes().end(), [](const ir::Node& n) { return is_hir_only(n.op); }));
    Graph m = decompose(g, {});
    ASSERT_NO_THROW(m.verify());
    for (const auto& n : m.nodes()) EXPECT_FALSE(is_hir_only(n.op)) << ir::describe_node(m, n);
    ASSERT_EQ(m.outputs().size(), g.outputs().size());
    for (std::size_t i = 0; i < g.outputs().size(); ++i) {
      const auto &a = m.node(m.outputs()[i].node), &b = g.node(g.outputs()[i].node);
      EXPECT_EQ(a.dtype, b.dtype);
      EXPECT_EQ(a.shape, b.shape);
      EXPECT_EQ(m.outputs()[i].name, g.outputs()[i].name);
    }
    expect_same_results(m, g, make_inputs(g, gen));
  }
}

TEST(Decompose, Linear) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    expect_decomposes([&](Graph& g, DType dt) {
      NodeId x = g.input("x", {2, 3, 5}, dt), w = g.input("w", {5, 4}, dt);
      g.add_output(g.linear(x, w, bias ? std::optional(g.input("b", {4}, dt)) : std::nullopt), "y");
    });
  }
}

TEST(Decompose, Embedding) {
  expect_decomposes(
      [](Graph& g, DType dt) {
        g.add_output(g.embedding(g.input("table", {7, 3}, dt), g.input("ids", {2, 4}, DType::I64)));
      },
      [](const ir::Node& n, std::mt19937_64& rng) {
        return testing::random_tensor(n.dtype, n.shape.extents(), rng, 0, n.dtype == DType::I64 ? 7 : 2);
      });
}

TEST(Decompose, SoftmaxAndLogSoftmaxOverEachAxis) {
  for (std::int64_t axis : {-1, 0, 1}) {
    SCOPED_TRACE("axis " + std::to_string(axis));
    expect_decomposes([&](Graph& g, DType dt) {
      NodeId x = g.input("x", {3, 4, 5}, dt);
      g.add_output(g.softmax(x, axis));
      g.add_output(g.log_softmax(x, axis));
    });
  }
}

// Naive exp(x) overflows to inf even in f64 here; subtracting the max first does not.
TEST(Decompose, SoftmaxIsNumericallyStable) {
  expect_decomposes(
      [](Graph& g, DType dt) {
        NodeId x = g.input("x", {4, 6}, dt);
        g.add_output(g.softmax(x));
        g.add_output(g.log_softmax(x));
      },
      [](const ir::Node& n, std::mt19937_64& rng) {
        return testing::random_tensor(n.dtype, n.shape.extents(), rng, 1000, 1010);
      });
}

TEST(Decompose, LayerNormVariants) {
  struct Case {
    bool gamma, beta;
    std::int64_t axis;
    double eps;
  };
  for (auto c : {Case{false, false, -1, 1e-5}, Case{true, false, -1, 1e-5}, Case{true, true, -1, 1e-3},
                 Case{true, true, -2, 1e-5}, Case{false, false, 1, 1e-5}}) {
    SCOPED_TRACE("gamma " + std::to_string(c.gamma) + " beta " + std::to_string(c.beta) + " axis " +
                 std::to_string(c.axis));
    expect_decomposes([&](Graph& g, DType dt) {
      Ints xs{2, 3, 4, 5};
      Ints norm(xs.begin() + (c.axis < 0 ? 4 + c.axis : c.axis), xs.end());
      NodeId x = g.input("x", Shape(xs), dt);
      auto gamma = c.gamma ? std::optional(g.input("gamma", Shape(norm), dt)) : std::nullopt;
      auto beta = c.beta ? std::optional(g.input("beta", Shape(norm), dt)) : std::nullopt;
      g.add_output(g.layer_norm(x, gamma, beta, c.eps, c.axis));
    });
  }
}

TEST(Decompose, RmsNorm) {
  for (bool gamma : {false, true}) {
    SCOPED_TRACE(gamma ? "gamma" : "no gamma");
    expect_decomposes([&](Graph& g, DType dt) {
      NodeId x = g.input("x", {3, 2, 8}, dt);
      g.add_output(g.rms_norm(x, gamma ? std::optional(g.input("gamma", {8}, dt)) : std::nullopt, 1e-4));
    });
  }
}

struct ConvCase {
  const char* name;
  std::int64_t c, o, h, w, kh, kw;
  Ints stride, padding, dilation;
  std::int64_t groups;
  bool bias;
};

TEST(Decompose, Conv2dVariants) {
  for (const auto& c : {
           ConvCase{"3x3", 3, 4, 6, 7, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, false},
           ConvCase{"bias", 3, 4, 6, 7, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
           ConvCase{"stride 2", 3, 4, 7, 8, 3, 3, {2, 2}, {0, 0}, {1, 1}, 1, true},
           ConvCase{"padding", 2, 3, 5, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
           ConvCase{"dilation 2", 2, 3, 7, 8, 3, 2, {1, 1}, {0, 0}, {2, 2}, 1, false},
           ConvCase{"groups 2", 4, 6, 5, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},
           ConvCase{"depthwise", 3, 3, 5, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3, false},
           ConvCase{"1x1", 4, 5, 3, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
           ConvCase{"mixed", 4, 2, 9, 8, 3, 2, {2, 3}, {1, 2}, {2, 1}, 2, true},
       }) {
    SCOPED_TRACE(c.name);
    expect_decomposes([&](Graph& g, DType dt) {
      NodeId x = g.input("x", {2, c.c, c.h, c.w}, dt);
      NodeId w = g.input("w", {c.o, c.c / c.groups, c.kh, c.kw}, dt);
      auto b = c.bias ? std::optional(g.input("b", {c.o}, dt)) : std::nullopt;
      g.add_output(g.conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups));
    });
  }
}

TEST(Decompose, Conv1dVariants) {
  for (const auto& c : {
           ConvCase{"k3", 3, 4, 1, 9, 1, 3, {1}, {0}, {1}, 1, false},
           ConvCase{"stride 2 padding bias", 3, 4, 1, 9, 1, 3, {2}, {1}, {1}, 1, true},
           ConvCase{"dilation 2", 2, 3, 1, 10, 1, 3, {1}, {2}, {2}, 1, true},
           ConvCase{"groups 2", 4, 2, 1, 8, 1, 2, {1}, {0}, {1}, 2, false},
       }) {
    SCOPED_TRACE(c.name);
    expect_decomposes([&](Graph& g, DType dt) {
      NodeId x = g.input("x", {2, c.c, c.w}, dt);
      NodeId w = g.input("w", {c.o, c.c / c.groups, c.kw}, dt);
      auto b = c.bias ? std::optional(g.input("b", {c.o}, dt)) : std::nullopt;
      g.add_output(g.conv1d(x, w, b, c.stride[0], c.padding[0], c.dilation[0], c.groups));
    });
  }
}

TEST(Decompose, PoolVariants) {
  struct Case {
    Ints kernel, stride, padding;
  };
  for (const auto& c : {Case{{2, 2}, {2, 2}, {0, 0}}, Case{{3, 3}, {2, 2}, {1, 1}}, Case{{2, 3}, {1, 2}, {1, 1}},
                        Case{{3, 2}, {3, 1}, {0, 1}}}) {
    SCOPED_TRACE("kernel " + std::to_string(c.kernel[0]) + "x" + std::to_string(c.kernel[1]) + " padding " +
                 std::to_string(c.padding[0]) + "," + std::to_string(c.padding[1]));
    expect_decomposes([&](Graph& g, DType dt) {
      NodeId x = g.input("x", {2, 3, 7, 6}, dt);
      g.add_output(g.max_pool2d(x, c.kernel, c.stride, c.padding), "max");
      g.add_output(g.avg_pool2d(x, c.kernel, c.stride, c.padding), "avg");
    });
  }
}

// Bool masks keep key 0 in every row: a fully masked row is NaN by definition.
Tensor attention_input(const ir::Node& n, std::mt19937_64& rng) {
  Tensor t = uniform(n, rng);
  if (n.dtype == DType::Bool)
    for (std::int64_t i = 0; i < t.numel(); i += n.shape.extents().back()) t.set(i, 1);
  return t;
}

TEST(Decompose, AttentionVariants) {
  struct Case {
    const char* name;
    std::int64_t s, skv, dv;
    bool causal;
    double scale;
    std::optional<DType> mask;  // mask of shape mask_shape, in this dtype (nullopt: the float dtype)
    Ints mask_shape;
  };
  for (const auto& c : {
           Case{"plain", 4, 4, 8, false, 0.0, std::nullopt, {}},
           Case{"causal", 5, 5, 8, true, 0.0, std::nullopt, {}},
           Case{"causal, fewer queries", 3, 6, 8, true, 0.0, std::nullopt, {}},
           Case{"causal, more queries", 6, 3, 8, true, 0.0, std::nullopt, {}},
           Case{"custom scale, dv != d", 4, 5, 3, false, 0.3, std::nullopt, {}},
           Case{"bool mask [S,Skv]", 4, 5, 8, false, 0.0, DType::Bool, {4, 5}},
           Case{"bool mask [B,1,S,Skv]", 4, 5, 8, false, 0.0, DType::Bool, {2, 1, 4, 5}},
           Case{"float mask", 4, 5, 8, false, 0.0, DType::F32, {2, 3, 4, 5}},
           Case{"causal + bool mask + scale", 5, 5, 8, true, 0.5, DType::Bool, {1, 3, 5, 5}},
           Case{"causal + float mask", 5, 5, 8, true, 0.0, DType::F32, {5, 5}},
       }) {
    SCOPED_TRACE(c.name);
    expect_decomposes(
        [&](Graph& g, DType dt) {
          NodeId q = g.input("q", {2, 3, c.s, 8}, dt), k = g.input("k", {2, 3, c.skv, 8}, dt);
          NodeId v = g.input("v", {2, 3, c.skv, c.dv}, dt);
          std::optional<NodeId> mask;
          if (c.mask) mask = g.input("mask", Shape(c.mask_shape), *c.mask == DType::Bool ? DType::Bool : dt);
          g.add_output(g.attention(q, k, v, mask, c.causal, c.scale));
        },
        attention_input);
  }
}

TEST(Decompose, SqueezeAndUnsqueezeBecomeReshape) {
  expect_decomposes([](Graph& g, DType dt) {
    NodeId x = g.input("x", {3, 1, 4}, dt);
    NodeId u = g.unsqueeze(x, {0, -1});
    g.add_output(g.relu(u), "u");
    g.add_output(g.squeeze(x, {1}), "s");
  });
  Graph g;
  NodeId x = g.input("x", {3, 1, 4});
  g.add_output(g.squeeze(x, {1}));
  Graph m = decompose(g, {OpKind::Squeeze, OpKind::Unsqueeze});
  EXPECT_EQ(count_ops(m, OpKind::Squeeze), 0u);
  ASSERT_EQ(count_ops(m, OpKind::Reshape), 1u);
  EXPECT_EQ(m.node(m.output_ids()[0]).shape, (Shape{3, 4}));
}

TEST(Decompose, KeepLeavesClaimedCompositesAndReportsTiers) {
  Graph g;
  NodeId x = g.input("x", {2, 4, 6});
  NodeId gamma = g.param("gamma", {6});
  NodeId ln = g.layer_norm(x, gamma, std::nullopt, 1e-5, -1);
  NodeId lin = g.linear(ln, g.param("w", {6, 3}), g.param("b", {3}));
  NodeId sm = g.softmax(lin, 1);
  g.add_output(sm, "probs");
  g.add_output(ln, "normed");

  compile::DispatchReport report{.backend = "cpu"};
  Graph m = decompose(g, {OpKind::LayerNorm, OpKind::Attention}, &report);
  ASSERT_NO_THROW(m.verify());
  EXPECT_EQ(count_ops(m, OpKind::LayerNorm), 1u);
  EXPECT_EQ(count_ops(m, OpKind::Linear), 0u);
  EXPECT_EQ(count_ops(m, OpKind::Softmax), 0u);
  const auto& kept = m.node(m.outputs()[1].node);
  EXPECT_EQ(kept.op, OpKind::LayerNorm);
  EXPECT_EQ(kept.attrs, g.node(ln).attrs);
  ASSERT_EQ(kept.inputs.size(), 2u);
  EXPECT_EQ(m.node(kept.inputs[1]).attrs.get_str("name"), "gamma");

  ASSERT_EQ(report.entries.size(), 3u);
  const auto &e0 = report.entries[0], &e1 = report.entries[1], &e2 = report.entries[2];
  EXPECT_EQ(e0.hir_node, ln);
  EXPECT_EQ(e0.op, OpKind::LayerNorm);
  EXPECT_EQ(e0.tier, DispatchTier::Native);
  EXPECT_EQ(e0.reason, "cpu claims layer_norm natively");
  EXPECT_EQ(e1.hir_node, lin);
  EXPECT_EQ(e1.tier, DispatchTier::Decomposed);
  EXPECT_EQ(e1.reason, "decomposed into 2 primitives");  // matmul, add
  EXPECT_EQ(e2.hir_node, sm);
  EXPECT_EQ(e2.op, OpKind::Softmax);
  EXPECT_EQ(e2.tier, DispatchTier::Decomposed);
  EXPECT_EQ(e2.reason, "decomposed into 5 primitives");  // reduce_max, sub, exp, reduce_sum, div

  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap inputs{{"x", testing::random_tensor(DType::F32, {2, 4, 6}, rng)}};
  reference::TensorMap params{{"gamma", testing::random_tensor(DType::F32, {6}, rng)},
                              {"w", testing::random_tensor(DType::F32, {6, 3}, rng)},
                              {"b", testing::random_tensor(DType::F32, {3}, rng)}};
  auto want = reference::run(g, inputs, params), got = reference::run(m, inputs, params);
  ASSERT_EQ(got.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i]));
}

TEST(Decompose, PrimitiveGraphIsCopiedUnchanged) {
  Graph g;
  NodeId x = g.input("x", {2, 3});
  g.add_output(g.exp(g.sum(x, {1}, true)), "y");
  compile::DispatchReport report{.backend = "cpu"};
  Graph m = decompose(g, {}, &report);
  EXPECT_TRUE(report.entries.empty());
  ASSERT_EQ(m.size(), g.size());
  for (NodeId i = 0; i < g.size(); ++i) {
    EXPECT_EQ(m.node(i).op, g.node(i).op);
    EXPECT_EQ(m.node(i).inputs, g.node(i).inputs);
    EXPECT_EQ(m.node(i).attrs, g.node(i).attrs);
  }
  EXPECT_EQ(m.outputs()[0].name, "y");
}

// Row-wise composites need no static extents: the batch dim stays symbolic
// through decomposition, and both graphs agree once it is bound.
TEST(Decompose, SymbolicBatchSurvives) {
  Graph g;
  Shape xs(std::vector<Dim>{Dim::symbol("B"), Dim(3), Dim(6)});
  NodeId x = g.input("x", xs);
  NodeId y = g.layer_norm(x, std::nullopt, std::nullopt, 1e-5, -2);
  g.add_output(g.rms_norm(g.softmax(y, -1), std::nullopt));
  NodeId q = g.input("q", Shape(std::vector<Dim>{Dim::symbol("B"), Dim(2), Dim::symbol("S"), Dim(4)}));
  g.add_output(g.attention(q, q, q, std::nullopt, true, 0.0));
  Graph m = decompose(g, {});
  EXPECT_EQ(m.node(m.output_ids()[0]).shape, xs);
  std::vector<std::pair<std::string, std::int64_t>> bind{{"B", 3}, {"S", 5}};
  Graph gb = ir::bind_symbols(g, bind), mb = ir::bind_symbols(m, bind);
  expect_same_results(mb, gb, make_inputs(gb, uniform));
}

TEST(Decompose, DefaultScaleNeedsStaticHeadDim) {
  Graph g;
  NodeId q = g.input("q", Shape(std::vector<Dim>{Dim(1), Dim(1), Dim(4), Dim::symbol("D")}));
  g.add_output(g.attention(q, q, q));
  try {
    decompose(g, {});
    FAIL() << "expected rlx::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("attention"), std::string::npos) << msg;
    EXPECT_NE(msg.find("symbolic"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace rlx
