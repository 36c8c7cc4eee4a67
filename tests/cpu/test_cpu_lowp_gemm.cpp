// The low-precision GEMMs (lowp_gemm.hpp): every table's int8 kernel against an exact integer product and its
// bf16 kernel against a float64 product, at sizes off the tiles (K tails of 1..3, N tails, row and panel
// ranges that start inside the matrix, a K past one slice), into poisoned outputs; and matmuls whose operands
// are widening casts end to end on every CPU ISA (the int8/bf16 kernels or the widening fallback), weights
// packed once or activations packed per run, with epilogues, against the reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/isa.hpp"
#include "backends/cpu/lowp_gemm.hpp"
#include "conformance/harness.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/ir/quants.hpp"

namespace rlx::backends::cpu {
namespace {

using conformance::Check;
using ir::DType;
using ir::Graph;
using ir::OpKind;
using runtime::Device;

struct Shape3 {
  std::int64_t M, N, K;
};
// Tails of every kind: K % 4 in 1..3 and odd K, N off the 16-lane vectors and the panels, M off the 6-row
// tiles, and K = 2053 past the int8 kernel's 2048-value slice; for AMX's 32 x 32 blocks of 16 x 16 tiles and
// 64-value k steps: whole blocks and steps (64 x 64 x 192: split in two, each half 32 rows), a block of 17
// rows (one past the first tile's 16) and one of 16, K one past a step. The VNNI tile (6 rows x 4 vectors, its
// k loop and its masked tail of K in assembly, stored straight to C unless the offsets' corrections or a later
// K slice add to it): whole tiles with K a multiple of 4 (18 x 128 x 64, straight to C), every row count 1..5
// after whole tiles (11, 23), one vector of 10 columns (PTQ's classes), and K slices of 2048 ending in a tail
// of 1 and 2 values (2049, 4098).
constexpr Shape3 kShapes[] = {{1, 1, 1},      {7, 17, 3},     {6, 64, 4},    {13, 65, 5},  {5, 130, 31}, {3, 20, 2053},
                              {12, 33, 1030}, {2, 200, 2},    {64, 64, 192}, {34, 96, 65}, {32, 40, 64}, {18, 128, 64},
                              {11, 10, 129},  {23, 192, 127}, {4, 49, 2049}, {9, 16, 4098}};

// Runs rows [m0, m1) x panels [p0, p1) in two calls each way, so ranges that start inside the matrix are
// covered; returns C.
template <class Gemm>
void split_calls(std::int64_t M, std::int64_t panels, Gemm gemm) {
  const std::int64_t mh = M / 2, ph = panels / 2;
  gemm(0, mh, 0, ph);
  gemm(0, mh, ph, panels);
  gemm(mh, M, 0, ph);
  gemm(mh, M, ph, panels);
}

// n uniformly random bytes: the operands' u8 or, read as int8_t, s8 values.
std::vector<std::uint8_t> random_bytes(std::mt19937_64& rng, std::int64_t n) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  for (auto& v : out) v = std::uint8_t(byte(rng));
  return out;
}

TEST(LowpGemm, Int8KernelsAreExactOnEveryIsa) {
  std::mt19937_64 rng(testing::test_seed());
  int tables = 0;
  for (const auto& isa : lowp_isas()) {
    const LowpTable& t = lowp_table(isa);
    if (t.i8_nr == 0) continue;
    ++tables;
    for (auto [M, N, K] : kShapes)
      for (int a_unsigned = 0; a_unsigned < 2; ++a_unsigned)
        for (int b_unsigned = 0; b_unsigned < 2; ++b_unsigned)
          for (int transposed = 0; transposed < 2; ++transposed) {
            const auto a = random_bytes(rng, M * K), b = random_bytes(rng, K * N);
            auto av = [&](std::int64_t m, std::int64_t k) -> std::int64_t {
              const std::uint8_t v = a[std::size_t(m * K + k)];
              return a_unsigned ? v : std::int8_t(v);
            };
            // b holds B [K, N], or B^T [N, K] when transposed.
            auto bv = [&](std::int64_t k, std::int64_t n) -> std::int64_t {
              const std::uint8_t v = transposed ? b[std::size_t(n * K + k)] : b[std::size_t(k * N + n)];
              return b_unsigned ? v : std::int8_t(v);
            };
            const auto panels = std::int64_t(lowp_panels(t.i8_nr, N));
            std::vector<std::byte> packed(std::size_t(panels) * i8_panel_bytes(t, K), std::byte{0x5a});
            t.i8_pack_b(b.data(), b_unsigned, transposed, transposed ? K : N, K, N, packed.data(), 0, panels);
            std::vector<std::int32_t> c(std::size_t(M * N), std::numeric_limits<std::int32_t>::min());
            std::vector<std::int32_t> rowsum(static_cast<std::size_t>(M));
            split_calls(M, panels, [&](std::int64_t m0, std::int64_t m1, std::int64_t p0, std::int64_t p1) {
              t.i8_gemm(a.data(), a_unsigned, K, packed.data(), b_unsigned, K, N, c.data(), N, m0, m1, p0, p1,
                        rowsum.data());
            });
            const std::string label = std::string(t.name) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                      std::to_string(K) + (a_unsigned ? " u8" : " i8") +
                                      (b_unsigned ? " x u8" : " x i8") + (transposed ? " (B^T)" : "");
            int wrong = 0;
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t n = 0; n < N; ++n) {
                std::int64_t want = 0;
                for (std::int64_t k = 0; k < K; ++k) want += av(m, k) * bv(k, n);
                if (c[std::size_t(m * N + n)] != want && wrong++ < 3)
                  ADD_FAILURE() << label << ": C[" << m << ", " << n << "] = " << c[std::size_t(m * N + n)] << ", want "
                                << want;
              }
          }
  }
  if (tables == 0) GTEST_SKIP() << "this CPU has no int8 GEMM table (needs AVX-512 VNNI and BF16)";
}

