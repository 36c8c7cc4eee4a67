// The int8 matmul's fused store and the standalone quantize (lowp_chain.hpp): PTQ's chains, and chains with
// every step kind, on every CPU ISA, match the generic epilogue program (RLX_CPU_INT8_EPILOGUE=0) byte for
// byte, into poisoned outputs, with NaN, infinities and values past the clamp in the inputs of the quantize;
// the matcher takes exactly the chains it can compute bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/lowp_chain.hpp"
#include "conformance/harness.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::backends::cpu {
namespace {

using ir::DType;
using ir::Graph;
using runtime::Device;

// An RLX setting for the scope (every reader sees it through rlx::env; the process environment is untouched).
using Env = rlx::env::ScopedOverride;

ir::Tensor random_tensor(DType t, std::vector<std::int64_t> shape, std::mt19937_64& rng, bool specials = false) {
  ir::Tensor x(t, shape);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<double> real(-3, 3);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (t == DType::U8)
      x.set(i, byte(rng));
    else if (t == DType::I8)
      x.set(i, byte(rng) - 128);
    else
      x.set(i, real(rng));
  }
  if (specials && t == DType::F32 && x.numel() >= 8) {
    const float s[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY, 1e30f, -1e30f, 2.5f, -0.0f, 3.5f};
    for (std::size_t k = 0; k < std::size(s); ++k) x.data_as<float>()[k * std::size_t(x.numel()) / 8] = s[k];
  }
  return x;
}

// Runs g with `inputs` and `params` into outputs poisoned with 0x5a bytes; the outputs.
std::vector<ir::Tensor> run_poisoned(const Graph& g, const std::map<std::string, ir::Tensor, std::less<>>& params,
                                     const std::map<std::string, ir::Tensor, std::less<>>& inputs) {
  auto c = Session(Device::Cpu).compile(g);
  for (const auto& [name, t] : params) c.set_param(name, t);
  std::vector<runtime::NamedTensor> named;
  for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
  std::vector<ir::Tensor> outs;
  for (const auto& spec : c.output_specs()) {
    outs.emplace_back(spec.dtype, spec.shape);
    std::memset(outs.back().data(), 0x5a, std::size_t(outs.back().nbytes()));
  }
  c.run_into(named, outs);
  return outs;
}

// Whether the CPU backend compiles g's int8 matmul kernels, and quantize kernels, to the fused chain.
struct Fused {
  int matmuls = 0, chains = 0, quantizes = 0;
};
Fused count_fused(const Graph& g) {
  const auto c = Session(Device::Cpu).compile(g);
  const auto& lir = c.compile_result().lir;
  Fused f;
  for (const auto& k : lir.kernels) {
    const BuildCtx b{lir, k, 1, 0, nullptr};
    if (k.kind == compile::KernelKind::MatMul) {
      ++f.matmuls;
      for (const auto& n : k.body.nodes())
        if (n.op == ir::OpKind::MatMul && match_int8_chain(b, n)) ++f.chains;
    } else if (k.kind == compile::KernelKind::Elementwise && build_quantize_chain(b, select_lowp_table())) {
      ++f.quantizes;
    }
  }
  return f;
}

