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

#include "conformance/harness.hpp"

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
        for (int threads : {1, 2, 3}) {
          Graph g("conv split");
          auto x = g.input("x", ir::Shape(c.x), t);
          auto w = g.input("w", ir::Shape(c.w), t);
          std::optional<ir::NodeId> b;
          if (bias) b = g.input("b", {c.w[0]}, t);
          g.add_output(g.conv2d(x, w, b, c.stride, c.pad, c.dilation, c.groups));
          conformance::Check check;
          check.seed = testing::test_seed();
          check.label = c.what;
          check.options.num_threads = threads;
          EXPECT_TRUE(conformance::matches_reference(runtime::Device::Cpu, g, check))
              << c.what << ", " << ir::dtype_name(t) << ", bias " << bias << ", threads " << threads;
        }
}

}  // namespace
}  // namespace rlx::backends::cpu
