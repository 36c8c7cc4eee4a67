#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "rlx/error.hpp"
#include "rlx/ir/graph.hpp"
#include "support/testing.hpp"

using namespace rlx::ir;

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(DType, HalfRoundTripsEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_half(f), h) << "half bits " << h;
  }
}

TEST(DType, HalfRoundsToNearestEven) {
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 1.0f / 2048)), 1.0f);  // tie -> even (1.0)
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 3.0f / 2048)), 1.0f + 4.0f / 2048);
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(70000.0f))));
  EXPECT_EQ(half_to_float(float_to_half(5.96046448e-08f)), 5.96046448e-08f);  // smallest subnormal
}

TEST(DType, BF16AndIntegerRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(round_to_dtype(300, DType::U8), 44);
  EXPECT_EQ(round_to_dtype(-1.7, DType::I32), -1);
  EXPECT_EQ(round_to_dtype(128, DType::I8), -128);
  EXPECT_EQ(round_to_dtype(0.2, DType::Bool), 1);
  // Past int64's range an integer wraps as a two's complement store would (exactly, with no undefined
  // conversion: the ONNX importer's fuzzer found one), and NaN and the infinities become 0.
  EXPECT_EQ(round_to_dtype(9223372036854775808.0, DType::I64), -9223372036854775808.0);
  EXPECT_EQ(round_to_dtype(18446744073709551616.0 + 4096.0, DType::I64), 4096.0);
  EXPECT_EQ(round_to_dtype(-9223372036854775808.0 - 4096.0, DType::I64), 9223372036854771712.0);
  EXPECT_EQ(round_to_dtype(-1.0, DType::I64), -1.0);
  EXPECT_EQ(round_to_dtype(1e30, DType::I32), round_to_dtype(std::fmod(1e30, 18446744073709551616.0), DType::I32));
  EXPECT_EQ(round_to_dtype(INFINITY, DType::I32), 0);
  EXPECT_EQ(round_to_dtype(-INFINITY, DType::I64), 0);
  EXPECT_EQ(round_to_dtype(NAN, DType::U8), 0);
  EXPECT_THROW(parse_dtype("f8"), rlx::Error);
}

TEST(Shape, BroadcastAndSymbols) {
  EXPECT_EQ(broadcast_shapes(Shape{4, 1, 3}, Shape{5, 1}), (Shape{4, 5, 3}));
  EXPECT_EQ(broadcast_shapes(Shape{}, Shape{2, 3}), (Shape{2, 3}));
  Shape sym(std::vector<Dim>{Dim::symbol("B"), Dim(3)});
  EXPECT_EQ(broadcast_shapes(sym, Shape{1, 3}), sym);
  EXPECT_FALSE(sym.is_static());
  EXPECT_EQ(sym.str(), "[B,3]");
  EXPECT_THROW(sym.numel(), rlx::Error);
  auto msg = error_of([] { broadcast_shapes(Shape{2, 3}, Shape{4, 3}); });
  EXPECT_NE(msg.find("[2,3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4,3]"), std::string::npos) << msg;
}

TEST(Infer, ElementwiseAndReduce) {
  Graph g;
  auto x = g.input("x", {2, 3});
  auto b = g.input("b", {3});
  auto y = g.add(x, b);
  EXPECT_EQ(g.node(y).shape, (Shape{2, 3}));
  auto c = g.binary(OpKind::Lt, x, b);
  EXPECT_EQ(g.node(c).dtype, DType::Bool);
  auto s = g.sum(x, {-1}, true);
  EXPECT_EQ(g.node(s).shape, (Shape{2, 1}));
  auto m = g.reduce(OpKind::ReduceMax, x, {0, 1});
  EXPECT_EQ(g.node(m).shape, Shape{});
  auto am = g.argmax(x, 1);
  EXPECT_EQ(g.node(am).dtype, DType::I64);
  EXPECT_EQ(g.node(am).shape, Shape{2});
  EXPECT_THROW(g.exp(g.cast(x, DType::I32)), rlx::Error);     // exp needs a float
  EXPECT_THROW(g.add(x, g.cast(b, DType::F16)), rlx::Error);  // no implicit promotion
}