// The GEMM with its store fused (LowpTable::i8_gemm_fused, the chain applied to each tile in registers) writes
// what the GEMM followed by the separate store writes, byte for byte, at every shape and sign combination
// (the offsets' corrections before the chain), into poisoned outputs; past one slice of K it declines.
TEST(LowpGemm, FusedStoreMatchesTheGemmThenTheStore) {
  std::mt19937_64 rng(testing::test_seed() + 3);
  std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
  int tables = 0;
  for (const auto& isa : lowp_isas()) {
    const LowpTable& t = lowp_table(isa);
    if (t.i8_nr == 0 || !t.i8_gemm_fused) continue;
    ++tables;
    for (auto [M, N, K] : kShapes)
      for (int a_unsigned = 0; a_unsigned < 2; ++a_unsigned)
        for (int b_unsigned = 0; b_unsigned < 2; ++b_unsigned)
          for (int u8_out = 0; u8_out < 2; ++u8_out) {
            const auto a = random_bytes(rng, M * K), b = random_bytes(rng, K * N);
            std::vector<float> mul(static_cast<std::size_t>(N)), add(static_cast<std::size_t>(N));
            for (auto& v : mul) v = scale(rng);
            for (auto& v : add) v = 100 * scale(rng) + 120;
            // Requantize to u8 (mul, add, round, clamp), or dequantize to f32 (mul, add, relu).
            I8EpiStep steps[4];
            steps[0] = {.kind = I8EpiStep::Mul, .col = mul.data()};
            steps[1] = {.kind = I8EpiStep::Add, .col = add.data()};
            steps[2] = {.kind = u8_out ? I8EpiStep::Round : I8EpiStep::Relu};
            steps[3] = {.kind = I8EpiStep::Clamp, .lo = 3, .hi = 255};
            const auto panels = std::int64_t(lowp_panels(t.i8_nr, N));
            std::vector<std::byte> packed(std::size_t(panels) * i8_panel_bytes(t, K));
            t.i8_pack_b(b.data(), b_unsigned, false, N, K, N, packed.data(), 0, panels);
            const std::size_t out_bytes = std::size_t(M * N) * (u8_out ? 1 : 4);
            std::vector<std::byte> want(out_bytes, std::byte{0x7f}), got(out_bytes, std::byte{0x7f});
            const I8Epilogue epi{.steps = steps,
                                 .n_steps = u8_out ? 4 : 3,
                                 .out = u8_out ? I8Epilogue::U8 : I8Epilogue::F32,
                                 .dst = want.data(),
                                 .ldd = N};
            std::vector<std::int32_t> c(std::size_t(M * N)), rowsum(static_cast<std::size_t>(M));
            t.i8_gemm(a.data(), a_unsigned, K, packed.data(), b_unsigned, K, N, c.data(), N, 0, M, 0, panels,
                      rowsum.data());
            t.i8_epilogue(c.data(), N, 0, M, 0, N, epi);
            I8Epilogue fused = epi;
            fused.dst = got.data();
            bool ran = true;
            split_calls(M, panels, [&](std::int64_t m0, std::int64_t m1, std::int64_t p0, std::int64_t p1) {
              // rowsum has room for the rows of one call, from its first.
              ran &= t.i8_gemm_fused(a.data(), a_unsigned, K, packed.data(), b_unsigned, K, N, m0, m1, p0, p1,
                                     rowsum.data(), fused);
            });
            const std::string label = std::string(t.name) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                      std::to_string(K) + (a_unsigned ? " u8" : " i8") +
                                      (b_unsigned ? " x u8" : " x i8") + (u8_out ? " -> u8" : " -> f32");
            if (K > 2048) {  // past the VNNI kernel's slice of K
              EXPECT_FALSE(ran) << label;
              continue;
            }
            EXPECT_TRUE(ran) << label;
            EXPECT_TRUE(got == want) << label;
          }
  }
  if (tables == 0) GTEST_SKIP() << "this CPU has no int8 GEMM with a fused store (needs AVX-512 VNNI)";
}

