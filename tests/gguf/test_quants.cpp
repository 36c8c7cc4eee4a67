// rlx/gguf/quants.hpp, bit for bit against independent references (docs/quants.md):
//   - dequantize against gguf.quants.dequantize (numpy) for every type it has, against a numpy
//     d * q for Q8_1 and Q8_K, and against llama.cpp's dequantize_row_* where the driver is built;
//   - quantize against gguf.quants.quantize where gguf implements the type (F16, BF16, Q4_0, Q4_1,
//     Q5_0, Q5_1, Q8_0), and against llama.cpp's quantize_row_*_ref (tests/gguf/ggml_quant_ref.c,
//     built by scripts/build_llama_cpp.sh) for every ggml block type, the K-quants included.
// tests/gguf/quant_vectors.py draws the inputs (a fixed seed and this run's RLX_TEST_SEED) and runs
// the references into build/tests/quant_vectors/<test>/. Without llama.cpp's source (no network),
// the llama.cpp cases skip and say why; a missing gguf package is a failure.
// Also: quantize -> dequantize error bounds per type, NaN/inf inputs, and the size/type errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "rlx/gguf/quants.hpp"
#include "rlx/ir/dtype.hpp"
#include "rlx/ir/quants.hpp"
#include "support/testing.hpp"

namespace fs = std::filesystem;
using rlx::gguf::GgmlType;

