#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/text.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx::ir {
namespace {

// Attributes are equal, bodies (graph attributes) by their text: a parsed body is a new graph.
bool same_attrs(const Attrs& a, const Attrs& b) {
  if (a.items().size() != b.items().size()) return false;
  for (auto x = a.items().begin(), y = b.items().begin(); x != a.items().end(); ++x, ++y) {
    if (x->first != y->first) return false;
    const auto *gx = std::get_if<GraphRef>(&x->second), *gy = std::get_if<GraphRef>(&y->second);
    if (gx && gy ? to_text(**gx) != to_text(**gy) : !(x->second == y->second)) return false;
  }
  return true;
}

::testing::AssertionResult same_graph(const Graph& a, const Graph& b) {
  auto fail = [](const std::string& what) { return ::testing::AssertionFailure() << what; };
  if (a.name() != b.name()) return fail("name " + a.name() + " vs " + b.name());
  if (a.size() != b.size()) return fail("size " + std::to_string(a.size()) + " vs " + std::to_string(b.size()));
  for (NodeId i = 0; i < a.size(); ++i) {
    const Node &x = a.node(i), &y = b.node(i);
    const std::string at = "node %" + std::to_string(i) + " (" + std::string(op_name(x.op)) + "): ";
    if (x.id != y.id || x.op != y.op) return fail(at + "id/op differ");
    if (x.inputs != y.inputs) return fail(at + "inputs differ");
    if (!same_attrs(x.attrs, y.attrs)) return fail(at + "attrs differ");
    if (x.dtype != y.dtype) return fail(at + "dtype differs");
    if (x.shape != y.shape) return fail(at + "shape " + x.shape.str() + " vs " + y.shape.str());
    if (bool(x.value) != bool(y.value)) return fail(at + "value presence differs");
    if (x.value && (x.value->dtype() != y.value->dtype() || x.value->shape() != y.value->shape() ||
                    x.value->nbytes() != y.value->nbytes() ||
                    // memcmp's pointers must be valid even for 0 bytes, and an empty constant has none.
                    (x.value->nbytes() != 0 && std::memcmp(x.value->data(), y.value->data(), x.value->nbytes()) != 0)))
      return fail(at + "constant values differ");
  }
  if (a.outputs().size() != b.outputs().size()) return fail("output count differs");
  for (std::size_t i = 0; i < a.outputs().size(); ++i)
    if (a.outputs()[i].node != b.outputs()[i].node || a.outputs()[i].name != b.outputs()[i].name)
      return fail("output " + std::to_string(i) + " differs");
  return ::testing::AssertionSuccess();
}

// print -> parse -> print is the identity, and parse(print(g)) equals g.
void expect_round_trip(const Graph& g) {
  const std::string text = to_text(g);
  Graph back;
  try {
    back = parse_text(text);
  } catch (const Error& e) {
    FAIL() << e.what() << "\nin:\n" << text;
  }
  EXPECT_TRUE(same_graph(g, back)) << text;
  EXPECT_EQ(to_text(back), text);
}

// One graph with every op in kAllOps, built with the Graph builders.
Graph all_ops_graph() {
  Graph g("all_ops");
  const NodeId x = g.input("x", {2, 3, 4});
  const NodeId p = g.param("p", {2, 3, 4});
  const NodeId m = g.input("mask", {2, 3, 4}, DType::Bool);
  const NodeId m2 = g.input("mask2", {2, 3, 4}, DType::Bool);
  g.constant(Tensor::from_f32({4}, std::vector<float>{0.5f, -1.25f, 3.0f, 1e-3f}));
  g.scalar(2.5);
  g.iota({2, 3, 4}, 2);
  g.random_uniform({2, 3}, 7, -1, 1);
  g.random_normal({5}, 9, 0.5, 2);
  for (OpKind op : kAllOps) {
    const OpClass cls = op_info(op).cls;
    if (cls == OpClass::Unary) g.unary(op, op == OpKind::Not ? m : x);
    if (cls == OpClass::Binary) {
      const bool logical = op == OpKind::And || op == OpKind::Or;
      g.binary(op, logical ? m : x, logical ? m2 : p);
    }
  }
  g.where(m, x, p);
  g.cast(x, DType::F16);
  g.clamp(x, -1, 1);
  for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceProd})
    g.reduce(op, x, {0, 2}, op == OpKind::ReduceMean);
  g.argmax(x, 1);
  g.argmin(x, -1, true);
  const NodeId w = g.param("w", {4, 5});
  g.matmul(x, w);
  g.reshape(x, std::vector<std::int64_t>{6, 4});
  g.permute(x, {2, 0, 1});
  g.expand(g.input("e", {1, 3, 1}), Shape{2, 3, 4});
  g.slice(x, {1, 2}, {0, 1}, {2, 4}, {1, 2});
  g.concat({x, p, x}, 1);
  g.pad(x, {0, 1, 0, 0, 2, 1}, 0.5);
  g.gather(x, g.input("gidx", {2, 3, 2}, DType::I64), 2);
  g.index_select(x, g.input("sidx", {5}, DType::I64), 1);
  g.scatter_add(x, g.input("aidx", {2, 3, 2}, DType::I64), g.input("upd", {2, 3, 2}), 2);
  g.squeeze(g.input("s", {2, 1, 4}), {1});
  g.unsqueeze(x, {0, -1});
  g.flip(x, {0, 2});
  const NodeId x2 = g.input("x2", {2, 4});
  g.linear(x2, w, g.param("b", {5}));
  g.softmax(x, -1);
  g.log_softmax(x, 1);
  g.layer_norm(x, g.param("gamma", {4}), g.param("beta", {4}), 1e-5, -1);
  g.rms_norm(x, g.param("rms_gamma", {4}), 1e-6);
  g.group_norm(x, 3, g.param("gn_gamma", {3}), g.param("gn_beta", {3}));
  // Backward ops (emitted by autodiff's VJP rules).
  g.add(OpKind::SoftmaxBackward, {x, p}, {{"axis", std::int64_t(-1)}});
  g.add(OpKind::LogSoftmaxBackward, {x, p}, {{"axis", std::int64_t(0)}});
  g.add(OpKind::LayerNormBackward, {x, p, g.param("ln_gamma", {3, 4})}, {{"axis", std::int64_t(1)}, {"eps", 1e-5}});
  g.add(OpKind::RmsNormBackward, {x, p}, {{"eps", 1e-6}});
  g.conv1d(g.input("seq", {1, 2, 8}), g.param("k1", {3, 2, 3}), g.param("kb", {3}), 1, 1);
  const NodeId img = g.input("img", {1, 2, 6, 6});
  g.conv2d(img, g.param("k2", {4, 2, 3, 3}), std::nullopt, {2, 2}, {1, 1});
  g.max_pool2d(img, {2, 2}, {2, 2});
  g.avg_pool2d(img, {3, 3}, {1, 1}, {1, 1});
  const NodeId emb = g.embedding(g.param("table", {10, 4}), g.input("ids", {2, 3}, DType::I64));
  g.dynamic_update_slice(g.input("cache", {2, 8, 4}), g.input("rows", {2, 1, 4}), g.input("at", {1}, DType::I32), 1);
  // Block-quantized storage: a q4_0 weight, its dequantized values, a quantized copy and the product.
  const NodeId qw = g.param("qw", {3, 32}, DType::Q4_0);
  g.dequantize(g.quantize(g.input("qx", {2, 32}), DType::Q8_0));
  g.add_output(g.quantized_matmul(g.input("mx", {2, 32}), qw, "q8"), "qmm");
  g.dequantize(qw);
  g.rope(g.input("rx", {3, 2, 4}), g.input("rc", {3, 1, 2}), g.input("rs", {2}), false);
  const NodeId q = g.input("q", {1, 2, 3, 4});
  const NodeId att = g.attention(q, q, q, g.input("amask", {1, 2, 3, 3}, DType::Bool), true, 0.5);
  rlx::testing::register_test_ops();
  g.custom_op("test_scaled_silu", {{"alpha", 1.5}}, {x});
  {  // control flow, with bodies that the text nests
    Graph step("step"), neg("neg"), small("small");
    const NodeId c = step.input("c", {4}), e = step.input("e", {4});
    step.set_outputs({step.add(c, e), step.mul(c, e)});
    neg.add_output(neg.unary(OpKind::Neg, neg.input("v", {4})));
    small.add_output(small.binary(OpKind::Lt, small.sum(small.input("v", {4}), {0}), small.scalar(10)));
    const auto r = scan(g, body_ref(std::move(step)), {g.input("c0", {4})}, {g.input("cs", {3, 4})}, -1, true);
    const GraphRef nb = body_ref(std::move(neg));
    if_else(g, g.input("flag", {}, DType::Bool), nb, nb, {r[0]});
    while_loop(g, body_ref(std::move(small)), nb, {r[0]}, {}, 5);
  }
  g.add_output(emb, "emb");
  g.add_output(att);
  g.add_output(x, "x again");
  return g;
}

