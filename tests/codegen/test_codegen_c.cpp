// The C codegen target: emitted code is compiled with the system C compiler
// (strict C99, warnings as errors), loaded with dlopen (support/c_module.hpp)
// and checked against the reference interpreter on random inputs. Every op's
// variants also run through C in the op-parity suite (tests/conformance).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <set>

#include "rlx/codegen/c.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/c_module.hpp"
#include "support/testing.hpp"

using namespace rlx;
using ir::DType;
using ir::Graph;
using ir::OpKind;
using reference::TensorMap;
namespace cg = rlx::codegen::c;

namespace {

using rlx::testing::c_compiler;
using rlx::testing::CModule;
using rlx::testing::have_c_compiler;

// Random values for every input and param of `g`; `ranges` narrows some by name.
struct Feeds {
  TensorMap inputs, params;
};
Feeds random_feeds(const Graph& g, const std::map<std::string, std::pair<double, double>>& ranges = {}) {
  std::mt19937_64 rng(rlx::testing::test_seed());
  Feeds f;
  for (const auto& n : g.nodes()) {
    if (n.op != OpKind::Input && n.op != OpKind::Param) continue;
    const std::string& name = n.attrs.get_str("name");
    auto r = ranges.contains(name) ? ranges.at(name) : std::pair{-2.0, 2.0};
    (n.op == OpKind::Input ? f.inputs : f.params)
        .emplace(name, rlx::testing::random_tensor(n.dtype, n.shape.extents(), rng, r.first, r.second));
  }
  return f;
}

void expect_matches_reference(const Graph& g, const Feeds& f, const cg::Options& options = {}) {
  auto want = reference::run(g, f.inputs, f.params);
  CModule m(cg::emit(g, options));
  ASSERT_TRUE(m.error().empty()) << m.error();
  auto got = m.run(f.inputs, options.params == cg::ParamMode::Pointers ? f.params : TensorMap{});
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t j = 0; j < got.size(); ++j)
    EXPECT_TRUE(rlx::testing::tensors_close(got[j], want[j]))
        << "output " << j << " '" << g.outputs()[j].name << "'"
        << (m.source().source.size() < 30000 ? "\n" + m.source().source : std::string());
}

class CodegenC : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_c_compiler()) GTEST_SKIP() << "no C compiler: '" << c_compiler() << " --version' failed";
  }
};

TEST_F(CodegenC, MlpMatchesReference) {
  Graph g = models::mlp({4, 16, 3});
  expect_matches_reference(g, random_feeds(g));
}

TEST_F(CodegenC, MlpWithBakedParamsAndCallerWorkspace) {
  Graph g = models::mlp({3, 8, 2});
  Feeds f = random_feeds(g);
  cg::Options o;
  o.function_name = "tiny_mlp";
  o.params = cg::ParamMode::Baked;
  o.param_values = f.params;
  o.workspace = cg::WorkspaceMode::Caller;
  cg::Source src = cg::emit(g, o);
  EXPECT_TRUE(src.params.empty());
  EXPECT_GT(src.workspace_bytes, 0);
  EXPECT_NE(src.header.find("#define TINY_MLP_WORKSPACE_BYTES " + std::to_string(src.workspace_bytes)),
            std::string::npos);
  EXPECT_NE(src.header.find("void tiny_mlp(const float* x, float* y, void* workspace);"), std::string::npos)
      << src.header;
  EXPECT_NE(src.source.find("static const float rlx_p_w0[64]"), std::string::npos);
  expect_matches_reference(g, f, o);
}

TEST_F(CodegenC, EncoderBlockMatchesReference) {
  Graph g = models::encoder_block({2, 5, 16, 2, 32, 1e-5});
  expect_matches_reference(g, random_feeds(g));
}

TEST_F(CodegenC, EncoderBlockWithCallerWorkspace) {
  Graph g = models::encoder_block({1, 4, 8, 2, 16, 1e-5});
  cg::Options o;
  o.workspace = cg::WorkspaceMode::Caller;
  expect_matches_reference(g, random_feeds(g), o);
}

