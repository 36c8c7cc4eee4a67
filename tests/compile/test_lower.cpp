// Lowering MIR to LIR: which kernels fusion forms, which values become
// buffers or views, and that executing the kernels reproduces the reference.
#include <random>

#include "compile/lir_exec.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::BufferRole;
using compile::FusionRecord;
using compile::KernelKind;
using compile::LirModule;
using ir::OpKind;
using ir::Shape;

struct Lowered {
  LirModule lir;
  std::vector<FusionRecord> fusion;
};

Lowered lower(const ir::Graph& g, const compile::BackendTraits& traits = testing::all_primitives()) {
  Lowered l;
  l.lir = compile::passes::lower_to_lir(g, traits, &l.fusion);
  compile::passes::plan_memory(l.lir, traits.arena_alignment);
  return l;
}

std::vector<KernelKind> kinds(const LirModule& m) {
  std::vector<KernelKind> k;
  for (const auto& kr : m.kernels) k.push_back(kr.kind);
  return k;
}

std::size_t count_ops(const ir::Graph& body, OpKind op) {
  std::size_t c = 0;
  for (const auto& n : body.nodes()) c += n.op == op;
  return c;
}

// Lowers, checks the contract, runs the kernels and compares with the reference.
Lowered lower_and_check(const ir::Graph& g, const compile::BackendTraits& traits = testing::all_primitives()) {
  auto l = lower(g, traits);
  EXPECT_TRUE(testing::check_contract(l.lir, traits)) << l.lir.to_text();
  std::mt19937_64 rng(testing::test_seed());
  auto [in, params] = testing::random_feeds(g, rng);
  auto want = reference::run(g, in, params);
  auto got = testing::run_lir(l.lir, in, params);
  EXPECT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    EXPECT_TRUE(testing::tensors_close(got[i], want[i])) << "output " << i << "\n" << l.lir.to_text();
  return l;
}

TEST(Lower, MatmulBiasReluIsOneMatmulKernel) {
  ir::Graph g("mlp");
  auto x = g.input("x", Shape{4, 8});
  auto w = g.param("w", Shape{8, 16});
  auto b = g.param("b", Shape{16});
  g.add_output(g.relu(g.add(g.matmul(x, w), b)), "y");
  auto l = lower_and_check(g);
  ASSERT_EQ(kinds(l.lir), std::vector{KernelKind::MatMul});
  const auto& k = l.lir.kernels[0];
  EXPECT_EQ(k.name, "k0_matmul: matmul+add+relu");
  EXPECT_EQ(k.inputs.size(), 3u);
  EXPECT_EQ(l.lir.buffer(k.outputs[0]).name, "y");
  ASSERT_EQ(l.fusion.size(), 1u);
  EXPECT_EQ(l.fusion[0].ops, (std::vector{OpKind::MatMul, OpKind::Add, OpKind::Relu}));
  EXPECT_EQ(l.fusion[0].why_not, "graph output");
}

TEST(Lower, BatchedMatmulEpilogueFusesAcrossTheFlatteningReshape) {
  ir::Graph h;
  auto x = h.input("x", Shape{2, 3, 8});
  auto y = h.linear(x, h.param("w", Shape{8, 16}), h.param("b", Shape{16}));
  h.add_output(h.add(h.relu(y), h.input("res", Shape{2, 3, 16})));
  auto mir = compile::passes::legalize_broadcast(compile::passes::decompose(h, {}));
  auto l = lower_and_check(mir);
  ASSERT_EQ(kinds(l.lir), std::vector{KernelKind::MatMul});
  EXPECT_EQ(l.lir.kernels[0].name, "k0_matmul: matmul+add+relu+add");
  const auto& out = l.lir.buffer(l.lir.outputs[0]);
  EXPECT_EQ(out.shape, (std::vector<std::int64_t>{2, 3, 16}));
  EXPECT_EQ(out.root, l.lir.kernels[0].outputs[0]);  // a view of the [6,16] result
  for (auto id : l.lir.kernels[0].source_nodes) EXPECT_LT(id, mir.size());
}

TEST(Lower, MatmulEpilogueFlagKeepsMatmulAlone) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 8});
  g.add_output(g.relu(g.matmul(x, g.param("w", Shape{8, 16}))));
  auto traits = testing::all_primitives();
  traits.fuse_matmul_epilogue = false;
  auto l = lower_and_check(g, traits);
  EXPECT_EQ(kinds(l.lir), (std::vector{KernelKind::MatMul, KernelKind::Elementwise}));
  EXPECT_EQ(l.fusion[0].why_not, "matmul epilogue fusion disabled");
}