std::uint16_t to_bf16(float f) {  // round to nearest even
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  return std::uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

TEST(LowpGemm, Bf16KernelsMatchAFloat64ProductOnEveryIsa) {
  std::mt19937_64 rng(testing::test_seed());
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  int tables = 0;
  for (const auto& isa : lowp_isas()) {
    const LowpTable& t = lowp_table(isa);
    if (t.bf16_nr == 0) continue;
    ++tables;
    for (auto [M, N, K] : kShapes)
      for (int transposed = 0; transposed < 2; ++transposed) {
        std::vector<std::uint16_t> a(std::size_t(M * K)), b(std::size_t(K * N));
        for (auto& v : a) v = to_bf16(value(rng));
        for (auto& v : b) v = to_bf16(value(rng));
        const auto panels = std::int64_t(lowp_panels(t.bf16_nr, N));
        std::vector<std::byte> packed(std::size_t(panels) * bf16_panel_bytes(t.bf16_nr, K, t.bf16_k_align),
                                      std::byte{0x7f});
        t.bf16_pack_b(b.data(), transposed, transposed ? K : N, K, N, packed.data(), 0, panels);
        std::vector<float> c(std::size_t(M * N), std::numeric_limits<float>::quiet_NaN());
        split_calls(M, panels, [&](std::int64_t m0, std::int64_t m1, std::int64_t p0, std::int64_t p1) {
          t.bf16_gemm(a.data(), K, packed.data(), K, N, c.data(), N, m0, m1, p0, p1);
        });
        int wrong = 0;
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < N; ++n) {
            double want = 0, scale = 0;
            for (std::int64_t k = 0; k < K; ++k) {
              const double x = ir::bf16_to_f32(a[std::size_t(m * K + k)]);
              const double y = ir::bf16_to_f32(transposed ? b[std::size_t(n * K + k)] : b[std::size_t(k * N + n)]);
              want += x * y;
              scale += std::fabs(x * y);
            }
            const float got = c[std::size_t(m * N + n)];
            // f32 accumulation: at most about K roundings of the running sum.
            if (!(std::fabs(double(got) - want) <= 1e-6 * double(K) * scale + 1e-30) && wrong++ < 3)
              ADD_FAILURE() << t.name << " " << M << "x" << N << "x" << K << (transposed ? " (B^T)" : "") << ": C[" << m
                            << ", " << n << "] = " << got << ", want " << want;
          }
      }
  }
  if (tables == 0) GTEST_SKIP() << "this CPU has no bf16 GEMM table (needs AVX2)";
}

