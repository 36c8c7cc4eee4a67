// The Vulkan backend's headline figures (docs/backends/vulkan.md): f32 GEMM,
// a fused 8-op elementwise chain against a device-to-device copy, and the
// transformer encoder block from rlx::models. Kernel figures are GPU time
// from timestamp queries; the encoder also reports wall time per run
// (staging, submit, fence included). Prints one `key value unit` line per
// figure for bench/gpu_peers.py, which puts them next to PyTorch's.
//
//   vulkan_bench            full sizes (GEMM 4096^3, chain on 256M floats)
//   vulkan_bench small      quick sizes, for a CPU device (lavapipe)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_common.hpp"
#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/custom_kernels.hpp"

using namespace rlx;
namespace vk = backends::vulkan;
using namespace rlx::bench;

namespace {

// Hand-written copies through the raw-kernel seam: what a shader that only
// moves the chain's bytes reaches, the ceiling for generated elementwise code
// on this device (vkCmdCopyBuffer may run on a copy engine instead).
class BenchCopy final : public ir::OpExtension {
 public:
  explicit BenchCopy(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }

 private:
  std::string name_;
};

// `per_thread` vec4s per invocation, `local` invocations per workgroup; the
// seam dispatches n / (4 * per_thread * local) workgroups for n floats.
void register_copy(const std::string& name, int per_thread, int local) {
  std::string body;
  for (int j = 0; j < per_thread; ++j) body += fmt::format("vec4 v{0} = a[s + {0}u * stride];\n", j);
  for (int j = 0; j < per_thread; ++j) body += fmt::format("a[d + {0}u * stride] = v{0};\n", j);
  std::string glsl = fmt::format(R"(#version 450
layout(local_size_x = {0}) in;
layout(std430, binding = 0) buffer Arena {{ vec4 a[]; }};
layout(std430, binding = 1) readonly buffer Offsets {{ uint off[]; }};
layout(push_constant) uniform Push {{ uint n; }};
void main() {{
  uint stride = gl_NumWorkGroups.x * {0}u, i = gl_GlobalInvocationID.x;
  uint s = off[0] / 4u + i, d = off[1] / 4u + i;
  if (i < n / 4u) {{
{1}  }}
}}
)",
                                 local, body);
  ir::register_op(std::make_shared<BenchCopy>(name));
  runtime::register_vulkan_kernel(name, {.glsl = glsl, .local_size = {std::uint32_t(4 * per_thread * local), 1, 1}});
}

}  // namespace

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::string(argv[1]) == "small";
  try {
    if (auto why = vk::unavailable_reason(); !why.empty()) {
      fmt::print(stderr, "vulkan is unavailable: {}\n", why);
      return 2;
    }
    auto dev = vk::selected_device();
    fmt::print("# device '{}' ({}, Vulkan {})\n", dev.name, dev.type, dev.api_version);
    auto backend = vk::make_vulkan_backend();

    // f32 GEMM.
    const std::int64_t n = small ? 512 : 4096;
    ir::Graph mm("gemm");
    mm.add_output(mm.matmul(mm.param("a", ir::Shape{n, n}), mm.param("b", ir::Shape{n, n})), "c");
    auto gemm = prepare(*backend, mm);
    auto tg = time_runs(*gemm.compiled.exe, gemm.in, gemm.out, 2, 5);
    report(fmt::format("gemm_f32_{}_tflops", n), 2.0 * double(n * n * n) / tg.gpu_s * 1e-12, "TFLOP/s");

    // A fused chain of 8 elementwise ops against a device-to-device copy of the same bytes.
    const std::int64_t m = small ? (std::int64_t(1) << 22) : (std::int64_t(1) << 28);
    ir::Graph ch("chain8");
    ch.add_output(chain8(ch, ch.param("x", ir::Shape{m})), "y");
    auto chain = prepare(*backend, ch);
    const double bytes = 8.0 * double(m);  // one f32 read and one written per element
    auto tc = time_runs(*chain.compiled.exe, chain.in, chain.out, 2, 10);
    const double copy = vk::copy_bandwidth_gbps(std::uint64_t(4 * m));
    report("chain8_kernels", double(chain.compiled.result->lir.kernels.size()), "kernels");
    report("chain8_gbps", bytes / tc.gpu_s * 1e-9, "GB/s");
    report("copy_d2d_gbps", copy, "GB/s");
    report("chain8_vs_copy", bytes / tc.gpu_s * 1e-9 / copy, "x");
    // The same chain three times in one run, a hand-written copy between (a kernel boundary): the later
    // chains run with the GPU already busy, as in a model, where a lone run starts from idle clocks.
    register_copy("bench_copy_4x256", 4, 256);
    {
      ir::Graph sq("chain8_x3");
      auto y = chain8(sq, sq.param("x", ir::Shape{m}));
      for (int r = 0; r < 2; ++r) y = chain8(sq, sq.custom_op("bench_copy_4x256", {}, {y}));
      sq.add_output(y, "y");
      auto seq = prepare(*backend, sq);
      time_runs(*seq.compiled.exe, seq.in, seq.out, 1, 3);
      for (const auto& kt : vk::last_run_times(*seq.compiled.exe))
        fmt::print("#   {:9.1f} us  {:7.0f} GB/s  {}\n", kt.micros, bytes / kt.micros * 1e-3, kt.kernel);
      double last = vk::last_run_times(*seq.compiled.exe).back().micros;
      report("chain8_busy_gbps", bytes / last * 1e-3, "GB/s");
    }
    for (auto [per, local] : {std::pair{1, 256}, {4, 256}, {1, 1024}}) {
      const std::string op = fmt::format("bench_copy_{}x{}", per, local);
      if (per != 4) register_copy(op, per, local);
      ir::Graph cg(op);
      cg.add_output(cg.custom_op(op, {}, {cg.input("x", ir::Shape{m})}), "y");
      auto cp = prepare(*backend, cg);
      auto tk = time_runs(*cp.compiled.exe, cp.in, cp.out, 1, 5);
      report(op + "_gbps", bytes / tk.gpu_s * 1e-9, "GB/s");
    }
    {  // A quarter of the bytes: does the copy's bandwidth depend on the footprint (TLB reach)?
      ir::Graph cg("copy_quarter");
      cg.add_output(cg.custom_op("bench_copy_4x256", {}, {cg.input("x", ir::Shape{m / 4})}), "y");
      auto cp = prepare(*backend, cg);
      auto tk = time_runs(*cp.compiled.exe, cp.in, cp.out, 1, 5);
      report("bench_copy_4x256_quarter_gbps", bytes / 4 / tk.gpu_s * 1e-9, "GB/s");
    }

    // ResNet's 3x3 conv at 256 channels, 14x14, batch 8 (the CPU benchmark's shape).
    {
      ir::Graph cv("conv2d");
      cv.add_output(cv.conv2d(cv.param("x", ir::Shape{8, 256, 14, 14}), cv.param("w", ir::Shape{256, 256, 3, 3}),
                              std::nullopt, {1, 1}, {1, 1}),
                    "y");
      auto conv = prepare(*backend, cv);
      auto tv = time_runs(*conv.compiled.exe, conv.in, conv.out, 2, 10);
      report("conv2d_8x256x14x14_k3_tflops", 2.0 * 8 * 256 * 196 * 256 * 9 / tv.gpu_s * 1e-12, "TFLOP/s");
    }

    // The encoder block: the default config and a larger one.
    for (auto [name, cfg] : {std::pair<const char*, models::EncoderConfig>{"encoder", {}},
                             {"encoder_large", {8, 512, 1024, 16, 4096, 1e-5}}}) {
      if (small && std::string(name) == "encoder_large") continue;
      auto enc = prepare(*backend, models::encoder_block(cfg));
      auto te = time_runs(*enc.compiled.exe, enc.in, enc.out, 3, 20);
      report(std::string(name) + "_wall_us", te.wall_s * 1e6, "us");
      report(std::string(name) + "_gpu_us", te.gpu_s * 1e6, "us");
      report(std::string(name) + "_kernels", double(enc.compiled.result->lir.kernels.size()), "kernels");
      report(std::string(name) + "_host_kernels", double(te.host_kernels), "kernels");
      print_kernels(*enc.compiled.exe);
    }
  } catch (const Error& e) {
    fmt::print(stderr, "vulkan_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