TEST(Text, AllOpsGraphCoversEveryOp) {
  const Graph g = all_ops_graph();
  std::set<OpKind> seen;
  for (const Node& n : g.nodes()) seen.insert(n.op);
  for (OpKind op : kAllOps) EXPECT_TRUE(seen.count(op)) << "no " << op_name(op) << " in all_ops_graph";
}

TEST(Text, RoundTripsEveryOp) { expect_round_trip(all_ops_graph()); }

TEST(Text, PrintsTheDocumentedForm) {
  Graph g("mlp");
  const NodeId x = g.input("x", {64, 1024});
  const NodeId w = g.param("w1", {1024, 1024});
  const NodeId s = g.sum(g.matmul(x, w), {1}, true);
  const NodeId c = g.cast(s, DType::F16);
  g.clamp(x, -0.25, 1);
  g.add_output(s, "logits");
  g.add_output(c);
  EXPECT_EQ(to_text(g),
            "graph mlp {\n"
            "  %0 = input \"x\" : f32[64,1024]\n"
            "  %1 = param \"w1\" : f32[1024,1024]\n"
            "  %2 = matmul %0, %1 : f32[64,1024]\n"
            "  %3 = reduce_sum %2 {axes=[1], keepdims=true} : f32[64,1]\n"
            "  %4 = cast %3 {to=f16} : f16[64,1]\n"
            "  %5 = clamp %0 {max=1.0, min=-0.25} : f32[64,1024]\n"
            "  output %3 \"logits\", %4\n"
            "}\n");
}

