// The graph-level optimization and legalization passes. Each test states a
// fixture as IR text, compares the printed result, and checks that the
// reference interpreter computes the same outputs before and after.
#include <random>
#include <set>

#include "rlx/compile/passes_extra.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::passes::algebraic_simplify;
using compile::passes::const_fold;
using compile::passes::cse;
using compile::passes::dce;
using ir::DType;
using ir::OpKind;
using reference::TensorMap;

// Both sides go through the parser so the fixture's labels and spacing are free.
void expect_ir(const ir::Graph& g, std::string_view expected) {
  ASSERT_NO_THROW(g.verify()) << ir::to_text(g);
  EXPECT_EQ(ir::to_text(g), ir::to_text(ir::parse_text(expected)));
}

std::size_t count_op(const ir::Graph& g, OpKind op) {
  std::size_t c = 0;
  for (const auto& n : g.nodes()) c += n.op == op;
  return c;
}

// Runs both graphs on the same random inputs and params. `after` gets the
// params it still declares plus `extra` (values of promoted constants).
void expect_same_results(const ir::Graph& before, const ir::Graph& after, const TensorMap& extra = {}) {
  std::mt19937_64 rng(testing::test_seed());
  TensorMap inputs, params;
  for (auto id : before.input_ids()) {
    const auto& n = before.node(id);
    inputs.emplace(n.attrs.get_str("name"), testing::random_tensor(n.dtype, n.shape.extents(), rng));
  }
  for (auto id : before.param_ids()) {
    const auto& n = before.node(id);
    params.emplace(n.attrs.get_str("name"), testing::random_tensor(n.dtype, n.shape.extents(), rng));
  }
  TensorMap after_params = extra;
  for (auto id : after.param_ids()) {
    const auto& name = after.node(id).attrs.get_str("name");
    if (auto it = params.find(name); it != params.end()) after_params.insert(*it);
  }
  auto want = reference::run(before, inputs, params);
  auto got = reference::run(after, inputs, after_params);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i])) << "output " << i;
}

// ---- param_specialize --------------------------------------------------------

TEST(ParamSpecialize, BoundParamsBecomeConstantsOthersStay) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[2,2]
    %w = param "w" : f32[2,2]
    %b = param "b" : f32[2]
    %m = matmul %x, %w : f32[2,2]
    %y = add %m, %b : f32[2,2]
    output %y
  })");
  auto w = ir::Tensor::from_f32({2, 2}, std::vector<float>{1, 2, 3, 4});
  auto out = compile::passes::param_specialize(g, {{"w", w}});
  expect_ir(out, R"(graph t {
    %x = input "x" : f32[2,2]
    %w = constant {value=[1, 2, 3, 4]} : f32[2,2]
    %b = param "b" : f32[2]
    %m = matmul %x, %w : f32[2,2]
    %y = add %m, %b : f32[2,2]
    output %y
  })");
  std::mt19937_64 rng(testing::test_seed());
  TensorMap inputs{{"x", testing::random_tensor(DType::F32, {2, 2}, rng)}};
  auto b = testing::random_tensor(DType::F32, {2}, rng);
  auto want = reference::run(g, inputs, {{"w", w}, {"b", b}});
  auto got = reference::run(out, inputs, {{"b", b}});
  EXPECT_TRUE(testing::tensors_close(got[0], want[0]));
  EXPECT_EQ(ir::to_text(compile::passes::param_specialize(g, {})), ir::to_text(g));
}

TEST(ParamSpecialize, MismatchedBindingNamesParamAndBothTypes) {
  ir::Graph g("t");
  g.add_output(g.relu(g.param("w", {3, 4})));
  try {
    compile::passes::param_specialize(g, {{"w", ir::Tensor(DType::F32, {4, 3})}});
    FAIL() << "expected rlx::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[3,4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[4,3]"), std::string::npos) << msg;
  }
  EXPECT_THROW(compile::passes::param_specialize(g, {{"w", ir::Tensor(DType::F16, {3, 4})}}), Error);
  EXPECT_THROW(compile::passes::param_specialize(g, {{"typo", ir::Tensor(DType::F32, {3, 4})}}), Error);
}

