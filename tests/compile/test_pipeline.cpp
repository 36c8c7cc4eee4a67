// The compile pipeline: pass order and records, inspect/dump hooks, user
// passes, error attribution, and end-to-end equivalence with the reference.
#include <atomic>
#include <random>

#include "compile/lir_exec.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::CompileOptions;
using compile::KernelKind;
using ir::OpKind;
using ir::Shape;

ir::Graph mlp() {
  ir::Graph g("mlp");
  auto x = g.input("x", Shape{2, 3, 8});
  auto h = g.linear(x, g.param("w1", Shape{8, 16}), g.param("b1", Shape{16}));
  h = g.unary(OpKind::Gelu, h);
  h = g.layer_norm(h, g.param("gamma", Shape{16}), std::nullopt);
  g.add_output(g.softmax(g.linear(h, g.param("w2", Shape{16, 4})), -1), "probs");
  return g;
}

std::vector<std::string> names(const compile::CompileResult& r) {
  std::vector<std::string> v;
  for (const auto& p : r.passes) v.push_back(p.name);
  return v;
}

void expect_matches_reference(const ir::Graph& hir, const compile::CompileResult& r) {
  EXPECT_TRUE(testing::check_contract(r.lir)) << r.lir.to_text();
  std::mt19937_64 rng(testing::test_seed());
  auto [in, params] = testing::random_feeds(hir, rng);
  auto want = reference::run(hir, in, params);
  auto got = testing::run_lir(r.lir, in, params);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(testing::tensors_close(got[i], want[i])) << "output " << i << "\n" << r.lir.to_text();
}

// Off until a test switches it on: registered passes stay for the whole process.
std::atomic<int> user_pass_runs{0};
std::atomic<bool> user_pass_fails{false};
struct CountingPass : compile::Pass {
  std::string_view name() const override { return "count_nodes"; }
  ir::Graph run(const ir::Graph& g) const override {
    ++user_pass_runs;
    if (user_pass_fails) throw Error("deliberate failure");
    return g;
  }
};

TEST(Pipeline, RunsPassesInOrderAndMatchesReference) {
  auto hir = mlp();
  auto r = compile::compile(hir, testing::all_primitives(), {});
  auto n = names(r);
  auto pos = [&](const std::string& s) { return std::find(n.begin(), n.end(), s) - n.begin(); };
  for (const char* p : {"decompose", "legalize_broadcast", "const_fold", "algebraic_simplify", "cse", "dce", "verify",
                        "lower_to_lir", "plan_memory"})
    EXPECT_LT(pos(p), std::ptrdiff_t(n.size())) << p;
  EXPECT_LT(pos("decompose"), pos("legalize_broadcast"));
  EXPECT_LT(pos("legalize_broadcast"), pos("const_fold"));
  EXPECT_LT(pos("dce"), pos("verify"));
  EXPECT_EQ(n.back(), "plan_memory");
  EXPECT_EQ(r.passes[std::size_t(pos("decompose"))].nodes_before, hir.size());
  EXPECT_EQ(r.hir.size(), hir.size());
  EXPECT_EQ(r.lir.kernels.size(), r.fusion.size());
  EXPECT_GE(r.total_millis, 0.0);
  ASSERT_FALSE(r.lir.kernels.empty());
  EXPECT_EQ(r.lir.kernels[0].name, "k0_matmul: matmul+add+gelu");  // across the batch-flattening reshapes
  expect_matches_reference(hir, r);
}

TEST(Pipeline, OptimizeOffSkipsTheOptimizationPasses) {
  CompileOptions o;
  o.optimize = false;
  auto r = compile::compile(mlp(), testing::all_primitives(), o);
  auto n = names(r);
  EXPECT_EQ(std::count(n.begin(), n.end(), "cse"), 0);
  EXPECT_EQ(std::count(n.begin(), n.end(), "param_specialize"), 0);
  expect_matches_reference(mlp(), r);
}

TEST(Pipeline, NativeCompositesStayAndAreReported) {
  auto r = compile::compile(mlp(), testing::all_primitives({OpKind::Softmax}), {});
  std::size_t native = 0;
  for (const auto& k : r.lir.kernels) native += k.kind == KernelKind::Native;
  EXPECT_EQ(native, 1u);
  auto text = r.dispatch.to_text();
  EXPECT_NE(text.find("softmax"), std::string::npos) << text;
  EXPECT_NE(text.find("native"), std::string::npos) << text;
  EXPECT_NE(text.find("layer_norm"), std::string::npos) << text;
  EXPECT_NE(text.find("decomposed"), std::string::npos) << text;
  expect_matches_reference(mlp(), r);
}

TEST(Pipeline, FusionOffGivesMoreKernelsSameResults) {
  CompileOptions off;
  off.fusion = false;
  auto fused = compile::compile(mlp(), testing::all_primitives(), {});
  auto unfused = compile::compile(mlp(), testing::all_primitives(), off);
  EXPECT_GT(unfused.lir.kernels.size(), fused.lir.kernels.size());
  for (const auto& k : unfused.lir.kernels) EXPECT_EQ(k.source_nodes.size(), 1u) << k.name;
  expect_matches_reference(mlp(), unfused);
}

