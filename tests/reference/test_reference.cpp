// The reference interpreter against hand-computed values and naive loops
// written here, independently of src/reference.
#include <cmath>
#include <limits>
#include <random>

#include "rlx/error.hpp"
#include "rlx/ir/random.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using ir::Tensor;
using reference::TensorMap;
using Ints = std::vector<std::int64_t>;
using Vals = std::vector<double>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor tensor(Ints shape, Vals v, DType dt = DType::F64) { return Tensor::from_f64(dt, std::move(shape), v); }

Tensor run1(Graph& g, NodeId out, const TensorMap& inputs = {}, const TensorMap& params = {}) {
  g.set_outputs({out});
  auto r = reference::run(g, inputs, params);
  EXPECT_EQ(r.size(), 1u);
  return r.at(0);
}

::testing::AssertionResult is(const Tensor& t, DType dt, Ints shape, Vals v) {
  return testing::tensors_close(t, tensor(std::move(shape), std::move(v), dt));
}

using rlx::testing::expect_error;

// ---- leaves ----------------------------------------------------------------

TEST(Reference, ConstantIotaAndScalar) {
  Graph g;
  auto c = g.constant(tensor({2, 2}, {1, 2, 3, 4}, DType::F32));
  EXPECT_TRUE(is(run1(g, c), DType::F32, {2, 2}, {1, 2, 3, 4}));
  auto s = g.scalar(2.5, DType::F64);
  EXPECT_TRUE(is(run1(g, s), DType::F64, {}, {2.5}));
  EXPECT_TRUE(is(run1(g, g.iota(Shape{2, 3}, 1)), DType::I64, {2, 3}, {0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(is(run1(g, g.iota(Shape{2, 3}, -2, DType::F32)), DType::F32, {2, 3}, {0, 0, 0, 1, 1, 1}));
  EXPECT_TRUE(is(run1(g, g.iota(Shape{0, 3}, 0)), DType::I64, {0, 3}, {}));
}

TEST(Reference, RandomFollowsTheSharedCounterRng) {
  Graph g;
  auto u = g.random_uniform(Shape{3, 5}, 42, -1.0, 3.0, DType::F64);
  auto n = g.random_normal(Shape{15}, 7, 2.0, 0.5, DType::F64);
  g.set_outputs({u, n});
  auto r = reference::run(g, {});
  for (std::uint64_t i = 0; i < 15; ++i) {
    double uv = r[0].get(std::int64_t(i));
    EXPECT_EQ(uv, -1.0 + 4.0 * double(ir::rng_uniform01(42, i)));
    EXPECT_GE(uv, -1.0);
    EXPECT_LT(uv, 3.0);
    EXPECT_EQ(r[1].get(std::int64_t(i)), 2.0 + 0.5 * ir::rng_normal(7, i));
  }
  EXPECT_NE(r[0].get(0), r[0].get(1));
}

// ---- elementwise -----------------------------------------------------------

TEST(Reference, UnaryFloatOps) {
  const Vals x = {1.0, -2.0, 0.5};
  struct Case {
    OpKind op;
    Vals want;
  };
  const Case cases[] = {
      {OpKind::Neg, {-1, 2, -0.5}},
      {OpKind::Abs, {1, 2, 0.5}},
      {OpKind::Exp, {std::exp(1.0), std::exp(-2.0), std::exp(0.5)}},
      {OpKind::Log, {0, kNaN, std::log(0.5)}},
      {OpKind::Sqrt, {1, kNaN, std::sqrt(0.5)}},
      {OpKind::Rsqrt, {1, kNaN, std::sqrt(2.0)}},
      {OpKind::Reciprocal, {1, -0.5, 2}},
      {OpKind::Tanh, {0.7615941559557649, -0.9640275800758169, 0.46211715726000974}},
      {OpKind::Sigmoid, {0.7310585786300049, 0.11920292202211755, 0.6224593312018546}},
      {OpKind::Relu, {1, 0, 0.5}},
      {OpKind::Gelu, {0.8413447460685429, -0.04550026389635842, 0.34573123063700656}},
      {OpKind::GeluTanh, {0.8411919906082768, -0.04540230591222494, 0.34571400982514394}},
      {OpKind::Silu, {0.7310585786300049, -0.2384058440442351, 0.3112296656009273}},
      {OpKind::Softplus, {1.3132616875182228, 0.1269280110429725, 0.9740769841801067}},
      {OpKind::Erf, {0.8427007929497149, -0.9953222650189527, 0.5204998778130465}},
      {OpKind::Sin, {std::sin(1.0), std::sin(-2.0), std::sin(0.5)}},
      {OpKind::Cos, {std::cos(1.0), std::cos(-2.0), std::cos(0.5)}},
      {OpKind::Floor, {1, -2, 0}},
      {OpKind::Ceil, {1, -2, 1}},
      {OpKind::Sign, {1, -1, 1}},
  };
  for (const auto& c : cases) {
    Graph g;
    auto in = g.input("x", Shape{3}, DType::F64);
    EXPECT_TRUE(is(run1(g, g.unary(c.op, in), {{"x", tensor({3}, x)}}), DType::F64, {3}, c.want)) << ir::op_name(c.op);
  }
}

TEST(Reference, RoundSignNotAndIntegerUnary) {
  Graph g;
  auto x = g.input("x", Shape{7}, DType::F32);
  TensorMap in{{"x", tensor({7}, {0.5, 1.5, 2.5, -0.5, -1.5, 0, -0.0}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, g.unary(OpKind::Round, x), in), DType::F32, {7}, {0, 2, 2, -0.0, -2, 0, 0}));
  EXPECT_TRUE(is(run1(g, g.unary(OpKind::Sign, x), in), DType::F32, {7}, {1, 1, 1, -1, -1, 0, 0}));
  auto b = g.input("b", Shape{2}, DType::Bool);
  EXPECT_TRUE(
      is(run1(g, g.unary(OpKind::Not, b), {{"b", tensor({2}, {1, 0}, DType::Bool)}}), DType::Bool, {2}, {0, 1}));
  auto i = g.input("i", Shape{3}, DType::I32);
  TensorMap ii{{"i", tensor({3}, {-3, 0, 5}, DType::I32)}};
  EXPECT_TRUE(is(run1(g, g.unary(OpKind::Neg, i), ii), DType::I32, {3}, {3, 0, -5}));
  EXPECT_TRUE(is(run1(g, g.unary(OpKind::Abs, i), ii), DType::I32, {3}, {3, 0, 5}));
  EXPECT_TRUE(is(run1(g, g.unary(OpKind::Relu, i), ii), DType::I32, {3}, {0, 0, 5}));
  EXPECT_TRUE(is(run1(g, g.unary(OpKind::Sign, i), ii), DType::I32, {3}, {-1, 0, 1}));
}

TEST(Reference, ResultsRoundToTheNodeDtype) {
  Graph g;
  auto a = g.input("a", Shape{2}, DType::F16);
  auto b = g.input("b", Shape{2}, DType::BF16);
  // Adding half an f16 ulp (2^-11 at 1) is a tie: it rounds to the even neighbour.
  auto h = run1(g, g.add(a, g.scalar(std::ldexp(1.0, -11), DType::F16)),
                {{"a", tensor({2}, {1, 1 + std::ldexp(1.0, -10)}, DType::F16)}});
  EXPECT_EQ(h.get(0), 1.0);
  EXPECT_EQ(h.get(1), 1 + std::ldexp(1.0, -9));
  auto r = run1(g, g.add(b, g.scalar(std::ldexp(3.0, -8), DType::BF16)), {{"b", tensor({2}, {1, 2}, DType::BF16)}});
  EXPECT_EQ(r.get(0), 1.0 + std::ldexp(1.0, -6));  // 1 + 1.5 ulp: a tie, to the even 1 + 2 ulp
  EXPECT_EQ(r.get(1), 2.0 + std::ldexp(1.0, -6));  // 2 + 0.75 ulp rounds up to 2 + 1 ulp
  // Intermediates round too: (a + half ulp) - a is 0 in f16, and i32 wraps before the division.
  auto tie = g.sub(g.add(a, g.scalar(std::ldexp(1.0, -11), DType::F16)), a);
  EXPECT_EQ(run1(g, tie, {{"a", tensor({2}, {1, 1}, DType::F16)}}).get(0), 0.0);
  auto i = g.input("i", Shape{1}, DType::I32);
  auto wrapped = g.div(g.add(i, g.scalar(1, DType::I32)), g.scalar(2, DType::I32));
  EXPECT_EQ(run1(g, wrapped, {{"i", tensor({1}, {2147483647}, DType::I32)}}).get(0), -1073741824.0);
  auto f = g.input("f", Shape{1}, DType::F32);
  EXPECT_EQ(run1(g, g.mul(f, f), {{"f", tensor({1}, {0.1}, DType::F32)}}).get(0),
            double(float(double(0.1f) * double(0.1f))));
}

TEST(Reference, BinaryBroadcastingAndRankZero) {
  Graph g;
  auto a = g.input("a", Shape{2, 1}, DType::F64);
  auto b = g.input("b", Shape{3}, DType::F64);
  TensorMap in{{"a", tensor({2, 1}, {10, 20})}, {"b", tensor({3}, {1, 2, 3})}};
  EXPECT_TRUE(is(run1(g, g.add(a, b), in), DType::F64, {2, 3}, {11, 12, 13, 21, 22, 23}));
  EXPECT_TRUE(is(run1(g, g.sub(a, b), in), DType::F64, {2, 3}, {9, 8, 7, 19, 18, 17}));
  EXPECT_TRUE(is(run1(g, g.div(b, a), in), DType::F64, {2, 3}, {0.1, 0.2, 0.3, 0.05, 0.1, 0.15}));
  auto s = g.scalar(2, DType::F64);
  EXPECT_TRUE(is(run1(g, g.mul(s, a), in), DType::F64, {2, 1}, {20, 40}));
  EXPECT_TRUE(is(run1(g, g.mul(s, s), in), DType::F64, {}, {4}));
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Pow, b, s), in), DType::F64, {3}, {1, 4, 9}));
  auto z = g.input("z", Shape{0, 1}, DType::F64);
  EXPECT_TRUE(is(
      run1(g, g.add(z, b), {{"z", tensor({0, 1}, {})}, {"b", tensor({3}, {1, 2, 3})}, {"a", tensor({2, 1}, {0, 0})}}),
      DType::F64, {0, 3}, {}));
}

