// The quantized GEMV/GEMM kernels (src/backends/cpu/quant_matmul.hpp) against float64 dot products of
// the exactly dequantized weights: the exact mode with the f32 activations, the fast mode with the
// quantized-then-dequantized activations (tight) and with the f32 ones (within the activation
// quantization error), every ISA variant on this CPU against the scalar one, and the edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant_matmul.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/quants.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::cpu {
namespace {

using ir::DType;

const std::vector<DType> kFastTypes = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                                       DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string name(DType t) { return std::string(ir::dtype_name(t)); }
std::int64_t block(DType t) { return std::int64_t(ir::block_elems(t)); }

struct Weights {
  std::vector<std::byte> q;
  std::vector<float> deq;  // rows x cols, exactly as gguf dequantizes them
};

// Random rows quantized with rlx::ir::quantize; each row gets its own magnitude so that the
// scales vary.
Weights make_weights(DType t, std::int64_t rows, std::int64_t cols, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.25f, 2.0f);
  std::vector<float> f(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float m = mag(rng) * scale;
    for (std::int64_t k = 0; k < cols; ++k) f[r * cols + k] = m * nd(rng);
  }
  Weights w;
  w.q.resize(ir::quantized_bytes(t, f.size()));
  ir::quantize(t, f, w.q);
  w.deq.resize(f.size());
  ir::dequantize(t, w.q, w.deq);
  return w;
}

std::vector<float> make_x(std::int64_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = scale * nd(rng);
  return x;
}

// The fast mode's activations, quantized by the scalar table and dequantized here (d * q).
std::vector<float> quantized_x(DType t, const std::vector<float>& x, std::int64_t cols, std::int64_t n) {
  const std::size_t bytes = quant_act_bytes(t, cols);
  std::vector<std::byte> q(bytes * static_cast<std::size_t>(n));
  quant_activations_with(quant_table("generic"), t, x.data(), cols, n, q.data());
  std::vector<float> out(x.size());
  for (std::int64_t j = 0; j < n; ++j) {
    const std::byte* row = q.data() + static_cast<std::size_t>(j) * bytes;
    float* o = out.data() + j * cols;
    if (quant_act_type(t) == DType::Q8_K) {
      ir::dequantize(DType::Q8_K, std::span(row, bytes), std::span(o, static_cast<std::size_t>(cols)));
    } else {
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        ActQ8 a;
        std::memcpy(&a, row + b * sizeof a, sizeof a);
        for (int k = 0; k < 32; ++k) o[b * 32 + k] = a.d * static_cast<float>(a.qs[k]);
      }
    }
  }
  return out;
}

struct Ref {
  std::vector<double> y;      // [n, rows]
  std::vector<double> bound;  // sum |w| |x| per output
};

Ref reference(const Weights& w, const std::vector<float>& x, std::int64_t rows, std::int64_t cols, std::int64_t n) {
  Ref r{std::vector<double>(static_cast<std::size_t>(n * rows)),
        std::vector<double>(static_cast<std::size_t>(n * rows))};
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < rows; ++i) {
      double s = 0, b = 0;
      for (std::int64_t k = 0; k < cols; ++k) {
        const double a = w.deq[i * cols + k], v = x[j * cols + k];
        s += a * v;
        b += std::fabs(a * v);
      }
      r.y[j * rows + i] = s;
      r.bound[j * rows + i] = b;
    }
  return r;
}

std::vector<float> run(const QuantTable& table, DType t, const Weights& w, std::int64_t rows, std::int64_t cols,
                       const std::vector<float>& x, std::int64_t n, QuantMode mode) {
  std::vector<float> y(static_cast<std::size_t>(n * rows), kNaN);  // poisoned: every output must be written
  quant_gemm_with(table, t, w.q.data(), rows, cols, x.data(), n, y.data(), mode);
  return y;
}

// |y - ref| <= rel * bound (+ the smallest normal, for all-zero rows); returns the worst ratio.
double check_close(const std::vector<float>& y, const Ref& ref, double rel, const std::string& what) {
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << what << " output " << i << " = " << y[i];
    const double err = std::fabs(double(y[i]) - ref.y[i]);
    const double tol = rel * ref.bound[i] + 1e-30;
    EXPECT_LE(err, tol) << what << " output " << i << ": " << y[i] << " vs " << ref.y[i] << " (bound " << ref.bound[i]
                        << ")";
    if (ref.bound[i] > 0) worst = std::max(worst, err / ref.bound[i]);
    if (err > tol) break;
  }
  return worst;
}

struct Shape {
  std::int64_t rows, cols, n;
};