compile::BackendTraits matmul_extensions() {
  auto t = testing::all_primitives();
  t.matmul_transposed_b = true;
  t.matmul_multi_output_epilogue = true;
  return t;
}

// A backward pass's x @ W^T: the permute is read by the matmul kernel (only
// for B, only a swap of the last two dims, only when every reader is a matmul's B).
TEST(Lower, TransposedBIsReadByTheMatmulKernel) {
  ir::Graph g("dx");
  auto w = g.param("w", Shape{16, 8});
  auto wt = g.permute(w, {1, 0});
  g.add_output(g.relu(g.matmul(g.input("dy", Shape{4, 8}), wt)), "dx");
  auto l = lower_and_check(g, matmul_extensions());
  ASSERT_EQ(kinds(l.lir), std::vector{KernelKind::MatMul});
  EXPECT_EQ(l.lir.kernels[0].name, "k0_matmul: permute+matmul+relu");
  // Without the trait the transpose is its own kernel.
  auto plain = lower_and_check(g);
  EXPECT_EQ(kinds(plain.lir), (std::vector{KernelKind::Movement, KernelKind::MatMul}));
}

TEST(Lower, PermutesThatAreNotATransposedBStayMovement) {
  const auto traits = matmul_extensions();
  {
    ir::Graph g("transposed a");
    auto xt = g.permute(g.input("x", Shape{8, 4}), {1, 0});
    g.add_output(g.matmul(xt, g.param("w", Shape{8, 16})));
    EXPECT_EQ(kinds(lower_and_check(g, traits).lir), (std::vector{KernelKind::Movement, KernelKind::MatMul}));
  }
  {
    ir::Graph g("also read elsewhere");
    auto wt = g.permute(g.param("w", Shape{16, 8}), {1, 0});
    g.add_output(g.matmul(g.input("dy", Shape{4, 8}), wt));
    g.add_output(g.exp(wt));
    auto l = lower_and_check(g, traits);
    std::size_t permutes = 0;
    for (const auto& k : l.lir.kernels) permutes += count_ops(k.body, OpKind::Permute);
    EXPECT_EQ(permutes, 1u);  // computed once, by a movement kernel
    EXPECT_EQ(kinds(l.lir).front(), KernelKind::Movement);
  }
  {
    ir::Graph g("batch dims permuted");
    auto bt = g.permute(g.input("b", Shape{2, 8, 3}), {1, 0, 2});  // [8, 2, 3]
    g.add_output(g.matmul(g.input("a", Shape{8, 5, 2}), bt));
    EXPECT_EQ(kinds(lower_and_check(g, traits).lir), (std::vector{KernelKind::Movement, KernelKind::MatMul}));
  }
}

// An optimiser update behind the weight gradient: one matmul kernel writing
// every updated value, when the backend takes several epilogue outputs.
TEST(Lower, SeveralOutputEpilogueJoinsTheMatmulWhenClaimed) {
  ir::Graph g("sgd momentum");
  auto grad = g.matmul(g.input("xt", Shape{8, 4}), g.input("dy", Shape{4, 16}));
  auto m = g.add(g.mul(g.param("m", Shape{8, 16}), g.scalar(0.9)), grad);
  auto w = g.sub(g.param("w", Shape{8, 16}), g.mul(m, g.scalar(0.1)));
  g.add_output(m, "new_m");
  g.add_output(w, "new_w");
  auto l = lower_and_check(g, matmul_extensions());
  ASSERT_EQ(kinds(l.lir), std::vector{KernelKind::MatMul});
  EXPECT_EQ(l.lir.kernels[0].outputs.size(), 2u);
  auto plain = lower_and_check(g);
  EXPECT_EQ(kinds(plain.lir), (std::vector{KernelKind::MatMul, KernelKind::Elementwise}));
  EXPECT_EQ(plain.fusion[0].why_not, "epilogue kernel has several outputs");
}