TEST(Reference, MaxMinPropagateNaN) {
  Graph g;
  auto a = g.input("a", Shape{3}, DType::F32);
  auto b = g.input("b", Shape{3}, DType::F32);
  TensorMap in{{"a", tensor({3}, {1, kNaN, -3}, DType::F32)}, {"b", tensor({3}, {2, 0, kNaN}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Max, a, b), in), DType::F32, {3}, {2, kNaN, kNaN}));
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Min, a, b), in), DType::F32, {3}, {1, kNaN, kNaN}));
}

TEST(Reference, IntegerDivModPowAndWraparound) {
  Graph g;
  auto a = g.input("a", Shape{6}, DType::I32);
  auto b = g.input("b", Shape{6}, DType::I32);
  TensorMap in{{"a", tensor({6}, {-7, 7, -7, 7, 5, 2147483647}, DType::I32)},
               {"b", tensor({6}, {2, -2, 3, -3, 0, 1}, DType::I32)}};
  EXPECT_TRUE(is(run1(g, g.div(a, b), in), DType::I32, {6}, {-3, -3, -2, -2, 0, 2147483647}));
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Mod, a, b), in), DType::I32, {6}, {1, -1, 2, -2, 0, 0}));
  EXPECT_TRUE(is(run1(g, g.add(a, b), in), DType::I32, {6}, {-5, 5, -4, 4, 5, -2147483648.0}));
  auto p = g.input("p", Shape{5}, DType::I64);
  auto e = g.input("e", Shape{5}, DType::I64);
  TensorMap pin{{"p", tensor({5}, {2, -3, 2, -1, 1}, DType::I64)}, {"e", tensor({5}, {10, 3, -1, -3, -5}, DType::I64)}};
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Pow, p, e), pin), DType::I64, {5}, {1024, -27, 0, -1, 1}));
  auto big = g.input("big", Shape{2}, DType::I64);
  // 2^62 fits; 2^64 wraps to 0 like a 64-bit multiply.
  Tensor r = run1(g, g.binary(OpKind::Pow, big, g.input("n", Shape{2}, DType::I64)),
                  {{"big", tensor({2}, {2, 2}, DType::I64)}, {"n", tensor({2}, {62, 64}, DType::I64)}});
  EXPECT_EQ(r.data_as<std::int64_t>()[0], std::int64_t(1) << 62);
  EXPECT_EQ(r.data_as<std::int64_t>()[1], 0);
}