namespace {

// ---- the environment: build directory, Python, the llama.cpp driver ----

fs::path build_dir() {  // this binary is <build>/tests/gguf_test_quants
  return fs::canonical("/proc/self/exe").parent_path().parent_path();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; returns its exit status and its stdout and stderr together.
int run(const std::string& cmd, std::string& output) {
  output.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) output.append(buf.data(), n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// RLX_PYTHON, else the Python_EXECUTABLE this build was configured with, else the repository's
// .venv, else python3.
std::string python() {
  if (const char* p = std::getenv("RLX_PYTHON"); p != nullptr && *p != 0) return p;
  std::ifstream cache(build_dir() / "CMakeCache.txt");
  for (std::string line; std::getline(cache, line);) {
    const std::string key = "Python_EXECUTABLE:";
    if (line.rfind(key, 0) == 0) {
      const auto eq = line.find('=');
      if (eq != std::string::npos && fs::exists(line.substr(eq + 1))) return line.substr(eq + 1);
    }
  }
  const fs::path venv = fs::path(RLX_SOURCE_DIR) / ".venv/bin/python";
  return fs::exists(venv) ? venv.string() : "python3";
}

// The llama.cpp driver, built (and its source fetched) by scripts/build_llama_cpp.sh on first use;
// empty with the reason in `why` when that fails.
std::string ggml_driver(std::string& why) {
  static std::string exe, reason;
  static bool done = false;
  if (!done) {
    done = true;
    std::string out;
    const std::string cmd = "PYTHON=" + shell_quote(python()) + " bash " +
                            shell_quote(std::string(RLX_SOURCE_DIR) + "/scripts/build_llama_cpp.sh") + " --build-dir " +
                            shell_quote(build_dir().string()) + " quant-ref";
    const fs::path path = build_dir() / "llama.cpp" / "ggml_quant_ref";
    if (run(cmd, out) == 0 && fs::exists(path)) {
      exe = path.string();
    } else {
      reason = "scripts/build_llama_cpp.sh could not provide llama.cpp's reference quantizers: " + out;
    }
  }
  why = reason;
  return exe;
}

bool in_ggml(GgmlType t) { return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16; }

std::string name_of(GgmlType t) { return std::string(rlx::gguf::ggml_type_info(t).name); }

// ---- vectors ----

struct Vectors {
  fs::path dir;
  std::map<std::string, std::string> meta;
  bool has(const std::string& file) const { return fs::exists(dir / file); }
  std::string status(const std::string& ref) const {
    auto it = meta.find(ref);
    return it == meta.end() ? "absent: not recorded" : it->second;
  }
};

Vectors generate(GgmlType t, const char* what) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = std::string(info->test_suite_name()) + "." + info->name();
  std::replace(test.begin(), test.end(), '/', '-');
  Vectors v{build_dir() / "tests" / "quant_vectors" / test, {}};
  fs::create_directories(v.dir);
  std::string why, driver;
  if (in_ggml(t)) driver = ggml_driver(why);
  std::string cmd = shell_quote(python()) + " " +
                    shell_quote(std::string(RLX_SOURCE_DIR) + "/tests/gguf/quant_vectors.py") + " --type " +
                    name_of(t) + " --what " + what + " --seed " + std::to_string(rlx::testing::test_seed()) +
                    " --out " + shell_quote(v.dir.string());
  if (!driver.empty()) cmd += " --ggml-ref " + shell_quote(driver);
  if (!why.empty()) cmd += " --ggml-absent " + shell_quote(why.substr(0, 400));
  std::string out;
  const int rc = run(cmd, out);
  if (rc != 0) {
    ADD_FAILURE() << "tests/gguf/quant_vectors.py failed (exit " << rc << "):\n" << cmd << "\n" << out;
    return v;
  }
  std::ifstream meta(v.dir / "meta.txt");
  for (std::string line; std::getline(meta, line);) {
    const auto sp = line.find(' ');
    if (sp != std::string::npos) v.meta[line.substr(0, sp)] = line.substr(sp + 1);
  }
  std::fprintf(stderr, "[quants] %s %s vectors in %s (fixed seed %s and RLX_TEST_SEED %s)\n", what, name_of(t).c_str(),
               v.dir.c_str(), v.status("fixed_seed").c_str(), v.status("seed").c_str());
  return v;
}

template <class T>
std::vector<T> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

std::string hex32(float f) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", std::bit_cast<std::uint32_t>(f));
  return buf;
}

// Float outputs compared as bit patterns (NaN payloads and the sign of zero included).
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want,
                                     const std::string& ref, const std::vector<std::byte>& blocks,
                                     std::size_t block_elems, std::size_t block_bytes) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << ref << " has " << want.size() << " values, RLX " << got.size();
  std::size_t bad = 0;
  std::ostringstream msg;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i])) continue;
    if (bad++ < 8) {
      msg << "\n  element " << i << " (block " << i / block_elems << "): RLX " << got[i] << " (" << hex32(got[i])
          << "), " << ref << " " << want[i] << " (" << hex32(want[i]) << ")";
      if (bad == 1 && block_bytes > 0) {
        msg << "\n  block bytes:";
        const std::size_t b = i / block_elems;
        for (std::size_t k = 0; k < block_bytes && (b + 1) * block_bytes <= blocks.size(); ++k) {
          char h[4];
          std::snprintf(h, sizeof h, " %02x", static_cast<unsigned>(blocks[b * block_bytes + k]));
          msg << h;
        }
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " values differ from " << ref << msg.str();
}

::testing::AssertionResult same_bytes(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                                      const std::string& ref, const std::vector<float>& in, std::size_t block_elems,
                                      std::size_t block_bytes) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << ref << " wrote " << want.size() << " bytes, RLX " << got.size();
  std::size_t bad_blocks = 0, first = 0;
  for (std::size_t b = 0; b < got.size() / block_bytes; ++b) {
    if (std::memcmp(got.data() + b * block_bytes, want.data() + b * block_bytes, block_bytes) != 0) {
      if (bad_blocks++ == 0) first = b;
    }
  }
  if (bad_blocks == 0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg << bad_blocks << " of " << got.size() / block_bytes << " blocks differ from " << ref << "; the first, block "
      << first << ":\n  byte  RLX  " << ref;
  for (std::size_t k = 0; k < block_bytes; ++k) {
    const auto g = static_cast<unsigned>(got[first * block_bytes + k]);
    const auto w = static_cast<unsigned>(want[first * block_bytes + k]);
    char line[64];
    std::snprintf(line, sizeof line, "\n  %4zu   %02x   %02x%s", k, g, w, g != w ? "  <-" : "");
    msg << line;
  }
  msg << "\n  input:";
  for (std::size_t k = 0; k < block_elems; ++k) msg << " " << in[first * block_elems + k];
  return ::testing::AssertionFailure() << msg.str();
}

std::size_t block_bytes(GgmlType t) { return rlx::gguf::ggml_type_info(t).block_bytes; }

const std::vector<GgmlType> kAll = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                                    GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q2_K,
                                    GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K};