TEST_F(CodegenC, SignatureFollowsInputsParamsOutputs) {
  Graph g = models::mlp({2, 4, 2});
  cg::Source src = cg::emit(g);
  EXPECT_EQ(src.function_name, "mlp");
  EXPECT_EQ(src.header_file, "mlp.h");
  EXPECT_NE(src.header.find("void mlp(const float* x,\n         const float* w0,"), std::string::npos) << src.header;
  ASSERT_EQ(src.inputs.size(), 1u);
  ASSERT_EQ(src.params.size(), 4u);
  EXPECT_EQ(src.params[3].name, "b1");
  EXPECT_EQ(src.params[3].shape, (std::vector<std::int64_t>{4}));
  ASSERT_EQ(src.outputs.size(), 1u);
  // One function per LIR kernel, commented with the kernel's name and buffers, called in order.
  EXPECT_EQ(src.kernels, (std::vector<std::string>{"k0_matmul: matmul+add+relu", "k1_matmul: matmul+add"}));
  EXPECT_NE(src.source.find("/* k0_matmul: matmul+add+relu\n *   in0 = b0 input 'x' f32[2,4]"), std::string::npos)
      << src.source;
  EXPECT_LT(src.source.find("  rlx_k0("), src.source.find("  rlx_k1(")) << src.source;
}

// ---- every op: one small graph per family -----------------------------------

struct OpCase {
  std::string name;
  std::function<Graph()> build;
  std::map<std::string, std::pair<double, double>> ranges;
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

Graph unary_f32() {
  Graph g("unary_f32");
  auto x = g.input("x", {3, 5});
  auto p = g.input("p", {3, 5});  // positive: log, sqrt, rsqrt, reciprocal
  // Every unary float op of the table, so a new one is covered without a line here.
  for (auto op : ir::kAllOps) {
    if (ir::op_info(op).cls != ir::OpClass::Unary || op == OpKind::Not) continue;
    const bool positive = op == OpKind::Log || op == OpKind::Sqrt || op == OpKind::Rsqrt || op == OpKind::Reciprocal;
    g.add_output(g.unary(op, positive ? p : x), std::string(ir::op_name(op)));
  }
  return g;
}

Graph unary_int() {
  Graph g("unary_int");
  for (auto t : {DType::I64, DType::I32, DType::I8, DType::U8}) {
    std::string s(ir::dtype_name(t));
    auto x = g.input("x_" + s, {2, 6}, t);
    for (auto op : {OpKind::Neg, OpKind::Abs, OpKind::Relu, OpKind::Sign, OpKind::Floor, OpKind::Ceil, OpKind::Round})
      g.add_output(g.unary(op, x), std::string(ir::op_name(op)) + "_" + s);
  }
  g.add_output(g.unary(OpKind::Not, g.input("b", {4}, DType::Bool)), "not");
  return g;
}

Graph binary(DType t) {
  Graph g(std::string("binary_") + std::string(ir::dtype_name(t)));
  auto a = g.input("a", {2, 3, 4}, t);
  auto b = g.input("b", {3, 1}, t);  // broadcasts along the first and last axes
  for (auto op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow, OpKind::Max, OpKind::Min,
                  OpKind::Mod, OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge})
    g.add_output(g.binary(op, a, b), std::string(ir::op_name(op)));
  g.add_output(g.binary(OpKind::Add, b, a), "add_swapped");
  return g;
}

Graph logic() {
  Graph g("logic");
  auto p = g.input("p", {3, 4}, DType::Bool);
  auto q = g.input("q", {4}, DType::Bool);
  auto x = g.input("x", {3, 1});
  auto y = g.input("y", {4});
  g.add_output(g.binary(OpKind::And, p, q), "and");
  g.add_output(g.binary(OpKind::Or, p, q), "or");
  g.add_output(g.binary(OpKind::Eq, p, q), "eq");
  g.add_output(g.where(p, x, y), "where");
  g.add_output(g.where(q, g.scalar(1.5), y), "where_scalar");
  return g;
}