TEST(Reference, FloatModTakesTheDivisorSign) {
  Graph g;
  auto a = g.input("a", Shape{4}, DType::F64);
  auto b = g.input("b", Shape{4}, DType::F64);
  TensorMap in{{"a", tensor({4}, {-7.5, 7.5, 5.5, -4})}, {"b", tensor({4}, {2, -2, 2.5, 2})}};
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Mod, a, b), in), DType::F64, {4}, {0.5, -0.5, 0.5, 0}));
}

TEST(Reference, ComparisonsAndLogic) {
  Graph g;
  auto a = g.input("a", Shape{4}, DType::I32);
  auto b = g.input("b", Shape{}, DType::I32);
  TensorMap in{{"a", tensor({4}, {1, 2, 3, 2}, DType::I32)}, {"b", tensor({}, {2}, DType::I32)}};
  struct Case {
    OpKind op;
    Vals want;
  };
  for (auto [op, want] :
       {Case{OpKind::Eq, {0, 1, 0, 1}}, Case{OpKind::Ne, {1, 0, 1, 0}}, Case{OpKind::Lt, {1, 0, 0, 0}},
        Case{OpKind::Le, {1, 1, 0, 1}}, Case{OpKind::Gt, {0, 0, 1, 0}}, Case{OpKind::Ge, {0, 1, 1, 1}}})
    EXPECT_TRUE(is(run1(g, g.binary(op, a, b), in), DType::Bool, {4}, want)) << ir::op_name(op);
  auto p = g.input("p", Shape{4}, DType::Bool);
  auto q = g.input("q", Shape{4}, DType::Bool);
  TensorMap bin{{"p", tensor({4}, {0, 0, 1, 1}, DType::Bool)}, {"q", tensor({4}, {0, 1, 0, 1}, DType::Bool)}};
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::And, p, q), bin), DType::Bool, {4}, {0, 0, 0, 1}));
  EXPECT_TRUE(is(run1(g, g.binary(OpKind::Or, p, q), bin), DType::Bool, {4}, {0, 1, 1, 1}));
  auto f = g.input("f", Shape{2}, DType::F32);
  EXPECT_TRUE(
      is(run1(g, g.binary(OpKind::Eq, f, f), {{"f", tensor({2}, {kNaN, 1}, DType::F32)}}), DType::Bool, {2}, {0, 1}));
}

TEST(Reference, WhereCastClamp) {
  Graph g;
  auto c = g.input("c", Shape{2, 1}, DType::Bool);
  auto a = g.input("a", Shape{3}, DType::F32);
  auto w = g.where(c, a, g.scalar(-1, DType::F32));
  TensorMap in{{"c", tensor({2, 1}, {1, 0}, DType::Bool)}, {"a", tensor({3}, {1.5, -2.7, 300.2}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, w, in), DType::F32, {2, 3}, {1.5, -2.7, 300.2, -1, -1, -1}));
  EXPECT_TRUE(is(run1(g, g.cast(a, DType::I32), in), DType::I32, {3}, {1, -2, 300}));
  EXPECT_TRUE(is(run1(g, g.cast(a, DType::U8), in), DType::U8, {3}, {1, 254, 44}));
  EXPECT_TRUE(is(run1(g, g.cast(g.cast(a, DType::I32), DType::Bool), in), DType::Bool, {3}, {1, 1, 1}));
  EXPECT_TRUE(is(run1(g, g.cast(c, DType::F32), in), DType::F32, {2, 1}, {1, 0}));
  EXPECT_TRUE(is(run1(g, g.clamp(a, -1, 2), in), DType::F32, {3}, {1.5, -1, 2}));
  auto i = g.input("i", Shape{3}, DType::I32);
  EXPECT_TRUE(
      is(run1(g, g.clamp(i, -1.5, 2.5), {{"i", tensor({3}, {-5, 1, 9}, DType::I32)}}), DType::I32, {3}, {-1, 1, 2}));
}

// ---- reductions ------------------------------------------------------------

TEST(Reference, ReductionsOverAxes) {
  Graph g;
  auto x = g.input("x", Shape{2, 3}, DType::F64);
  TensorMap in{{"x", tensor({2, 3}, {1, 5, 3, 4, 2, 6})}};
  EXPECT_TRUE(is(run1(g, g.sum(x, {1}), in), DType::F64, {2}, {9, 12}));
  EXPECT_TRUE(is(run1(g, g.sum(x, {-2}, true), in), DType::F64, {1, 3}, {5, 7, 9}));
  EXPECT_TRUE(is(run1(g, g.sum(x, {0, 1}), in), DType::F64, {}, {21}));
  EXPECT_TRUE(is(run1(g, g.mean(x, {0, 1}, true), in), DType::F64, {1, 1}, {3.5}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceMax, x, {1}), in), DType::F64, {2}, {5, 6}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceMin, x, {0}), in), DType::F64, {3}, {1, 2, 3}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceProd, x, {1}), in), DType::F64, {2}, {15, 48}));
  // Empty axes reduce nothing.
  EXPECT_TRUE(is(run1(g, g.sum(x, {}), in), DType::F64, {2, 3}, {1, 5, 3, 4, 2, 6}));
  // Raw negative axes (not normalized by a builder).
  EXPECT_TRUE(is(run1(g, g.add(OpKind::ReduceSum, {x}, {{"axes", Ints{-1}}, {"keepdims", true}}), in), DType::F64,
                 {2, 1}, {9, 12}));
  auto i = g.input("i", Shape{3}, DType::I32);
  EXPECT_TRUE(is(run1(g, g.sum(i, {0}), {{"i", tensor({3}, {2147483647, 1, 0}, DType::I32)}}), DType::I32, {},
                 {-2147483648.0}));
}