TEST(Lower, EightOpElementwiseChainIsOneKernel) {
  ir::Graph g;
  auto x = g.input("x", Shape{3, 5});
  auto y = g.input("y", Shape{5});
  auto t = g.unary(OpKind::Tanh, x);
  t = g.mul(t, y);
  t = g.unary(OpKind::Sigmoid, t);
  t = g.add(t, g.scalar(1.5));
  t = g.unary(OpKind::Abs, t);
  t = g.sub(t, x);
  t = g.unary(OpKind::Neg, t);
  t = g.relu(t);
  g.add_output(t);
  auto l = lower_and_check(g);
  ASSERT_EQ(kinds(l.lir), std::vector{KernelKind::Elementwise});
  EXPECT_EQ(l.lir.kernels[0].source_nodes.size(), 8u);
  // The scalar constant is an immediate in the body, not a buffer.
  EXPECT_EQ(l.lir.kernels[0].inputs.size(), 2u);
  EXPECT_EQ(count_ops(l.lir.kernels[0].body, OpKind::Constant), 1u);
  EXPECT_TRUE(l.lir.constants.empty());
}

TEST(Lower, ElementwiseFlagOffGivesOneKernelPerOp) {
  ir::Graph g;
  auto x = g.input("x", Shape{3, 5});
  g.add_output(g.relu(g.exp(g.unary(OpKind::Neg, x))));
  auto traits = testing::all_primitives();
  traits.fuse_elementwise = false;
  auto l = lower_and_check(g, traits);
  EXPECT_EQ(l.lir.kernels.size(), 3u);
  EXPECT_EQ(l.fusion[0].why_not, "elementwise fusion disabled");
}

TEST(Lower, DecomposedSoftmaxIsReduceKernelsWithPrologueAndEpilogue) {
  ir::Graph h;
  h.add_output(h.softmax(h.input("x", Shape{4, 10}), -1));
  auto mir = compile::passes::decompose(h, {});
  auto l = lower_and_check(mir);
  // max | sub+exp+sum | sub+exp+div: exp(x - max) is recomputed rather than stored.
  EXPECT_EQ(kinds(l.lir), (std::vector{KernelKind::Reduce, KernelKind::Reduce, KernelKind::Elementwise}));
  const auto& sum = l.lir.kernels[1].body;
  EXPECT_EQ(count_ops(sum, OpKind::Exp), 1u);
  EXPECT_EQ(count_ops(sum, OpKind::ReduceSum), 1u);
  EXPECT_EQ(l.lir.memory.arena_bytes, 2 * 64 + 192);  // two [4,1] statistics and the output, 64-aligned
}

TEST(Lower, LogSoftmaxReduceTakesItsLogAsEpilogue) {
  ir::Graph h;
  h.add_output(h.log_softmax(h.input("x", Shape{4, 10}), -1));
  auto l = lower_and_check(compile::passes::decompose(h, {}));
  ASSERT_EQ(kinds(l.lir), (std::vector{KernelKind::Reduce, KernelKind::Reduce, KernelKind::Elementwise}));
  const auto& sum = l.lir.kernels[1].body;
  EXPECT_EQ(count_ops(sum, OpKind::Exp), 1u);  // prologue
  EXPECT_EQ(count_ops(sum, OpKind::Log), 1u);  // epilogue
  EXPECT_EQ(sum.nodes().back().op, OpKind::Log);
}

TEST(Lower, LayerNormIsThreeKernels) {
  ir::Graph h;
  auto x = h.input("x", Shape{4, 16});
  h.add_output(h.layer_norm(x, h.param("g", Shape{16}), h.param("b", Shape{16})));
  auto mir = compile::passes::legalize_broadcast(compile::passes::decompose(h, {}));
  auto l = lower_and_check(mir);
  EXPECT_EQ(kinds(l.lir), (std::vector{KernelKind::Reduce, KernelKind::Reduce, KernelKind::Elementwise}));
  // The variance kernel ends with rsqrt(var + eps): computed once per row.
  EXPECT_EQ(l.lir.kernels[1].body.nodes().back().op, OpKind::Rsqrt);
}

TEST(Lower, NodeWithTwoConsumerKernelsIsMaterialized) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 8});
  auto a = g.unary(OpKind::Tanh, x);
  g.add_output(g.matmul(a, g.param("w", Shape{8, 3})));
  g.add_output(g.mul(a, x));
  auto l = lower_and_check(g);
  // tanh is written once, by the elementwise kernel that also computes mul.
  ASSERT_EQ(kinds(l.lir), (std::vector{KernelKind::Elementwise, KernelKind::MatMul}));
  EXPECT_EQ(l.lir.kernels[0].outputs.size(), 2u);
  EXPECT_EQ(l.lir.kernels[1].inputs[0], l.lir.kernels[0].outputs[0]);
}

