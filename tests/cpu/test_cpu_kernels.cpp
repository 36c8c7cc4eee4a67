// CPU backend kernels against the float64 reference, aimed at the backend's
// own code paths: load kinds of the elementwise programs (contiguous, scalar,
// row, strided), block and thread boundaries, every reduction layout
// (row, column, split, permuted), GEMM panels and batch broadcasting, the
// transpose path of strided copies, native kernels, clones and errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "conformance/harness.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"

namespace rlx::backends::cpu {
namespace {

using conformance::Check;
using conformance::matches_reference;
using ir::DType;
using ir::Graph;
using ir::OpKind;
using runtime::Device;
using Ints = std::vector<std::int64_t>;

::testing::AssertionResult parity(const Graph& g, conformance::Gens gens = {},
                                  std::optional<testing::Tolerance> tol = {}, compile::CompileOptions opts = {}) {
  Check c;
  c.gens = std::move(gens);
  c.tol = tol;
  c.seed = testing::test_seed();
  c.options = std::move(opts);
  c.label = g.name();
  return matches_reference(Device::Cpu, g, c);
}

Graph named(const char* name) { return Graph(name); }

TEST(CpuElementwise, BroadcastLoadKinds) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    Graph g = named("broadcast kinds");
    auto x = g.input("x", {3, 64, 33}, t);
    auto row = g.input("row", {33}, t);                                // Row
    auto col = g.input("col", {64, 1}, t);                             // Strided: inner stride 0
    auto mid = g.input("mid", {3, 1, 33}, t);                          // Strided: a broadcast middle dim
    auto s = g.input("s", ir::Shape(std::vector<std::int64_t>{}), t);  // Scalar
    auto y = g.add(g.mul(g.add(x, row), col), g.sub(mid, s));
    g.add_output(g.relu(y));
    EXPECT_TRUE(parity(g)) << ir::dtype_name(t);
  }
}

TEST(CpuElementwise, ManyBlocksAndThreads) {
  Graph g = named("large chain");
  auto x = g.input("x", {300, 517});
  auto b = g.input("b", {517});
  auto y = g.unary(OpKind::Tanh, g.add(g.mul(x, g.scalar(1.5)), b));
  y = g.add(g.unary(OpKind::Gelu, y), g.unary(OpKind::Sigmoid, x));
  g.add_output(y);
  g.add_output(g.exp(x));  // a second output of the same kernel
  EXPECT_TRUE(parity(g));
}

TEST(CpuElementwise, EveryFloatUnaryAcrossDtypes) {
  const OpKind ops[] = {
      OpKind::Neg,  OpKind::Abs,   OpKind::Exp,      OpKind::Sqrt,  OpKind::Rsqrt,    OpKind::Tanh, OpKind::Sigmoid,
      OpKind::Relu, OpKind::Gelu,  OpKind::GeluTanh, OpKind::Silu,  OpKind::Softplus, OpKind::Erf,  OpKind::Sin,
      OpKind::Cos,  OpKind::Floor, OpKind::Ceil,     OpKind::Round, OpKind::Sign,     OpKind::Log,  OpKind::Reciprocal};
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (OpKind op : ops) {
      Graph g = named("unary");
      auto x = g.input("x", {1000}, t);
      bool positive = op == OpKind::Sqrt || op == OpKind::Rsqrt || op == OpKind::Log || op == OpKind::Reciprocal;
      g.add_output(g.unary(op, x));
      conformance::Gens gens;
      if (positive) gens["x"] = conformance::uniform(0.1, 4.0);
      if (op == OpKind::Round) gens["x"] = conformance::one_of({-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7});
      if (op == OpKind::Sign) gens["x"] = conformance::one_of({-1.5, 0.0, 2.0});
      EXPECT_TRUE(parity(g, gens)) << ir::op_name(op) << " " << ir::dtype_name(t);
    }
}