// ---- const_fold ------------------------------------------------------------

TEST(ConstFold, FoldsConstantSubgraphsOnly) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[2]
    %a = constant {value=[1, 2]} : f32[2]
    %s = constant {value=[3]} : f32[]
    %m = mul %a, %s : f32[2]
    %e = neg %m : f32[2]
    %y = add %x, %e : f32[2]
    %r = random_uniform {seed=7, low=0.0, high=1.0} : f32[2]
    %z = mul %r, %s : f32[2]
    output %y, %z
  })");
  auto out = const_fold(g);
  expect_ir(dce(out), R"(graph t {
    %x = input "x" : f32[2]
    %s = constant {value=[3]} : f32[]
    %e = constant {value=[-3, -6]} : f32[2]
    %y = add %x, %e : f32[2]
    %r = random_uniform {seed=7, low=0.0, high=1.0} : f32[2]
    %z = mul %r, %s : f32[2]
    output %y, %z
  })");
  expect_same_results(g, out);
}

TEST(ConstFold, SizeLimitStopsGrowthButNotShrinking) {
  ir::Graph g("t");
  auto one = g.scalar(1.0);
  auto small = g.expand(one, ir::Shape{16, 16});   // 1 KiB: folded
  auto big = g.expand(one, ir::Shape{1024, 512});  // 2 MiB from 4 bytes: kept
  auto w = g.constant(ir::Tensor(DType::F32, {1024, 1024}));
  auto half = g.cast(w, DType::F16);  // 2 MiB, smaller than its 4 MiB input: folded
  g.set_outputs({small, big, half});
  auto out = dce(const_fold(g));
  EXPECT_EQ(out.node(out.outputs()[0].node).op, OpKind::Constant);
  EXPECT_EQ(out.node(out.outputs()[1].node).op, OpKind::Expand);
  EXPECT_EQ(out.node(out.outputs()[2].node).op, OpKind::Constant);
  EXPECT_EQ(out.node(out.outputs()[2].node).dtype, DType::F16);
}

TEST(ConstFold, EvaluationErrorLeavesNodeForRuntime) {
  ir::Graph g("t");
  auto x = g.constant(ir::Tensor::from_f32({3}, std::vector<float>{1, 2, 3}));
  auto idx = g.constant(ir::Tensor::from_f64(DType::I64, {1}, std::vector<double>{7}));
  g.add_output(g.index_select(x, idx, 0));
  auto out = const_fold(g);
  EXPECT_EQ(out.node(out.outputs()[0].node).op, OpKind::IndexSelect);
  EXPECT_THROW(reference::run(out, {}), Error);
}

// ---- algebraic_simplify ----------------------------------------------------

TEST(AlgebraicSimplify, IdentitiesWithSplatConstantsDisappear) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[2,3]
    %one = constant {value=[1]} : f32[]
    %zero = constant {value=[0]} : f32[]
    %ones = constant {value=[1, 1, 1, 1, 1, 1]} : f32[2,3]
    %zrow = constant {value=[0, -0, 0]} : f32[3]
    %a = mul %x, %one : f32[2,3]
    %b = mul %ones, %a : f32[2,3]
    %c = add %b, %zero : f32[2,3]
    %d = add %zrow, %c : f32[2,3]
    %e = sub %d, %zero : f32[2,3]
    %f = div %e, %ones : f32[2,3]
    output %f
  })");
  auto out = algebraic_simplify(g);
  expect_ir(dce(out), R"(graph t {
    %x = input "x" : f32[2,3]
    output %x
  })");
  expect_same_results(g, out);
}

