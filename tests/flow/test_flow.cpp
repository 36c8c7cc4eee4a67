// Blocks: LayerStage / FlowCtx / ModelFlow build ordinary graphs that compile
// with Session and match the reference; errors name the stage.
#include <gtest/gtest.h>

#include "rlx/error.hpp"
#include "rlx/flow/flow.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

using namespace rlx;
using flow::FlowCtx;
using flow::FlowValue;
using flow::LayerStage;
using flow::ModelFlow;
using flow::StageArtifacts;
using ir::DType;
using reference::TensorMap;

namespace {

// The example of docs/extending.md: a gated MLP block.
struct GatedMlp : LayerStage {
  std::string gate, up, down;
  std::int64_t hidden;
  GatedMlp(std::string gate, std::string up, std::string down, std::int64_t hidden)
      : gate(std::move(gate)), up(std::move(up)), down(std::move(down)), hidden(hidden) {}

  std::string_view name() const override { return "gated_mlp"; }
  std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    std::int64_t width = x.shape()[x.shape().rank() - 1].size;
    FlowValue g = ctx.silu(ctx.linear(x, gate, hidden));
    FlowValue u = ctx.linear(x, up, hidden);
    FlowValue out = ctx.linear(ctx.mul(g, u), down, width);
    return {out, StageArtifacts::hidden_only(out.shape())};
  }
};

// Pre-norm residual around an activation, dropping to raw IR for a clamp,
// and publishing the normed value as a side output.
struct NormResidual : LayerStage {
  std::string prefix, act;
  explicit NormResidual(std::string prefix, std::string act = "gelu")
      : prefix(std::move(prefix)), act(std::move(act)) {}

  std::string_view name() const override { return "norm_residual"; }
  std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    FlowValue h = ctx.rms_norm(x, prefix + ".norm");
    ctx.publish_side_output(prefix + ".normed", h);
    FlowValue f = ctx.activation(ctx.linear(h, prefix + ".proj", x.shape()[1].size, true), act);
    f = ctx.value(ctx.hir().clamp(f.id(), -4.0, 4.0));
    FlowValue out = ctx.residual(x, f);
    return {out, StageArtifacts::hidden_only(out.shape())};
  }
};

TensorMap random_map(const ir::Graph& g, ir::OpKind kind, std::mt19937_64& rng) {
  TensorMap m;
  for (const auto& n : g.nodes())
    if (n.op == kind)
      m.emplace(n.attrs.get_str("name"), rlx::testing::random_tensor(n.dtype, n.shape.extents(), rng, -1, 1));
  return m;
}

// Compiles on the CPU backend and checks every output against the reference.
void expect_runs_like_reference(const ir::Graph& g) {
  std::mt19937_64 rng(rlx::testing::test_seed());
  TensorMap inputs = random_map(g, ir::OpKind::Input, rng), params = random_map(g, ir::OpKind::Param, rng);
  auto compiled = Session(Device::Cpu).compile(g);
  for (const auto& [name, t] : params) compiled.set_param(name, t);
  auto got = compiled.run(inputs);
  auto want = reference::run(g, inputs, params);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(rlx::testing::tensors_close(got[i], want[i])) << "output " << g.outputs()[i].name;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Flow, GatedMlpCompilesAndMatchesReference) {
  auto model = ModelFlow::create("my_model")
                   .input("x", {4, 16})
                   .layer_stage(GatedMlp("mlp.gate", "mlp.up", "mlp.down", 32))
                   .build();
  EXPECT_EQ(model.graph.name(), "my_model");
  EXPECT_EQ(model.output_names(), std::vector<std::string>{"hidden"});
  ASSERT_EQ(model.stages.size(), 1u);
  EXPECT_EQ(model.stages[0].name, "gated_mlp");
  EXPECT_EQ(model.stages[0].artifacts.hidden, (ir::Shape{4, 16}));
  std::vector<std::string> params;
  for (auto id : model.graph.param_ids()) params.push_back(model.graph.node(id).attrs.get_str("name"));
  EXPECT_EQ(params, (std::vector<std::string>{"mlp.gate.weight", "mlp.up.weight", "mlp.down.weight"}));
  EXPECT_EQ(model.graph.node(model.graph.find_param("mlp.down.weight")).shape, (ir::Shape{32, 16}));
  expect_runs_like_reference(model.graph);
}

TEST(Flow, StagesChainAndSideOutputsFollowThePrimary) {
  auto model = ModelFlow::create("stack")
                   .input("x", {3, 8})
                   .layer_stage(NormResidual("l0"))
                   .layer_stage(std::make_unique<GatedMlp>(GatedMlp("ffn.g", "ffn.u", "ffn.d", 12)))
                   .layer_stage(NormResidual("l1", "silu"))
                   .output("y")
                   .build();
  EXPECT_EQ(model.output_names(), (std::vector<std::string>{"y", "l0.normed", "l1.normed"}));
  ASSERT_EQ(model.stages.size(), 3u);
  EXPECT_EQ(model.stages[1].name, "gated_mlp");
  expect_runs_like_reference(model.graph);
}

TEST(Flow, RepeatedParamNamesShareOneWeight) {
  struct Tied : LayerStage {
    std::string_view name() const override { return "tied"; }
    std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
      FlowValue out = ctx.linear(ctx.relu(ctx.linear(x, "shared", 6)), "shared", 6);
      return {out, StageArtifacts::hidden_only(out.shape())};
    }
  };
  auto model = ModelFlow::create("tied").input("x", {2, 6}).layer_stage(Tied{}).build();
  EXPECT_EQ(model.graph.param_ids().size(), 1u);
  expect_runs_like_reference(model.graph);
}