Graph casts() {
  Graph g("casts");
  auto x = g.input("x", {2, 5});  // range covers negatives and fractions
  auto i = g.input("i", {2, 5}, DType::I64);
  auto b = g.input("b", {2, 5}, DType::Bool);
  auto w = g.input("w", {2, 5}, DType::I32);
  for (auto t : {DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool, DType::F64})
    g.add_output(g.cast(x, t), "f32_to_" + std::string(ir::dtype_name(t)));
  g.add_output(g.cast(i, DType::F32), "i64_to_f32");
  g.add_output(g.cast(i, DType::Bool), "i64_to_bool");
  g.add_output(g.cast(i, DType::I8), "i64_to_i8");
  g.add_output(g.cast(b, DType::F32), "bool_to_f32");
  g.add_output(g.cast(b, DType::I64), "bool_to_i64");
  g.add_output(g.cast(w, DType::I8), "i32_to_i8");
  g.add_output(g.cast(g.cast(x, DType::F64), DType::F32), "f64_to_f32");
  g.add_output(g.clamp(x, -0.5, 1.25), "clamp");
  g.add_output(g.clamp(i, -3, std::numeric_limits<double>::infinity()), "clamp_i64");
  return g;
}

Graph reductions() {
  Graph g("reductions");
  auto x = g.input("x", {3, 4, 5});
  auto i = g.input("i", {3, 4}, DType::I64);
  for (auto op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceProd}) {
    std::string s(ir::op_name(op));
    g.add_output(g.reduce(op, x, {1}), s + "_1");
    g.add_output(g.reduce(op, x, {0, 2}, true), s + "_02_keep");
    g.add_output(g.reduce(op, x, {0, 1, 2}), s + "_all");
  }
  for (auto op : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceProd})
    g.add_output(g.reduce(op, i, {-1}), std::string(ir::op_name(op)) + "_i64");
  g.add_output(g.argmax(x, 1), "argmax_1");
  g.add_output(g.argmin(x, -1, true), "argmin_last_keep");
  g.add_output(g.argmax(i, 0), "argmax_i64");
  return g;
}

Graph matmuls() {
  Graph g("matmuls");
  auto a = g.input("a", {3, 4});
  auto b = g.input("b", {4, 5});
  auto ba = g.input("ba", {2, 1, 3, 4});
  auto bb = g.input("bb", {5, 4, 2});
  auto v = g.input("v", {4, 1});
  auto ia = g.input("ia", {2, 3}, DType::I64);
  auto ib = g.input("ib", {3, 2}, DType::I64);
  g.add_output(g.matmul(a, b), "plain");
  g.add_output(g.matmul(ba, bb), "broadcast_batch");
  g.add_output(g.matmul(a, v), "matrix_vector");
  g.add_output(g.matmul(ia, ib), "i64");
  return g;
}

Graph movement() {
  Graph g("movement");
  auto x = g.input("x", {2, 3, 4});
  auto y = g.input("y", {2, 2, 4});
  g.add_output(g.reshape(x, std::vector<std::int64_t>{6, 4}), "reshape");
  g.add_output(g.permute(x, {2, 0, 1}), "permute");
  g.add_output(g.transpose(x), "transpose");
  g.add_output(g.expand(g.input("e", {3, 1}), ir::Shape{2, 3, 4}), "expand");
  g.add_output(g.slice(x, {1, 2}, {1, 0}, {3, 4}, {1, 2}), "slice_steps");
  g.add_output(g.narrow(x, 2, 1, 2), "narrow");
  g.add_output(g.flip(x, {0, 2}), "flip");
  g.add_output(g.concat({x, y, x}, 1), "concat");
  g.add_output(g.pad(x, {1, 0, 2, 0, 2, 1}, -1.5), "pad");
  g.add_output(g.pad(x, {0, -1, 1, -1, 0, -2}), "pad_crop");
  g.add_output(g.squeeze(g.unsqueeze(x, {0, 3}), {0}), "unsqueeze_squeeze");
  auto parts = g.split(x, {1, 3}, 2);
  g.add_output(parts[1], "split");
  // A view chain feeding compute: reshape of a reshape, then elementwise.
  g.add_output(g.relu(g.reshape(g.reshape(g.exp(x), std::vector<std::int64_t>{24}), std::vector<std::int64_t>{4, 6})),
               "view_chain");
  return g;
}