TEST(Text, SymbolicDimsRoundTrip) {
  Graph g("sym");
  const NodeId x = g.input("x", Shape(std::vector<Dim>{Dim::symbol("B"), Dim::symbol("seq len"), Dim(8)}));
  const NodeId w = g.param("w", {8, 4});
  const NodeId y = g.relu(g.matmul(x, w));
  g.add_output(g.sum(y, {1}));
  const std::string text = to_text(g);
  EXPECT_NE(text.find("f32[B,\"seq len\",8]"), std::string::npos) << text;
  expect_round_trip(g);
  const Graph back = parse_text(text);
  EXPECT_EQ(back.node(3).shape, Shape(std::vector<Dim>{Dim::symbol("B"), Dim::symbol("seq len"), Dim(4)}));
}

TEST(Text, ConstantsOfEveryDTypeRoundTrip) {
  std::mt19937_64 rng(rlx::testing::test_seed());
  Graph g("consts");
  for (DType dt : kAllDTypes) {
    g.constant(rlx::testing::random_tensor(dt, {2, 3}, rng, -100, 100));
    g.constant(Tensor::scalar(dt, 1));
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16})
    g.constant(Tensor::from_f64(dt, {6}, std::vector<double>{inf, -inf, -0.0, 0.1, 1e-30, 65504}));
  Tensor big(DType::I64, {3});
  big.data_as<std::int64_t>()[0] = std::numeric_limits<std::int64_t>::min();
  big.data_as<std::int64_t>()[1] = std::numeric_limits<std::int64_t>::max();
  big.data_as<std::int64_t>()[2] = (std::int64_t(1) << 53) + 1;  // not a double
  g.constant(big);
  g.constant(Tensor::from_f64(DType::I8, {2}, std::vector<double>{-128, 127}));
  g.constant(Tensor::from_f64(DType::U8, {2}, std::vector<double>{0, 255}));
  g.constant(Tensor::from_f64(DType::I32, {2}, std::vector<double>{-2147483648.0, 2147483647}));
  g.constant(Tensor(DType::F32, {0}));
  for (NodeId i = 0; i < g.size(); ++i) g.add_output(i);
  expect_round_trip(g);
  EXPECT_NE(to_text(g).find("value=[-9223372036854775808, 9223372036854775807, 9007199254740993]"), std::string::npos);
}

TEST(Text, ParsesNaNAndInfConstants) {
  const Graph g = parse_text("graph g { %0 = constant {value=[nan, -nan, inf, -inf, -1.5e3]} : f64[5] output %0 }");
  const Tensor& t = *g.node(0).value;
  EXPECT_TRUE(std::isnan(t.get(0)));
  EXPECT_TRUE(std::isnan(t.get(1)));
  EXPECT_EQ(t.get(2), std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.get(3), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.get(4), -1500.0);
}