// ---- end to end --------------------------------------------------------------------------------------------

// An RLX setting for the scope (every reader sees it through rlx::env; the process environment is untouched).
using Env = rlx::env::ScopedOverride;

Check check(const std::string& label) {
  Check c;
  c.seed = testing::test_seed();
  c.label = label;
  c.gens["x"] = conformance::ints_in(-128, 255);  // clipped to each dtype's range below
  return c;
}

// y = x @ w on operands widened from `a` and `b` to `wide`; w a param or an input; with the batch of x.
Graph widened_matmul(DType a, DType b, DType wide, bool w_param, std::int64_t batch, std::int64_t M, std::int64_t N,
                     std::int64_t K) {
  Graph g("widened matmul");
  std::vector<std::int64_t> xs = {M, K};
  if (batch > 1) xs.insert(xs.begin(), batch);
  auto x = g.cast(g.input("x", ir::Shape(xs), a), wide);
  auto w = g.cast(w_param ? g.param("w", {K, N}, b) : g.input("w", {K, N}, b), wide);
  g.add_output(g.matmul(x, w), "y");
  return g;
}

conformance::Gen range_of(DType t) {
  if (t == DType::U8) return conformance::ints_in(0, 255);
  if (t == DType::I8) return conformance::ints_in(-128, 127);
  return conformance::uniform();
}

TEST(LowpGemm, WidenedMatMulsMatchTheReferenceOnEveryIsa) {
  const std::pair<DType, DType> int_pairs[] = {
      {DType::U8, DType::I8}, {DType::I8, DType::I8}, {DType::U8, DType::U8}, {DType::I8, DType::U8}};
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    for (bool w_param : {true, false})
      for (std::int64_t batch : {1, 3})
        for (auto [M, N, K] : {Shape3{7, 65, 33}, Shape3{64, 130, 257}}) {
          const std::string shape = std::to_string(batch) + "x" + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                    std::to_string(K) + (w_param ? " w param" : " w input");
          for (auto [a, b] : int_pairs) {
            Check c = check(isa + " " + std::string(ir::dtype_name(a)) + " x " + std::string(ir::dtype_name(b)) + " " +
                            shape);
            c.gens["x"] = range_of(a);
            c.gens["w"] = range_of(b);
            EXPECT_TRUE(conformance::matches_reference(Device::Cpu,
                                                       widened_matmul(a, b, DType::I32, w_param, batch, M, N, K), c));
          }
          Check c = check(isa + " bf16 x bf16 " + shape);
          c.gens.clear();
          EXPECT_TRUE(conformance::matches_reference(
              Device::Cpu, widened_matmul(DType::BF16, DType::BF16, DType::F32, w_param, batch, M, N, K), c));
          Check h = check(isa + " f16 x bf16 " + shape);
          h.gens.clear();
          EXPECT_TRUE(conformance::matches_reference(
              Device::Cpu, widened_matmul(DType::F16, DType::BF16, DType::F32, w_param, batch, M, N, K), h));
        }
  }
}

// The quantized linear layer a PTQ graph holds: int8 product, then the dequantizing epilogue (scales and a
// bias), and a bf16 matmul as the f32-compute legalization writes it; each compiles to one kernel.
TEST(LowpGemm, CastsAndEpiloguesFuseIntoOneKernel) {
  Graph q("int8 linear");
  {
    auto x = q.cast(q.input("x", {32, 96}, DType::U8), DType::I32);
    auto w = q.cast(q.param("w", {96, 80}, DType::I8), DType::I32);
    auto acc = q.cast(q.matmul(x, w), DType::F32);
    auto y = q.add(q.mul(acc, q.param("scale", {80})), q.param("bias", {80}));
    q.add_output(q.relu(y), "y");
  }
  Graph h("bf16 matmul");
  h.add_output(h.matmul(h.input("x", {32, 96}, DType::BF16), h.param("w", {96, 80}, DType::BF16)), "y");
  for (const Graph* g : {&q, &h}) {
    Check c = check(g->name());
    c.gens["x"] = g == &q ? range_of(DType::U8) : conformance::uniform();
    c.gens["w"] = g == &q ? range_of(DType::I8) : conformance::uniform();
    c.gens["scale"] = conformance::uniform(1e-4, 1e-3);
    EXPECT_TRUE(conformance::matches_reference(Device::Cpu, *g, c));
    const auto compiled = Session(Device::Cpu).compile(*g);  // kept: the result lives in it
    const auto& lir = compiled.compile_result().lir;
    EXPECT_EQ(lir.kernels.size(), 1u) << g->name() << ":\n" << lir.to_text();
  }
}