TEST(CpuElementwise, IntegerSemantics) {
  for (DType t : {DType::I8, DType::U8, DType::I32, DType::I64}) {
    Graph g = named("integers");
    auto a = g.input("a", {513}, t);
    auto b = g.input("b", {513}, t);
    g.add_output(g.add(a, b));  // wraps in narrow types
    g.add_output(g.mul(a, b));
    g.add_output(g.binary(OpKind::Div, a, b));  // truncates; x/0 = 0
    g.add_output(g.binary(OpKind::Mod, a, b));  // sign of the divisor
    g.add_output(g.unary(OpKind::Neg, a));
    g.add_output(g.unary(OpKind::Abs, a));
    g.add_output(g.binary(OpKind::Max, a, b));
    g.add_output(g.binary(OpKind::Lt, a, b));
    g.add_output(g.clamp(a, -3.5, 7.25));
    g.add_output(g.cast(a, DType::F32));
    conformance::Gens gens{{"a", conformance::ints_in(-128, 127)}, {"b", conformance::ints_in(-5, 5)}};
    if (t == DType::U8) gens = {{"a", conformance::ints_in(0, 255)}, {"b", conformance::ints_in(0, 9)}};
    EXPECT_TRUE(parity(g, gens)) << ir::dtype_name(t);
  }
}

TEST(CpuElementwise, CastsBoolsAndWhere) {
  Graph g = named("casts");
  auto x = g.input("x", {7, 300});
  auto c = g.binary(OpKind::Gt, x, g.scalar(0.0));
  g.add_output(g.where(c, x, g.exp(x)));
  g.add_output(g.cast(g.mul(x, g.scalar(100.0)), DType::I32));
  g.add_output(g.cast(g.mul(x, g.scalar(100.0)), DType::U8));  // wraps like a store
  g.add_output(g.cast(x, DType::Bool));
  g.add_output(g.cast(g.cast(x, DType::F16), DType::F64));
  g.add_output(g.binary(OpKind::And, c, g.unary(OpKind::Not, g.binary(OpKind::Lt, x, g.scalar(1.0)))));
  auto i = g.input("i", {7, 300}, DType::I64);
  g.add_output(g.cast(i, DType::F32));
  g.add_output(g.cast(i, DType::I8));
  EXPECT_TRUE(parity(g, {{"i", conformance::ints_in(-100000, 100000)}}));
}

TEST(CpuElementwise, NaNPropagation) {
  Graph g = named("nan");
  auto x = g.input("x", {64});
  auto y = g.input("y", {64});
  g.add_output(g.binary(OpKind::Max, x, y));
  g.add_output(g.binary(OpKind::Min, x, y));
  g.add_output(g.relu(x));
  g.add_output(g.clamp(x, -1, 1));
  g.add_output(g.unary(OpKind::Sign, x));
  g.add_output(g.binary(OpKind::Ne, x, y));
  auto nanny = conformance::one_of({std::nan(""), -1.5, 0.0, 2.0});
  EXPECT_TRUE(parity(g, {{"x", nanny}, {"y", nanny}}));
}

TEST(CpuElementwise, FloatModTakesTheDivisorsSign) {
  for (DType t : {DType::F32, DType::F64, DType::F16}) {
    Graph g = named("fmod");
    auto x = g.input("x", {200}, t);
    auto y = g.input("y", {200}, t);
    g.add_output(g.binary(OpKind::Mod, x, y));
    g.add_output(g.binary(OpKind::Mod, x, g.scalar(-0.75, t)));  // a uniform divisor
    EXPECT_TRUE(parity(g, {{"x", conformance::one_of({0.0, -0.0, 1.5, -3.0, 3.0, 2.25})},
                           {"y", conformance::one_of({-1.5, 1.5, 0.75, -0.75})}}))
        << ir::dtype_name(t);
  }
}