TEST(Lower, ProducerReadThroughAViewIsMaterialized) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 8});
  auto a = g.exp(x);
  g.add_output(g.sum(a, {1}));
  g.add_output(g.reshape(a, std::vector<std::int64_t>{32}));
  auto l = lower_and_check(g);
  ASSERT_EQ(kinds(l.lir), (std::vector{KernelKind::Elementwise, KernelKind::Reduce}));
  EXPECT_TRUE(l.fusion[0].why_not.find("view") != std::string::npos) << l.fusion[0].why_not;
  const auto& out = l.lir.buffer(l.lir.outputs[1]);
  EXPECT_EQ(out.root, l.lir.kernels[0].outputs[0]);
  EXPECT_EQ(l.lir.memory.view_count, 1);
}

TEST(Lower, CheapSharedProducerIsRecomputedInBothConsumers) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 8});
  auto a = g.mul(x, x);
  g.add_output(g.sum(a, {0}));
  g.add_output(g.sum(a, {1}));
  auto l = lower_and_check(g);
  ASSERT_EQ(kinds(l.lir), (std::vector{KernelKind::Reduce, KernelKind::Reduce}));
  for (const auto& k : l.lir.kernels) EXPECT_EQ(count_ops(k.body, OpKind::Mul), 1u);
}

TEST(Lower, ExpensiveSharedProducerIsStoredOnce) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 8});
  auto a = x;
  for (int i = 0; i < 9; ++i) a = g.unary(OpKind::Sin, a);
  g.add_output(g.sum(a, {0}));
  g.add_output(g.sum(a, {1}));
  auto l = lower_and_check(g);
  EXPECT_EQ(kinds(l.lir), (std::vector{KernelKind::Elementwise, KernelKind::Reduce, KernelKind::Reduce}));
  EXPECT_EQ(l.fusion[0].why_not, "producer has 2 consumers");
}

TEST(Lower, ReshapeIsAView) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 6});
  auto r = g.reshape(x, std::vector<std::int64_t>{6, 4});
  g.add_output(r);
  g.add_output(g.exp(g.reshape(g.relu(x), std::vector<std::int64_t>{24})));
  auto l = lower_and_check(g);
  EXPECT_EQ(l.lir.kernels.size(), 2u);
  const auto& v = l.lir.buffer(l.lir.outputs[0]);
  EXPECT_EQ(v.root, l.lir.inputs[0]);
  EXPECT_EQ(v.view_offset, 0);
  EXPECT_EQ(v.shape, (std::vector<std::int64_t>{6, 4}));
  EXPECT_EQ(l.lir.memory.view_count, 2);
}

TEST(Lower, ContiguousSliceIsAViewStridedSliceIsMovement) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 6});
  auto rows = g.slice(x, {0}, {1}, {3});                  // rows 1..2: one byte range
  auto row = g.slice(g.relu(x), {0, 1}, {2, 0}, {3, 6});  // one whole row of a computed value
  auto cols = g.slice(x, {1}, {1}, {3});                  // strided in memory
  g.add_output(rows);
  g.add_output(row);
  g.add_output(cols);
  auto l = lower_and_check(g);
  EXPECT_EQ(kinds(l.lir), (std::vector{KernelKind::Elementwise, KernelKind::Movement}));
  const auto& r = l.lir.buffer(l.lir.outputs[0]);
  EXPECT_EQ(r.root, l.lir.inputs[0]);
  EXPECT_EQ(r.view_offset, 1 * 6 * 4);
  const auto& r2 = l.lir.buffer(l.lir.outputs[1]);
  EXPECT_EQ(r2.root, l.lir.kernels[0].outputs[0]);
  EXPECT_EQ(r2.view_offset, 2 * 6 * 4);
  EXPECT_NE(l.lir.buffer(l.lir.outputs[2]).root, l.lir.inputs[0]);
}

TEST(Lower, UnitPermuteAndSameSizeExpandAreViews) {
  ir::Graph g;
  auto x = g.input("x", Shape{1, 6});
  g.add_output(g.permute(x, {1, 0}));
  g.add_output(g.expand(x, Shape{1, 1, 6}));
  g.add_output(g.expand(x, Shape{3, 6}));
  auto l = lower_and_check(g);
  EXPECT_EQ(kinds(l.lir), std::vector{KernelKind::Movement});
  EXPECT_EQ(l.lir.buffer(l.lir.outputs[0]).root, l.lir.inputs[0]);
  EXPECT_EQ(l.lir.buffer(l.lir.outputs[1]).root, l.lir.inputs[0]);
}