TEST(Reference, ReductionsOfZeroSize) {
  Graph g;
  auto x = g.input("x", Shape{0, 3}, DType::F32);
  TensorMap in{{"x", tensor({0, 3}, {}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, g.sum(x, {0}), in), DType::F32, {3}, {0, 0, 0}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceProd, x, {0}), in), DType::F32, {3}, {1, 1, 1}));
  EXPECT_TRUE(is(run1(g, g.mean(x, {0}), in), DType::F32, {3}, {kNaN, kNaN, kNaN}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceMax, x, {0}), in), DType::F32, {3}, {-kInf, -kInf, -kInf}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceMin, x, {0, 1}), in), DType::F32, {}, {kInf}));
  EXPECT_TRUE(is(run1(g, g.sum(x, {1}), in), DType::F32, {0}, {}));
  expect_error([&] { run1(g, g.argmax(x, 0), in); }, {"argmax", "empty"});
}

TEST(Reference, ReduceMaxPropagatesNaN) {
  Graph g;
  auto x = g.input("x", Shape{2, 3}, DType::F32);
  TensorMap in{{"x", tensor({2, 3}, {1, kNaN, 3, 4, 5, kNaN}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceMax, x, {1}), in), DType::F32, {2}, {kNaN, kNaN}));
  EXPECT_TRUE(is(run1(g, g.reduce(OpKind::ReduceMin, x, {0}), in), DType::F32, {3}, {1, kNaN, kNaN}));
}

TEST(Reference, ArgMaxArgMin) {
  Graph g;
  auto x = g.input("x", Shape{2, 3}, DType::F32);
  TensorMap in{{"x", tensor({2, 3}, {1, 3, 3, 7, -1, 7}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, g.argmax(x, 1), in), DType::I64, {2}, {1, 0}));  // first max wins
  EXPECT_TRUE(is(run1(g, g.argmin(x, -1, true), in), DType::I64, {2, 1}, {0, 1}));
  EXPECT_TRUE(is(run1(g, g.argmax(x, 0), in), DType::I64, {3}, {1, 0, 1}));
  EXPECT_TRUE(
      is(run1(g, g.argmax(x, 1), {{"x", tensor({2, 3}, {1, kNaN, 9, 1, 2, 3}, DType::F32)}}), DType::I64, {2}, {1, 2}));
}

// ---- matmul ----------------------------------------------------------------

TEST(Reference, MatMulWithBatchBroadcast) {
  Graph g;
  auto a = g.input("a", Shape{2, 3}, DType::F64);
  auto b = g.input("b", Shape{3, 2}, DType::F64);
  TensorMap in{{"a", tensor({2, 3}, {1, 2, 3, 4, 5, 6})}, {"b", tensor({3, 2}, {7, 8, 9, 10, 11, 12})}};
  EXPECT_TRUE(is(run1(g, g.matmul(a, b), in), DType::F64, {2, 2}, {58, 64, 139, 154}));
  // [2,1,1,2] x [3,2,1]: batch dims broadcast to [2,3].
  auto p = g.input("p", Shape{2, 1, 1, 2}, DType::F64);
  auto q = g.input("q", Shape{3, 2, 1}, DType::F64);
  TensorMap pq{{"p", tensor({2, 1, 1, 2}, {1, 2, 3, 4})}, {"q", tensor({3, 2, 1}, {1, 0, 0, 1, 1, 1})}};
  EXPECT_TRUE(is(run1(g, g.matmul(p, q), pq), DType::F64, {2, 3, 1, 1}, {1, 2, 3, 3, 4, 7}));
  auto e = g.input("e", Shape{2, 0}, DType::F64);
  auto f = g.input("f", Shape{0, 2}, DType::F64);
  EXPECT_TRUE(is(run1(g, g.matmul(e, f), {{"e", tensor({2, 0}, {})}, {"f", tensor({0, 2}, {})}}), DType::F64, {2, 2},
                 {0, 0, 0, 0}));
}

// ---- movement --------------------------------------------------------------

class Movement : public ::testing::Test {
 protected:
  Graph g;
  NodeId x = g.input("x", Shape{2, 3}, DType::F64);
  TensorMap in{{"x", tensor({2, 3}, {0, 1, 2, 3, 4, 5})}};
};