TEST(AlgebraicSimplify, KeepsWhatWouldChangeShapeValueOrSemantics) {
  // x*1 broadcasting x up; 0-x and 1/x (constant on the non-identity side);
  // a non-splat constant; float x*0 (NaN/Inf/-0 semantics).
  const char* text = R"(graph t {
    %x = input "x" : f32[3]
    %ones = constant {value=[1, 1, 1, 1, 1, 1]} : f32[2,3]
    %zero = constant {value=[0]} : f32[]
    %one = constant {value=[1]} : f32[]
    %mix = constant {value=[1, 1, 2]} : f32[3]
    %a = mul %x, %ones : f32[2,3]
    %b = sub %zero, %x : f32[3]
    %c = div %one, %x : f32[3]
    %d = mul %x, %mix : f32[3]
    %e = mul %x, %zero : f32[3]
    %f = add %x, %one : f32[3]
    output %a, %b, %c, %d, %e, %f
  })";
  auto g = ir::parse_text(text);
  expect_ir(algebraic_simplify(g), text);
}

TEST(AlgebraicSimplify, IntegerTimesZeroBecomesZeros) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : i32[2,3]
    %z = constant {value=[0]} : i32[]
    %m = mul %z, %x : i32[2,3]
    %y = add %m, %x : i32[2,3]
    output %m, %y
  })");
  auto out = algebraic_simplify(g);
  // The zeros are an expanded scalar, which the next add recognizes as zero.
  expect_ir(dce(out), R"(graph t {
    %x = input "x" : i32[2,3]
    %z = constant {value=[0]} : i32[]
    %e = expand %z : i32[2,3]
    output %e, %x
  })");
  expect_same_results(g, out);
}

TEST(AlgebraicSimplify, MovementAndUnaryIdentities) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[2,3]
    %n1 = neg %x : f32[2,3]
    %n2 = neg %n1 : f32[2,3]
    %c = cast %n2 {to=f32} : f32[2,3]
    %r = reshape %c : f32[2,3]
    %p = permute %r {perm=[0, 1]} : f32[2,3]
    %e = expand %p : f32[2,3]
    %r1 = reshape %e : f32[6]
    %r2 = reshape %r1 : f32[3,2]
    %r3 = reshape %r1 : f32[2,3]
    output %r2, %r3
  })");
  auto out = algebraic_simplify(g);
  expect_ir(dce(out), R"(graph t {
    %x = input "x" : f32[2,3]
    %r2 = reshape %x : f32[3,2]
    output %r2, %x
  })");
  expect_same_results(g, out);
}

TEST(AlgebraicSimplify, KeepsRealMovementAndCasts) {
  const char* text = R"(graph t {
    %x = input "x" : f32[2,3]
    %n = neg %x : f32[2,3]
    %a = abs %n : f32[2,3]
    %c = cast %a {to=f16} : f16[2,3]
    %p = permute %x {perm=[1, 0]} : f32[3,2]
    %e = expand %x : f32[4,2,3]
    %r = reshape %x : f32[6]
    %q = permute %r {perm=[0]} : f32[6]
    output %c, %p, %e, %q
  })";
  auto out = algebraic_simplify(ir::parse_text(text));
  // Only the rank-1 identity permute goes.
  expect_ir(dce(out), R"(graph t {
    %x = input "x" : f32[2,3]
    %n = neg %x : f32[2,3]
    %a = abs %n : f32[2,3]
    %c = cast %a {to=f16} : f16[2,3]
    %p = permute %x {perm=[1, 0]} : f32[3,2]
    %e = expand %x : f32[4,2,3]
    %r = reshape %x : f32[6]
    output %c, %p, %e, %r
  })");
}

// ---- cse -------------------------------------------------------------------

TEST(Cse, MergesIdenticalNodesTransitively) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[2,3]
    %c1 = constant {value=[1]} : f32[]
    %c2 = constant {value=[1]} : f32[]
    %e1 = exp %x : f32[2,3]
    %e2 = exp %x : f32[2,3]
    %a1 = add %e1, %c1 : f32[2,3]
    %a2 = add %e2, %c2 : f32[2,3]
    %s1 = reduce_sum %a1 {axes=[1], keepdims=false} : f32[2]
    %s2 = reduce_sum %a2 {axes=[1], keepdims=false} : f32[2]
    output %s1, %s2
  })");
  auto out = cse(g);
  expect_ir(dce(out), R"(graph t {
    %x = input "x" : f32[2,3]
    %c1 = constant {value=[1]} : f32[]
    %e1 = exp %x : f32[2,3]
    %a1 = add %e1, %c1 : f32[2,3]
    %s1 = reduce_sum %a1 {axes=[1], keepdims=false} : f32[2]
    output %s1, %s1
  })");
  expect_same_results(g, out);
}

