// Fused f32 runs of the CPU elementwise programs (program.cpp's fuse(),
// kernels_impl.inc's fused_tile): the running value stays in registers, so
// these cases aim at the bookkeeping around it: values read again after acc
// moved on, several stores in either order, the swapped forms of
// non-commutative ops, partial tiles and vectors, steps that call out of line,
// streaming stores to unaligned memory, and fused runs inside reduce and
// matmul kernels.
#include <gtest/gtest.h>

#include <cstring>

#include "conformance/harness.hpp"

namespace rlx::backends::cpu {
namespace {

using conformance::Check;
using conformance::matches_reference;
using ir::Graph;
using ir::OpKind;
using runtime::Device;

::testing::AssertionResult parity(const Graph& g, conformance::Gens gens = {}) {
  Check c;
  c.gens = std::move(gens);
  c.seed = testing::test_seed();
  c.label = g.name();
  return matches_reference(Device::Cpu, g, c);
}

TEST(CpuFused, StoresInEitherOrderAndValuesReadAgain) {
  for (bool swap : {false, true}) {
    Graph g("stores");
    auto x = g.input("x", {1000});
    auto a = g.unary(OpKind::Rsqrt, g.add(g.unary(OpKind::Abs, x), g.scalar(1.0)));
    auto b = g.unary(OpKind::Reciprocal, g.add(g.unary(OpKind::Abs, a), g.scalar(1.0)));
    g.add_output(swap ? a : b);
    g.add_output(swap ? b : a);
    EXPECT_TRUE(parity(g)) << "swap " << swap;
  }
  // y is read by the step after next, after an out-of-line step.
  Graph g("read again");
  auto x = g.input("x", {777});
  auto y = g.mul(x, g.scalar(2.0));
  auto z = g.exp(y);
  g.add_output(g.add(g.sub(z, y), g.mul(y, y)));
  EXPECT_TRUE(parity(g));
}

TEST(CpuFused, NonCommutativeOpsWithTheRunningValueOnEitherSide) {
  const OpKind ops[] = {OpKind::Sub, OpKind::Div, OpKind::Pow, OpKind::Mod, OpKind::Max, OpKind::Min};
  for (OpKind op : ops) {
    Graph g("swapped");
    auto x = g.input("x", {301});
    auto s = g.input("s", {301});
    auto t = g.add(g.unary(OpKind::Abs, x), g.scalar(0.5));   // positive: a valid base for pow
    auto u = g.add(g.unary(OpKind::Abs, s), g.scalar(0.25));  // computed after t, so t is reloaded
    g.add_output(g.binary(op, g.scalar(1.75), t));
    g.add_output(g.binary(op, s, g.mul(t, g.scalar(1.5))));
    g.add_output(g.binary(op, t, u));
    g.add_output(g.binary(op, u, u));
    EXPECT_TRUE(parity(g)) << ir::op_name(op);
  }
}

TEST(CpuFused, PartialTilesAndVectors) {
  for (std::int64_t n : {1, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 4097}) {
    Graph g("tails");
    auto x = g.input("x", {n});
    auto y = g.clamp(g.sub(g.mul(x, g.scalar(3.0)), g.scalar(0.5)), -1.0, 1.0);
    g.add_output(g.add(g.unary(OpKind::Tanh, y), x));
    EXPECT_TRUE(parity(g)) << "n = " << n;
  }
}

TEST(CpuFused, InsideReduceAndMatMulKernels) {
  Graph g("reduce and matmul");
  auto x = g.input("x", {37, 129});
  auto w = g.input("w", {129, 65});
  auto b = g.input("b", {65});
  auto r = g.reduce(OpKind::ReduceSum, g.exp(g.sub(g.mul(x, g.scalar(0.5)), g.scalar(1.0))), {1}, false);
  g.add_output(g.add(g.mul(r, g.scalar(3.0)), g.scalar(1.0)));
  g.add_output(g.mul(g.relu(g.add(g.matmul(x, w), b)), g.scalar(0.5)));
  EXPECT_TRUE(parity(g));
}

// Outputs past the streaming-store threshold, written to memory that is not
// vector aligned: such stores fall back to ordinary ones. Both runs must agree
// bit for bit with an aligned run.
TEST(CpuFused, StreamedOutputAtAnyAlignment) {
  const std::int64_t n = (std::int64_t(32) << 20) / 4 + 13;
  Graph g("streamed");
  auto x = g.input("x", {n});
  g.add_output(g.add(g.mul(g.relu(g.mul(x, g.scalar(1.5))), g.scalar(0.75)), x));
  Session session;
  auto cg = session.compile(g);
  ir::Tensor in(ir::DType::F32, {n});
  for (std::int64_t i = 0; i < n; ++i) in.data_as<float>()[i] = float(i % 1001) * 0.01f - 5.0f;
  const std::vector<runtime::NamedTensor> inputs{{"x", ir::view(in)}};
  const auto count = static_cast<std::size_t>(n);
  std::vector<float> want(count), buf(count + 64);
  cg.run_raw(inputs, std::vector<void*>{want.data()});
  for (std::size_t off : {1u, 3u, 16u}) {
    std::fill(buf.begin(), buf.end(), -1.0f);
    cg.run_raw(inputs, std::vector<void*>{buf.data() + off});
    EXPECT_EQ(std::memcmp(buf.data() + off, want.data(), want.size() * sizeof(float)), 0) << "offset " << off;
    EXPECT_EQ(buf[off - 1], -1.0f);
    EXPECT_EQ(buf[off + count], -1.0f);
  }
  for (std::int64_t i = 0; i < n; i += 4099) {
    const float v = in.data_as<float>()[i], r = std::max(v * 1.5f, 0.0f) * 0.75f + v;
    ASSERT_EQ(want[std::size_t(i)], r) << i;
  }
}

// A kernel whose outputs are each under the threshold but together past it (an optimizer's update writes
// three or four arrays of a weight's size) streams them all: every output, at any alignment, matches the
// aligned run bit for bit and the formula, and nothing outside it is touched.
TEST(CpuFused, OutputsStreamedTogetherAtAnyAlignment) {
  const std::int64_t n = (std::int64_t(12) << 20) / 4 + 5;  // 3 x 12 MiB: past the (at most 32 MiB) threshold
  Graph g("streamed_together");
  auto x = g.input("x", {n});
  auto y = g.input("y", {n});
  auto m = g.add(g.mul(x, g.scalar(0.5)), y);  // as Adam's moments feed its new weight
  auto v = g.sub(g.mul(m, g.scalar(2.0)), x);
  g.add_output(m);
  g.add_output(v);
  g.add_output(g.mul(g.relu(v), y));
  Session session;
  auto cg = session.compile(g);
  ASSERT_EQ(cg.compile_result().lir.kernels.size(), 1u) << "one kernel writes the three outputs";
  ir::Tensor xs(ir::DType::F32, {n}), ys(ir::DType::F32, {n});
  for (std::int64_t i = 0; i < n; ++i) {
    xs.data_as<float>()[i] = float(i % 1001) * 0.01f - 5.0f;
    ys.data_as<float>()[i] = float(i % 997) * 0.02f - 9.0f;
  }
  const std::vector<runtime::NamedTensor> inputs{{"x", ir::view(xs)}, {"y", ir::view(ys)}};
  const auto count = static_cast<std::size_t>(n);
  std::vector<std::vector<float>> want(3, std::vector<float>(count)), buf(3, std::vector<float>(count + 64));
  cg.run_raw(inputs, std::vector<void*>{want[0].data(), want[1].data(), want[2].data()});
  for (std::size_t off : {1u, 7u, 16u}) {
    for (auto& b : buf) std::fill(b.begin(), b.end(), -1.0f);
    cg.run_raw(inputs, std::vector<void*>{buf[0].data() + off, buf[1].data() + off + 1, buf[2].data() + off + 2});
    for (std::size_t j = 0; j < 3; ++j) {
      const std::size_t o = off + j;
      EXPECT_EQ(std::memcmp(buf[j].data() + o, want[j].data(), count * sizeof(float)), 0)
          << "output " << j << " at " << o;
      EXPECT_EQ(buf[j][o - 1], -1.0f);
      EXPECT_EQ(buf[j][o + count], -1.0f);
    }
  }
  for (std::int64_t i = 0; i < n; i += 4099) {
    const float a = xs.data_as<float>()[i], b = ys.data_as<float>()[i];
    const auto k = std::size_t(i);
    const float m = a * 0.5f + b, v = m * 2.0f - a;
    ASSERT_EQ(want[0][k], m) << i;
    ASSERT_EQ(want[1][k], v) << i;
    ASSERT_EQ(want[2][k], std::max(v, 0.0f) * b) << i;
  }
}

}  // namespace
}  // namespace rlx::backends::cpu