TEST(Pipeline, InspectIsCalledAfterEveryGraphPass) {
  CompileOptions o;
  std::vector<std::string> seen;
  std::size_t last_size = 0;
  o.inspect = [&](std::string_view pass, const ir::Graph& g) {
    seen.emplace_back(pass);
    last_size = g.size();
  };
  auto r = compile::compile(mlp(), testing::all_primitives(), o);
  std::vector<std::string> graph_passes;
  for (const auto& p : r.passes)
    if (p.name != "verify" && p.name != "lower_to_lir" && p.name != "plan_memory") graph_passes.push_back(p.name);
  EXPECT_EQ(seen, graph_passes);
  EXPECT_EQ(last_size, r.mir.size());
}

TEST(Pipeline, DumpPrintsRequestedPassesAndLevels) {
  CompileOptions o;
  o.dump = "cse, lir";
  ::testing::internal::CaptureStderr();
  auto r = compile::compile(mlp(), testing::all_primitives(), o);
  auto err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rlx dump: cse"), std::string::npos);
  EXPECT_NE(err.find("rlx dump: lir"), std::string::npos);
  EXPECT_NE(err.find(r.lir.to_text()), std::string::npos);
  EXPECT_EQ(err.find("rlx dump: dce"), std::string::npos);
  EXPECT_EQ(err.find("rlx dump: hir"), std::string::npos);

  o.dump = "hir";
  ::testing::internal::CaptureStderr();
  compile::compile(mlp(), testing::all_primitives(), o);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(ir::to_text(mlp())), std::string::npos) << err;
}

TEST(Pipeline, RegisteredUserPassRunsAndErrorsNameIt) {
  compile::register_ir_pass(std::make_shared<CountingPass>());
  ASSERT_FALSE(compile::registered_ir_passes().empty());
  int before = user_pass_runs;
  auto r = compile::compile(mlp(), testing::all_primitives(), {});
  EXPECT_EQ(user_pass_runs, before + 1);
  auto n = names(r);
  auto it = std::find(n.begin(), n.end(), "count_nodes");
  ASSERT_NE(it, n.end());
  EXPECT_EQ(*(it + 1), "verify");

  user_pass_fails = true;
  try {
    compile::compile(mlp(), testing::all_primitives(), {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "pass 'count_nodes': deliberate failure");
  }
  user_pass_fails = false;
}

TEST(Pipeline, LoweringErrorsNameThePassAndTheOp) {
  auto traits = testing::all_primitives();
  traits.native_ops.erase(OpKind::Erf);
  traits.native_ops.erase(OpKind::Gelu);
  try {
    compile::compile(mlp(), traits, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string what = e.what();
    // gelu without a kernel runs as its formula, whose erf the backend lacks too.
    EXPECT_EQ(what.rfind("pass 'lower_to_lir': backend 'cpu' does not support op 'erf'", 0), 0u) << what;
  }
}

TEST(Pipeline, SymbolicDimsMustBeBound) {
  ir::Graph g("dyn");
  auto x = g.input("x", Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(4)}));
  g.add_output(g.relu(x));
  try {
    compile::compile(g, testing::all_primitives(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic dims B"), std::string::npos) << e.what();
  }
  CompileOptions o;
  o.bind = {{"B", 3}};
  auto r = compile::compile(g, testing::all_primitives(), o);
  EXPECT_EQ(r.lir.buffer(r.lir.inputs[0]).shape, (std::vector<std::int64_t>{3, 4}));
}

TEST(Pipeline, SummaryAndLirText) {
  auto r = compile::compile(mlp(), testing::all_primitives(), {});
  auto s = r.summary();
  EXPECT_NE(s.find("HIR nodes"), std::string::npos) << s;
  EXPECT_NE(s.find(std::to_string(r.lir.kernels.size()) + " kernels"), std::string::npos) << s;
  EXPECT_NE(s.find("matmul"), std::string::npos) << s;
  EXPECT_NE(s.find("% saved"), std::string::npos) << s;
  auto t = r.lir.to_text();
  for (const auto& k : r.lir.kernels) EXPECT_NE(t.find(k.name), std::string::npos);
  EXPECT_NE(t.find("\"probs\""), std::string::npos) << t;
  EXPECT_EQ(compile::kernel_kind_name(KernelKind::Reduce), "reduce");
  EXPECT_EQ(compile::dispatch_tier_name(compile::DispatchTier::HostFallback), "host_fallback");
}

TEST(Pipeline, RandomGraphsMatchReference) {
  std::mt19937_64 rng(testing::test_seed());
  for (int trial = 0; trial < 30; ++trial) {
    auto g = testing::random_mir(rng, 10 + trial);
    SCOPED_TRACE(ir::to_text(g));
    auto r = compile::compile(g, testing::all_primitives(), {});
    expect_matches_reference(g, r);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace rlx