TEST(Cse, KeepsLeavesRandomsAndDifferingNodesApart) {
  const char* text = R"(graph t {
    %x = input "x" : f32[2,3]
    %y = input "y" : f32[2,3]
    %p = param "p" : f32[2,3]
    %q = param "q" : f32[2,3]
    %r1 = random_uniform {seed=1, low=0.0, high=1.0} : f32[2,3]
    %r2 = random_uniform {seed=1, low=0.0, high=1.0} : f32[2,3]
    %n1 = random_normal {seed=1, mean=0.0, std=1.0} : f32[2,3]
    %n2 = random_normal {seed=1, mean=0.0, std=1.0} : f32[2,3]
    %zp = constant {value=[0]} : f32[]
    %zn = constant {value=[-0]} : f32[]
    %zh = constant {value=[0]} : f16[]
    %s0 = reduce_sum %x {axes=[0], keepdims=false} : f32[3]
    %s1 = reduce_sum %x {axes=[1], keepdims=false} : f32[2]
    %k1 = reduce_sum %x {axes=[1], keepdims=true} : f32[2,1]
    %a = add %x, %y : f32[2,3]
    %b = add %y, %x : f32[2,3]
    %c = sub %p, %q : f32[2,3]
    %d = sub %r1, %r2 : f32[2,3]
    %e = sub %n1, %n2 : f32[2,3]
    output %zp, %zn, %zh, %s0, %s1, %k1, %a, %b, %c, %d, %e
  })";
  auto g = ir::parse_text(text);
  expect_ir(cse(g), text);
}

// ---- dce -------------------------------------------------------------------

TEST(Dce, DropsUnreachableKeepsInterface) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[4]
    %unused_in = input "u" : f32[2]
    %w = param "w" : f32[4]
    %unused_p = param "v" : f32[9]
    %dead1 = exp %x : f32[4]
    %dead2 = neg %dead1 : f32[4]
    %y = mul %x, %w : f32[4]
    %dead3 = constant {value=[1, 2]} : f32[2]
    %z = relu %y : f32[4]
    output %z "out", %y "pre"
  })");
  auto out = dce(g);
  expect_ir(out, R"(graph t {
    %x = input "x" : f32[4]
    %unused_in = input "u" : f32[2]
    %w = param "w" : f32[4]
    %unused_p = param "v" : f32[9]
    %y = mul %x, %w : f32[4]
    %z = relu %y : f32[4]
    output %z "out", %y "pre"
  })");
  expect_same_results(g, out);
}

// ---- promote_params ----------------------------------------------------------

TEST(PromoteParams, LargeConstantsBecomeNamedParams) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[4]
    %big = constant {value=[1, 2, 3, 4]} : f32[4]
    %small = constant {value=[2]} : f32[]
    %const_1 = param "const_1" : f32[]
    %a = mul %x, %big : f32[4]
    %b = add %a, %small : f32[4]
    %c = add %b, %const_1 : f32[4]
    output %c
  })");
  auto p = compile::passes::promote_params_with_values(g, 16);
  // The natural name of node 1 is taken by a user param.
  expect_ir(p.graph, R"(graph t {
    %x = input "x" : f32[4]
    %big = param "const_1_" : f32[4]
    %small = constant {value=[2]} : f32[]
    %const_1 = param "const_1" : f32[]
    %a = mul %x, %big : f32[4]
    %b = add %a, %small : f32[4]
    %c = add %b, %const_1 : f32[4]
    output %c
  })");
  ASSERT_EQ(p.values.size(), 1u);
  EXPECT_EQ(p.values.at("const_1_"), *g.node(1).value);
  EXPECT_EQ(ir::to_text(compile::passes::promote_params(g, 16)), ir::to_text(p.graph));
  EXPECT_EQ(ir::to_text(compile::passes::promote_params(g, 0)), ir::to_text(g));
  EXPECT_EQ(count_op(compile::passes::promote_params(g, 1), OpKind::Constant), 0u);
  expect_same_results(g, p.graph, p.values);
}

