// The packed-B GEMM (isa/gemm_impl.inc): every ISA's pack and micro kernels
// against a float64 product at sizes that are not multiples of the tiles, and
// the MatMul kernels that use them end to end: epilogues, constant and param
// weights, set_param repacking, clones sharing the packed copy, the override
// and the shape rule.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <thread>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/isa.hpp"
#include "conformance/harness.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::backends::cpu {
namespace {

using conformance::Check;
using ir::DType;
using ir::Graph;
using ir::OpKind;
using runtime::Device;
using Ints = std::vector<std::int64_t>;

// An RLX setting for the scope (every reader sees it through rlx::env; the process environment is untouched).
using Env = rlx::env::ScopedOverride;

constexpr std::int64_t kOdd[] = {1, 7, 33, 65, 257};

// n floats that end where an inaccessible page begins: a read one float past
// the end faults in every build, not only under ASan (a vector's slack or a
// wider stride would absorb it silently, since the over-read columns are
// computed and then dropped).
class GuardedFloats {
 public:
  explicit GuardedFloats(std::size_t n) : page_(std::size_t(::sysconf(_SC_PAGESIZE))) {
    bytes_ = (n * sizeof(float) + page_ - 1) / page_ * page_ + page_;
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    auto* guard = static_cast<std::byte*>(base_) + bytes_ - page_;
    if (::mprotect(guard, page_, PROT_NONE) != 0) throw std::runtime_error("mprotect failed");
    floats_ = {reinterpret_cast<float*>(guard) - n, n};
  }
  ~GuardedFloats() { ::munmap(base_, bytes_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  std::span<float> floats() const { return floats_; }

 private:
  std::size_t page_, bytes_ = 0;
  void* base_ = nullptr;
  std::span<float> floats_;
};

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// How the GEMM reads B: packed from B, packed from B^T, or in place.
enum class BLayout { Packed, PackedFromTransposed, InPlace };

// One GEMM through a table's kernels, split into two row ranges and two panel
// ranges the way the MatMul kernel's units split it. Strides are wider than
// the matrices, and C's padding must stay untouched.
::testing::AssertionResult table_gemm_matches(const KernelTable& t, std::int64_t M, std::int64_t N, std::int64_t K,
                                              std::mt19937_64& rng, BLayout layout = BLayout::Packed) {
  const std::int64_t lda = K + 3, ldb = N + 5, ldbt = K + 7, ldc = N + 2, nr = t.gemm_nr, panels = (N + nr - 1) / nr;
  auto a = random_floats(std::size_t(M * lda), rng);
  auto b = random_floats(std::size_t(K * ldb), rng);
  std::vector<float> bt(std::size_t(N * ldbt), std::numeric_limits<float>::quiet_NaN());
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n) bt[std::size_t(n * ldbt + k)] = b[std::size_t(k * ldb + n)];
  std::vector<float> packed(packed_floats(t, K, N), std::numeric_limits<float>::quiet_NaN());
  for (auto [p0, p1] : {std::pair{std::int64_t(0), panels / 2}, std::pair{panels / 2, panels}}) {
    if (layout == BLayout::Packed) t.gemm_pack_b(b.data(), ldb, K, N, packed.data(), p0, p1);
    if (layout == BLayout::PackedFromTransposed) t.gemm_pack_bt(bt.data(), ldbt, K, N, packed.data(), p0, p1);
  }
  const bool in_place = layout == BLayout::InPlace;
  const float* bp = in_place ? b.data() : packed.data();
  const std::int64_t row = in_place ? ldb : nr, panel = in_place ? nr : K * nr;
  std::vector<float> c(std::size_t(M * ldc), std::numeric_limits<float>::quiet_NaN());
  for (auto [m0, m1] : {std::pair{std::int64_t(0), M / 3}, std::pair{M / 3, M}})
    for (auto [p0, p1] : {std::pair{std::int64_t(0), panels / 2}, std::pair{panels / 2, panels}})
      t.gemm_packed(a.data(), lda, bp, row, panel, K, N, c.data(), ldc, m0, m1, p0, p1);
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < ldc; ++n) {
      const float got = c[std::size_t(m * ldc + n)];
      if (n >= N) {
        if (!std::isnan(got)) return ::testing::AssertionFailure() << "wrote C padding at row " << m << " column " << n;
        continue;
      }
      double want = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = double(a[std::size_t(m * lda + k)]) * double(b[std::size_t(k * ldb + n)]);
        want += p;
        mag += std::fabs(p);
      }
      if (!(std::fabs(got - want) <= 1e-6 * mag + 1e-30))
        return ::testing::AssertionFailure() << "c[" << m << ", " << n << "] = " << got << ", want " << want;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CpuGemm, KernelsMatchAFloat64ProductOnEveryIsa) {
  for (const auto& isa : available_isas()) {
    const KernelTable& t = kernel_table(isa);
    std::mt19937_64 rng(testing::test_seed());
    for (auto M : kOdd)
      for (auto N : kOdd)
        for (auto K : kOdd) {
          EXPECT_TRUE(table_gemm_matches(t, M, N, K, rng)) << isa << " " << M << "x" << N << "x" << K;
          EXPECT_TRUE(table_gemm_matches(t, M, N, K, rng, BLayout::PackedFromTransposed))
              << isa << " from B^T " << M << "x" << N << "x" << K;
        }
    // Every width of the last panel (narrow tiles, whole vectors, the edge tile).
    for (std::int64_t w = 1; w <= t.gemm_nr; ++w) {
      EXPECT_TRUE(table_gemm_matches(t, 7, t.gemm_nr + w, 33, rng)) << isa << " last panel width " << w;
      if (w % t.simd_width == 0) {
        EXPECT_TRUE(table_gemm_matches(t, 7, t.gemm_nr + w, 33, rng, BLayout::InPlace))
            << isa << " B in place, last panel width " << w;
      }
    }
    // K beyond one slice of the kernel's K blocking accumulates into C.
    EXPECT_TRUE(table_gemm_matches(t, 13, 70, 2500, rng)) << isa;
    EXPECT_TRUE(table_gemm_matches(t, 6, t.gemm_nr * 2, 1025, rng)) << isa;
    EXPECT_TRUE(table_gemm_matches(t, 13, t.gemm_nr * 3, 1025, rng, BLayout::InPlace)) << isa;
    EXPECT_TRUE(table_gemm_matches(t, 13, 70, 1025, rng, BLayout::PackedFromTransposed)) << isa;
  }
}

// B read in place with rows exactly N floats apart and nothing after its last
// element: the last panel of every width must load no column past N (the
// generic ISA's tile once loaded all 8 columns of a 4..7 wide panel, a heap
// overflow on the caller's B). Every width that may be read in place, i.e. a
// multiple of the SIMD width, up to two panels and a vector.
TEST(CpuGemm, InPlaceBReadsNoColumnPastNOnEveryIsa) {
  for (const auto& isa : available_isas()) {
    const KernelTable& t = kernel_table(isa);
    std::mt19937_64 rng(testing::test_seed());
    const std::int64_t M = 7, K = 33, nr = t.gemm_nr;
    const auto a = random_floats(std::size_t(M * K), rng);
    for (std::int64_t N = t.simd_width; N <= 2 * nr + t.simd_width; N += t.simd_width) {
      GuardedFloats b(std::size_t(K * N));
      const auto values = random_floats(b.floats().size(), rng);
      std::copy(values.begin(), values.end(), b.floats().begin());
      const std::int64_t panels = (N + nr - 1) / nr;
      std::vector<float> c(std::size_t(M * N), std::numeric_limits<float>::quiet_NaN());
      t.gemm_packed(a.data(), K, b.floats().data(), N, nr, K, N, c.data(), N, 0, M, 0, panels);
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          double want = 0, mag = 0;
          for (std::int64_t k = 0; k < K; ++k) {
            const double p = double(a[std::size_t(m * K + k)]) * double(values[std::size_t(k * N + n)]);
            want += p;
            mag += std::fabs(p);
          }
          const float got = c[std::size_t(m * N + n)];
          ASSERT_TRUE(std::fabs(got - want) <= 1e-6 * mag + 1e-30)
              << isa << " N = " << N << ": c[" << m << ", " << n << "] = " << got << ", want " << want;
        }
    }
  }
}