TEST(Infer, MatMulBatchBroadcast) {
  Graph g;
  auto a = g.input("a", {2, 1, 4, 5});
  auto b = g.input("b", {3, 5, 6});
  EXPECT_EQ(g.node(g.matmul(a, b)).shape, (Shape{2, 3, 4, 6}));
  auto msg = error_of([&] { g.matmul(g.input("p", {2, 3}), g.input("q", {4, 5})); });
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[2,3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[4,5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node %"), std::string::npos) << msg;
}

TEST(Infer, Movement) {
  Graph g;
  auto x = g.input("x", {2, 3, 4});
  EXPECT_EQ(g.node(g.reshape(x, std::vector<std::int64_t>{6, -1})).shape, (Shape{6, 4}));
  EXPECT_EQ(g.node(g.permute(x, {2, 0, 1})).shape, (Shape{4, 2, 3}));
  EXPECT_EQ(g.node(g.slice(x, {2}, {1}, {100}, {2})).shape, (Shape{2, 3, 2}));
  EXPECT_EQ(g.node(g.slice(x, {0}, {-1}, {2})).shape, (Shape{1, 3, 4}));
  EXPECT_EQ(g.node(g.concat({x, x}, 1)).shape, (Shape{2, 6, 4}));
  EXPECT_EQ(g.node(g.pad(x, {0, 1, 0, 0, 2, -1})).shape, (Shape{2, 6, 3}));
  auto parts = g.split(x, {1, 2}, 1);
  EXPECT_EQ(g.node(parts[1]).shape, (Shape{2, 2, 4}));
  auto idx = g.input("idx", {5}, DType::I64);
  EXPECT_EQ(g.node(g.index_select(x, idx, 1)).shape, (Shape{2, 5, 4}));
  EXPECT_EQ(g.node(g.unsqueeze(x, {0, -1})).shape, (Shape{1, 2, 3, 4, 1}));
  EXPECT_EQ(g.node(g.squeeze(g.input("s", {1, 3, 1}), {0, 2})).shape, Shape{3});
  EXPECT_EQ(g.node(g.expand(g.input("e", {3, 1}), Shape{2, 3, 5})).shape, (Shape{2, 3, 5}));
  EXPECT_THROW(g.expand(x, Shape{2, 5, 4}), rlx::Error);
  EXPECT_THROW(g.reshape(x, std::vector<std::int64_t>{5, 5}), rlx::Error);
  EXPECT_THROW(g.squeeze(x, {0}), rlx::Error);
  EXPECT_THROW(g.split(x, {1, 1}, 1), rlx::Error);
  // A scalar has no axis to slice (normalize_axis takes axis 0 of a scalar for the reductions' sake).
  const auto scalar = g.input("scalar", Shape(std::vector<Dim>{}));
  rlx::testing::expect_error([&] { g.slice(scalar, {0}, {0}, {1}); }, {"scalar", "no axis to slice"});
  rlx::testing::expect_error([&] { g.split(scalar, {1}, 0); }, {"scalar"});
}

TEST(Infer, Composites) {
  Graph g;
  auto x = g.input("x", {8, 3, 14, 14});
  auto w = g.param("w", {16, 3, 3, 3});
  auto y = g.conv2d(x, w, std::nullopt, {2, 2}, {1, 1}, {1, 1}, 1);
  EXPECT_EQ(g.node(y).shape, (Shape{8, 16, 7, 7}));
  auto wg = g.param("wg", {4, 1, 3, 3});
  EXPECT_THROW(g.conv2d(x, wg, std::nullopt, {1, 1}, {0, 0}, {1, 1}, 2), rlx::Error);  // 3 % 2 != 0
  EXPECT_EQ(g.node(g.max_pool2d(x, {2, 2}, {2, 2})).shape, (Shape{8, 3, 7, 7}));
  auto q = g.input("q", {2, 4, 8, 16});
  auto kv = g.input("kv", {2, 4, 10, 16});
  EXPECT_EQ(g.node(g.attention(q, kv, kv)).shape, (Shape{2, 4, 8, 16}));
  auto mask = g.input("mask", {8, 10}, DType::Bool);
  EXPECT_EQ(g.node(g.attention(q, kv, kv, mask, true)).shape, (Shape{2, 4, 8, 16}));
  auto h = g.input("h", {5, 32});
  EXPECT_EQ(g.node(g.linear(h, g.param("lw", {32, 7}), g.param("lb", {7}))).shape, (Shape{5, 7}));
  auto ids = g.input("ids", {2, 9}, DType::I32);
  EXPECT_EQ(g.node(g.embedding(g.param("table", {100, 32}), ids)).shape, (Shape{2, 9, 32}));
}

TEST(Verify, CycleDanglingAndMismatch) {
  {
    Graph g("cyclic");
    auto x = g.input("x", {2});
    Node n;
    n.op = OpKind::Add;
    n.inputs = {x, 1};  // node %1 reads itself: a cycle
    n.shape = Shape{2};
    g.add_raw(n);
    auto msg = error_of([&] { g.verify(); });
    EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;
    EXPECT_NE(msg.find("node %1 (add)"), std::string::npos) << msg;
  }
  {
    Graph g("dangling");
    auto x = g.input("x", {2});
    Node n;
    n.op = OpKind::Neg;
    n.inputs = {42};
    n.shape = Shape{2};
    g.add_raw(n);
    g.add_output(x);
    auto msg = error_of([&] { g.verify(); });
    EXPECT_NE(msg.find("dangling"), std::string::npos) << msg;
  }
  {
    Graph g("mismatch");
    auto x = g.input("x", {2, 3});
    Node n;
    n.op = OpKind::Relu;
    n.inputs = {x};
    n.shape = Shape{3, 2};
    g.add_raw(n);
    auto msg = error_of([&] { g.verify(); });
    EXPECT_NE(msg.find("f32[3,2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[2,3]"), std::string::npos) << msg;
  }
  {
    Graph g("attrs");
    auto x = g.input("x", {2, 3});
    Node n;
    n.op = OpKind::ReduceSum;
    n.inputs = {x};
    n.attrs = {{"axes", std::vector<std::int64_t>{0}}, {"keepdims", false}, {"bogus", std::int64_t{1}}};
    n.shape = Shape{3};
    g.add_raw(n);
    auto msg = error_of([&] { g.verify(); });
    EXPECT_NE(msg.find("bogus"), std::string::npos) << msg;
  }
}

TEST(Graph, NamesAndLookup) {
  Graph g;
  g.input("x", {2});
  g.param("w", {2});
  EXPECT_THROW(g.input("w", {2}), rlx::Error);
  auto msg = error_of([&] { g.find_input("nope"); });
  EXPECT_NE(msg.find("known: x"), std::string::npos) << msg;
  EXPECT_EQ(g.find_param("w"), 1u);
}

TEST(Graph, BindSymbols) {
  Graph g;
  Shape s(std::vector<Dim>{Dim::symbol("B"), Dim(4)});
  auto x = g.input("x", s);
  auto y = g.sum(g.relu(x), {1});
  g.add_output(y);
  EXPECT_EQ(g.node(y).shape.str(), "[B]");
  auto bound = bind_symbols(g, {{"B", 3}});
  EXPECT_EQ(bound.node(y).shape, Shape{3});
  EXPECT_TRUE(bound.node(x).shape.is_static());
}