// ---- legalize_broadcast ------------------------------------------------------

TEST(LegalizeBroadcast, ElementwiseOperandsGetOutputRank) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f32[2,3]
    %b = input "b" : f32[3]
    %m = input "m" : bool[3]
    %s = constant {value=[2]} : f32[]
    %y = input "y" : f32[2,1]
    %a = add %x, %b : f32[2,3]
    %w = where %m, %a, %s : f32[2,3]
    %z = mul %w, %y : f32[2,3]
    output %z
  })");
  auto out = compile::passes::legalize_broadcast(g);
  expect_ir(out, R"(graph t {
    %x = input "x" : f32[2,3]
    %b = input "b" : f32[3]
    %m = input "m" : bool[3]
    %s = constant {value=[2]} : f32[]
    %y = input "y" : f32[2,1]
    %b2 = reshape %b : f32[1,3]
    %a = add %x, %b2 : f32[2,3]
    %m2 = reshape %m : bool[1,3]
    %s2 = reshape %s : f32[1,1]
    %w = where %m2, %a, %s2 : f32[2,3]
    %z = mul %w, %y : f32[2,3]
    output %z
  })");
  expect_same_results(g, out);
}

TEST(LegalizeBroadcast, SharedWeightMatmulBecomesOneGemm) {
  auto g = ir::parse_text(R"(graph t {
    %a = input "a" : f32[2,4,5,6]
    %b = param "b" : f32[6,7]
    %c = param "c" : f32[1,6,3]
    %m = matmul %a, %b : f32[2,4,5,7]
    %n = matmul %a, %c : f32[2,4,5,3]
    output %m, %n
  })");
  auto out = compile::passes::legalize_broadcast(g);
  expect_ir(out, R"(graph t {
    %a = input "a" : f32[2,4,5,6]
    %b = param "b" : f32[6,7]
    %c = param "c" : f32[1,6,3]
    %a2 = reshape %a : f32[40,6]
    %m2 = matmul %a2, %b : f32[40,7]
    %m = reshape %m2 : f32[2,4,5,7]
    %c2 = reshape %c : f32[6,3]
    %a3 = reshape %a : f32[40,6]
    %n2 = matmul %a3, %c2 : f32[40,3]
    %n = reshape %n2 : f32[2,4,5,3]
    output %m, %n
  })");
  expect_same_results(g, out);
}

TEST(LegalizeBroadcast, BatchedMatmulGetsEqualBatchDims) {
  auto g = ir::parse_text(R"(graph t {
    %a = input "a" : f32[2,1,4,5]
    %b = input "b" : f32[3,5,6]
    %c = input "c" : f32[4,5]
    %d = input "d" : f32[3,4,5]
    %e = input "e" : f32[5,4]
    %m = matmul %a, %b : f32[2,3,4,6]
    %n = matmul %c, %b : f32[3,4,6]
    %o = matmul %d, %b : f32[3,4,6]
    %p = matmul %c, %e : f32[4,4]
    output %m, %n, %o, %p
  })");
  auto out = compile::passes::legalize_broadcast(g);
  expect_ir(out, R"(graph t {
    %a = input "a" : f32[2,1,4,5]
    %b = input "b" : f32[3,5,6]
    %c = input "c" : f32[4,5]
    %d = input "d" : f32[3,4,5]
    %e = input "e" : f32[5,4]
    %a2 = expand %a : f32[2,3,4,5]
    %b2 = expand %b : f32[2,3,5,6]
    %m = matmul %a2, %b2 : f32[2,3,4,6]
    %c2 = expand %c : f32[3,4,5]
    %n = matmul %c2, %b : f32[3,4,6]
    %o = matmul %d, %b : f32[3,4,6]
    %p = matmul %c, %e : f32[4,4]
    output %m, %n, %o, %p
  })");
  expect_same_results(g, out);
}