std::vector<Shape> shapes_for(DType t) {
  // n = 4 and more also take the AVX-512 VNNI table's panel: 16-row tiles, 8, 4, 2 and 1 activation rows a
  // pass, an odd number of 32-blocks (96) and of super-blocks (768).
  if (block(t) == 256) return {{1, 256, 1}, {37, 512, 1}, {19, 1024, 6}, {8, 4096, 1}, {33, 768, 15}};
  return {{1, 32, 1}, {37, 576, 1}, {19, 1536, 6}, {8, 4096, 1}, {5, 96, 70}, {17, 96, 4}, {40, 576, 13}};
}

TEST(QuantMatmul, ExactMatchesFloat64) {
  std::mt19937_64 rng(rlx::testing::test_seed());
  for (DType t : kFastTypes)
    for (const auto& isa : quant_isas())
      for (auto s : shapes_for(t)) {
        SCOPED_TRACE(name(t) + " " + isa + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                     " n=" + std::to_string(s.n));
        auto w = make_weights(t, s.rows, s.cols, rng);
        auto x = make_x(s.n * s.cols, rng);
        auto y = run(quant_table(isa), t, w, s.rows, s.cols, x, s.n, QuantMode::Exact);
        check_close(y, reference(w, x, s.rows, s.cols, s.n), 1e-5, "exact");
      }
}

TEST(QuantMatmul, ExactTakesEveryDequantizableType) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 1);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(name(t));
    auto w = make_weights(t, 7, 64, rng);
    auto x = make_x(2 * 64, rng);
    std::vector<float> y(14, kNaN);
    quant_gemm(t, w.q.data(), 7, 64, x.data(), 2, y.data(), QuantMode::Exact);
    check_close(y, reference(w, x, 7, 64, 2), 1e-5, "exact");
  }
}

TEST(QuantMatmul, FastMatchesQuantizedActivations) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 2);
  double worst = 0;
  for (DType t : kFastTypes)
    for (const auto& isa : quant_isas())
      for (auto s : shapes_for(t)) {
        SCOPED_TRACE(name(t) + " " + isa + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                     " n=" + std::to_string(s.n));
        auto w = make_weights(t, s.rows, s.cols, rng);
        auto x = make_x(s.n * s.cols, rng);
        auto y = run(quant_table(isa), t, w, s.rows, s.cols, x, s.n, QuantMode::Fast);
        worst = std::max(worst, check_close(y, reference(w, quantized_x(t, x, s.cols, s.n), s.rows, s.cols, s.n), 1e-5,
                                            "fast vs quantized x"));
      }
  std::printf("[rlx] fast vs float64 with quantized activations: worst |err| / sum|w||x| = %.3g\n", worst);
}

TEST(QuantMatmul, FastWithinActivationQuantizationError) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 3);
  for (DType t : kFastTypes)
    for (auto s : shapes_for(t)) {
      SCOPED_TRACE(name(t) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols));
      auto w = make_weights(t, s.rows, s.cols, rng);
      auto x = make_x(s.n * s.cols, rng);
      auto xq = quantized_x(t, x, s.cols, s.n);
      std::vector<float> y(static_cast<std::size_t>(s.n * s.rows), kNaN);
      quant_gemm(t, w.q.data(), s.rows, s.cols, x.data(), s.n, y.data());
      auto exact = reference(w, x, s.rows, s.cols, s.n);
      auto tight = reference(w, xq, s.rows, s.cols, s.n);
      for (std::int64_t j = 0; j < s.n; ++j)
        for (std::int64_t r = 0; r < s.rows; ++r) {
          // |sum w (x - xq)| <= sum |w| |x - xq|, and each |x - xq| <= d / 2 (checked below).
          double qerr = 0;
          for (std::int64_t k = 0; k < s.cols; ++k)
            qerr +=
                std::fabs(double(w.deq[r * s.cols + k])) * std::fabs(double(x[j * s.cols + k]) - xq[j * s.cols + k]);
          const auto i = static_cast<std::size_t>(j * s.rows + r);
          EXPECT_LE(std::fabs(y[i] - exact.y[i]), qerr + 1e-5 * (exact.bound[i] + tight.bound[i])) << "output " << i;
          // The activation error is small next to the product's magnitude: |x - xq| <= amax / 254 per
          // block, a few percent of the mean |x| of a normal block at most.
          EXPECT_LE(qerr, 0.05 * exact.bound[i] + 1e-30);
        }
    }
}