// The types gguf.quants quantizes (gguf-py 0.x: quants.py has quantize_blocks for these only).
const std::vector<GgmlType> kGgufQuantize = {GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                                             GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0};
const std::vector<GgmlType> kBlockTypes(kAll.begin() + 3, kAll.end());

std::string param_name(const ::testing::TestParamInfo<GgmlType>& p) { return name_of(p.param); }

}  // namespace

namespace rlx::gguf {
void PrintTo(GgmlType t, std::ostream* os) { *os << ggml_type_info(t).name; }  // gtest's name for a parameter
}  // namespace rlx::gguf

namespace {

// ---- exactness ----

class Dequantize : public ::testing::TestWithParam<GgmlType> {};

TEST_P(Dequantize, MatchesReferencesBitForBit) {
  const GgmlType t = GetParam();
  const Vectors v = generate(t, "dequantize");
  if (HasFailure()) return;
  const auto blocks = read_file<std::byte>(v.dir / "dq_in.bin");
  const std::size_t n = std::stoul(v.meta.at("elements"));
  const std::size_t elems = rlx::gguf::ggml_type_info(t).block_elems;
  std::vector<float> got(n, std::numeric_limits<float>::quiet_NaN());
  rlx::gguf::dequantize(t, blocks, got);
  std::string with, without;
  for (const char* ref : {"gguf", "numpy", "ggml"}) {
    const std::string file = std::string("dq_") + ref + ".f32";
    if (!v.has(file)) {
      if (ref != std::string("numpy")) without += std::string("; no ") + ref + " (" + v.status(ref) + ")";
      continue;
    }
    EXPECT_TRUE(same_bits(got, read_file<float>(v.dir / file), ref, blocks, elems, elems > 1 ? block_bytes(t) : 0));
    with += (with.empty() ? "" : ", ") + std::string(ref);
  }
  std::fprintf(stderr, "[quants] dequantize %s, %zu elements: compared with %s%s\n", name_of(t).c_str(), n,
               with.c_str(), without.c_str());
  // gguf.quants or the numpy formula is always there: the dequantize check never rests on llama.cpp alone.
  EXPECT_TRUE(v.has("dq_gguf.f32") || v.has("dq_numpy.f32")) << "no gguf or numpy reference for " << name_of(t);
}
INSTANTIATE_TEST_SUITE_P(Quants, Dequantize, ::testing::ValuesIn(kAll), param_name);

class QuantizeGguf : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantizeGguf, MatchesGgufBitForBit) {
  const GgmlType t = GetParam();
  const Vectors v = generate(t, "quantize");
  if (HasFailure()) return;
  ASSERT_TRUE(v.has("q_gguf.bin")) << "gguf.quants should quantize " << name_of(t) << ": " << v.status("gguf");
  const auto in = read_file<float>(v.dir / "q_in.f32");
  std::vector<std::byte> got(rlx::gguf::quantized_bytes(t, in.size()), std::byte{0x5a});
  rlx::gguf::quantize(t, in, got);
  const std::size_t elems = rlx::gguf::ggml_type_info(t).block_elems;
  EXPECT_TRUE(same_bytes(got, read_file<std::byte>(v.dir / "q_gguf.bin"), "gguf", in, elems,
                         elems > 1 ? block_bytes(t) : rlx::gguf::ggml_type_info(t).block_bytes));
}
INSTANTIATE_TEST_SUITE_P(Quants, QuantizeGguf, ::testing::ValuesIn(kGgufQuantize), param_name);