TEST(LegalizeBroadcast, SymbolicBatchFallsBackToExpand) {
  auto g = ir::parse_text(R"(graph t {
    %a = input "a" : f32[B,4,5]
    %b = param "b" : f32[5,6]
    %m = matmul %a, %b : f32[B,4,6]
    output %m
  })");
  expect_ir(compile::passes::legalize_broadcast(g), R"(graph t {
    %a = input "a" : f32[B,4,5]
    %b = param "b" : f32[5,6]
    %b2 = expand %b : f32[B,5,6]
    %m = matmul %a, %b2 : f32[B,4,6]
    output %m
  })");
}

// The LIR contract, over a sweep of shapes: after the pass every matmul has
// equal batch dims (or is 2-D) and every binary/where operand has the output's rank.
TEST(LegalizeBroadcast, SweepMeetsKernelContract) {
  using S = std::vector<std::int64_t>;
  const std::vector<std::pair<S, S>> cases = {
      {{2, 3}, {3, 4}},          {{5, 2, 3}, {3, 4}},    {{2, 3}, {5, 3, 4}},    {{5, 2, 3}, {5, 3, 4}},
      {{5, 1, 2, 3}, {4, 3, 4}}, {{1, 2, 3}, {6, 3, 4}}, {{6, 2, 3}, {1, 3, 4}}, {{2, 1, 1, 2, 3}, {1, 3, 4}}};
  for (const auto& [sa, sb] : cases) {
    ir::Graph g("t");
    auto a = g.input("a", ir::Shape(sa));
    auto b = g.input("b", ir::Shape(sb));
    auto m = g.matmul(a, b);
    g.add_output(g.add(m, g.input("bias", ir::Shape{4})));
    auto out = compile::passes::legalize_broadcast(g);
    SCOPED_TRACE(ir::to_text(out));
    ASSERT_NO_THROW(out.verify());
    for (const auto& n : out.nodes()) {
      if (n.op == OpKind::MatMul) {
        const auto& x = out.node(n.inputs[0]).shape;
        const auto& y = out.node(n.inputs[1]).shape;
        bool plain = x.rank() == 2 && y.rank() == 2;
        bool equal_batch = x.rank() == y.rank() && std::equal(x.dims().begin(), x.dims().end() - 2, y.dims().begin());
        EXPECT_TRUE(plain || equal_batch) << x.str() << " x " << y.str();
      }
      if (ir::op_info(n.op).cls == ir::OpClass::Binary) {
        for (auto i : n.inputs) EXPECT_EQ(out.node(i).shape.rank(), n.shape.rank());
      }
    }
    expect_same_results(g, out);
  }
}

// ---- dtype legalization ------------------------------------------------------

TEST(LegalizeDtypes, NonNativeFloatsComputeInF32) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : f16[2,3]
    %y = input "y" : f16[2,3]
    %i = input "i" : i32[2,3]
    %a = add %x, %y : f16[2,3]
    %l = lt %a, %y : bool[2,3]
    %c = cast %a {to=f32} : f32[2,3]
    %j = add %i, %i : i32[2,3]
    %e = exp %c : f32[2,3]
    output %l, %c, %j, %e
  })");
  std::set<DType> native = {DType::F32, DType::Bool};  // i32 is not native either, but integers are never moved
  auto out = compile::passes::legalize_dtypes(g, native);
  expect_ir(out, R"(graph t {
    %x = input "x" : f16[2,3]
    %y = input "y" : f16[2,3]
    %i = input "i" : i32[2,3]
    %x2 = cast %x {to=f32} : f32[2,3]
    %y2 = cast %y {to=f32} : f32[2,3]
    %a2 = add %x2, %y2 : f32[2,3]
    %a = cast %a2 {to=f16} : f16[2,3]
    %a3 = cast %a {to=f32} : f32[2,3]
    %y3 = cast %y {to=f32} : f32[2,3]
    %l = lt %a3, %y3 : bool[2,3]
    %c = cast %a {to=f32} : f32[2,3]
    %j = add %i, %i : i32[2,3]
    %e = exp %c : f32[2,3]
    output %l, %c, %j, %e
  })");
  expect_same_results(g, out);
  std::set<DType> all(std::begin(ir::kAllDTypes), std::end(ir::kAllDTypes));
  EXPECT_EQ(ir::to_text(compile::passes::legalize_dtypes(g, all)), ir::to_text(g));
}