TEST(CpuReduce, EveryAxisSubset) {
  const Ints shape{3, 4, 5};
  for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMean, OpKind::ReduceProd})
    for (int mask = 1; mask < 8; ++mask)
      for (bool keep : {false, true}) {
        Ints axes;
        for (int d = 0; d < 3; ++d)
          if (mask >> d & 1) axes.push_back(d);
        Graph g = named("reduce subset");
        auto x = g.input("x", ir::Shape(shape));
        g.add_output(g.mul(g.reduce(op, g.exp(x), axes, keep), g.scalar(0.5)));
        EXPECT_TRUE(parity(g, {{"x", conformance::uniform(-0.5, 0.5)}})) << ir::op_name(op) << " mask " << mask;
      }
}

TEST(CpuReduce, ArgReductionsWithTiesAndNaN) {
  for (int axis : {0, 1, 2})
    for (OpKind op : {OpKind::ArgMax, OpKind::ArgMin}) {
      Graph g = named("arg");
      auto x = g.input("x", {6, 40, 9});
      g.add_output(op == OpKind::ArgMax ? g.argmax(x, axis) : g.argmin(x, axis, true));
      EXPECT_TRUE(parity(g, {{"x", conformance::one_of({1.0, 2.0, -1.0, 2.0, std::nan("")})}})) << axis;
      EXPECT_TRUE(parity(g, {{"x", conformance::ints_in(-3, 3)}})) << axis;
    }
}

TEST(CpuReduce, LayoutsSplitsAndChunks) {
  struct Case {
    Ints shape;
    Ints axes;
  };
  const Case cases[] = {
      {{1 << 20}, {0}},        // one long row: split over threads
      {{4096, 3}, {0}},        // column reduction with a tiny inner dim, split
      {{2, 5000, 70}, {1}},    // inner > 1 in one chunk, several rows per block
      {{3, 40, 3000}, {1}},    // inner > chunk
      {{50, 7}, {1}},          // many short rows in one block
      {{20, 30, 40}, {0, 2}},  // non-contiguous axes: permuted prologue
      {{64, 1, 33}, {1}},      // reducing a unit dim
  };
  for (const auto& c : cases)
    for (DType t : {DType::F32, DType::F64, DType::I32}) {
      Graph g = named("reduce layout");
      auto x = g.input("x", ir::Shape(c.shape), t);
      g.add_output(g.sum(x, c.axes));
      g.add_output(g.reduce(OpKind::ReduceMax, x, c.axes));
      g.add_output(g.argmax(x, c.axes[0]));
      conformance::Gens gens{{"x", conformance::uniform(-1, 1)}};
      if (t == DType::I32) gens = {{"x", conformance::ints_in(-50, 50)}};
      EXPECT_TRUE(parity(g, gens, testing::Tolerance{1e-3, 1e-4})) << ir::Shape(c.shape).str();
    }
}

TEST(CpuReduce, LongFloatSumIsAccurate) {
  Graph g = named("long sum");
  auto x = g.input("x", {1 << 20});
  g.add_output(g.sum(x, {0}));
  Session s;
  auto exe = s.compile(g);
  std::mt19937_64 rng(testing::test_seed());
  auto xt = testing::random_tensor(DType::F32, {1 << 20}, rng, 0.0, 1.0);
  double want = 0;
  for (std::int64_t i = 0; i < xt.numel(); ++i) want += xt.get(i);
  auto got = exe.run({{"x", xt}})[0].get(0);
  EXPECT_LT(std::fabs(got - want) / want, 1e-6) << got << " vs " << want;
}

TEST(CpuReduce, HalfPrecisionWithEpilogue) {
  for (DType t : {DType::F16, DType::BF16}) {
    Graph g = named("half reduce");
    auto x = g.input("x", {8, 300}, t);
    auto m = g.mean(x, {1}, true);
    g.add_output(g.sub(x, m));
    g.add_output(g.unary(OpKind::Sqrt, g.mean(g.mul(x, x), {1})));
    EXPECT_TRUE(parity(g)) << ir::dtype_name(t);
  }
}