// An int8 linear layer y = tail(cast(x_u8) @ cast(w_s8)) of [M, K] x [K, N], whose tail `kind` picks:
//   requant: PTQ's requantize between int8 layers (scale, offset per column; round, clamp at the zero point, u8);
//   dequant: PTQ's dequantize of the last layer (minus the zero point's column term, times the scales, plus a
//            bias param, relu), f32 out;
//   steps:   every other step kind (scalar - x, division, max with a param holding NaNs, min), clamp, i8 out.
Graph int8_linear(const std::string& kind, std::int64_t M, std::int64_t N, std::int64_t K, std::mt19937_64& rng) {
  Graph g("int8 linear " + kind);
  auto x = g.cast(g.input("x", {M, K}, DType::U8), DType::I32);
  auto w = g.cast(g.param("w", {K, N}, DType::I8), DType::I32);
  auto acc = g.cast(g.matmul(x, w), DType::F32);
  ir::Tensor scale(DType::F32, {N}), offset(DType::F32, {N});
  std::uniform_real_distribution<double> s(1e-4, 4e-3), o(-40, 60);
  for (std::int64_t j = 0; j < N; ++j) scale.set(j, s(rng)), offset.set(j, o(rng));
  if (kind == "requant") {
    auto v = g.unary(ir::OpKind::Round, g.add(g.mul(acc, g.constant(scale)), g.constant(offset)));
    g.add_output(g.cast(g.clamp(v, 3, 255), DType::U8), "y");
  } else if (kind == "dequant") {
    auto y = g.mul(g.sub(acc, g.constant(offset)), g.constant(scale));
    g.add_output(g.relu(g.add(y, g.param("bias", {N}))), "y");
  } else {
    auto y = g.binary(ir::OpKind::Div, g.sub(g.scalar(7.0), g.mul(acc, g.constant(scale))), g.scalar(0.75));
    y = g.binary(ir::OpKind::Min, g.binary(ir::OpKind::Max, y, g.param("floor", {N})), g.scalar(200.0));
    y = g.unary(ir::OpKind::Round, g.add(y, g.constant(offset)));
    g.add_output(g.cast(g.clamp(y, -128, 127), DType::I8), "y");
  }
  return g;
}

// PTQ's quantize of an activation, per tensor, or with a scale per column.
Graph quantize(std::int64_t M, std::int64_t N, bool per_column, DType to, std::mt19937_64& rng) {
  Graph g("quantize");
  auto x = g.input("x", {M, N});
  ir::Tensor scale(DType::F32, {N});
  std::uniform_real_distribution<double> s(20, 80);
  for (std::int64_t j = 0; j < N; ++j) scale.set(j, s(rng));
  auto v = per_column ? g.mul(x, g.constant(scale)) : g.mul(x, g.scalar(42.5));
  v = g.unary(ir::OpKind::Round, g.add(v, g.scalar(to == DType::U8 ? 128.0 : 0.0)));
  v = to == DType::U8 ? g.clamp(v, 0, 255) : g.clamp(v, -128, 127);
  g.add_output(g.cast(v, to), "q");
  return g;
}

void expect_same_bytes(const ir::Tensor& fused, const ir::Tensor& plain, const std::string& label) {
  ASSERT_EQ(fused.nbytes(), plain.nbytes()) << label;
  const auto* a = reinterpret_cast<const std::uint8_t*>(fused.data());
  const auto* b = reinterpret_cast<const std::uint8_t*>(plain.data());
  int wrong = 0;
  for (std::size_t i = 0; i < std::size_t(fused.nbytes()); ++i)
    if (a[i] != b[i] && wrong++ < 3)
      ADD_FAILURE() << label << ": byte " << i << " fused " << int(a[i]) << ", program " << int(b[i]);
}

TEST(Int8Chain, FusedStoreMatchesTheEpilogueProgramBitForBit) {
  std::mt19937_64 rng(testing::test_seed());
  for (const auto& isa : available_isas()) {
    Env env_isa("RLX_CPU_ISA", isa);
    for (const std::string kind : {"requant", "dequant", "steps"})
      for (auto [M, N, K] : {std::tuple{1, 10, 3}, {7, 37, 64}, {64, 10, 128}, {50, 130, 33}}) {
        const std::string label =
            isa + " " + kind + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
        const Graph g = int8_linear(kind, M, N, K, rng);
        ir::Tensor floor = random_tensor(DType::F32, {N}, rng);
        for (std::int64_t j = 0; j < N; j += 3) floor.set(j, std::nan(""));  // a NaN operand wins over a number
        const std::map<std::string, ir::Tensor, std::less<>> params{{"w", random_tensor(DType::I8, {K, N}, rng)},
                                                                    {"bias", random_tensor(DType::F32, {N}, rng)},
                                                                    {"floor", floor}};
        const std::map<std::string, ir::Tensor, std::less<>> in{{"x", random_tensor(DType::U8, {M, K}, rng)}};
        std::map<std::string, ir::Tensor, std::less<>> used;
        for (const auto& [name, t] : params)
          if (name == "w" || (name == "bias" && kind == "dequant") || (name == "floor" && kind == "steps"))
            used.emplace(name, t);
        const auto fused = run_poisoned(g, used, in);
        std::vector<ir::Tensor> plain;
        {
          Env off("RLX_CPU_INT8_EPILOGUE", "0");
          plain = run_poisoned(g, used, in);
          EXPECT_EQ(count_fused(g).chains, 0) << label;
        }
        expect_same_bytes(fused[0], plain[0], label);
        // Where the CPU has an int8 GEMM, the kernel takes the fused store.
        if (select_lowp_table().i8_nr > 0) {
          EXPECT_EQ(count_fused(g).chains, 1) << label;
        }
      }
  }
}