Graph indexing() {
  Graph g("indexing");
  auto x = g.input("x", {4, 5});
  auto gi = g.input("gi", {4, 3}, DType::I64);  // gather along axis 1, negative wraps
  auto si = g.input("si", {6}, DType::I64);     // index_select along axis 0
  auto ui = g.input("ui", {2, 5}, DType::I32);  // scatter_add along axis 0
  auto upd = g.input("upd", {2, 5});
  g.add_output(g.gather(x, gi, 1), "gather");
  g.add_output(g.index_select(x, si, 0), "index_select");
  g.add_output(g.index_select(x, g.input("si2", {2, 2}, DType::I64), 1), "index_select_2d");
  g.add_output(g.scatter_add(x, ui, upd, 0), "scatter_add");
  g.add_output(g.embedding(x, si), "embedding");
  return g;
}

Graph leaves() {
  Graph g("leaves");
  auto x = g.input("x", {2, 3});
  g.add_output(g.iota(ir::Shape{2, 3}, 1), "iota_1");
  g.add_output(g.iota(ir::Shape{4, 2, 3}, 0, DType::I32), "iota_0");
  g.add_output(g.add(x, g.cast(g.iota(ir::Shape{2, 3}, 0), DType::F32)), "iota_used");
  g.add_output(g.random_uniform(ir::Shape{3, 4}, 42, -1, 3), "uniform");
  g.add_output(g.random_normal(ir::Shape{5}, 7, 0.5, 2, DType::F64), "normal");
  std::vector<float> c{1.5f, -2.f, 0.25f, 8.f, -0.f, 3e-8f};
  g.add_output(g.mul(x, g.constant(ir::Tensor::from_f32({2, 3}, c))), "constant_array");
  g.add_output(g.sub(g.scalar(-2.5), x), "scalar_literal");
  g.add_output(g.scalar(3.0), "scalar_output");
  g.add_output(x, "input_output");
  g.add_output(g.reshape(x, std::vector<std::int64_t>{3, 2}), "view_output");
  auto r = g.relu(x);
  g.add_output(r, "twice_a");
  g.add_output(r, "twice_b");
  return g;
}