TEST(CpuMatMul, BatchesPanelsAndEpilogues) {
  struct Case {
    Ints a, b;
  };
  const Case cases[] = {
      {{2, 3, 5, 7}, {2, 3, 7, 4}},  // equal batches
      {{6, 5, 7}, {7, 4}},           // shared B: one taller GEMM
      {{5, 7}, {3, 7, 4}},           // shared A
      {{2, 1, 5, 7}, {3, 7, 4}},     // broadcast batch dims on both sides
      {{256, 300}, {300, 200}},      // panels over M
      {{1, 512}, {512, 1000}},       // GEMV: panels over N
      {{0, 4}, {4, 3}},              // empty
      {{3, 0}, {0, 5}},              // K = 0
  };
  for (const auto& c : cases)
    for (DType t : {DType::F32, DType::F64, DType::F16}) {
      Graph g = named("matmul");
      auto a = g.input("a", ir::Shape(c.a), t);
      auto b = g.input("b", ir::Shape(c.b), t);
      auto bias = g.input("bias", {c.b.back()}, t);
      auto mm = g.matmul(a, b);
      g.add_output(g.relu(g.add(mm, bias)));
      testing::Tolerance tol = t == DType::F16 ? testing::Tolerance{5e-2, 2e-2} : testing::tolerance_for(t);
      EXPECT_TRUE(parity(g, {}, tol)) << ir::Shape(c.a).str() << " x " << ir::Shape(c.b).str() << " "
                                      << ir::dtype_name(t);
    }
  for (DType t : {DType::I32, DType::I64, DType::I8}) {
    Graph g = named("int matmul");
    auto a = g.input("a", {4, 9, 6}, t);
    auto b = g.input("b", {4, 6, 5}, t);
    g.add_output(g.matmul(a, b));
    EXPECT_TRUE(parity(g, {{"a", conformance::ints_in(-20, 20)}, {"b", conformance::ints_in(-20, 20)}}));
  }
}

TEST(CpuMovement, StridedCopies) {
  for (DType t : {DType::F32, DType::F16, DType::I8, DType::I64}) {
    Graph g = named("movement");
    auto x = g.input("x", {4, 6, 70, 33}, t);
    g.add_output(g.permute(x, {0, 2, 1, 3}));
    g.add_output(g.permute(x, {3, 2, 1, 0}));
    g.add_output(g.transpose(x));  // tiled transpose path
    g.add_output(g.slice(x, {1, 2, 3}, {1, 3, 2}, {5, 60, 33}, {2, 7, 3}));
    g.add_output(g.flip(x, {0, 3}));
    g.add_output(g.expand(g.slice(x, {1}, {0}, {1}), ir::Shape({4, 5, 70, 33})));
    g.add_output(g.pad(x, {0, -1, 2, 0, 1, 0, -3, 4}, 1.5));
    g.add_output(g.concat({x, g.flip(x, {2}), x}, 2));
    EXPECT_TRUE(parity(g, {{"x", conformance::ints_in(-9, 9)}})) << ir::dtype_name(t);
  }
}

TEST(CpuMovement, IndexedOps) {
  Graph g = named("indexed");
  auto x = g.input("x", {5, 8, 6});
  auto gi = g.input("gi", {5, 3, 6}, DType::I64);
  auto si = g.input("si", {7}, DType::I32);
  auto upd = g.input("upd", {5, 3, 6});
  g.add_output(g.gather(x, gi, 1));
  g.add_output(g.index_select(x, si, 1));
  g.add_output(g.index_select(x, si, 2));
  g.add_output(g.scatter_add(x, gi, upd, 1));
  EXPECT_TRUE(parity(g, {{"gi", conformance::ints_in(-8, 7)}, {"si", conformance::ints_in(-6, 5)}}));
}

