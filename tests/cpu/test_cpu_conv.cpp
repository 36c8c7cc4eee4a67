// How the CPU conv kernel splits its GEMMs (kernel_native.cpp, make_conv).
// f64 goes through BLAS: whole images per unit and, with fewer images than
// threads, a split of the output channels (weights larger than the image's
// im2col) or of the output positions (rows cut mid-way, strides, dilation,
// padding wider than the kernel). f32 goes through the packed-B GEMM: one
// panel of positions per unit (a short last panel), channel blocks when there
// are fewer panels than threads, K longer than the GEMM's K slice. Both with
// im2col's row-at-a-time and "same"-padding paths, with and without bias, on
// 1, 2 or 3 threads.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "backends/cpu/isa.hpp"
#include "conformance/harness.hpp"
#include "rlx/env.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::backends::cpu {
namespace {

using ir::DType;
using ir::Graph;
using Ints = std::vector<std::int64_t>;

struct Case {
  const char* what;
  Ints x, w;
  Ints stride, pad, dilation;
  std::int64_t groups;
};

// The conv of case c (bias and weights as params when asked, else inputs) against the reference interpreter on
// fresh random inputs, on `threads` threads.
bool conv_matches(const Case& c, DType t, bool bias, bool weights_param, int threads) {
  Graph g(c.what);
  auto x = g.input("x", ir::Shape(c.x), t);
  auto w = weights_param ? g.param("w", ir::Shape(c.w), t) : g.input("w", ir::Shape(c.w), t);
  std::optional<ir::NodeId> b;
  if (bias) b = weights_param ? g.param("b", {c.w[0]}, t) : g.input("b", {c.w[0]}, t);
  g.add_output(g.conv2d(x, w, b, c.stride, c.pad, c.dilation, c.groups));
  conformance::Check check;
  check.seed = testing::test_seed();
  check.label = c.what;
  check.options.num_threads = threads;
  return conformance::matches_reference(runtime::Device::Cpu, g, check);
}

TEST(CpuConv, WorkSplitsMatchTheReference) {
  const Case cases[] = {
      {"batch of images", {3, 8, 9, 7}, {12, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"channel split (weights outweigh the image)", {1, 8, 5, 5}, {40, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"groups", {1, 8, 4, 6}, {36, 4, 3, 3}, {1, 2}, {1, 0}, {1, 1}, 2},
      {"position split (image outweighs the weights)", {1, 4, 21, 19}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"position split, strides, dilation, wide padding", {1, 3, 31, 29}, {4, 3, 2, 3}, {3, 2}, {4, 7}, {2, 3}, 1},
      {"same padding, dilated", {2, 3, 9, 8}, {5, 3, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1},
      {"same padding wider than the image", {1, 2, 3, 3}, {3, 2, 3, 3}, {1, 1}, {4, 4}, {4, 4}, 1},
      {"pointwise, channel split", {1, 16, 5, 5}, {48, 16, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"pointwise, position split", {1, 3, 30, 30}, {5, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"one panel, channel blocks", {1, 8, 5, 5}, {100, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"K longer than a GEMM slice, groups", {2, 128, 6, 5}, {12, 64, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},
      // f32 panels run over every image's positions: these straddle images (63 and 42 positions an image).
      {"panels straddling images, groups", {5, 6, 7, 9}, {8, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},
      {"panels straddling images, strides, channel blocks", {3, 4, 11, 13}, {100, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"a panel spanning three images", {4, 2, 3, 5}, {3, 2, 2, 2}, {1, 1}, {0, 0}, {1, 1}, 1},
  };
  for (DType t : {DType::F32, DType::F64})
    for (const Case& c : cases)
      for (bool bias : {false, true})
        for (int threads : {1, 2, 3})
          EXPECT_TRUE(conv_matches(c, t, bias, false, threads))
              << c.what << ", " << ir::dtype_name(t) << ", bias " << bias << ", threads " << threads;
}

// The direct kernel (isa/conv_impl.inc), forced so that a fall back to im2col fails the test: whole channel
// blocks (of 16, so of 8 too), column strides 1 and 2, row strides, dilation, groups, padding, pointwise convs
// run as one row of positions, rows longer than a register tile (strips), short rows (four channel blocks a
// tile on AVX-512), an odd count of channel blocks (one a tile), weights packed once (params) and per run
// (inputs), with and without bias, on 1 to 3 threads and every SIMD ISA.
TEST(CpuConv, DirectKernelMatchesTheReferenceOnEveryIsa) {
  const Case cases[] = {
      {"3x3 same", {2, 32, 9, 11}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"rows longer than a tile", {1, 16, 5, 40}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"short rows, four blocks a tile", {2, 16, 6, 6}, {64, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"odd block count", {1, 16, 7, 9}, {48, 16, 3, 3}, {1, 1}, {0, 1}, {1, 1}, 1},
      {"strides 2, groups", {2, 32, 15, 13}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 2},
      {"row stride 3, dilation", {1, 16, 17, 12}, {16, 16, 3, 2}, {3, 1}, {2, 0}, {2, 3}, 1},
      {"wide padding, 5x3", {1, 32, 10, 30}, {64, 32, 5, 3}, {2, 1}, {4, 2}, {1, 2}, 1},
      {"pointwise", {2, 32, 7, 9}, {48, 32, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"pointwise, stride 2", {1, 16, 20, 19}, {32, 16, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
      {"pointwise, padded", {1, 16, 4, 5}, {16, 16, 1, 1}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"groups of 16 channels", {1, 64, 6, 6}, {64, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 4},
  };
  env::ScopedOverride direct("RLX_CPU_CONV", "direct");
  int ran = 0;
  for (const std::string& isa : supported_isas()) {
    if (isa == "generic") continue;
    env::ScopedOverride use_isa("RLX_CPU_ISA", isa);
    for (const Case& c : cases)
      for (bool bias : {false, true})
        for (bool param : {false, true})
          for (int threads : {1, 2, 3}) {
            EXPECT_TRUE(conv_matches(c, DType::F32, bias, param, threads))
                << c.what << ", " << isa << ", bias " << bias << ", weights as params " << param << ", threads "
                << threads;
            ++ran;
          }
    for (auto [stride, pad, dil] : {std::array<std::int64_t, 3>{1, 1, 1}, {2, 3, 2}}) {
      Graph g("direct conv1d");
      g.add_output(g.conv1d(g.input("x", {2, 16, 30}), g.param("w", {32, 16, 3}), std::nullopt, stride, pad, dil));
      conformance::Check check;
      check.seed = testing::test_seed();
      EXPECT_TRUE(conformance::matches_reference(runtime::Device::Cpu, g, check)) << isa << " stride " << stride;
    }
  }
  if (ran == 0) GTEST_SKIP() << "this CPU has no SIMD ISA with a direct convolution";
}

// Winograd F(2x2, 3x3), forced: odd output sizes (tiles past the edges, and past a group of tiles on the last
// column), no padding and wide padding, several images, output blocks in and out of the transposed groups,
// with and without bias, on 1 to 3 threads and every SIMD ISA; and with 128 channels each way, where the
// default picks it.
TEST(CpuConv, WinogradMatchesTheReferenceOnEveryIsa) {
  const Case cases[] = {
      {"same, odd rows and columns", {2, 32, 9, 11}, {48, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"no padding", {1, 16, 10, 7}, {32, 16, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"wide padding, three images", {3, 16, 5, 13}, {16, 16, 3, 3}, {1, 1}, {2, 1}, {1, 1}, 1},
      {"one output", {1, 16, 3, 3}, {16, 16, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
  };
  int ran = 0;
  for (const std::string& isa : supported_isas()) {
    if (isa == "generic") continue;
    env::ScopedOverride use_isa("RLX_CPU_ISA", isa);
    {
      env::ScopedOverride winograd("RLX_CPU_CONV", "winograd");
      for (const Case& c : cases)
        for (bool bias : {false, true})
          for (int threads : {1, 2, 3}) {
            EXPECT_TRUE(conv_matches(c, DType::F32, bias, true, threads))
                << c.what << ", " << isa << ", bias " << bias << ", threads " << threads;
            ++ran;
          }
    }
    const Case wide{"winograd by default", {1, 128, 12, 12}, {128, 128, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1};
    EXPECT_TRUE(conv_matches(wide, DType::F32, true, true, 2)) << isa;
  }
  if (ran == 0) GTEST_SKIP() << "this CPU has no SIMD ISA with a direct convolution";
}

// Forcing the direct kernel where it cannot run is an error that says why, not a silent fall back.
TEST(CpuConv, ForcedDirectKernelSaysWhyItCannotRun) {
  env::ScopedOverride direct("RLX_CPU_CONV", "direct");
  auto expect_refusal = [](const Graph& g, const std::string& why) {
    try {
      (void)runtime::Session(runtime::Device::Cpu).compile(g);
      ADD_FAILURE() << "compiled: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  Graph odd("odd channels");
  odd.add_output(odd.conv2d(odd.input("x", {1, 3, 8, 8}), odd.param("w", {16, 3, 3, 3}), std::nullopt));
  expect_refusal(odd, "not multiples of");
  Graph f64("f64");
  f64.add_output(
      f64.conv2d(f64.input("x", {1, 16, 8, 8}, DType::F64), f64.param("w", {16, 16, 3, 3}, DType::F64), std::nullopt));
  expect_refusal(f64, "f32 only");
  {
    env::ScopedOverride winograd("RLX_CPU_CONV", "winograd");
    Graph pointwise("pointwise");
    pointwise.add_output(
        pointwise.conv2d(pointwise.input("x", {1, 16, 8, 8}), pointwise.param("w", {16, 16, 1, 1}), std::nullopt));
    expect_refusal(pointwise, "not 3x3 with stride 1");
    Graph input_weights("weights as an input");
    input_weights.add_output(input_weights.conv2d(input_weights.input("x", {1, 16, 8, 8}),
                                                  input_weights.input("w", {16, 16, 3, 3}), std::nullopt));
    expect_refusal(input_weights, "not a param or constant");
    Graph grouped("groups");
    grouped.add_output(grouped.conv2d(grouped.input("x", {1, 32, 8, 8}), grouped.param("w", {32, 16, 3, 3}),
                                      std::nullopt, {1, 1}, {1, 1}, {1, 1}, 2));
    expect_refusal(grouped, "groups 2");
  }
  env::ScopedOverride generic("RLX_CPU_ISA", "generic");
  Graph scalar("generic");
  scalar.add_output(scalar.conv2d(scalar.input("x", {1, 16, 8, 8}), scalar.param("w", {16, 16, 3, 3}), std::nullopt));
  expect_refusal(scalar, "no direct convolution");
}

}  // namespace
}  // namespace rlx::backends::cpu