Check packed_check(const std::string& label) {
  Check c;
  c.seed = testing::test_seed();
  c.label = label;
  return c;
}

Graph linear_graph(std::int64_t M, std::int64_t N, std::int64_t K) {
  Graph g("x @ w");
  g.add_output(g.matmul(g.input("x", {M, K}), g.param("w", {K, N})), "y");
  return g;
}

TEST(CpuGemm, OddSizesMatchTheReferenceOnEveryIsa) {
  Env gemm("RLX_CPU_GEMM", "packed");
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    for (auto M : kOdd)
      for (auto N : kOdd)
        for (auto K : {std::int64_t(1), std::int64_t(33), std::int64_t(257)}) {
          const std::string label = isa + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
          EXPECT_TRUE(conformance::matches_reference(Device::Cpu, linear_graph(M, N, K), packed_check(label)));
        }
  }
}

// Epilogues read the tile the GEMM just wrote: bias, activations, a residual,
// a narrower output dtype (the GEMM then writes scratch), a batch folded into rows.
TEST(CpuGemm, EpiloguesOnEveryIsa) {
  Env gemm("RLX_CPU_GEMM", "packed");
  std::vector<Graph> graphs;
  {
    Graph g("linear bias relu");
    auto x = g.input("x", {65, 33});
    g.add_output(g.relu(g.linear(x, g.param("w", {33, 257}), g.param("b", {257}))));
    graphs.push_back(std::move(g));
  }
  {
    Graph g("gelu residual");
    auto x = g.input("x", {7, 130});
    auto r = g.input("r", {7, 130});
    auto y = g.unary(OpKind::Gelu, g.matmul(x, g.param("w", {130, 130})));
    g.add_output(g.add(g.mul(y, g.scalar(0.5)), r));
    graphs.push_back(std::move(g));
  }
  {
    Graph g("batched tanh to f16");
    auto x = g.input("x", {3, 33, 65});
    auto y = g.unary(OpKind::Tanh, g.add(g.matmul(x, g.param("w", {65, 7})), g.input("b", {33, 1})));
    g.add_output(g.cast(y, DType::F16));
    graphs.push_back(std::move(g));
  }
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    for (const auto& g : graphs)
      EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, packed_check(isa + " " + g.name())));
  }
}