class QuantizeLlamaCpp : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantizeLlamaCpp, MatchesReferenceQuantizerBitForBit) {
  const GgmlType t = GetParam();
  std::string why;
  if (ggml_driver(why).empty()) GTEST_SKIP() << "llama.cpp's reference quantizers are not available: " << why;
  const Vectors v = generate(t, "quantize");
  if (HasFailure()) return;
  ASSERT_TRUE(v.has("q_ggml.bin")) << v.status("ggml");
  const auto in = read_file<float>(v.dir / "q_in.f32");
  std::vector<std::byte> got(rlx::gguf::quantized_bytes(t, in.size()), std::byte{0x5a});
  rlx::gguf::quantize(t, in, got);
  EXPECT_TRUE(same_bytes(got, read_file<std::byte>(v.dir / "q_ggml.bin"), "llama.cpp", in,
                         rlx::gguf::ggml_type_info(t).block_elems, block_bytes(t)));
  if (v.has("q_gguf.bin")) {  // the legacy types: gguf and llama.cpp agree, and RLX with both
    EXPECT_TRUE(same_bytes(got, read_file<std::byte>(v.dir / "q_gguf.bin"), "gguf", in,
                           rlx::gguf::ggml_type_info(t).block_elems, block_bytes(t)));
  }
}
INSTANTIATE_TEST_SUITE_P(Quants, QuantizeLlamaCpp, ::testing::ValuesIn(kBlockTypes), param_name);

// ---- round trips ----

// Per-type bound on |x - dequantize(quantize(x))| for one block, given the block's values and the
// stored scale fields. For the 32-element types the bound is exact: half a step (a whole step on
// the clipped side of Q4_0/Q5_0), plus what rounding the scale and min to f16 moves. For the
// K-quants the sub-block scales are themselves quantized; the bound is a multiple of the block's
// largest magnitude, set from ggml's own behaviour with margin (docs/quants.md).
struct Stats {
  double max_err = 0, sum_err2 = 0, sum_x2 = 0;
};

double k_quant_rel_bound(GgmlType t) {  // max |error| / max |x| over a super-block
  switch (t) {
    case GgmlType::Q2_K: return 0.75;
    case GgmlType::Q3_K: return 0.40;
    case GgmlType::Q4_K: return 0.15;
    case GgmlType::Q5_K: return 0.08;
    case GgmlType::Q6_K: return 0.05;
    default: return 0;
  }
}
double k_quant_rms_bound(GgmlType t) {  // RMS error / RMS x for Gaussian data
  switch (t) {
    case GgmlType::Q2_K: return 0.40;
    case GgmlType::Q3_K: return 0.20;
    case GgmlType::Q4_K: return 0.10;
    case GgmlType::Q5_K: return 0.05;
    case GgmlType::Q6_K: return 0.025;
    default: return 0;
  }
}

class RoundTrip : public ::testing::TestWithParam<GgmlType> {};