TEST(QuantMatmul, IsaVariantsMatchScalar) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 4);
  const auto isas = quant_isas();
  std::printf("[rlx] quant ISAs on this CPU:");
  for (const auto& isa : isas) std::printf(" %s", isa.c_str());
  std::printf("\n");
  for (DType t : kFastTypes)
    for (auto s : shapes_for(t)) {
      auto w = make_weights(t, s.rows, s.cols, rng);
      auto x = make_x(s.n * s.cols, rng);
      for (QuantMode mode : {QuantMode::Fast, QuantMode::Exact}) {
        auto base = run(quant_table("generic"), t, w, s.rows, s.cols, x, s.n, mode);
        Ref ref{std::vector<double>(base.begin(), base.end()), reference(w, x, s.rows, s.cols, s.n).bound};
        for (const auto& isa : isas) {
          SCOPED_TRACE(name(t) + " " + isa + (mode == QuantMode::Fast ? " fast" : " exact"));
          check_close(run(quant_table(isa), t, w, s.rows, s.cols, x, s.n, mode), ref, 2e-6, "isa vs generic");
        }
      }
    }
}

// A row of a GEMM is that activation's GEMV, to f32 rounding: the integer sums are exact in both, and the
// GEMM's panel (AVX-512 VNNI) applies the scales once per group where the GEMV applies them per lane.
TEST(QuantMatmul, GemmRowsMatchGemv) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 5);
  for (DType t : kFastTypes) {
    SCOPED_TRACE(name(t));
    const std::int64_t rows = 37, cols = 512, n = 71;  // crosses the 16-row tiles and every activation group
    auto w = make_weights(t, rows, cols, rng);
    auto x = make_x(n * cols, rng);
    const Ref ref = reference(w, x, rows, cols, n);
    std::vector<float> y(static_cast<std::size_t>(n * rows), kNaN);
    quant_gemm(t, w.q.data(), rows, cols, x.data(), n, y.data());
    for (std::int64_t j = 0; j < n; ++j) {
      std::vector<float> yv(static_cast<std::size_t>(rows), kNaN);
      quant_gemv(t, w.q.data(), rows, cols, x.data() + j * cols, yv.data());
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto i = static_cast<std::size_t>(j * rows + r);
        ASSERT_LE(std::fabs(double(y[i]) - yv[r]), 1e-6 * ref.bound[i] + 1e-30) << "j " << j << " r " << r;
      }
    }
  }
}

TEST(QuantMatmul, ActivationQuantizer) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 6);
  auto x = make_x(4096, rng, 3.0f);
  for (const auto& isa : quant_isas()) {
    SCOPED_TRACE(isa);
    // Q8_K: bit for bit what rlx::ir::quantize makes (ggml's reference quantizer).
    std::vector<std::byte> mine(quant_act_bytes(DType::Q4_K, 4096)), ref(ir::quantized_bytes(DType::Q8_K, 4096));
    quant_activations_with(quant_table(isa), DType::Q4_K, x.data(), 4096, 1, mine.data());
    ir::quantize(DType::Q8_K, x, ref);
    ASSERT_EQ(mine, ref);
    // ActQ8: |x - d q| <= d / 2, |q| <= 127, the exact sum, and ggml's Q8_0 quants but for ties.
    std::vector<std::byte> a8(quant_act_bytes(DType::Q4_0, 4096)), q80(ir::quantized_bytes(DType::Q8_0, 4096));
    quant_activations_with(quant_table(isa), DType::Q4_0, x.data(), 4096, 1, a8.data());
    ir::quantize(DType::Q8_0, x, q80);
    for (int b = 0; b < 4096 / 32; ++b) {
      ActQ8 a;
      std::memcpy(&a, a8.data() + b * sizeof a, sizeof a);
      ir::BlockQ8_0 g;
      std::memcpy(&g, q80.data() + b * sizeof g, sizeof g);
      int sum = 0;
      for (int k = 0; k < 32; ++k) {
        sum += a.qs[k];
        EXPECT_LE(std::abs(int(a.qs[k])), 127);
        // Half a step, plus f32 rounding of x / d near a tie (relative to |x|, up to 127 steps).
        EXPECT_LE(std::fabs(x[b * 32 + k] - a.d * a.qs[k]), 0.5 * a.d * (1 + 1e-6) + 1e-6 * std::fabs(x[b * 32 + k]))
            << b << " " << k;
        EXPECT_LE(std::abs(a.qs[k] - g.qs[k]), 1);
      }
      EXPECT_EQ(a.sum, sum);
      EXPECT_EQ(ir::f32_to_f16(a.d), g.d);
    }
  }
}