// A B that is an activation is packed by every run: one copy when all batches
// share it, one per batch otherwise (attention's K^T), with odd sizes and an epilogue.
TEST(CpuGemm, ActivationBIsPackedPerRunOnEveryIsa) {
  Env gemm("RLX_CPU_GEMM", "packed");
  std::vector<Graph> graphs;
  for (auto [M, N, K] : {std::array<std::int64_t, 3>{65, 257, 33}, {7, 33, 257}, {1, 65, 65}}) {
    Graph g("activation b");
    g.add_output(g.matmul(g.input("x", {M, K}), g.input("w", {K, N})));
    graphs.push_back(std::move(g));
  }
  {
    Graph g("batched b per batch, bias relu");
    auto y = g.matmul(g.input("q", {3, 65, 33}), g.input("k", {3, 33, 70}));
    g.add_output(g.relu(g.add(y, g.input("b", {70}))));
    graphs.push_back(std::move(g));
  }
  {
    Graph g("broadcast b over batch");
    g.add_output(g.matmul(g.input("q", {2, 3, 17, 33}), g.input("k", {3, 33, 20})));
    graphs.push_back(std::move(g));
  }
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    for (const auto& g : graphs)
      EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, packed_check(isa + " " + g.name())));
  }
}

// End to end through the MatMul kernel: an activation B of every width
// remainder mod 8 and mod 16 (N = 1..48), few rows of A, so B is read in place
// wherever N is a multiple of the SIMD width and packed per run elsewhere.
// B lives right before an inaccessible page, so an over-read faults (not only
// under ASan); the outputs are checked against the float64 reference.
TEST(CpuGemm, ActivationBOfEveryWidthIsReadInBoundsOnEveryIsa) {
  Env gemm("RLX_CPU_GEMM", "packed");
  std::mt19937_64 rng(testing::test_seed());
  const std::int64_t M = 5, K = 19;
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    for (std::int64_t N = 1; N <= 48; ++N) {
      Graph g("x @ w");
      g.add_output(g.matmul(g.input("x", {M, K}), g.input("w", {K, N})), "y");
      auto compiled = Session(Device::Cpu).compile(g);
      const auto x = testing::random_tensor(DType::F32, {M, K}, rng);
      const auto w = testing::random_tensor(DType::F32, {K, N}, rng);
      GuardedFloats wb(std::size_t(K * N));
      std::memcpy(wb.floats().data(), w.data(), w.nbytes());
      const Ints w_shape{K, N};
      const runtime::NamedTensor inputs[] = {
          {"x", ir::view(x)}, {"w", ir::TensorView{DType::F32, w_shape, wb.floats().data(), w.nbytes()}}};
      std::vector<ir::Tensor> out;
      out.emplace_back(DType::F32, Ints{M, N});
      compiled.run_into(inputs, out);
      const auto want = reference::run(g, {{"x", x}, {"w", w}});
      EXPECT_TRUE(testing::tensors_close(out[0], want[0], testing::tolerance_for(DType::F32))) << isa << " N = " << N;
    }
  }
}