TEST(LegalizeDtypes, MovementAndDeclaredShapeOps) {
  auto g = ir::parse_text(R"(graph t {
    %x = input "x" : bf16[2,3]
    %r = reshape %x : bf16[3,2]
    %e = expand %r : bf16[4,3,2]
    %k = argmax %e {axis=1, keepdims=false} : i64[4,2]
    output %e, %k
  })");
  auto out = compile::passes::legalize_dtypes(g, {DType::F32, DType::I64});
  EXPECT_EQ(count_op(out, OpKind::Cast), 5u) << ir::to_text(out);  // in+out of reshape, expand; in of argmax
  for (std::size_t i = 0; i < g.outputs().size(); ++i)
    EXPECT_EQ(out.node(out.outputs()[i].node).dtype, g.node(g.outputs()[i].node).dtype);
  expect_same_results(g, out);
}

TEST(LegalizeF32Compute, OnlyListedOpsInHalfTypes) {
  auto g = ir::parse_text(R"(graph t {
    %a = input "a" : bf16[2,3]
    %b = input "b" : bf16[3,4]
    %c = input "c" : f32[3,4]
    %d = input "d" : f32[2,3]
    %m = matmul %a, %b : bf16[2,4]
    %n = matmul %d, %c : f32[2,4]
    %e = exp %m : bf16[2,4]
    output %e, %n
  })");
  auto out = compile::passes::legalize_f32_compute(g, {OpKind::MatMul});
  expect_ir(out, R"(graph t {
    %a = input "a" : bf16[2,3]
    %b = input "b" : bf16[3,4]
    %c = input "c" : f32[3,4]
    %d = input "d" : f32[2,3]
    %a2 = cast %a {to=f32} : f32[2,3]
    %b2 = cast %b {to=f32} : f32[3,4]
    %m2 = matmul %a2, %b2 : f32[2,4]
    %m = cast %m2 {to=bf16} : bf16[2,4]
    %n = matmul %d, %c : f32[2,4]
    %e = exp %m : bf16[2,4]
    output %e, %n
  })");
  expect_same_results(g, out);
  auto exp_only = compile::passes::legalize_f32_compute(g, {OpKind::Exp});
  EXPECT_EQ(count_op(exp_only, OpKind::Cast), 2u) << ir::to_text(exp_only);
  EXPECT_EQ(ir::to_text(compile::passes::legalize_f32_compute(g, {OpKind::Add})), ir::to_text(g));
}

// ---- passes compose ------------------------------------------------------------

TEST(Passes, OptimizationChainPreservesSemanticsOnABiggerGraph) {
  ir::Graph g("t");
  auto x = g.input("x", {4, 8});
  auto w = g.param("w", {8, 8});
  auto b = g.param("b", {8});
  auto h = g.add(g.matmul(x, w), b);
  auto one = g.scalar(1.0);
  auto two = g.add(one, one);
  auto h2 = g.mul(g.add(g.matmul(x, w), b), one);  // a duplicate of h, times 1
  auto y = g.mul(g.relu(g.add(h, h2)), two);
  auto z = g.reshape(g.reshape(g.unary(OpKind::Neg, g.unary(OpKind::Neg, y)), std::vector<std::int64_t>{32}),
                     std::vector<std::int64_t>{8, 4});
  g.add_output(z);
  g.add_output(g.exp(x));  // unused otherwise
  auto out = g;
  for (auto pass : {compile::passes::legalize_broadcast, const_fold, algebraic_simplify, cse, dce}) out = pass(out);
  EXPECT_EQ(count_op(out, OpKind::MatMul), 1u) << ir::to_text(out);
  EXPECT_EQ(count_op(out, OpKind::Neg), 0u) << ir::to_text(out);
  EXPECT_EQ(count_op(out, OpKind::Reshape), 2u) << ir::to_text(out);  // bias rank lift + one reshape
  EXPECT_LT(out.size(), g.size());
  expect_same_results(g, out);
}

}  // namespace
}  // namespace rlx