TEST(Flow, ExtraInputsAndCastsAreReachable) {
  struct Masked : LayerStage {
    std::string_view name() const override { return "masked"; }
    std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
      FlowValue keep = ctx.cast(ctx.input("keep"), DType::F32);
      FlowValue out = ctx.sub(ctx.mul(ctx.matmul(x, ctx.param("w", {5, 5})), keep), ctx.param("shift", {5}));
      return {out, StageArtifacts::hidden_only(out.shape())};
    }
  };
  auto model =
      ModelFlow::create("masked").input("x", {3, 5}).input("keep", {3, 1}, DType::Bool).layer_stage(Masked{}).build();
  EXPECT_EQ(model.graph.input_ids().size(), 2u);
  expect_runs_like_reference(model.graph);
}

TEST(FlowErrors, UnknownActivationNamesTheStage) {
  auto flow = ModelFlow::create("m").input("x", {2, 4}).layer_stage(NormResidual("l0", "swish"));
  std::string e = error_of([&] { flow.build(); });
  EXPECT_NE(e.find("model 'm', stage 0 'norm_residual': unknown activation kind 'swish' (known: relu, gelu"),
            std::string::npos)
      << e;
}

TEST(FlowErrors, ShapeMismatchNamesTheStage) {
  struct BadResidual : LayerStage {
    std::string_view name() const override { return "bad_residual"; }
    std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
      FlowValue out = ctx.residual(x, ctx.linear(x, "proj", 3));
      return {out, StageArtifacts::hidden_only(out.shape())};
    }
  };
  std::string e = error_of([] {
    ModelFlow::create("m")
        .input("x", {2, 4})
        .layer_stage(GatedMlp("a", "b", "c", 8))
        .layer_stage(BadResidual{})
        .build();
  });
  EXPECT_NE(e.find("model 'm', stage 1 'bad_residual': residual: shape mismatch between x f32[2,4] and f(x) f32[2,3]"),
            std::string::npos)
      << e;

  // An error raised by the graph builders underneath is prefixed the same way.
  struct BadAdd : LayerStage {
    std::string_view name() const override { return "bad_add"; }
    std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
      FlowValue out = ctx.add(x, ctx.param("b", {3}));
      return {out, StageArtifacts::hidden_only(out.shape())};
    }
  };
  e = error_of([] { ModelFlow::create("m").input("x", {2, 4}).layer_stage(BadAdd{}).build(); });
  EXPECT_TRUE(e.starts_with("model 'm', stage 0 'bad_add': ")) << e;
  EXPECT_NE(e.find("[2,4]"), std::string::npos) << e;
  EXPECT_NE(e.find("[3]"), std::string::npos) << e;
}

TEST(FlowErrors, ConflictingParamDeclaration) {
  struct Conflict : LayerStage {
    std::string_view name() const override { return "conflict"; }
    std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
      ctx.linear(x, "p", 4);
      FlowValue out = ctx.linear(x, "p", 5);
      return {out, StageArtifacts::hidden_only(out.shape())};
    }
  };
  std::string e = error_of([] { ModelFlow::create("m").input("x", {2, 4}).layer_stage(Conflict{}).build(); });
  EXPECT_NE(e.find("stage 0 'conflict': param 'p.weight' is already declared as f32[4,4], requested f32[4,5]"),
            std::string::npos)
      << e;
}

TEST(FlowErrors, ArtifactsMustDescribeTheOutput) {
  struct Liar : LayerStage {
    std::string_view name() const override { return "liar"; }
    std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
      return {ctx.relu(x), StageArtifacts::hidden_only({7})};
    }
  };
  std::string e = error_of([] { ModelFlow::create("m").input("x", {2, 4}).layer_stage(Liar{}).build(); });
  EXPECT_NE(e.find("stage 0 'liar': artifacts declare the hidden shape [7] but the stage returned f32[2,4]"),
            std::string::npos)
      << e;
}

TEST(FlowErrors, SideOutputNamesMustBeUnique) {
  std::string e = error_of([] {
    ModelFlow::create("m").input("x", {2, 4}).layer_stage(NormResidual("a")).layer_stage(NormResidual("a")).build();
  });
  EXPECT_NE(e.find("stage 1 'norm_residual': side output 'a.normed' clashes"), std::string::npos) << e;
  e = error_of([] {
    ModelFlow::create("m").input("x", {2, 4}).layer_stage(NormResidual("a")).output("a.normed").build();
  });
  EXPECT_NE(e.find("stage 0 'norm_residual': side output 'a.normed' clashes"), std::string::npos) << e;
}

TEST(FlowErrors, FlowNeedsAnInputAndAStage) {
  EXPECT_NE(error_of([] {
              ModelFlow::create("m").layer_stage(GatedMlp("a", "b", "c", 8)).build();
            }).find("model 'm': no input"),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelFlow::create("m").input("x", {2}).build(); }).find("model 'm': no layer stage"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { ModelFlow::create("m").input("x", {2}).input("x", {3}); }).find("input 'x' is declared twice"),
      std::string::npos);
}

TEST(FlowErrors, FlowCtxStandsAloneOverAGraph) {
  ir::Graph g("raw");
  FlowCtx ctx(g, "my block");
  FlowValue x = ctx.value(g.input("x", {2, 3}));
  EXPECT_EQ(ctx.gelu(x).shape(), (ir::Shape{2, 3}));
  EXPECT_EQ(error_of([&] { ctx.linear(x, "p", 0); }), "my block: linear 'p' needs out_features >= 1, got 0");
  EXPECT_NE(error_of([&] { ctx.value(99); }).find("my block: node %99 does not exist"), std::string::npos);
  ctx.publish_side_output("tap", x);
  EXPECT_EQ(error_of([&] { ctx.publish_side_output("tap", x); }), "my block: side output 'tap' is published twice");
}

}  // namespace