// Backward-pass shapes: B transposed (a permute the matmul kernel reads in
// place) through every GEMM path (constant packed from B^T, per-run packed
// from B^T, OpenBLAS with CblasTrans, f64, integers), B read in place (rows of
// whole vectors, few rows of A), and an optimiser update as a several-output epilogue.
TEST(CpuGemm, TransposedInPlaceAndSeveralOutputsOnEveryIsa) {
  std::mt19937_64 rng(testing::test_seed());
  std::vector<Graph> graphs;
  for (auto [M, N, K] : {std::array<std::int64_t, 3>{65, 257, 33}, {7, 64, 130}, {300, 48, 65}}) {
    Graph g("x @ w^T");
    g.add_output(g.matmul(g.input("x", {M, K}), g.permute(g.param("w", {N, K}), {1, 0})));
    graphs.push_back(std::move(g));
    Graph c("x @ constant^T, relu");
    c.add_output(c.relu(c.matmul(c.input("x", {M, K}),
                                 c.permute(c.constant(testing::random_tensor(DType::F32, {N, K}, rng)), {1, 0}))));
    graphs.push_back(std::move(c));
  }
  {
    Graph g("batched q @ k^T");
    g.add_output(g.matmul(g.input("q", {3, 65, 33}), g.permute(g.input("k", {3, 70, 33}), {0, 2, 1})));
    graphs.push_back(std::move(g));
  }
  for (auto t : {DType::F64, DType::I32}) {
    Graph g(std::string("transposed ") + std::string(ir::dtype_name(t)));
    g.add_output(g.matmul(g.input("x", {9, 17}, t), g.permute(g.input("w", {12, 17}, t), {1, 0})));
    graphs.push_back(std::move(g));
  }
  for (std::int64_t N : {64, 128}) {
    Graph g("b in place");
    g.add_output(g.add(g.matmul(g.input("x", {37, 70}), g.input("w", {70, N})), g.input("r", {37, N})));
    graphs.push_back(std::move(g));
  }
  {
    Graph g("adam-like epilogue");
    auto grad = g.matmul(g.permute(g.input("x", {64, 33}), {1, 0}), g.input("dy", {64, 48}));
    auto m = g.add(g.mul(g.input("m", {33, 48}), g.scalar(0.9)), g.mul(grad, g.scalar(0.1)));
    auto v = g.add(g.mul(g.input("v", {33, 48}), g.scalar(0.99)), g.mul(g.mul(grad, grad), g.scalar(0.01)));
    auto w = g.sub(g.input("w", {33, 48}), g.div(m, g.add(g.mul(v, v), g.scalar(1.0))));
    g.add_output(m, "m");
    g.add_output(v, "v");
    g.add_output(w, "w");
    graphs.push_back(std::move(g));
  }
  for (const char* choice : {"", "packed", "blas"}) {
    Env gemm("RLX_CPU_GEMM", choice);
    for (const auto& isa : available_isas()) {
      Env env("RLX_CPU_ISA", isa);
      for (const auto& g : graphs)
        EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g,
                                                   packed_check(std::string(choice) + " " + isa + " " + g.name())));
    }
  }
  // The weight gradient's update is one kernel with three outputs, and no transpose kernel runs for w^T.
  const auto update = Session().compile(graphs.back());
  const auto& lir = update.compile_result().lir;
  ASSERT_EQ(lir.kernels.size(), 2u) << lir.to_text();  // x^T (A is not read transposed), then matmul + update
  EXPECT_EQ(lir.kernels[1].outputs.size(), 3u);
  EXPECT_EQ(Session().compile(graphs[0]).compile_result().lir.kernels.size(), 1u);
}

