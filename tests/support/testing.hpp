#pragma once
// Shared test helpers: fresh random inputs, poisoned outputs, and comparison
// against the float64 reference with per-dtype tolerances. NaN never passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::testing {

// A file's bytes (empty when it cannot be read).
inline std::vector<std::byte> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(buf.size());
  for (std::size_t i = 0; i < buf.size(); ++i) out[i] = std::byte(buf[i]);
  return out;
}

// A fresh seed per run unless RLX_TEST_SEED is set; recorded in the test log
// so a failure can be replayed.
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    auto env = rlx::env::get_int("RLX_TEST_SEED");
    std::uint64_t s = env ? static_cast<std::uint64_t>(*env) : std::random_device{}();
    ::testing::Test::RecordProperty("rlx_seed", std::to_string(s));
    std::fprintf(stderr, "[rlx] RLX_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline ir::Tensor random_tensor(ir::DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng,
                                double lo = -2.0, double hi = 2.0) {
  ir::Tensor t(dtype, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = u(rng);
    if (dtype == ir::DType::Bool)
      v = v > (lo + hi) / 2;
    else if (!ir::is_float(dtype))
      v = std::floor(v);
    t.set(i, v);
  }
  return t;
}

struct Tolerance {
  double atol, rtol;
};
inline Tolerance tolerance_for(ir::DType t) {
  switch (t) {
    case ir::DType::F64: return {1e-9, 1e-9};
    case ir::DType::F32: return {1e-4, 1e-4};
    case ir::DType::F16: return {2e-2, 2e-2};
    case ir::DType::BF16: return {1e-1, 5e-2};
    default: return {0, 0};
  }
}

// Compares element by element. NaN in `actual` fails unless `expected` is NaN
// at the same place; infinities must match exactly.
inline ::testing::AssertionResult tensors_close(const ir::Tensor& actual, const ir::Tensor& expected, Tolerance tol) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << "dtype " << ir::dtype_name(actual.dtype()) << " vs "
                                         << ir::dtype_name(expected.dtype());
  if (actual.shape() != expected.shape()) return ::testing::AssertionFailure() << "shape mismatch";
  int bad = 0;
  std::string first;
  for (std::int64_t i = 0; i < actual.numel(); ++i) {
    double a = actual.get(i), e = expected.get(i);
    bool ok;
    if (std::isnan(e))
      ok = std::isnan(a);
    else if (std::isinf(e))
      ok = a == e;
    else
      ok = !std::isnan(a) && std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
    if (!ok && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(a) + ", want " + std::to_string(e);
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << actual.numel() << " elements differ; " << first;
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult tensors_close(const ir::Tensor& actual, const ir::Tensor& expected) {
  return tensors_close(actual, expected, tolerance_for(expected.dtype()));
}

// Runs `f`, which must throw rlx::Error whose message mentions every needle.
// Failures point at the caller's line.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string_view> needles,
                  std::source_location at = std::source_location::current()) {
  try {
    f();
    ADD_FAILURE_AT(at.file_name(), int(at.line())) << "no rlx::Error was thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (auto needle : needles)
      if (msg.find(needle) == std::string::npos)
        ADD_FAILURE_AT(at.file_name(), int(at.line())) << "the message lacks \"" << needle << "\": " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE_AT(at.file_name(), int(at.line())) << "threw a non-rlx exception: " << e.what();
  }
}

}  // namespace rlx::testing