// Every edge case for one activation row (the GEMV) and for five (the AVX-512 VNNI table's panel).
TEST(QuantMatmul, EdgeCases) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 7);
  for (DType t : kFastTypes)
    for (const auto& isa : quant_isas())
      for (std::int64_t n : {1, 5}) {
        SCOPED_TRACE(name(t) + " " + isa + " n=" + std::to_string(n));
        const QuantTable& table = quant_table(isa);
        const std::int64_t bl = block(t);
        // One row of one block.
        {
          auto w = make_weights(t, 1, bl, rng);
          auto x = make_x(n * bl, rng);
          check_close(run(table, t, w, 1, bl, x, n, QuantMode::Fast), reference(w, quantized_x(t, x, bl, n), 1, bl, n),
                      1e-5, "one block");
        }
        // An all-zero weight block and an all-zero activation block: zero, not NaN.
        {
          const std::int64_t cols = 3 * bl;
          std::vector<float> f(static_cast<std::size_t>(2 * cols), 0.0f);
          auto xs = make_x(cols, rng);
          for (std::int64_t k = 2 * bl; k < cols; ++k) f[k] = xs[k];  // row 0: blocks 0, 1 zero
          for (std::int64_t k = cols; k < 2 * cols; ++k) f[k] = xs[k - cols];
          Weights w;
          w.q.resize(ir::quantized_bytes(t, f.size()));
          ir::quantize(t, f, w.q);
          w.deq.resize(f.size());
          ir::dequantize(t, w.q, w.deq);
          auto x = make_x(n * cols, rng);
          for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t k = 2 * bl; k < cols; ++k) x[j * cols + k] = 0.0f;  // activation block 2 zero
          for (QuantMode mode : {QuantMode::Fast, QuantMode::Exact}) {
            auto y = run(table, t, w, 2, cols, x, n, mode);
            for (std::int64_t j = 0; j < n; ++j) EXPECT_EQ(y[j * 2], 0.0f);  // row 0 meets zeros everywhere
            auto xr = mode == QuantMode::Fast ? quantized_x(t, x, cols, n) : x;
            check_close(y, reference(w, xr, 2, cols, n), 1e-5, "zero blocks");
          }
        }
        // Extreme magnitudes: large and tiny weights (f16 scales near their range's ends) and activations.
        for (float ws : {3000.0f, 1e-3f})
          for (float xs : {1e20f, 1e-20f}) {
            SCOPED_TRACE("weights x" + std::to_string(ws) + " activations x" + std::to_string(xs));
            const std::int64_t cols = 2 * bl;
            auto w = make_weights(t, 3, cols, rng, ws);
            auto x = make_x(n * cols, rng, xs);
            check_close(run(table, t, w, 3, cols, x, n, QuantMode::Fast),
                        reference(w, quantized_x(t, x, cols, n), 3, cols, n), 1e-5, "extreme fast");
            check_close(run(table, t, w, 3, cols, x, n, QuantMode::Exact), reference(w, x, 3, cols, n), 1e-5,
                        "extreme exact");
          }
      }
}

// A NaN or an infinity in an activation row makes that row's outputs NaN in both modes (rounding it to a
// finite quant would hide it); the other rows are untouched.
TEST(QuantMatmul, NonFiniteActivationsPropagate) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 9);
  for (DType t : kFastTypes)
    for (const auto& isa : quant_isas())
      for (std::int64_t n : {1, 5})
        for (float bad : {kNaN, std::numeric_limits<float>::infinity()}) {
          SCOPED_TRACE(name(t) + " " + isa + " n=" + std::to_string(n) + " " + std::to_string(bad));
          const std::int64_t rows = 19, cols = 2 * block(t), j_bad = n - 1;
          auto w = make_weights(t, rows, cols, rng);
          auto x = make_x(n * cols, rng);
          x[j_bad * cols + cols - 3] = bad;
          for (QuantMode mode : {QuantMode::Fast, QuantMode::Exact}) {
            auto y = run(quant_table(isa), t, w, rows, cols, x, n, mode);
            for (std::int64_t j = 0; j < n; ++j)
              for (std::int64_t r = 0; r < rows; ++r) {
                const float v = y[j * rows + r];
                if (j == j_bad)
                  EXPECT_FALSE(std::isfinite(v)) << "j " << j << " r " << r << " = " << v;
                else
                  EXPECT_TRUE(std::isfinite(v)) << "j " << j << " r " << r << " = " << v;
              }
          }
        }
}