// The executable the CPU backend builds for `g` under the current environment.
std::unique_ptr<runtime::ExecutableGraph> cpu_executable(const Graph& g) {
  auto lir = Session().compile(g).compile_result().lir;
  return make_cpu_backend()->compile_lir(lir, {});
}

// The strategy of the one matmul kernel of `g` (kernel_matmul.cpp's MatMulKernel::strategy).
std::string matmul_strategy(const Graph& g) {
  for (const auto& s : kernel_strategies(*cpu_executable(g)))
    if (!s.empty()) return s;
  return "no matmul kernel";
}

// x @ y^T with y an activation (a backward pass's dX = dY W^T), and an epilogue that reads a residual and
// masks like a relu's backward.
Graph times_activation_transposed(std::int64_t M, std::int64_t N, std::int64_t K, bool epilogue) {
  Graph g("x @ y^T");
  auto c = g.matmul(g.input("x", {M, K}), g.permute(g.input("y", {N, K}), {1, 0}));
  if (epilogue) {
    auto r = g.input("r", {M, N});
    c = g.where(g.binary(OpKind::Gt, r, g.scalar(0.0)), g.add(c, r), g.scalar(0.0));
  }
  g.add_output(c);
  return g;
}

// With few rows of A (32 to 255), C = A B^T for an activation B^T runs as C^T = B^T A^T: B^T read in place as
// the GEMM's A, A packed, C^T transposed into C before the epilogue. Odd sizes on every side, with and
// without an epilogue, every ISA (the generic one never swaps and checks the same graphs), every unit split.
TEST(CpuGemm, FewRowsTimesAnActivationTransposedRunSwappedOnEveryIsa) {
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    for (std::int64_t M : {32, 37, 100, 255})
      for (std::int64_t N : {64, 65, 257, 1000})
        for (std::int64_t K : {2, 33, 130}) {
          const bool epilogue = (M + N + K) % 2 == 0;
          const Graph g = times_activation_transposed(M, N, K, epilogue);
          const std::string label = isa + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                                    (epilogue ? " with epilogue" : "");
          EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, packed_check(label)));
          const std::string strategy = matmul_strategy(g);
          if (isa != "generic")
            EXPECT_EQ(strategy.rfind("swapped, B^T", 0), 0u) << label << ": " << strategy;
          else
            EXPECT_EQ(strategy.find("swapped"), std::string::npos) << label << ": " << strategy;
        }
  }
  // Too few rows (tiles mostly padding) or enough to repay packing B^T, and a batch: not swapped.
  for (std::int64_t M : {31, 256})
    EXPECT_EQ(matmul_strategy(times_activation_transposed(M, 512, 64, false)).find("swapped"), std::string::npos) << M;
  Graph batched("batched q @ k^T");
  batched.add_output(
      batched.matmul(batched.input("q", {2, 64, 33}), batched.permute(batched.input("k", {2, 300, 33}), {0, 2, 1})));
  EXPECT_EQ(matmul_strategy(batched).find("swapped"), std::string::npos);
  Env blas("RLX_CPU_GEMM", "blas");
  EXPECT_EQ(matmul_strategy(times_activation_transposed(64, 512, 64, false)).rfind("blas", 0), 0u);
}