Graph composites() {
  Graph g("composites");
  auto x = g.input("x", {2, 3, 6});
  auto gamma = g.param("gamma", {6});
  auto beta = g.param("beta", {6});
  g.add_output(g.softmax(x, 1), "softmax");
  g.add_output(g.log_softmax(x), "log_softmax");
  g.add_output(g.layer_norm(x, gamma, beta, 1e-5), "layer_norm");
  g.add_output(g.rms_norm(x, gamma), "rms_norm");
  g.add_output(g.linear(g.input("v", {6}), g.param("w", {6, 3}), g.param("b", {3})), "linear_vector");
  auto img = g.input("img", {1, 4, 6, 5});
  g.add_output(g.conv2d(img, g.param("k2", {6, 2, 3, 2}), g.param("kb", {6}), {2, 1}, {1, 1}, {1, 2}, 2), "conv2d");
  g.add_output(g.conv1d(x, g.param("k1", {4, 3, 3}), std::nullopt, 1, 1), "conv1d");
  g.add_output(g.max_pool2d(img, {2, 2}, {2, 2}, {1, 0}), "max_pool2d");
  g.add_output(g.avg_pool2d(img, {3, 2}, {1, 2}, {1, 1}), "avg_pool2d");
  auto q = g.input("q", {1, 2, 3, 4});
  auto k = g.input("k", {1, 2, 5, 4});
  auto v = g.input("val", {1, 2, 5, 4});
  g.add_output(g.attention(q, k, v, std::nullopt, true), "attention_causal");
  g.add_output(g.attention(q, k, v, g.input("mask", {3, 5}, DType::Bool)), "attention_bool_mask");
  g.add_output(g.attention(q, k, v, g.input("bias", {1, 1, 3, 5}), false, 0.3), "attention_float_mask");
  return g;
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = {
      {"unary_f32", unary_f32, {{"x", {-3, 3}}, {"p", {0.1, 3}}}},
      {"unary_int", unary_int, {{"x_i64", {-5, 5}}, {"x_i32", {-5, 5}}, {"x_i8", {-128, 128}}, {"x_u8", {0, 256}}}},
      {"binary_f32", [] { return binary(DType::F32); }, {{"a", {-3, 3}}, {"b", {-3, 3}}}},
      {"binary_f64", [] { return binary(DType::F64); }, {{"a", {0.1, 3}}, {"b", {-3, 3}}}},
      {"binary_i64", [] { return binary(DType::I64); }, {{"a", {-6, 6}}, {"b", {-3, 3}}}},
      {"binary_i32", [] { return binary(DType::I32); }, {{"a", {-6, 6}}, {"b", {-3, 3}}}},
      {"logic", logic, {}},
      {"casts", casts, {{"x", {-300, 300}}, {"i", {-300, 300}}, {"w", {-1000, 1000}}}},
      {"reductions", reductions, {{"i", {-4, 4}}}},
      {"matmuls", matmuls, {{"ia", {-5, 5}}, {"ib", {-5, 5}}}},
      {"movement", movement, {}},
      {"indexing", indexing, {{"gi", {-5, 5}}, {"si", {-4, 4}}, {"si2", {-5, 5}}, {"ui", {0, 4}}}},
      {"leaves", leaves, {}},
      {"composites", composites, {}},
  };
  return cases;
}

class CodegenCOps : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    if (!have_c_compiler()) GTEST_SKIP() << "no C compiler: '" << c_compiler() << " --version' failed";
  }
};

TEST_P(CodegenCOps, MatchesReference) {
  Graph g = GetParam().build();
  expect_matches_reference(g, random_feeds(g, GetParam().ranges));
}

INSTANTIATE_TEST_SUITE_P(Ops, CodegenCOps, ::testing::ValuesIn(op_cases()),
                         [](const auto& info) { return info.param.name; });