TEST(QuantMatmul, ThreadCountDoesNotChangeResults) {
  std::mt19937_64 rng(rlx::testing::test_seed() + 8);
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q4_K}) {
    SCOPED_TRACE(name(t));
    const std::int64_t rows = 301, cols = 512, n = 9;
    auto w = make_weights(t, rows, cols, rng);
    auto x = make_x(n * cols, rng);
    for (QuantMode mode : {QuantMode::Fast, QuantMode::Exact}) {
      std::vector<float> one(static_cast<std::size_t>(n * rows), kNaN), all(one.size(), kNaN);
      const QuantTable& table = select_quant_table();
      quant_gemm_with(table, t, w.q.data(), rows, cols, x.data(), n, one.data(), mode, 1);
      quant_gemm_with(table, t, w.q.data(), rows, cols, x.data(), n, all.data(), mode, 0);
      ASSERT_EQ(one, all);
    }
  }
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no rlx::Error (expected one mentioning '" << needle << "')";
  } catch (const rlx::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(QuantMatmul, BadShapesThrow) {
  std::vector<std::byte> w(4096);
  std::vector<float> x(1024, 1.0f), y(64, kNaN);
  expect_error([&] { quant_gemv(DType::Q4_0, w.data(), 2, 48, x.data(), y.data()); }, "q4_0");
  expect_error([&] { quant_gemv(DType::Q4_0, w.data(), 2, 48, x.data(), y.data()); }, "cols = 48");
  expect_error([&] { quant_gemv(DType::Q4_K, w.data(), 1, 576, x.data(), y.data()); }, "block (256)");
  expect_error([&] { quant_gemv(DType::Q6_K, w.data(), 1, 0, x.data(), y.data(), QuantMode::Exact); }, "q6_k");
  expect_error([&] { quant_gemm(DType::Q8_0, w.data(), 0, 32, x.data(), 1, y.data()); }, "rows (0)");
  expect_error([&] { quant_gemm(DType::Q8_0, w.data(), 1, 32, x.data(), 0, y.data()); }, "n (0)");
}

TEST(QuantMatmul, UnsupportedTypesThrow) {
  std::vector<std::byte> w(4096);
  std::vector<float> x(1024, 1.0f), y(64, kNaN);
  expect_error([&] { quant_gemv(DType::F16, w.data(), 2, 64, x.data(), y.data()); }, "f16");
  expect_error([&] { quant_gemv(DType::Q8_K, w.data(), 2, 256, x.data(), y.data()); }, "q8_k");
  expect_error([&] { quant_gemv(DType::I32, w.data(), 1, 256, x.data(), y.data(), QuantMode::Exact); }, "i32");
  expect_error([] { (void)quant_table("sse9"); }, "sse9");
  for (DType t : kFastTypes) EXPECT_TRUE(quant_fast_supported(t)) << name(t);
}

}  // namespace
}  // namespace rlx::backends::cpu

namespace rlx::backends::cpu {
namespace {

// quantized_matmul through a compiled graph at a model's sizes (SmolLM2's 576 x 1536), one row (decode) and a
// chunk of rows (prefill), against the float64 reference: the op, its kernel choice and its threading together.
TEST(QuantizedMatmulOp, ModelSizedGraphsMatchTheReference) {
  std::mt19937_64 rng(testing::test_seed());
  struct Size {
    std::int64_t n, k;
  };
  for (DType t : {DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (Size sz : {Size{1536, 768}, Size{192, 576}, Size{576, 1536}})
      for (const char* act : {"f32", "q8"})
        for (std::int64_t m : {1, 5, 16}) {
          if (sz.k % std::int64_t(ir::block_elems(t)) != 0) continue;
          ir::Graph g("qmm");
          auto x = g.input("x", ir::Shape{m, sz.k}, DType::F32);
          auto w = g.param("w", ir::Shape{sz.n, sz.k}, t);
          g.add_output(g.quantized_matmul(x, w, act));
          const ir::Tensor wf = testing::random_tensor(DType::F32, {sz.n, sz.k}, rng, -1, 1);
          const ir::Tensor wq = ir::Tensor::from_f64(t, {sz.n, sz.k}, wf.to_f64());
          const ir::Tensor xv = testing::random_tensor(DType::F32, {m, sz.k}, rng, -2, 2);
          Session s(Device::Cpu);
          CompiledGraph cg = s.compile(g);
          cg.set_param("w", wq);
          const ir::Tensor got = cg.run({{"x", xv}})[0];
          const ir::Tensor want = reference::run(g, {{"x", xv}}, {{"w", wq}})[0];
          EXPECT_TRUE(testing::tensors_close(got, want, {1e-3, 1e-4}))
              << ir::dtype_name(t) << " " << act << " [" << m << ", " << sz.k << "] x [" << sz.n << ", " << sz.k << "]";
        }
}

}  // namespace
}  // namespace rlx::backends::cpu