TEST(Lower, ReduceEpilogueAndInlinedScalar) {
  ir::Graph g;
  auto x = g.input("x", Shape{4, 8});
  auto s = g.sum(g.mul(x, x), {1}, true);
  g.add_output(g.unary(OpKind::Sqrt, g.mul(s, g.scalar(0.125))));
  auto l = lower_and_check(g);
  ASSERT_EQ(kinds(l.lir), std::vector{KernelKind::Reduce});
  EXPECT_EQ(l.lir.kernels[0].name, "k0_reduce: mul+reduce_sum+mul+sqrt");
}

TEST(Lower, NativeLeafAndMovementKernels) {
  ir::Graph g;
  auto x = g.input("x", Shape{2, 5});
  auto sm = g.softmax(x, -1);
  auto io = g.iota(Shape{2, 5}, 1, ir::DType::F32);
  g.add_output(g.concat({g.add(sm, io), x}, 0));
  auto l = lower_and_check(g, testing::all_primitives({OpKind::Softmax}));
  EXPECT_EQ(kinds(l.lir),
            (std::vector{KernelKind::Native, KernelKind::Leaf, KernelKind::Elementwise, KernelKind::Movement}));
  EXPECT_EQ(l.lir.kernels[0].name, "k0_native: softmax");
}

TEST(Lower, UnsupportedOpNamesBackendOpAndNode) {
  ir::Graph g;
  g.add_output(g.exp(g.input("x", Shape{2})));
  auto traits = testing::all_primitives();
  traits.native_ops.erase(OpKind::Exp);
  try {
    compile::passes::lower_to_lir(g, traits, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'cpu' does not support op 'exp' (node %1 (exp)"), std::string::npos)
        << e.what();
  }
  ir::Graph h;
  h.add_output(h.softmax(h.input("x", Shape{2, 3})));
  EXPECT_THROW(compile::passes::lower_to_lir(h, testing::all_primitives(), nullptr), Error);
}

TEST(Lower, InputsParamsAndOutputsKeepGraphOrder) {
  ir::Graph g;
  auto b = g.input("b", Shape{3});
  auto p = g.param("p", Shape{3});
  auto a = g.input("a", Shape{3});
  g.param("unused", Shape{2});
  g.add_output(a, "first");
  g.add_output(g.add(g.add(a, b), p), "second");
  auto l = lower_and_check(g);
  ASSERT_EQ(l.lir.inputs.size(), 2u);
  EXPECT_EQ(l.lir.buffer(l.lir.inputs[0]).name, "b");
  EXPECT_EQ(l.lir.buffer(l.lir.inputs[1]).external_index, 1);
  ASSERT_EQ(l.lir.params.size(), 2u);
  EXPECT_EQ(l.lir.buffer(l.lir.params[1]).name, "unused");
  EXPECT_EQ(l.lir.outputs[0], l.lir.inputs[1]);
  EXPECT_EQ(l.lir.output_names, (std::vector<std::string>{"first", "second"}));
}

TEST(Lower, ConstantBuffersCarryTheirValues) {
  ir::Graph g;
  auto c = g.constant(ir::Tensor::from_f32({2, 2}, std::vector<float>{1, 2, 3, 4}));
  g.add_output(g.matmul(g.input("x", Shape{2, 2}), c));
  auto l = lower_and_check(g);
  ASSERT_EQ(l.lir.constants.size(), 1u);
  EXPECT_EQ(l.lir.constant_values[0].get(3), 4.0);
  EXPECT_EQ(l.lir.buffer(l.lir.constants[0]).role, BufferRole::Constant);
}

TEST(Lower, RandomGraphsKeepTheirSemantics) {
  std::mt19937_64 rng(testing::test_seed());
  for (int trial = 0; trial < 60; ++trial) {
    auto g = testing::random_mir(rng, 10 + trial % 30);
    SCOPED_TRACE(ir::to_text(g));
    for (bool fuse : {true, false}) {
      auto traits = testing::all_primitives();
      traits.fuse_elementwise = traits.fuse_reduce = traits.fuse_matmul_epilogue = fuse;
      lower_and_check(g, traits);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace rlx