TEST_P(RoundTrip, ErrorWithinTheTypesBound) {
  const GgmlType t = GetParam();
  const std::size_t elems = rlx::gguf::ggml_type_info(t).block_elems;
  const std::size_t block = elems > 1 ? elems : 256;
  std::mt19937_64 rng(rlx::testing::test_seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-3.0f, 3.0f);
  const std::size_t nblocks = 64;
  std::vector<float> x(nblocks * block);
  for (std::size_t b = 0; b < nblocks; ++b) {
    const float scale = b % 2 == 0 ? 1.0f : std::pow(10.0f, mag(rng));  // Gaussian, and scaled blocks
    for (std::size_t i = 0; i < block; ++i) x[b * block + i] = normal(rng) * scale;
  }
  std::vector<std::byte> q(rlx::gguf::quantized_bytes(t, x.size()));
  rlx::gguf::quantize(t, x, q);
  std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
  rlx::gguf::dequantize(t, q, y);
  const std::size_t bb = block_bytes(t);
  double rms_num = 0, rms_den = 0, worst_rel = 0;
  for (std::size_t b = 0; b < nblocks; ++b) {
    const float* xb = x.data() + b * block;
    const float* yb = y.data() + b * block;
    const std::byte* qb = q.data() + b * block / elems * bb;
    double amax = 0, max_err = 0, xmin = xb[0], xmax = xb[0];
    for (std::size_t i = 0; i < block; ++i) {
      amax = std::max(amax, double(std::fabs(xb[i])));
      xmin = std::min(xmin, double(xb[i]));
      xmax = std::max(xmax, double(xb[i]));
      ASSERT_TRUE(std::isfinite(yb[i])) << "block " << b << " element " << i;
      const double err = std::fabs(double(xb[i]) - double(yb[i]));
      max_err = std::max(max_err, err);
      if (b % 2 == 0) {
        rms_num += err * err;
        rms_den += double(xb[i]) * xb[i];
      }
    }
    auto f16 = [&](std::size_t off) {
      std::uint16_t h;
      std::memcpy(&h, qb + off, 2);
      return double(rlx::ir::f16_to_f32(h));
    };
    double bound = 0;
    const double tiny = 1e-6 * amax;  // float rounding of the products
    switch (t) {
      case GgmlType::F32: bound = 0; break;
      case GgmlType::F16: bound = amax * 0x1p-11 + 0x1p-25; break;
      case GgmlType::BF16: bound = amax * 0x1p-8; break;
      case GgmlType::Q4_0: bound = amax / 8 + 8 * std::fabs(amax / 8 - std::fabs(f16(0))) + tiny; break;
      case GgmlType::Q5_0: bound = amax / 16 + 16 * std::fabs(amax / 16 - std::fabs(f16(0))) + tiny; break;
      case GgmlType::Q8_0:
      case GgmlType::Q8_1: bound = amax / 127 / 2 + 127 * std::fabs(amax / 127 - f16(0)) + tiny; break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1: {
        const double steps = t == GgmlType::Q4_1 ? 15 : 31;
        const double d = (xmax - xmin) / steps;
        bound = d / 2 + steps * std::fabs(d - f16(0)) + std::fabs(xmin - f16(2)) + tiny;
        break;
      }
      case GgmlType::Q8_K: {
        float d;
        std::memcpy(&d, qb, 4);
        bound = std::fabs(double(d)) / 2 + tiny;
        break;
      }
      default: bound = k_quant_rel_bound(t) * amax; break;
    }
    EXPECT_LE(max_err, bound) << name_of(t) << " block " << b << " (max |x| " << amax << ")";
    worst_rel = std::max(worst_rel, max_err / amax);
  }
  if (k_quant_rms_bound(t) > 0) {
    const double rel_rms = std::sqrt(rms_num / rms_den);
    std::fprintf(stderr, "[quants] %s: RMS error / RMS x = %.4f on Gaussian blocks, max |error| / max |x| = %.4f\n",
                 name_of(t).c_str(), rel_rms, worst_rel);
    EXPECT_LE(rel_rms, k_quant_rms_bound(t));
  }
}
INSTANTIATE_TEST_SUITE_P(Quants, RoundTrip, ::testing::ValuesIn(kAll), param_name);

// ---- non-finite inputs ----

// The codecs name a type by its dtype ("q4_k"; the gguf calls forward to them).
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

TEST(QuantsNonFinite, BlockTypesRejectNanAndInfinityNamingTheElement) {
  for (GgmlType t : kBlockTypes) {
    const std::size_t n = 2 * rlx::gguf::ggml_type_info(t).block_elems;
    std::vector<std::byte> out(rlx::gguf::quantized_bytes(t, n));
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(n, 0.5f);
      x[n - 3] = bad;
      const std::string what = std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf";
      rlx::testing::expect_error([&] { rlx::gguf::quantize(t, x, out); },
                                 {"quantize to " + lower(name_of(t)), "element " + std::to_string(n - 3), what});
    }
  }
}

TEST(QuantsNonFinite, FloatTypesKeepNanAndInfinity) {
  const std::vector<float> x = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), -0.0f};
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    std::vector<std::byte> q(rlx::gguf::quantized_bytes(t, x.size()));
    rlx::gguf::quantize(t, x, q);
    std::vector<float> y(x.size());
    rlx::gguf::dequantize(t, q, y);
    EXPECT_TRUE(std::isnan(y[0])) << name_of(t);
    EXPECT_EQ(y[1], x[1]) << name_of(t);
    EXPECT_EQ(y[2], x[2]) << name_of(t);
    EXPECT_TRUE(std::signbit(y[3])) << name_of(t);
  }
}

TEST(QuantsNonFinite, NanAndInfiniteScalesPropagateOnDequantize) {
  rlx::ir::BlockQ8_0 b{};
  b.d = 0x7c00;  // +inf
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<std::int8_t>(j - 16);
  std::vector<std::byte> bytes(sizeof b);
  std::memcpy(bytes.data(), &b, sizeof b);
  std::vector<float> y(32);
  rlx::gguf::dequantize(GgmlType::Q8_0, bytes, y);
  EXPECT_EQ(y[0], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(y[16]));  // inf * 0
  EXPECT_EQ(y[31], std::numeric_limits<float>::infinity());
}