TEST(Int8Chain, StandaloneQuantizeMatchesTheProgramWithNanInfinitiesAndOverflow) {
  std::mt19937_64 rng(testing::test_seed());
  for (const auto& isa : available_isas()) {
    Env env_isa("RLX_CPU_ISA", isa);
    for (DType to : {DType::U8, DType::I8})
      for (bool per_column : {false, true})
        for (auto [M, N] : {std::pair{1, 5}, {33, 64}, {256, 10}, {9, 1000}}) {
          const std::string label = isa + " " + std::string(ir::dtype_name(to)) + (per_column ? " per column " : " ") +
                                    std::to_string(M) + "x" + std::to_string(N);
          const Graph g = quantize(M, N, per_column, to, rng);
          const std::map<std::string, ir::Tensor, std::less<>> in{{"x", random_tensor(DType::F32, {M, N}, rng, true)}};
          EXPECT_EQ(count_fused(g).quantizes, 1) << label;
          const auto fused = run_poisoned(g, {}, in);
          Env off("RLX_CPU_INT8_EPILOGUE", "0");
          EXPECT_EQ(count_fused(g).quantizes, 0) << label;
          expect_same_bytes(fused[0], run_poisoned(g, {}, in)[0], label);
        }
  }
}

// Chains the store cannot compute bit for bit stay with the program: a cast to u8 without a clamp inside
// [0, 255] (the program wraps the truncated value, a clamp outside the range lets it), an exp, a second
// reader of an intermediate value, an operand that varies along the rows.
TEST(Int8Chain, OtherChainsStayWithTheProgram) {
  std::mt19937_64 rng(testing::test_seed());
  auto linear = [&](auto tail) {
    Graph g("int8 linear");
    auto x = g.cast(g.input("x", {16, 32}, DType::U8), DType::I32);
    auto acc = g.cast(g.matmul(x, g.cast(g.param("w", {32, 24}, DType::I8), DType::I32)), DType::F32);
    tail(g, acc);
    return g;
  };
  const Graph cases[] = {
      linear([](Graph& g, ir::NodeId a) { g.add_output(g.cast(g.mul(a, g.scalar(0.01)), DType::U8), "y"); }),
      linear([](Graph& g, ir::NodeId a) { g.add_output(g.cast(g.clamp(a, -1, 300), DType::U8), "y"); }),
      linear([](Graph& g, ir::NodeId a) { g.add_output(g.unary(ir::OpKind::Exp, g.mul(a, g.scalar(1e-4))), "y"); }),
      linear([](Graph& g, ir::NodeId a) {
        auto s = g.mul(a, g.scalar(1e-3));
        g.add_output(g.add(s, g.relu(s)), "y");
      }),
      linear([](Graph& g, ir::NodeId a) {
        g.add_output(g.add(a, g.param("rows", {16, 1})), "y");
      }),
  };
  for (const auto& g : cases) {
    EXPECT_EQ(count_fused(g).chains, 0);
    conformance::Check c;
    c.seed = testing::test_seed();
    c.label = "unfused chain";
    c.gens["x"] = conformance::ints_in(0, 255);
    c.gens["w"] = conformance::ints_in(-127, 127);
    EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, c));
  }
  (void)rng;
}

}  // namespace
}  // namespace rlx::backends::cpu