TEST_F(CodegenC, NanPropagatesThroughMaxAndArgmax) {
  Graph g("nan");
  auto x = g.input("x", {2, 4});
  g.add_output(g.reduce(OpKind::ReduceMax, x, {1}), "max");
  g.add_output(g.argmax(x, 1), "argmax");
  g.add_output(g.binary(OpKind::Min, x, g.scalar(0.0)), "min");
  Feeds f = random_feeds(g);
  f.inputs["x"].set(2, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(cg::emit(g).function_name, "nan_");  // nan() is a C library function
  expect_matches_reference(g, f);
}

TEST_F(CodegenC, ArgumentNamesAreMadeValidAndDistinct) {
  Graph g("odd names");
  auto a = g.input("in-put", {2});
  auto b = g.input("in.put", {2});
  auto k = g.input("k", {2});  // the name of a local in the emitted code
  auto f = g.input("float", {2});
  g.add_output(g.add(g.add(a, b), g.mul(k, f)), "3out");
  cg::Source src = cg::emit(g);
  EXPECT_EQ(src.function_name, "odd_names");
  std::vector<std::string> names;
  for (const auto& arg : src.inputs) names.push_back(arg.c_name);
  EXPECT_EQ(names, (std::vector<std::string>{"in_put", "in_put_", "k_", "float_"}));
  EXPECT_EQ(src.outputs[0].c_name, "t3out");
  expect_matches_reference(g, random_feeds(g));
  // Names end up in comments too: one holding "*/" must not end them.
  Graph h("odd*/comments");
  auto x = h.input("x*/", {2});
  h.add_output(h.exp(h.mul(x, h.param("w*/", {2}))), "y*/");
  h.add_output(x, "copy*/");
  Feeds feeds = random_feeds(h);
  cg::Options baked;
  baked.params = cg::ParamMode::Baked;
  baked.param_values = feeds.params;
  expect_matches_reference(h, feeds);
  expect_matches_reference(h, feeds, baked);
}

TEST_F(CodegenC, DeadInputsStayInTheSignature) {
  Graph g("dead");
  auto x = g.input("x", {3});
  g.input("unused", {3});
  g.param("unused_w", {3});
  g.add_output(g.exp(x), "y");
  cg::Source src = cg::emit(g);
  EXPECT_EQ(src.inputs.size(), 2u);
  EXPECT_EQ(src.params.size(), 1u);
  EXPECT_NE(src.source.find("(void)unused;"), std::string::npos);
  expect_matches_reference(g, random_feeds(g));
  // An output named like an unused input: the comment on its copy does not count as a use.
  Graph h("dead_named");
  auto a = h.input("a", {2});
  h.input("b", {2});
  h.add_output(a, "b");
  EXPECT_NE(cg::emit(h).source.find("(void)b;"), std::string::npos) << cg::emit(h).source;
  expect_matches_reference(h, random_feeds(h));
}

TEST_F(CodegenC, FusedElementwiseChainIsOneLoop) {
  Graph g("chain");
  auto h = g.input("x", {64});
  for (int i = 0; i < 8; ++i) h = g.exp(g.sub(h, g.scalar(1.0)));
  g.add_output(h, "y");
  cg::Source src = cg::emit(g);
  // Sixteen ops, one LIR kernel: one loop computing the chain in locals, straight into y.
  ASSERT_EQ(src.kernels.size(), 1u);
  EXPECT_EQ(src.kernels[0].rfind("k0_elementwise: sub+exp+", 0), 0u) << src.kernels[0];
  std::size_t loops = 0;
  for (std::size_t at = src.source.find("for ("); at != std::string::npos; at = src.source.find("for (", at + 1))
    ++loops;
  EXPECT_EQ(loops, 1u) << src.source;
  EXPECT_NE(src.source.find("out0[i0] = v"), std::string::npos) << src.source;
  EXPECT_NE(src.source.find("rlx_k0(x, y);"), std::string::npos) << src.source;
  expect_matches_reference(g, random_feeds(g));
}

TEST_F(CodegenC, WorkspaceIsReusedAlongAMatmulChain) {
  Graph g("mm_chain");
  auto h = g.input("x", {4, 16});
  auto w = g.param("w", {16, 16});
  for (int i = 0; i < 8; ++i) h = g.matmul(h, w);
  g.add_output(h, "y");
  cg::Source src = cg::emit(g);
  // Eight matmul kernels; at most two [4,16] intermediates alive at once.
  EXPECT_EQ(src.kernels.size(), 8u);
  EXPECT_EQ(src.workspace_bytes, 2 * 4 * 16 * 4);
  expect_matches_reference(g, random_feeds(g, {{"w", {-0.5, 0.5}}}));
}

// ---- the C module is the LIR: its kernels in order, its memory plan ------------

// Matmuls on i64 casts and a transposed bool mask put intermediates of three
// dtypes into the arena; constants, params and outputs of every kind around them.
Graph mixed_storage() {
  Graph g("mixed_storage");
  auto x = g.input("x", {4, 6});
  auto w = g.param("w", {6, 4});
  auto bias = g.param("bias", {4});
  std::vector<float> cv{0.5f, -1.f, 2.f, 0.25f, -0.75f, 1.5f};
  auto c = g.constant(ir::Tensor::from_f32({6}, cv));
  auto xi = g.cast(g.mul(x, g.scalar(3.0)), DType::I64);
  auto wi = g.cast(g.mul(w, g.scalar(3.0)), DType::I64);
  g.add_output(g.matmul(xi, wi), "int_matmul");
  auto mask = g.transpose(g.binary(OpKind::Gt, g.mul(x, c), g.scalar(0.0)));
  auto y = g.add(g.matmul(x, w), bias);
  g.add_output(y, "linear");
  g.add_output(g.where(mask, g.transpose(x), g.scalar(-1.0)), "masked");
  g.add_output(g.reshape(y, std::vector<std::int64_t>{16}), "linear_flat");
  g.add_output(y, "linear_again");
  g.add_output(g.reduce(OpKind::ReduceMax, g.exp(y), {1}), "row_max");
  g.add_output(x, "x_out");
  g.add_output(bias, "bias_out");
  g.add_output(c, "constant_out");
  return g;
}

TEST_F(CodegenC, ArenaAndKernelsAreTheLirs) {
  std::vector<Graph> graphs = {models::mlp({4, 16, 3}), models::encoder_block({1, 4, 8, 2, 16, 1e-5}), mixed_storage()};
  for (const auto& c : op_cases()) graphs.push_back(c.build());
  for (const Graph& g : graphs) {
    SCOPED_TRACE(g.name());
    compile::LirModule lir = compile::compile(g, cg::traits(), {}).lir;
    for (auto mode : {cg::WorkspaceMode::Static, cg::WorkspaceMode::Caller}) {
      cg::Options o;
      o.workspace = mode;
      cg::Source src = cg::emit(g, o);
      EXPECT_EQ(src.workspace_bytes, lir.memory.arena_bytes);
      ASSERT_EQ(src.kernels.size(), lir.kernels.size());
      for (std::size_t i = 0; i < lir.kernels.size(); ++i) EXPECT_EQ(src.kernels[i], lir.kernels[i].name);
      EXPECT_EQ(cg::emit(lir, o).source, src.source);  // emit(graph) is emit(its LIR)
    }
  }
}

TEST_F(CodegenC, PlanNeverSharesBytesAcrossDtypes) {
  compile::LirModule lir = compile::compile(mixed_storage(), cg::traits(), {}).lir;
  std::set<DType> arena_dtypes;
  for (const auto& a : lir.buffers) {
    if (a.role != compile::BufferRole::Arena || a.root != a.id || a.nbytes() == 0) continue;
    arena_dtypes.insert(a.dtype);
    for (const auto& b : lir.buffers)
      if (b.role == compile::BufferRole::Arena && b.root == b.id && b.nbytes() > 0 && a.dtype != b.dtype)
        EXPECT_TRUE(a.arena_offset + a.nbytes() <= b.arena_offset || b.arena_offset + b.nbytes() <= a.arena_offset)
            << "b" << a.id << " and b" << b.id;
  }
  EXPECT_GE(arena_dtypes.size(), 3u);  // the test covers what it says
}

TEST_F(CodegenC, ConstantsParamsAndSeveralOutputs) {
  Graph g = mixed_storage();
  Feeds f = random_feeds(g);
  for (auto params : {cg::ParamMode::Pointers, cg::ParamMode::Baked})
    for (auto workspace : {cg::WorkspaceMode::Static, cg::WorkspaceMode::Caller}) {
      cg::Options o;
      o.params = params;
      o.workspace = workspace;
      if (params == cg::ParamMode::Baked) o.param_values = f.params;
      cg::Source src = cg::emit(g, o);
      EXPECT_EQ(src.outputs.size(), 9u);
      // The static arena is read through one union member per C type it holds.
      if (workspace == cg::WorkspaceMode::Static)
        for (std::string member : {"float f32[", "int64_t i64[", "uint8_t u8["})
          EXPECT_NE(src.source.find(member), std::string::npos) << member << "\n" << src.source;
      expect_matches_reference(g, f, o);
    }
}

TEST(CodegenCErrors, NativeKernelsAreRefusedByName) {
  Graph g("native");
  g.add_output(g.softmax(g.input("x", {2, 3}), -1), "y");
  compile::BackendTraits t = cg::traits();
  t.native_ops.insert(OpKind::Softmax);
  compile::LirModule lir = compile::compile(g, t, {}).lir;
  std::string e;
  try {
    cg::emit(lir);
  } catch (const rlx::Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("k0_native: softmax' is a native kernel, which the C target cannot emit"), std::string::npos) << e;
}

// ---- errors ------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CodegenCErrors, UnsupportedDtypeNamesTheNodeOpAndDtype) {
  Graph g("half");
  auto x = g.input("x", {4}, DType::F16);
  g.add_output(g.unary(OpKind::Tanh, x), "y");
  std::string e = error_of([&] { cg::emit(g); });
  EXPECT_NE(e.find("node %0 (input 'x')"), std::string::npos) << e;
  EXPECT_NE(e.find("dtype f16 is not supported by the C target"), std::string::npos) << e;

  Graph h("bf16_op");
  auto y = h.input("y", {4});
  h.add_output(h.add(h.cast(y, DType::BF16), h.cast(y, DType::BF16)), "z");
  e = error_of([&] { cg::emit(h); });
  EXPECT_NE(e.find("node %1 (cast) inputs %0:f32[4]: dtype bf16"), std::string::npos) << e;
}