// Auto-mixed precision's weight: an f32 param narrowed to bf16 for a bf16 matmul (lower.cpp's
// absorb_narrowed_param). Where the ISA has a bf16 GEMM, the matmul's kernel reads the f32 param and rounds it as
// it packs it, once per write: no cast kernel runs for it, and the result is bit for bit what a cast kernel and a
// pack every run give (the same graph with w an input). A new value is rounded and packed again.
TEST(LowpGemm, ANarrowedParamIsRoundedAsItIsPackedOnceOnEveryIsa) {
  const auto narrowed = [](bool w_param, std::int64_t M, std::int64_t N, std::int64_t K) {
    Graph g(w_param ? "narrowed param" : "narrowed input");
    auto x = g.cast(g.cast(g.input("x", {M, K}), DType::BF16), DType::F32);
    auto w = w_param ? g.param("w", {K, N}) : g.input("w", {K, N});
    g.add_output(g.relu(g.matmul(x, g.cast(g.cast(w, DType::BF16), DType::F32))), "y");
    return g;
  };
  std::mt19937_64 rng(rlx::testing::test_seed());
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    const bool bf16_gemm = select_lowp_table().bf16_nr > 0;
    for (auto [M, N, K] : {Shape3{7, 65, 33}, Shape3{64, 130, 257}}) {
      const std::string what = isa + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
      Check c = check(what);
      c.gens.clear();
      EXPECT_TRUE(conformance::matches_reference(Device::Cpu, narrowed(true, M, N, K), c)) << what;

      auto param = Session(Device::Cpu).compile(narrowed(true, M, N, K));
      auto input = Session(Device::Cpu).compile(narrowed(false, M, N, K));
      const auto& lir = param.compile_result().lir;
      if (bf16_gemm) {
        // x's cast and the matmul: w's cast is in the matmul's kernel, which reads the f32 param.
        EXPECT_EQ(lir.kernels.size(), input.compile_result().lir.kernels.size() - 1) << what << ":\n" << lir.to_text();
        EXPECT_EQ(packed_operand_count(*make_cpu_backend()->compile_lir(lir, {})), 1u) << what;
      }
      {
        // A widened from f16 (the weight's casts written first, so lowering meets A's cast after W's): no bf16
        // product, so W's cast stays a kernel of its own, and the graph compiles and runs.
        Graph h("f16 x narrowed param");
        auto wn = h.cast(h.cast(h.param("w", {K, N}), DType::BF16), DType::F32);
        h.add_output(h.matmul(h.cast(h.input("x", {M, K}, DType::F16), DType::F32), wn), "y");
        Check f = check(what + " f16 A");
        f.gens.clear();
        EXPECT_TRUE(conformance::matches_reference(Device::Cpu, h, f)) << what;
      }
      for (int round = 0; round < 2; ++round) {  // the second value is packed again (set_param)
        const ir::Tensor x = rlx::testing::random_tensor(DType::F32, {M, K}, rng);
        const ir::Tensor w = rlx::testing::random_tensor(DType::F32, {K, N}, rng);
        param.set_param("w", w);
        const ir::Tensor got = param.run({{"x", x}})[0];
        const ir::Tensor want = input.run({{"x", x}, {"w", w}})[0];
        ASSERT_EQ(got.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0) << what << " round " << round;
      }
    }
  }
}

}  // namespace
}  // namespace rlx::backends::cpu