TEST(CpuMovement, IndexOutOfRangeNamesTheKernel) {
  Graph g = named("bad index");
  auto x = g.input("x", {4, 3});
  auto i = g.input("i", {2}, DType::I64);
  g.add_output(g.index_select(x, i, 0));
  Session s;
  auto exe = s.compile(g);
  ir::Tensor xt(DType::F32, {4, 3});
  ir::Tensor it = ir::Tensor::from_f64(DType::I64, {2}, std::vector<double>{1, 9});
  try {
    exe.run({{"x", xt}, {"i", it}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cpu kernel"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 9 out of range"), std::string::npos) << msg;
  }
}

TEST(CpuNative, NormsSoftmaxConvPoolAttention) {
  for (DType t : {DType::F32, DType::F64}) {
    {
      Graph g = named("softmax axes");
      auto x = g.input("x", {6, 50, 7}, t);
      g.add_output(g.softmax(x, 1));
      g.add_output(g.log_softmax(x, -1));
      g.add_output(g.softmax(x, 0));
      EXPECT_TRUE(parity(g));
    }
    {
      Graph g = named("norms");
      auto x = g.input("x", {9, 4, 300}, t);
      auto gm = g.input("g", {4, 300}, t);
      auto bt = g.input("b", {4, 300}, t);
      auto gr = g.input("gr", {300}, t);
      g.add_output(g.layer_norm(x, gm, bt, 1e-5, 1));
      g.add_output(g.rms_norm(x, gr));
      EXPECT_TRUE(parity(g, {{"x", conformance::uniform(30, 34)}}));  // |mean| >> std
    }
    {
      Graph g = named("conv");
      auto x = g.input("x", {2, 6, 17, 13}, t);
      auto w = g.input("w", {4, 3, 3, 2}, t);
      auto b = g.input("b", {4}, t);
      g.add_output(g.conv2d(x, w, b, {2, 1}, {1, 2}, {1, 2}, 2));
      auto w1 = g.input("w1", {5, 6, 1, 1}, t);
      g.add_output(g.conv2d(x, w1, std::nullopt));
      auto x1 = g.input("x1", {3, 4, 40}, t);
      auto w2 = g.input("w2", {8, 4, 5}, t);
      g.add_output(g.conv1d(x1, w2, std::nullopt, 2, 3, 2, 1));
      g.add_output(g.max_pool2d(x, {3, 2}, {2, 2}, {1, 1}));
      g.add_output(g.avg_pool2d(x, {2, 3}, {1, 2}, {1, 0}));
      EXPECT_TRUE(parity(g));
    }
    {
      Graph g = named("attention");
      auto q = g.input("q", {2, 3, 37, 16}, t);
      auto k = g.input("k", {2, 3, 45, 16}, t);
      auto v = g.input("v", {2, 3, 45, 8}, t);
      auto fm = g.input("fm", {37, 45}, t);
      auto bm = g.input("bm", {2, 1, 1, 45}, DType::Bool);
      g.add_output(g.attention(q, k, v, fm, false, 0.3));
      g.add_output(g.attention(q, k, v, bm, true));
      g.add_output(g.attention(q, k, v, std::nullopt, true));
      EXPECT_TRUE(parity(g, {{"bm", conformance::bools(0.8)}}));
    }
  }
}