TEST(CodegenCErrors, SymbolicShapesAreRejected) {
  Graph g("sym");
  auto x = g.input("x", ir::Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(4)}));
  g.add_output(g.relu(x), "y");
  std::string e = error_of([&] { cg::emit(g); });
  EXPECT_NE(e.find("shape [B,4] is symbolic"), std::string::npos) << e;
}

TEST(CodegenCErrors, BakedParamsAreChecked) {
  Graph g = models::mlp({2, 4, 1});
  cg::Options o;
  o.params = cg::ParamMode::Baked;
  EXPECT_NE(error_of([&] { cg::emit(g, o); }).find("param 'w0' has no value"), std::string::npos);
  o.param_values = models::random_params(g, 1);
  o.param_values["b0"] = ir::Tensor(DType::F32, {5});
  EXPECT_NE(error_of([&] { cg::emit(g, o); }).find("param 'b0' is f32[4] but its baked value is f32[5]"),
            std::string::npos);
  o.param_values = models::random_params(g, 1);
  o.param_values["nope"] = ir::Tensor(DType::F32, {1});
  EXPECT_NE(error_of([&] { cg::emit(g, o); }).find("names 'nope', which is not a param"), std::string::npos);
}

TEST(CodegenCErrors, FunctionNameMustBeAnIdentifier) {
  Graph g = models::mlp({2, 4, 1});
  cg::Options o;
  o.function_name = "2fast";
  EXPECT_NE(error_of([&] { cg::emit(g, o); }).find("'2fast' is not usable as the C function name"), std::string::npos);
  o.function_name = "double";
  EXPECT_NE(error_of([&] { cg::emit(g, o); }).find("'double' is not usable as the C function name"), std::string::npos);
  o.function_name = "expf";
  EXPECT_NE(error_of([&] { cg::emit(g, o); }).find("'expf' is not usable as the C function name"), std::string::npos);
}

TEST(CodegenCErrors, GraphWithoutOutputs) {
  Graph g("empty");
  g.input("x", {1});
  EXPECT_NE(error_of([&] { cg::emit(g); }).find("has no outputs"), std::string::npos);
}

}  // namespace