// An epilogue reading operands the size of the output (an optimizer's update of the weights) runs over units of
// whole rows once they outgrow L2; the results match the reference at sizes whose rows split unevenly.
TEST(CpuGemm, UpdateEpiloguesOfLargeOperandsRunOverWholeRows) {
  for (auto [K, N] : {std::array<std::int64_t, 2>{64, 512}, {33, 1000}, {130, 700}}) {
    Graph g("w - lr x^T dy");
    auto grad = g.matmul(g.permute(g.input("x", {K, N}), {1, 0}), g.input("dy", {K, N}));
    g.add_output(g.sub(g.input("w", {N, N}), g.mul(g.input("lr", {}), grad)), "w");
    const std::string label = std::to_string(K) + " x " + std::to_string(N);
    EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, packed_check(label)));
    const std::string strategy = matmul_strategy(g);
    EXPECT_NE(strategy.find("x1 units"), std::string::npos) << label << ": " << strategy;
  }
  // Operands that fit in L2 keep the split of columns that balances the threads.
  Graph small("small update");
  auto grad = small.matmul(small.permute(small.input("x", {64, 128}), {1, 0}), small.input("dy", {64, 128}));
  small.add_output(small.sub(small.input("w", {128, 128}), grad), "w");
  EXPECT_TRUE(conformance::matches_reference(Device::Cpu, small, packed_check("small update")));
}

TEST(CpuGemm, ConstantWeightsArePackedAtCompile) {
  Env gemm("RLX_CPU_GEMM", "packed");
  std::mt19937_64 rng(testing::test_seed());
  Graph g("constant weights");
  auto x = g.input("x", {33, 65});
  auto w = g.constant(testing::random_tensor(DType::F32, {65, 257}, rng));
  auto h = g.relu(g.matmul(x, w));
  g.add_output(g.matmul(h, g.constant(testing::random_tensor(DType::F32, {257, 7}, rng))));
  EXPECT_EQ(packed_operand_count(*cpu_executable(g)), 2u);
  for (const auto& isa : available_isas()) {
    Env env("RLX_CPU_ISA", isa);
    EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, packed_check(isa + " constant weights")));
  }
}

TEST(CpuGemm, OneWeightReadByTwoMatMulsIsPackedOnce) {
  Env gemm("RLX_CPU_GEMM", "packed");
  Graph g("shared weight");
  auto w = g.param("w", {65, 65});
  g.add_output(g.matmul(g.matmul(g.input("x", {7, 65}), w), w));
  EXPECT_EQ(packed_operand_count(*cpu_executable(g)), 1u);
  EXPECT_TRUE(conformance::matches_reference(Device::Cpu, g, packed_check("shared weight")));
}

struct Weights {
  ir::Tensor w, b;
};

// y = relu(x @ w + b) from the float64 reference.
ir::Tensor expected(const Graph& g, const ir::Tensor& x, const Weights& p) {
  return reference::run(g, {{"x", x}}, {{"w", p.w}, {"b", p.b}})[0];
}

Graph mlp_layer() {
  Graph g("mlp layer");
  g.add_output(g.relu(g.linear(g.input("x", {33, 257}), g.param("w", {257, 65}), g.param("b", {65}))), "y");
  return g;
}

TEST(CpuGemm, SetParamTwiceRepacks) {
  Env gemm("RLX_CPU_GEMM", "packed");
  std::mt19937_64 rng(testing::test_seed());
  const Graph g = mlp_layer();
  auto exe = Session().compile(g);
  const auto x = testing::random_tensor(DType::F32, {33, 257}, rng);
  for (int round = 0; round < 2; ++round) {
    Weights p{testing::random_tensor(DType::F32, {257, 65}, rng), testing::random_tensor(DType::F32, {65}, rng)};
    exe.set_param("w", p.w);
    exe.set_param("b", p.b);
    EXPECT_TRUE(testing::tensors_close(exe.run({{"x", x}})[0], expected(g, x, p))) << "round " << round;
  }
}