TEST(Text, FloatAttrsRoundTripExactly) {
  Graph g("floats");
  const NodeId x = g.input("x", {4});
  for (double v : {0.1, 1.0 / 3.0, -2.0, 1e-300, 6.02214076e23, 5e-324, -0.0})
    g.clamp(x, v, std::numeric_limits<double>::infinity());
  g.clamp(x, -std::numeric_limits<double>::infinity(), std::nextafter(1.0, 2.0));
  expect_round_trip(g);
}

TEST(Text, OutputNamesRoundTrip) {
  Graph g("outs");
  const NodeId x = g.input("in \"quoted\"\\ \n\t\x01", {2});
  g.add_output(g.relu(x), "relu");
  g.add_output(x, "with \"quotes\" and \\ and\nnewline");
  g.add_output(x);
  g.add_output(x, "relu");
  expect_round_trip(g);
}

TEST(Text, EmptyGraphAndOddNamesRoundTrip) {
  expect_round_trip(Graph("empty"));
  expect_round_trip(Graph(""));
  expect_round_trip(Graph("my graph"));
}

TEST(Text, ParserMapsLabelsToDenseIds) {
  const Graph g = parse_text(R"(// a comment line
graph "hand written" {
  %in = input "x" : f32[3]   // trailing comment
  %10 = param "w" : f32[3]
  %3 = add %in, %10 : f32[3]
  %a.b = clamp %3 {min=1, max=2.5} : f32[3]
  %z = constant {value=[true, false]} : bool[2]
  %y = reduce_sum %a.b {keepdims=false, axes=[-1]} : f32[]
  output %y "total", %3
}
)");
  EXPECT_EQ(g.name(), "hand written");
  ASSERT_EQ(g.size(), 6u);
  EXPECT_EQ(g.node(2).inputs, (std::vector<NodeId>{0, 1}));
  EXPECT_EQ(g.node(3).inputs, (std::vector<NodeId>{2}));
  EXPECT_EQ(g.node(5).inputs, (std::vector<NodeId>{3}));
  // A Float attribute written as an int literal is still a double.
  EXPECT_TRUE(std::holds_alternative<double>(g.node(3).attrs.items().at("min")));
  EXPECT_EQ(g.node(3).attrs.get_float("min"), 1.0);
  EXPECT_EQ(g.node(0).attrs.get_str("name"), "x");
  EXPECT_EQ(g.node(4).value->get(0), 1.0);
  EXPECT_EQ(g.node(4).value->get(1), 0.0);
  ASSERT_EQ(g.outputs().size(), 2u);
  EXPECT_EQ(g.outputs()[0].node, 5u);
  EXPECT_EQ(g.outputs()[0].name, "total");
  EXPECT_EQ(g.outputs()[1].node, 2u);
}

struct Malformed {
  const char* text;
  std::vector<const char*> fragments;  // each must appear in the error message
};

class TextErrors : public ::testing::TestWithParam<Malformed> {};