TEST_F(Movement, ReshapePermuteExpand) {
  EXPECT_TRUE(is(run1(g, g.reshape(x, Ints{3, -1}), in), DType::F64, {3, 2}, {0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(is(run1(g, g.permute(x, {1, 0}), in), DType::F64, {3, 2}, {0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(is(run1(g, g.transpose(x), in), DType::F64, {3, 2}, {0, 3, 1, 4, 2, 5}));
  auto col = g.reshape(g.slice(x, {1}, {0}, {1}), Ints{2, 1});
  EXPECT_TRUE(
      is(run1(g, g.expand(col, Shape{2, 2, 3}), in), DType::F64, {2, 2, 3}, {0, 0, 0, 3, 3, 3, 0, 0, 0, 3, 3, 3}));
  EXPECT_TRUE(is(run1(g, g.expand(g.scalar(7, DType::F64), Shape{2}), in), DType::F64, {2}, {7, 7}));
}

TEST_F(Movement, SliceWithStepsAndEmpty) {
  EXPECT_TRUE(is(run1(g, g.slice(x, {1}, {0}, {3}, {2}), in), DType::F64, {2, 2}, {0, 2, 3, 5}));
  EXPECT_TRUE(is(run1(g, g.slice(x, {-1, 0}, {-2, 1}, {100, 2}), in), DType::F64, {1, 2}, {4, 5}));
  EXPECT_TRUE(is(run1(g, g.slice(x, {1}, {2}, {1}), in), DType::F64, {2, 0}, {}));
  EXPECT_TRUE(is(run1(g, g.narrow(x, 1, 1, 1), in), DType::F64, {2, 1}, {1, 4}));
}

TEST_F(Movement, ConcatAndSplit) {
  auto y = g.input("y", Shape{2, 1}, DType::F64);
  auto none = g.input("none", Shape{2, 0}, DType::F64);
  in.emplace("y", tensor({2, 1}, {9, 8}));
  in.emplace("none", tensor({2, 0}, {}));
  EXPECT_TRUE(is(run1(g, g.concat({y, x, none, y}, -1), in), DType::F64, {2, 5}, {9, 0, 1, 2, 9, 8, 3, 4, 5, 8}));
  EXPECT_TRUE(is(run1(g, g.concat({x, x}, 0), in), DType::F64, {4, 3}, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  auto parts = g.split(x, {1, 2}, 1);
  EXPECT_TRUE(is(run1(g, parts[1], in), DType::F64, {2, 2}, {1, 2, 4, 5}));
}

TEST_F(Movement, PadAndCrop) {
  EXPECT_TRUE(
      is(run1(g, g.pad(x, {1, 0, 0, 1}, -1), in), DType::F64, {3, 4}, {-1, -1, -1, -1, 0, 1, 2, -1, 3, 4, 5, -1}));
  // Negative pads crop: drop the first row and the last column, add one column in front.
  EXPECT_TRUE(is(run1(g, g.pad(x, {-1, 1, 0, -1}), in), DType::F64, {1, 3}, {0, 3, 4}));
}

TEST_F(Movement, GatherIndexSelectScatterAdd) {
  auto idx = g.input("idx", Shape{2, 2}, DType::I64);
  in.emplace("idx", tensor({2, 2}, {2, 0, -1, 1}, DType::I64));
  // torch.gather(x, 1, idx) -> x[i][idx[i][j]]
  EXPECT_TRUE(is(run1(g, g.gather(x, idx, 1), in), DType::F64, {2, 2}, {2, 0, 5, 4}));
  // numpy.take(x, idx, axis=1) -> [2, 2, 2]
  EXPECT_TRUE(is(run1(g, g.index_select(x, idx, 1), in), DType::F64, {2, 2, 2}, {2, 0, 2, 1, 5, 3, 5, 4}));
  auto i0 = g.input("i0", Shape{}, DType::I32);
  in.emplace("i0", tensor({}, {-2}, DType::I32));
  EXPECT_TRUE(is(run1(g, g.index_select(x, i0, 0), in), DType::F64, {3}, {0, 1, 2}));
  auto upd = g.input("upd", Shape{2, 2}, DType::F64);
  auto sidx = g.input("sidx", Shape{2, 2}, DType::I32);
  in.emplace("upd", tensor({2, 2}, {10, 20, 30, 40}));
  in.emplace("sidx", tensor({2, 2}, {1, 1, 0, -1}, DType::I32));
  // Duplicate targets accumulate: row 0 col 1 gets 10 + 20.
  EXPECT_TRUE(is(run1(g, g.scatter_add(x, sidx, upd, 1), in), DType::F64, {2, 3}, {0, 31, 2, 33, 4, 45}));
}

TEST_F(Movement, IndexOutOfRangeNamesTheNode) {
  auto idx = g.input("idx", Shape{1, 1}, DType::I64);
  in.emplace("idx", tensor({1, 1}, {3}, DType::I64));
  auto gat = g.gather(x, idx, 1);
  expect_error([&] { run1(g, gat, in); }, {"%" + std::to_string(gat), "gather", "index 3"});
  auto sel = g.index_select(x, idx, 0);
  expect_error([&] { run1(g, sel, in); }, {"%" + std::to_string(sel), "index_select"});
  in["idx"] = tensor({1, 1}, {-4}, DType::I64);  // wraps once to -1: still out of range
  auto sc = g.scatter_add(x, idx, g.input("u", Shape{1, 1}, DType::F64), 1);
  in.emplace("u", tensor({1, 1}, {1}));
  expect_error([&] { run1(g, sc, in); }, {"%" + std::to_string(sc), "scatter_add", "index -4"});
}

TEST_F(Movement, SqueezeUnsqueezeFlip) {
  auto u = g.unsqueeze(x, {0, -1});
  EXPECT_TRUE(is(run1(g, u, in), DType::F64, {1, 2, 3, 1}, {0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(is(run1(g, g.squeeze(u, {-1}), in), DType::F64, {1, 2, 3}, {0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(is(run1(g, g.squeeze(u, {}), in), DType::F64, {1, 2, 3, 1}, {0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(is(run1(g, g.flip(x, {1}), in), DType::F64, {2, 3}, {2, 1, 0, 5, 4, 3}));
  EXPECT_TRUE(is(run1(g, g.flip(x, {0, -1}), in), DType::F64, {2, 3}, {5, 4, 3, 2, 1, 0}));
  auto s = g.scalar(3, DType::F64);
  EXPECT_TRUE(is(run1(g, g.unsqueeze(s, {0}), in), DType::F64, {1}, {3}));
}

// ---- composites ------------------------------------------------------------

TEST(Reference, LinearSoftmaxLogSoftmax) {
  Graph g;
  auto x = g.input("x", Shape{2, 2}, DType::F64);
  auto w = g.param("w", Shape{2, 3}, DType::F64);
  auto b = g.param("b", Shape{3}, DType::F64);
  TensorMap in{{"x", tensor({2, 2}, {1, 2, 3, 4})}};
  TensorMap ps{{"w", tensor({2, 3}, {1, 0, 1, 0, 1, 1})}, {"b", tensor({3}, {0.5, 0, -1})}};
  EXPECT_TRUE(is(run1(g, g.linear(x, w, b), in, ps), DType::F64, {2, 3}, {1.5, 2, 2, 3.5, 4, 6}));
  EXPECT_TRUE(is(run1(g, g.linear(x, w), in, ps), DType::F64, {2, 3}, {1, 2, 3, 3, 4, 7}));
  double e1 = std::exp(1.0), e2 = std::exp(2.0), s = 1 + e1 + e2;
  auto v = g.input("v", Shape{2, 3}, DType::F64);
  in.emplace("v", tensor({2, 3}, {0, 1, 2, 1000, 1000, -kInf}));
  EXPECT_TRUE(is(run1(g, g.softmax(v), in, ps), DType::F64, {2, 3}, {1 / s, e1 / s, e2 / s, 0.5, 0.5, 0}));
  EXPECT_TRUE(is(run1(g, g.log_softmax(v, -1), in, ps), DType::F64, {2, 3},
                 {-std::log(s), 1 - std::log(s), 2 - std::log(s), -std::log(2.0), -std::log(2.0), -kInf}));
  EXPECT_TRUE(is(run1(g, g.softmax(v, 0), in, ps), DType::F64, {2, 3}, {0, 0, 1, 1, 1, 0}));
  EXPECT_TRUE(is(run1(g, g.add(OpKind::Softmax, {v}, {{"axis", std::int64_t(-2)}}), in, ps), DType::F64, {2, 3},
                 {0, 0, 1, 1, 1, 0}));
}

TEST(Reference, RankZeroSoftmaxAndLayerNorm) {
  Graph g;
  auto s = g.input("s", Shape{}, DType::F64);
  TensorMap in{{"s", tensor({}, {-3})}};
  EXPECT_TRUE(is(run1(g, g.softmax(s, 0), in), DType::F64, {}, {1}));
  EXPECT_TRUE(is(run1(g, g.log_softmax(s, 0), in), DType::F64, {}, {0}));
  EXPECT_TRUE(is(run1(g, g.layer_norm(s, std::nullopt, std::nullopt, 1e-5, 0), in), DType::F64, {}, {0}));
}

TEST(Reference, LayerNormAndRmsNorm) {
  Graph g;
  auto x = g.input("x", Shape{2, 2}, DType::F64);
  auto gamma = g.input("g", Shape{2}, DType::F64);
  auto beta = g.input("b", Shape{2}, DType::F64);
  TensorMap in{{"x", tensor({2, 2}, {1, 3, -2, 2})}, {"g", tensor({2}, {2, 1})}, {"b", tensor({2}, {0, 10})}};
  // Rows [1,3] and [-2,2]: mean 2 / 0, biased variance 1 / 4.
  double eps = 1e-3, i1 = 1 / std::sqrt(1 + eps), i2 = 1 / std::sqrt(4 + eps);
  EXPECT_TRUE(is(run1(g, g.layer_norm(x, std::nullopt, std::nullopt, eps), in), DType::F64, {2, 2},
                 {-i1, i1, -2 * i2, 2 * i2}));
  EXPECT_TRUE(
      is(run1(g, g.layer_norm(x, gamma, beta, eps), in), DType::F64, {2, 2}, {-2 * i1, 10 + i1, -4 * i2, 10 + 2 * i2}));
  EXPECT_TRUE(
      is(run1(g, g.layer_norm(x, gamma, std::nullopt, eps), in), DType::F64, {2, 2}, {-2 * i1, i1, -4 * i2, 2 * i2}));
  // Over both dims: mean 1, variance (0 + 4 + 9 + 1) / 4 = 3.5.
  auto g2 = g.input("g2", Shape{2, 2}, DType::F64);
  in.emplace("g2", tensor({2, 2}, {1, 1, 1, 2}));
  double i3 = 1 / std::sqrt(3.5 + eps);
  EXPECT_TRUE(
      is(run1(g, g.layer_norm(x, g2, std::nullopt, eps, -2), in), DType::F64, {2, 2}, {0, 2 * i3, -3 * i3, 2 * i3}));
  // rms: rows' mean squares 5 and 4.
  double r1 = 1 / std::sqrt(5 + eps), r2 = 1 / std::sqrt(4 + eps);
  EXPECT_TRUE(is(run1(g, g.rms_norm(x, gamma, eps), in), DType::F64, {2, 2}, {2 * r1, 3 * r1, -4 * r2, 2 * r2}));
  EXPECT_TRUE(is(run1(g, g.rms_norm(x, std::nullopt, eps), in), DType::F64, {2, 2}, {r1, 3 * r1, -2 * r2, 2 * r2}));
}

TEST(Reference, Conv1dByHand) {
  Graph g;
  auto x = g.input("x", Shape{1, 1, 5}, DType::F64);
  auto w = g.input("w", Shape{1, 1, 2}, DType::F64);
  auto b = g.input("b", Shape{1}, DType::F64);
  TensorMap in{{"x", tensor({1, 1, 5}, {1, 2, 3, 4, 5})}, {"w", tensor({1, 1, 2}, {1, -1})}, {"b", tensor({1}, {10})}};
  EXPECT_TRUE(is(run1(g, g.conv1d(x, w, b), in), DType::F64, {1, 1, 4}, {9, 9, 9, 9}));
  // padding 1, stride 2, dilation 2: taps at p-1 and p+1 for p = 0, 2, 4.
  EXPECT_TRUE(is(run1(g, g.conv1d(x, w, std::nullopt, 2, 1, 2), in), DType::F64, {1, 1, 3}, {-2, -2, 4}));
}

// Naive NCHW convolution with every knob, written independently of the reference.
Tensor naive_conv2d(const Tensor& x, const Tensor& w, const Tensor* b, Ints s, Ints p, Ints d, std::int64_t groups) {
  auto N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  auto O = w.shape()[0], Cg = w.shape()[1], KH = w.shape()[2], KW = w.shape()[3];
  auto OH = (H + 2 * p[0] - d[0] * (KH - 1) - 1) / s[0] + 1, OW = (W + 2 * p[1] - d[1] * (KW - 1) - 1) / s[1] + 1;
  Tensor out(DType::F64, {N, O, OH, OW});
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double acc = b ? b->get(o) : 0;
          std::int64_t group = o / (O / groups);
          for (std::int64_t ci = 0; ci < Cg; ++ci)
            for (std::int64_t kh = 0; kh < KH; ++kh)
              for (std::int64_t kw = 0; kw < KW; ++kw) {
                std::int64_t ih = oh * s[0] - p[0] + kh * d[0], iw = ow * s[1] - p[1] + kw * d[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc +=
                    x.get(((n * C + group * Cg + ci) * H + ih) * W + iw) * w.get(((o * Cg + ci) * KH + kh) * KW + kw);
              }
          out.set(((n * O + o) * OH + oh) * OW + ow, acc);
        }
  return out;
}

TEST(Reference, Conv2dMatchesNaiveLoop) {
  std::mt19937_64 rng(testing::test_seed());
  struct Case {
    Ints stride, padding, dilation;
    std::int64_t groups;
    bool bias;
  };
  const Case cases[] = {{{1, 1}, {0, 0}, {1, 1}, 1, false},
                        {{2, 1}, {1, 2}, {1, 1}, 2, true},
                        {{1, 2}, {2, 1}, {2, 3}, 3, true},
                        {{3, 3}, {1, 1}, {2, 2}, 6, false}};
  for (const auto& c : cases) {
    const std::int64_t N = 2, C = 6, O = 6;
    Tensor x = testing::random_tensor(DType::F64, {N, C, 7, 8}, rng);
    Tensor w = testing::random_tensor(DType::F64, {O, C / c.groups, 3, 2}, rng);
    Tensor b = testing::random_tensor(DType::F64, {O}, rng);
    Graph g;
    auto xi = g.input("x", Shape(x.shape()), DType::F64);
    auto wi = g.input("w", Shape(w.shape()), DType::F64);
    std::optional<NodeId> bi;
    if (c.bias) bi = g.input("b", Shape{O}, DType::F64);
    TensorMap in{{"x", x}, {"w", w}, {"b", b}};
    Tensor got = run1(g, g.conv2d(xi, wi, bi, c.stride, c.padding, c.dilation, c.groups), in);
    EXPECT_TRUE(testing::tensors_close(
        got, naive_conv2d(x, w, c.bias ? &b : nullptr, c.stride, c.padding, c.dilation, c.groups)))
        << "groups " << c.groups;
  }
}

TEST(Reference, Conv2dSingleEntryAttrsApplyToBothDims) {
  Graph g;
  auto x = g.input("x", Shape{1, 1, 3, 3}, DType::F64);
  auto w = g.input("w", Shape{1, 1, 1, 1}, DType::F64);
  TensorMap in{{"x", tensor({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})}, {"w", tensor({1, 1, 1, 1}, {2})}};
  EXPECT_TRUE(is(run1(g, g.conv2d(x, w, std::nullopt, {2}, {0}, {1}), in), DType::F64, {1, 1, 2, 2}, {2, 6, 14, 18}));
  EXPECT_TRUE(is(run1(g, g.conv2d(x, w, std::nullopt, {2}, {1}, {1}), in), DType::F64, {1, 1, 3, 3},
                 {0, 0, 0, 0, 10, 0, 0, 0, 0}));
}

TEST(Reference, Pooling) {
  Graph g;
  auto x = g.input("x", Shape{1, 1, 3, 4}, DType::F64);
  TensorMap in{{"x", tensor({1, 1, 3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, -9, -10, -11, -12})}};
  EXPECT_TRUE(is(run1(g, g.max_pool2d(x, {2, 2}, {1, 2}), in), DType::F64, {1, 1, 2, 2}, {6, 8, 6, 8}));
  EXPECT_TRUE(is(run1(g, g.avg_pool2d(x, {2, 2}, {1, 2}), in), DType::F64, {1, 1, 2, 2}, {3.5, 5.5, -2, -2}));
  // Padding 1, kernel 2, stride 2: max ignores the padding, avg divides by 4 regardless.
  EXPECT_TRUE(is(run1(g, g.max_pool2d(x, {2, 2}, {2, 2}, {1, 1}), in), DType::F64, {1, 1, 2, 3}, {1, 3, 4, 5, 7, 8}));
  EXPECT_TRUE(
      is(run1(g, g.avg_pool2d(x, {2, 2}, {2, 2}, {1, 1}), in), DType::F64, {1, 1, 2, 3}, {0.25, 1.25, 1, -1, -2, -1}));
  // All-negative window with padding: max is the real element, not a padded zero.
  EXPECT_TRUE(is(run1(g, g.max_pool2d(g.slice(x, {2}, {2}, {3}), {1, 2}, {1, 2}, {0, 1}), in), DType::F64, {1, 1, 1, 3},
                 {-9, -10, -12}));
}

TEST(Reference, Embedding) {
  Graph g;
  auto table = g.param("t", Shape{3, 2}, DType::F32);
  auto ids = g.input("ids", Shape{2, 2}, DType::I32);
  TensorMap ps{{"t", tensor({3, 2}, {0, 1, 10, 11, 20, 21}, DType::F32)}};
  EXPECT_TRUE(is(run1(g, g.embedding(table, ids), {{"ids", tensor({2, 2}, {2, 0, 1, 1}, DType::I32)}}, ps), DType::F32,
                 {2, 2, 2}, {20, 21, 0, 1, 10, 11, 10, 11}));
  auto e = g.embedding(table, ids);
  expect_error(
      [&] {
        run1(g, e, {{"ids", tensor({2, 2}, {0, 3, 0, 0}, DType::I32)}}, ps);
      },
      {"%" + std::to_string(e), "embedding", "index 3"});
}

// softmax(q k^T * scale + mask) v by explicit loops.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask, bool causal,
                       double scale) {
  auto B = q.shape()[0], H = q.shape()[1], S = q.shape()[2], D = q.shape()[3], T = k.shape()[2], E = v.shape()[3];
  if (scale == 0) scale = 1 / std::sqrt(double(D));
  Tensor out(DType::F64, {B, H, S, E});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> p(std::size_t(T), 0.0);
        double mx = -kInf, sum = 0;
        for (std::int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += q.get(((b * H + h) * S + i) * D + d) * k.get(((b * H + h) * T + j) * D + d);
          double sc = dot * scale;
          if (mask) {  // the test masks are [B, 1, S, T]
            double m = mask->get((b * S + i) * T + j);
            sc = mask->dtype() == DType::Bool ? (m != 0 ? sc : -kInf) : sc + m;
          }
          if (causal && j > i) sc = -kInf;
          p[std::size_t(j)] = sc;
          mx = std::max(mx, sc);
        }
        for (auto& e : p) sum += (e = std::exp(e - mx));
        for (std::int64_t e = 0; e < E; ++e) {
          double acc = 0;
          for (std::int64_t j = 0; j < T; ++j) acc += p[std::size_t(j)] / sum * v.get(((b * H + h) * T + j) * E + e);
          out.set(((b * H + h) * S + i) * E + e, acc);
        }
      }
  return out;
}

TEST(Reference, AttentionMatchesNaiveLoop) {
  std::mt19937_64 rng(testing::test_seed());
  const std::int64_t B = 2, H = 3, S = 4, T = 4, D = 5, E = 3;
  Tensor q = testing::random_tensor(DType::F64, {B, H, S, D}, rng);
  Tensor k = testing::random_tensor(DType::F64, {B, H, T, D}, rng);
  Tensor v = testing::random_tensor(DType::F64, {B, H, T, E}, rng);
  Tensor add_mask = testing::random_tensor(DType::F64, {B, 1, S, T}, rng);
  Tensor bool_mask = testing::random_tensor(DType::Bool, {B, 1, S, T}, rng);
  for (std::int64_t i = 0; i < B * S; ++i) bool_mask.set(i * T, 1);  // no fully masked row
  struct Case {
    const Tensor* mask;
    bool causal;
    double scale;
  };
  for (const auto& c : {Case{nullptr, false, 0}, Case{nullptr, true, 0}, Case{&add_mask, false, 0.7},
                        Case{&bool_mask, true, 0}, Case{&bool_mask, false, 2}}) {
    Graph g;
    auto qi = g.input("q", Shape(q.shape()), DType::F64);
    auto ki = g.input("k", Shape(k.shape()), DType::F64);
    auto vi = g.input("v", Shape(v.shape()), DType::F64);
    std::optional<NodeId> mi;
    TensorMap in{{"q", q}, {"k", k}, {"v", v}};
    if (c.mask) {
      mi = g.input("m", Shape(c.mask->shape()), c.mask->dtype());
      in.emplace("m", *c.mask);
    }
    Tensor got = run1(g, g.attention(qi, ki, vi, mi, c.causal, c.scale), in);
    EXPECT_TRUE(testing::tensors_close(got, naive_attention(q, k, v, c.mask, c.causal, c.scale)))
        << "causal " << c.causal << " scale " << c.scale << " mask " << (c.mask ? 1 : 0);
  }
}

TEST(Reference, AttentionByHand) {
  // One query, two keys with scores 0 and ln 3 (scale 1): weights 1/4, 3/4.
  Graph g;
  auto q = g.input("q", Shape{1, 1, 1, 1}, DType::F64);
  auto k = g.input("k", Shape{1, 1, 2, 1}, DType::F64);
  auto v = g.input("v", Shape{1, 1, 2, 2}, DType::F64);
  TensorMap in{{"q", tensor({1, 1, 1, 1}, {1})},
               {"k", tensor({1, 1, 2, 1}, {0, std::log(3.0)})},
               {"v", tensor({1, 1, 2, 2}, {4, 0, 0, 8})}};
  EXPECT_TRUE(is(run1(g, g.attention(q, k, v, std::nullopt, false, 1.0), in), DType::F64, {1, 1, 1, 2}, {1, 6}));
  // Causal hides key 1 from query 0.
  EXPECT_TRUE(is(run1(g, g.attention(q, k, v, std::nullopt, true, 1.0), in), DType::F64, {1, 1, 1, 2}, {4, 0}));
}

// ---- run() contract --------------------------------------------------------

TEST(Reference, MissingOrMismatchedFeedsNameThemselves) {
  Graph g;
  auto x = g.input("x", Shape{2}, DType::F32);
  auto w = g.param("w", Shape{2}, DType::F32);
  g.set_outputs({g.mul(x, w)});
  Tensor two = tensor({2}, {1, 2}, DType::F32);
  expect_error([&] { reference::run(g, {}, {{"w", two}}); }, {"'x'", "input"});
  expect_error([&] { reference::run(g, {{"x", two}}, {}); }, {"'w'", "param"});
  expect_error([&] { reference::run(g, {{"w", two}}, {{"x", two}}); }, {"'x'"});
  expect_error(
      [&] {
        reference::run(g, {{"x", tensor({2}, {1, 2}, DType::F64)}}, {{"w", two}});
      },
      {"'x'", "f32", "f64"});
  expect_error(
      [&] {
        reference::run(g, {{"x", two}}, {{"w", tensor({3}, {1, 2, 3}, DType::F32)}});
      },
      {"'w'", "[2]", "[3]"});
  expect_error([&] { reference::run(g, {{"x", tensor({2, 1}, {1, 2}, DType::F32)}}, {{"w", two}}); }, {"'x'"});
  auto r = reference::run(g, {{"x", two}}, {{"w", two}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(is(r[0], DType::F32, {2}, {1, 4}));
}

TEST(Reference, OnlyFeedsThatReachAnOutputAreRequired) {
  Graph g;
  auto x = g.input("x", Shape{2}, DType::F32);
  g.input("unused", Shape{2}, DType::F32);
  auto p = g.param("p", Shape{2}, DType::F32);
  g.add(x, p);
  EXPECT_TRUE(is(run1(g, g.exp(x), {{"x", tensor({2}, {0, 0}, DType::F32)}}), DType::F32, {2}, {1, 1}));
}

TEST(Reference, SymbolicDimsBindFromTheFeeds) {
  Graph g;
  auto x = g.input("x", Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(2)}), DType::F64);
  auto y = g.input("y", Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(1)}), DType::F64);
  g.set_outputs({g.sum(g.add(x, y), {1}), x});
  auto r = reference::run(g, {{"x", tensor({3, 2}, {1, 2, 3, 4, 5, 6})}, {"y", tensor({3, 1}, {1, 0, -1})}});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(is(r[0], DType::F64, {3}, {5, 7, 9}));
  EXPECT_TRUE(is(r[1], DType::F64, {3, 2}, {1, 2, 3, 4, 5, 6}));
  expect_error(
      [&] {
        reference::run(g, {{"x", tensor({3, 2}, {1, 2, 3, 4, 5, 6})}, {"y", tensor({2, 1}, {1, 0})}});
      },
      {"'y'", "[B,1]", "[2,1]"});
}

TEST(Reference, OutputsInOrderWithSharedAndRepeatedNodes) {
  Graph g;
  auto x = g.input("x", Shape{2}, DType::F32);
  auto e = g.exp(x);
  auto s = g.add(e, e);
  g.set_outputs({s, e, s, x});
  auto r = reference::run(g, {{"x", tensor({2}, {0, 1}, DType::F32)}});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(is(r[0], DType::F32, {2}, {2, 2 * std::exp(1.0)}));
  EXPECT_TRUE(is(r[1], DType::F32, {2}, {1, std::exp(1.0)}));
  EXPECT_TRUE(is(r[2], DType::F32, {2}, {2, 2 * std::exp(1.0)}));
  EXPECT_TRUE(is(r[3], DType::F32, {2}, {0, 1}));
}

TEST(Reference, EvalNodeEvaluatesOneNode) {
  Graph g;
  auto a = g.input("a", Shape{2, 2}, DType::F32);
  auto b = g.input("b", Shape{2}, DType::F32);
  auto m = g.matmul(a, g.reshape(b, Ints{2, 1}));
  Tensor ta = tensor({2, 2}, {1, 2, 3, 4}, DType::F32), tb = tensor({2, 1}, {1, -1}, DType::F32);
  EXPECT_TRUE(is(reference::eval_node(g, g.node(m), {&ta, &tb}), DType::F32, {2, 1}, {-1, -1}));
  expect_error([&] { reference::eval_node(g, g.node(m), {&ta}); }, {"matmul"});
  expect_error([&] { reference::eval_node(g, g.node(a), {}); }, {"'a'"});
}

}  // namespace
}  // namespace rlx