TEST(CpuGemm, ClonesShareThePackedWeights) {
  Env gemm("RLX_CPU_GEMM", "packed");
  std::mt19937_64 rng(testing::test_seed());
  const Graph g = mlp_layer();
  auto exe = Session().compile(g);
  Weights first{testing::random_tensor(DType::F32, {257, 65}, rng), testing::random_tensor(DType::F32, {65}, rng)};
  exe.set_param("w", first.w);
  exe.set_param("b", first.b);
  std::vector<CompiledGraph> clones;
  for (int i = 0; i < 3; ++i) clones.push_back(exe.clone());
  // New weights through the original reach every clone, repacked once.
  Weights second{testing::random_tensor(DType::F32, {257, 65}, rng), first.b};
  exe.set_param("w", second.w);
  std::vector<ir::Tensor> xs, got(clones.size());
  for (std::size_t i = 0; i < clones.size(); ++i) xs.push_back(testing::random_tensor(DType::F32, {33, 257}, rng));
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < clones.size(); ++i)
      threads.emplace_back([&, i] { got[i] = clones[i].run({{"x", xs[i]}})[0]; });
  }
  for (std::size_t i = 0; i < clones.size(); ++i)
    EXPECT_TRUE(testing::tensors_close(got[i], expected(g, xs[i], second))) << "clone " << i;
  EXPECT_TRUE(testing::tensors_close(exe.run({{"x", xs[0]}})[0], expected(g, xs[0], second)));
}

TEST(CpuGemm, ShapeRuleAndOverride) {
  const Graph mlp = linear_graph(64, 1024, 1024);
  Graph variable("variable b");
  variable.add_output(variable.matmul(variable.input("x", {64, 1024}), variable.input("w", {1024, 1024})));
  Graph f64("f64");
  f64.add_output(f64.matmul(f64.input("x", {64, 1024}, DType::F64), f64.param("w", {1024, 1024}, DType::F64)));
  {
    Env gemm("RLX_CPU_GEMM", "blas");
    EXPECT_EQ(packed_operand_count(*cpu_executable(mlp)), 0u);
  }
  {
    Env gemm("RLX_CPU_GEMM", "packed");
    EXPECT_EQ(packed_operand_count(*cpu_executable(mlp)), 1u);
    // Only a constant f32 B is packed ahead of time, whatever the override says
    // (an activation B is packed by each run, into scratch).
    EXPECT_EQ(packed_operand_count(*cpu_executable(variable)), 0u);
    EXPECT_EQ(packed_operand_count(*cpu_executable(f64)), 0u);
  }
  {
    Env gemm("RLX_CPU_GEMM", "fast");
    try {
      cpu_executable(mlp);
      ADD_FAILURE() << "an invalid RLX_CPU_GEMM compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("RLX_CPU_GEMM='fast'"), std::string::npos) << e.what();
    }
  }
  // Unset: the shape rule of kernel_matmul.cpp (bench/bench_gemm_packed.cpp measured it).
  Env automatic("RLX_CPU_GEMM", "");
  const auto isas = available_isas();
  const Graph cube = linear_graph(1024, 1024, 1024);
  for (const char* isa : {"avx512", "avx2"}) {
    if (std::find(isas.begin(), isas.end(), isa) == isas.end()) continue;
    Env env("RLX_CPU_ISA", isa);
    EXPECT_EQ(packed_operand_count(*cpu_executable(mlp)), 1u) << isa;
    EXPECT_EQ(packed_operand_count(*cpu_executable(cube)), 0u) << isa;
  }
  Env isa("RLX_CPU_ISA", "generic");
  EXPECT_EQ(packed_operand_count(*cpu_executable(mlp)), 0u);
}

}  // namespace
}  // namespace rlx::backends::cpu