TEST_P(TextErrors, ThrowsWithPosition) {
  const Malformed& m = GetParam();
  try {
    parse_text(m.text);
    FAIL() << "parsed without error:\n" << m.text;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("line ", 0), 0u) << msg;
    for (const char* f : m.fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

#define G "graph g {\n  %0 = input \"x\" : f32[2]\n"
INSTANTIATE_TEST_SUITE_P(
    Table, TextErrors,
    ::testing::Values(
        Malformed{"", {"line 1, col 1", "empty"}}, Malformed{"  \n // only a comment\n", {"line 3, col 1", "empty"}},
        Malformed{"grap g {}", {"line 1, col 1", "'grap'"}},
        Malformed{"graph {}", {"line 1, col 7", "graph name", "'{'"}},
        Malformed{"graph g\n %0 = input \"x\" : f32[2]\n}", {"line 2, col 2", "expected '{'"}},
        Malformed{G, {"line 3, col 1", "end of input", "'}'"}},
        Malformed{G "}\n}", {"line 4, col 1", "after the closing"}},
        Malformed{G "  %1 = frobnicate %0 : f32[2]\n}", {"line 3, col 8", "unknown op 'frobnicate'"}},
        Malformed{G "  %1 = relu %0 : f33[2]\n}", {"line 3, col 18", "f33"}},
        Malformed{G "  %1 = relu %0 : [2]\n}", {"line 3, col 18", "dtype", "'['"}},
        Malformed{G "  %1 = relu %0 : f32[2,-1]\n}", {"line 3, col 24", "dim", "the negative extent -1"}},
        Malformed{G "  %1 = relu %0 : f32[2.5]\n}", {"line 3, col 22", "'2.5'"}},
        Malformed{G "  %1 = relu %0 : f32[2\n}", {"line 4, col 1", "expected ']'"}},
        Malformed{G "  %1 = relu %0 f32[2]\n}", {"line 3, col 16", "expected ':'", "'f32'"}},
        Malformed{G "  %1 = relu %7 : f32[2]\n}", {"line 3, col 13", "undefined", "%7"}},
        Malformed{G "  %1 = relu %2 : f32[2]\n  %2 = relu %0 : f32[2]\n}",
                  {"line 3, col 13", "forward", "%2", "line 4"}},
        Malformed{G "  %0 = relu %0 : f32[2]\n}", {"line 3, col 3", "duplicate label %0", "line 2"}},
        Malformed{G "  %1 = relu %0 {alpha=1.0} : f32[2]\n}", {"line 3, col 17", "unknown attribute 'alpha'", "relu"}},
        Malformed{G "  %1 = reduce_sum %0 {axes=1.5, keepdims=true} : f32[]\n}", {"line 3, col 28", "axes", "'1.5'"}},
        Malformed{G "  %1 = reduce_sum %0 {axes=[0], keepdims=1} : f32[]\n}", {"line 3, col 42", "true or false"}},
        Malformed{G "  %1 = reduce_sum %0 {axes=[0], axes=[0], keepdims=true} : f32[]\n}",
                  {"line 3, col 33", "duplicate attribute 'axes'"}},
        Malformed{G "  %1 = argmax %0 {axis=1.0, keepdims=true} : i64[]\n}", {"line 3, col 24", "integer", "'1.0'"}},
        Malformed{G "  %1 = argmax %0 {axis=99999999999999999999, keepdims=true} : i64[]\n}",
                  {"line 3", "99999999999999999999"}},
        Malformed{G "  %1 = cast %0 : f16[2]\n}", {"line 3, col 8", "cast", "'to'"}},
        Malformed{G "  %1 = cast %0 {to=f99} : f99[2]\n}", {"line 3, col 20", "f99"}},
        Malformed{G "  %1 = relu %0, %0 : f32[2]\n}", {"line 3, col 8", "relu takes 1 operand"}},
        Malformed{G "  %1 = add %0 : f32[2]\n}", {"line 3, col 8", "add takes 2"}},
        Malformed{G "  %1 = constant : f32[2]\n}", {"line 3, col 8", "value"}},
        Malformed{G "  %1 = constant {value=[1, 2]} : f32[3]\n}", {"line 3, col 24", "2 values", "f32[3]"}},
        Malformed{G "  %1 = constant {value=[1, 300]} : i8[2]\n}", {"line 3, col 28", "'300'", "i8"}},
        Malformed{G "  %1 = constant {value=[1, -1]} : u8[2]\n}", {"line 3, col 28", "'-1'"}},
        Malformed{G "  %1 = constant {value=[1.5]} : i32[1]\n}", {"line 3, col 25", "'1.5'"}},
        Malformed{G "  %1 = constant {value=[yes]} : bool[1]\n}", {"line 3, col 25", "'yes'"}},
        Malformed{G "  %1 = constant {value=[1, 2]} : f32[B]\n}", {"line 3, col 34", "static"}},
        Malformed{G "  %1 = constant {value=[1], value=[2]} : f32[1]\n}", {"line 3, col 29", "duplicate"}},
        Malformed{G "  %1 = input \"y\" {name=\"z\"} : f32[2]\n}", {"line 3, col 19", "duplicate attribute 'name'"}},
        Malformed{G "  %1 = input : f32[2]\n}", {"line 3, col 8", "'name'"}},
        Malformed{G "  output %9\n}", {"line 3, col 10", "%9"}}, Malformed{G "  output\n}", {"line 4, col 1", "label"}},
        Malformed{G "  %1 = relu %0 : f32[2] @\n}", {"line 3, col 25", "'@'"}},
        Malformed{G "  %1 = input \"y : f32[2]\n}", {"line 3, col 14", "unterminated string"}},
        Malformed{G "  %1 = input \"y\\q\" : f32[2]\n}", {"line 3, col 16", "escape"}},
        Malformed{G "  %1 = clamp %0 {min=1e, max=2} : f32[2]\n}", {"line 3, col 22", "'1e'"}},
        Malformed{G "  %1 = clamp %0 {min=-true, max=2} : f32[2]\n}", {"line 3, col 22", "'-true'"}},
        Malformed{G "  %1 = clamp %0 {min=1e999, max=2} : f32[2]\n}", {"line 3, col 22", "1e999"}},
        Malformed{G "  % = relu %0 : f32[2]\n}", {"line 3, col 3", "label"}},
        Malformed{G "  relu %0 : f32[2]\n}", {"line 3, col 3", "'relu'"}},
        // Shape errors come from the verifier, pinned to the offending node's line.
        Malformed{G "  %1 = relu %0 : f32[5]\n}", {"line 3, col 3", "%1"}},
        Malformed{G "  %1 = input \"y\" : f32[3]\n  %2 = add %0, %1 : f32[3]\n}", {"line 4, col 3", "add"}},
        Malformed{G "  %1 = not %0 : bool[2]\n}", {"line 3, col 3", "not"}}));
#undef G

TEST(Text, DotContainsEveryNodeAndEdge) {
  const Graph g = all_ops_graph();
  const std::string dot = to_dot(g);
  EXPECT_EQ(dot.rfind("digraph \"all_ops\" {", 0), 0u);
  std::size_t edges = 0;
  for (const Node& n : g.nodes()) {
    const std::string label =
        "n" + std::to_string(n.id) + " [label=\"%" + std::to_string(n.id) + " " + std::string(op_name(n.op));
    EXPECT_NE(dot.find(label), std::string::npos) << label;
    EXPECT_NE(dot.find(std::string(dtype_name(n.dtype)) + n.shape.str() + "\""), std::string::npos);
    for (NodeId in : n.inputs)
      EXPECT_NE(dot.find("n" + std::to_string(in) + " -> n" + std::to_string(n.id)), std::string::npos);
    edges += n.inputs.size();
  }
  std::size_t arrows = 0;
  for (std::size_t p = dot.find("->"); p != std::string::npos; p = dot.find("->", p + 2)) ++arrows;
  EXPECT_EQ(arrows, edges + g.outputs().size());
  EXPECT_NE(dot.find("label=\"output emb\""), std::string::npos);
  EXPECT_NE(dot.find("%0 input \\\"x\\\"\\nf32[2,3,4]"), std::string::npos);
}

bool have_dot() { return std::system("command -v dot >/dev/null 2>&1") == 0; }

TEST(Text, WriteSvgProducesSvg) {
  if (!have_dot()) GTEST_SKIP() << "graphviz 'dot' is not on PATH";
  const std::string path = ::testing::TempDir() + "rlx_test_text_graph with space.svg";
  std::filesystem::remove(path);
  write_svg(all_ops_graph(), path);
  std::ifstream in(path);
  const std::string svg{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::filesystem::remove(path);
  EXPECT_TRUE(svg.rfind("<?xml", 0) == 0 || svg.rfind("<svg", 0) == 0) << svg.substr(0, 80);
  EXPECT_NE(svg.find("matmul"), std::string::npos);
}

TEST(Text, WriteSvgReportsDotFailure) {
  if (!have_dot()) GTEST_SKIP() << "graphviz 'dot' is not on PATH";
  Graph g("g");
  g.add_output(g.input("x", {2}));
  EXPECT_THROW(write_svg(g, "/nonexistent-rlx-dir/out.svg"), Error);
}

// Random single-byte edits of a valid text either parse or throw rlx::Error
// carrying a position; never another exception type.
TEST(Text, MutatedTextsFailCleanly) {
  const std::string text = to_text(all_ops_graph());
  std::mt19937_64 rng(rlx::testing::test_seed());
  const std::string alphabet = "%=,:[]{}-\"\\ \n0123456789.eabxyzf_";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s = text;
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const std::size_t at = rng() % s.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: s.erase(at, 1); break;
        case 1: s.insert(at, 1, c); break;
        default: s[at] = c;
      }
    }
    try {
      parse_text(s);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("line ", 0), 0u) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-rlx exception " << e.what() << " for:\n" << s;
    }
  }
}

}  // namespace
}  // namespace rlx::ir