// ---- errors ----

TEST(QuantsErrors, SizesThatAreNotWholeBlocksNameTypeCountAndBlock) {
  std::vector<float> x(300);
  std::vector<std::byte> out(1000);
  rlx::testing::expect_error([&] { rlx::gguf::quantize(GgmlType::Q4_K, x, out); }, {"q4_k", "300", "256"});
  rlx::testing::expect_error([&] { rlx::gguf::dequantize(GgmlType::Q8_0, out, std::span<float>(x).first(33)); },
                             {"q8_0", "33", "32"});
  rlx::testing::expect_error([&] { (void)rlx::gguf::quantized_bytes(GgmlType::Q6_K, 255); }, {"Q6_K", "255", "256"});
}

TEST(QuantsErrors, WrongBufferSizesAreErrors) {
  std::vector<float> x(64);
  std::vector<std::byte> out(2 * 18 + 1);
  rlx::testing::expect_error([&] { rlx::gguf::quantize(GgmlType::Q4_0, x, out); }, {"q4_0", "64", "36", "37"});
  rlx::testing::expect_error([&] { rlx::gguf::dequantize(GgmlType::Q4_0, out, x); }, {"q4_0", "64", "36", "37"});
  std::vector<std::byte> q81(2 * 36);
  EXPECT_NO_THROW(rlx::gguf::quantize(GgmlType::Q8_1, x, q81));  // ggml's 36-byte Q8_1 block
  EXPECT_EQ(rlx::gguf::quantized_bytes(GgmlType::Q8_1, 64), 72u);
  EXPECT_EQ(rlx::gguf::quantized_bytes(GgmlType::Q4_K, 512), 288u);
}

TEST(QuantsErrors, UnsupportedTypesAreNamed) {
  std::vector<float> x(256);
  std::vector<std::byte> bytes(4096);
  int unsupported = 0;
  for (const auto& info : rlx::gguf::kGgmlTypes) {
    if (std::find(kAll.begin(), kAll.end(), info.type) != kAll.end()) {
      EXPECT_TRUE(rlx::gguf::can_dequantize(info.type) && rlx::gguf::can_quantize(info.type)) << info.name;
      continue;
    }
    ++unsupported;
    EXPECT_FALSE(rlx::gguf::can_dequantize(info.type) || rlx::gguf::can_quantize(info.type)) << info.name;
    const std::string name(info.name);
    rlx::testing::expect_error([&] { rlx::gguf::dequantize(info.type, bytes, x); },
                               {"dequantize of " + name + " is not supported"});
    rlx::testing::expect_error([&] { rlx::gguf::quantize(info.type, x, bytes); },
                               {"quantize to " + name + " is not supported"});
  }
  EXPECT_GE(unsupported, 10);  // IQ*, TQ*, MXFP4, the integer types and F64
  rlx::testing::expect_error([&] { rlx::gguf::dequantize(static_cast<GgmlType>(99), bytes, x); }, {"99"});
}

TEST(QuantsErrors, EmptyRunsAreFine) {
  for (GgmlType t : kAll) {
    EXPECT_EQ(rlx::gguf::quantized_bytes(t, 0), 0u);
    EXPECT_NO_THROW(rlx::gguf::quantize(t, {}, {}));
    EXPECT_NO_THROW(rlx::gguf::dequantize(t, {}, {}));
  }
}

// ---- f16 ----

TEST(QuantsF16, EveryHalfRoundTripsThroughFloat) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = rlx::ir::f16_to_f32(bits);
    ASSERT_EQ(rlx::ir::f32_to_f16(f), bits) << std::hex << h;  // NaN payloads too
  }
}

TEST(QuantsF16, AgreesWithTheIrConversionOnFiniteValues) {
  // The IR's float_to_half (rlx/ir/dtype.hpp) rounds to nearest even too; only NaN payloads differ.
  std::mt19937_64 rng(rlx::testing::test_seed());
  for (int i = 0; i < 1'000'000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(rlx::ir::f32_to_f16(f), rlx::ir::float_to_half(f)) << std::hex << bits;
  }
}

}  // namespace