// Attention reading [B, S, H, D] projections and writing its result as [B, S, H, D] (the head split and merge
// are its GEMMs' leading dims: BackendTraits::attention_layout_views): one kernel, no movement kernels, in f32
// and f64, with grouped KV heads and a bool mask; a permute that moves the head dim stays a movement kernel.
TEST(CpuNative, AttentionReadsAndWritesThroughHeadSplitPermutes) {
  const compile::BackendTraits traits = runtime::make_backend(Device::Cpu)->traits();
  for (DType t : {DType::F32, DType::F64}) {
    Graph g = named("attention over [B, S, H, D]");
    const Ints heads{0, 2, 1, 3};
    auto q = g.permute(g.reshape(g.input("q", {2, 19, 4 * 16}, t), ir::Shape{2, 19, 4, 16}), heads);
    auto k = g.permute(g.input("k", {2, 23, 2, 16}, t), heads);
    auto v = g.permute(g.input("v", {2, 23, 2, 8}, t), heads);
    auto bm = g.input("bm", {2, 1, 19, 23}, DType::Bool);
    g.add_output(g.permute(g.attention(q, k, v, bm, false), heads), "y");
    const auto lir = compile::compile(g, traits, {}).lir;
    ASSERT_EQ(lir.kernels.size(), 1u) << lir.to_text();
    EXPECT_EQ(lir.kernels[0].kind, compile::KernelKind::Native);
    EXPECT_TRUE(parity(g, {{"bm", conformance::bools(0.8)}}));
  }
  Graph g = named("k read as [B, H, D, S]");
  auto q = g.input("q", {1, 2, 5, 8});
  auto kt = g.permute(g.input("kt", {1, 2, 8, 7}), {0, 1, 3, 2});
  g.add_output(g.attention(q, kt, g.input("v", {1, 2, 7, 8})), "y");
  std::size_t movement = 0;
  for (const auto& k : compile::compile(g, traits, {}).lir.kernels) movement += k.kind == compile::KernelKind::Movement;
  EXPECT_EQ(movement, 1u);
  EXPECT_TRUE(parity(g));
}

TEST(CpuLeaf, IotaAndRandom) {
  Graph g = named("leaf");
  g.add_output(g.iota({3, 1000}, 1, DType::F32));
  g.add_output(g.iota({40, 7}, 0, DType::I32));
  g.add_output(g.random_uniform({100, 333}, 42, -2, 3));
  g.add_output(g.random_normal({100, 333}, 7, 1, 2, DType::F64));
  EXPECT_TRUE(parity(g));
}

TEST(CpuExecutable, ClonesRunConcurrentlyAndShareParams) {
  Graph g = named("clones");
  auto x = g.input("x", {64, 128});
  auto w = g.param("w", {128, 32});
  auto y = g.mean(g.relu(g.matmul(x, w)), {1});
  g.add_output(y);
  Session s;
  auto exe = s.compile(g);
  std::mt19937_64 rng(testing::test_seed());
  auto wt = testing::random_tensor(DType::F32, {128, 32}, rng);
  exe.set_param("w", wt);
  std::vector<CompiledGraph> clones;
  for (int i = 0; i < 4; ++i) clones.push_back(exe.clone());
  std::vector<ir::Tensor> xs;
  std::vector<std::vector<ir::Tensor>> want;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(testing::random_tensor(DType::F32, {64, 128}, rng));
    want.push_back(reference::run(g, {{"x", xs.back()}}, {{"w", wt}}));
  }
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int r = 0; r < 50; ++r) {
        auto got = clones[std::size_t(i)].run({{"x", xs[std::size_t(i)]}});
        if (!testing::tensors_close(got[0], want[std::size_t(i)][0])) bad.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  // Params are shared: setting them through the original changes every clone.
  auto w2 = testing::random_tensor(DType::F32, {128, 32}, rng);
  exe.set_param("w", w2);
  auto got = clones[0].run({{"x", xs[0]}});
  EXPECT_TRUE(testing::tensors_close(got[0], reference::run(g, {{"x", xs[0]}}, {{"w", w2}})[0]));
}

TEST(CpuExecutable, NumThreadsOptionAndOutputAliases) {
  Graph g = named("aliases");
  auto x = g.input("x", {33, 65});
  auto y = g.exp(x);
  g.add_output(y);
  g.add_output(y);                           // the same buffer twice
  g.add_output(x);                           // an input passed through
  g.add_output(g.reshape(y, Ints{65, 33}));  // a view of an output
  compile::CompileOptions opts;
  opts.num_threads = 1;
  EXPECT_TRUE(parity(g, {}, {}, opts));
  EXPECT_TRUE(parity(g));
}

}  // namespace
}  // namespace rlx::backends::cpu
