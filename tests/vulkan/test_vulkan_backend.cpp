// The Vulkan backend around its kernels: device selection, staging and
// clones, the SPIR-V cache, calibration files, the raw kernel seam, errors
// and the dispatch tiers. Tests that need a device skip with the reason when
// there is none (no loader, no device, built without Vulkan).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "backends/vulkan/spirv.hpp"
#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

namespace fs = std::filesystem;
namespace vk = backends::vulkan;
using ir::DType;
using ir::Graph;
using ir::OpKind;
using ir::Shape;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no rlx::Error";
}

// ---- device selection (the rule alone: no device needed) ----------------------

std::vector<vk::DeviceInfo> fake_devices() {
  return {{0, "llvmpipe (LLVM 15.0.6, 256 bits)", "cpu", "1.3.230", true, ""},
          {1, "NVIDIA H200", "discrete", "1.3.289", true, ""},
          {2, "Old GPU", "integrated", "1.1.0", false, "lacks Vulkan 1.2"}};
}

TEST(VulkanDeviceSelection, PrefersADiscreteGpuOverCpuDevices) {
  auto d = fake_devices();
  EXPECT_EQ(vk::pick_device(d, ""), 1u);
  d.erase(d.begin() + 1);
  EXPECT_EQ(vk::pick_device(d, ""), 0u) << "lavapipe when it is the only usable device";
}

TEST(VulkanDeviceSelection, RequestByIndexOrNameSubstring) {
  auto d = fake_devices();
  EXPECT_EQ(vk::pick_device(d, "0"), 0u);
  EXPECT_EQ(vk::pick_device(d, "LLVMpipe"), 0u);
  EXPECT_EQ(vk::pick_device(d, "h200"), 1u);
}

TEST(VulkanDeviceSelection, BadRequestsNameTheRequestAndTheDevices) {
  auto d = fake_devices();
  auto msg = error_of([&] { vk::pick_device(d, "radeon"); });
  EXPECT_NE(msg.find("RLX_VULKAN_DEVICE='radeon'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NVIDIA H200"), std::string::npos) << msg;
  msg = error_of([&] { vk::pick_device(d, "2"); });
  EXPECT_NE(msg.find("lacks Vulkan 1.2"), std::string::npos) << msg;
  msg = error_of([&] { vk::pick_device({}, ""); });
  EXPECT_NE(msg.find("no Vulkan device"), std::string::npos) << msg;
}

// ---- with a device --------------------------------------------------------------

class Vulkan : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = vk::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

// Runs `exe` of `g` on fresh inputs and compares with the reference.
void check_run(runtime::ExecutableGraph& exe, const compile::LirModule& lir, const Graph& g,
               const reference::TensorMap& params, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  reference::TensorMap inputs;
  std::vector<const void*> in;
  for (auto id : lir.inputs) {
    auto& t = inputs[lir.buffer(id).name] = testing::random_tensor(lir.buffer(id).dtype, lir.buffer(id).shape, rng);
    in.push_back(t.data());
  }
  auto want = reference::run(g, inputs, params);
  std::vector<ir::Tensor> got;
  std::vector<void*> out;
  for (std::size_t j = 0; j < lir.outputs.size(); ++j) {
    got.emplace_back(want[j].dtype(), want[j].shape());
    out.push_back(got.back().data());
  }
  exe.run(in, out);
  for (std::size_t j = 0; j < got.size(); ++j) EXPECT_TRUE(testing::tensors_close(got[j], want[j])) << "output " << j;
}

TEST_F(Vulkan, EnvironmentSelectsTheDevice) {
  auto dev = vk::selected_device();
  {
    env::ScopedOverride by_index("RLX_VULKAN_DEVICE", std::to_string(dev.index));
    EXPECT_EQ(vk::selected_device().name, dev.name);
    EXPECT_EQ(vk::make_vulkan_backend()->device_name(), dev.name);
  }
  env::ScopedOverride bogus("RLX_VULKAN_DEVICE", "no-such-device-anywhere");
  auto why = vk::unavailable_reason();
  EXPECT_NE(why.find("RLX_VULKAN_DEVICE='no-such-device-anywhere'"), std::string::npos) << why;
  auto msg = error_of([] { runtime::make_backend(runtime::Device::Vulkan); });
  EXPECT_NE(msg.find("unavailable"), std::string::npos) << msg;
}

TEST_F(Vulkan, ClonesShareParamsAndRunConcurrently) {
  Graph g;
  auto x = g.input("x", Shape{64, 33});
  auto w = g.param("w", Shape{33, 17});
  g.add_output(g.unary(OpKind::Tanh, g.matmul(x, w)), "y");
  auto c = vk::make_vulkan_backend()->compile(g);
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap params{{"w", testing::random_tensor(DType::F32, {33, 17}, rng)}};
  c.exe->set_param(0, params["w"].data(), params["w"].nbytes());
  auto clone = c.exe->clone();
  // A new value set through the original is what the clone sees: the weights are shared.
  params["w"] = testing::random_tensor(DType::F32, {33, 17}, rng);
  c.exe->set_param(0, params["w"].data(), params["w"].nbytes());
  std::thread a([&] {
    for (int r = 0; r < 5; ++r) check_run(*c.exe, c.result->lir, g, params, testing::test_seed() + std::uint64_t(r));
  });
  std::thread b([&] {
    for (int r = 0; r < 5; ++r)
      check_run(*clone, c.result->lir, g, params, testing::test_seed() + 100 + std::uint64_t(r));
  });
  a.join();
  b.join();
  EXPECT_TRUE(c.exe->capabilities().clone);
  auto msg = error_of([&] { c.exe->set_param(0, params["w"].data(), 8); });
  EXPECT_NE(msg.find("expects"), std::string::npos) << msg;
}

TEST_F(Vulkan, InputsPassThroughAndRepeatedRunsLeaveNoState) {
  Graph g;
  auto x = g.input("x", Shape{3, 5}, DType::I64);
  auto f = g.input("f", Shape{7});
  g.add_output(x);  // an input read straight back
  g.add_output(g.add(x, x));
  g.add_output(g.reshape(f, std::vector<std::int64_t>{7, 1}));
  auto c = vk::make_vulkan_backend()->compile(g);
  for (int r = 0; r < 3; ++r) check_run(*c.exe, c.result->lir, g, {}, testing::test_seed() + std::uint64_t(r));
}

// Handles: a state kept in the arena between runs (bound, fed from an output each run), read back on the device's
// values; an identity output fed into its own input; a handle kept while other inputs change; a clone's handles
// its own. Then the errors, each naming the method and the input or output.
TEST_F(Vulkan, HandlesKeepStateOnTheDeviceAndFeedOutputsBack) {
  Graph g("state");
  auto state = g.input("state", Shape{4, 8});
  auto x = g.input("x", Shape{4, 8});
  g.add_output(g.add(g.mul(state, g.scalar(0.5)), x), "next");
  g.add_output(g.sum(state, {1}), "seen");
  g.add_output(state, "same");
  runtime::Session session(runtime::Device::Vulkan);
  auto c = session.compile(g);
  ASSERT_TRUE(c.capabilities().persistent_handles && c.capabilities().kv_resident);
  std::mt19937_64 rng(testing::test_seed());
  ir::Tensor want = testing::random_tensor(DType::F32, {4, 8}, rng);
  c.bind_handle("state", ir::view(want));
  auto other = c.clone();  // its own arena: not bound, so it needs the state as an input
  c.feed_handle("state", "next");
  for (int r = 0; r < 4; ++r) {
    const ir::Tensor xt = testing::random_tensor(DType::F32, {4, 8}, rng);
    const auto ref = reference::run(g, {{"state", want}, {"x", xt}}, {});
    const auto got = c.run(std::vector<runtime::NamedTensor>{{"x", ir::view(xt)}});
    EXPECT_TRUE(testing::tensors_close(got[1], ref[1])) << "run " << r;  // what the kernels saw of the handle
    EXPECT_TRUE(testing::tensors_close(got[2], ref[2])) << "run " << r;
    want = ref[0];
    EXPECT_TRUE(testing::tensors_close(c.read_handle("state"), want)) << "run " << r;
  }
  // The identity output fed back to its own input is no copy at all, and the state stays.
  c.feed_handle("state", "same");
  const ir::Tensor xt = testing::random_tensor(DType::F32, {4, 8}, rng);
  c.run(std::vector<runtime::NamedTensor>{{"x", ir::view(xt)}});
  EXPECT_TRUE(testing::tensors_close(c.read_handle("state"), want));
  testing::expect_error([&] { other.read_handle("state"); }, {"read_handle", "no handle"});
  testing::expect_error([&] { other.run(std::vector<runtime::NamedTensor>{{"x", ir::view(xt)}}); }, {"state"});
  testing::expect_error([&] { c.feed_handle("state", "seen"); }, {"feed_handle"});
  testing::expect_error([&] { other.feed_handle("state", "next"); }, {"feed_handle", "bind_handle"});
}

// commit_no_wait returns with the last segment submitted; every other call refuses, naming the method, until
// sync_pending, which returns the run's outputs.
TEST_F(Vulkan, CommitNoWaitRefusesOtherCallsUntilSyncPending) {
  Graph g("async");
  auto x = g.input("x", Shape{16, 32});
  g.add_output(g.matmul(x, g.param("w", Shape{32, 8})), "y");
  runtime::Session session(runtime::Device::Vulkan);
  auto c = session.compile(g);
  std::mt19937_64 rng(testing::test_seed());
  const reference::TensorMap params{{"w", testing::random_tensor(DType::F32, {32, 8}, rng)}};
  const reference::TensorMap in{{"x", testing::random_tensor(DType::F32, {16, 32}, rng)}};
  c.set_param("w", params.at("w"));
  const std::vector<runtime::NamedTensor> named{{"x", ir::view(in.at("x"))}};
  EXPECT_TRUE(c.sync_pending().empty());
  c.commit_no_wait(named);
  testing::expect_error([&] { c.run(named); }, {"pending", "sync_pending"});
  testing::expect_error([&] { c.set_param("w", params.at("w")); }, {"set_param", "pending"});
  testing::expect_error([&] { c.commit_no_wait(named); }, {"commit_no_wait", "pending"});
  testing::expect_error([&] { (void)c.kernel_times(); }, {"kernel_times", "pending"});
  const auto got = c.sync_pending();
  const auto want = reference::run(g, in, params);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(testing::tensors_close(got[0], want[0]));
  EXPECT_TRUE(testing::tensors_close(c.run(named)[0], want[0]));  // idle again
}

class TempCache {
 public:
  TempCache()
      : dir_(fs::temp_directory_path() /
             ("rlx-vk-test-" + std::to_string(testing::test_seed()) + "-" + std::to_string(::getpid()))),
        over_("RLX_CACHE_DIR", dir_.string()) {}
  ~TempCache() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  env::ScopedOverride over_;
};

TEST_F(Vulkan, SpirvCacheHitsMemoryThenDiskAndNeverTrustsACorruptFile) {
  TempCache cache;
  Graph g;
  // A constant no other test uses makes this shader new to every cache.
  double unique = 1.0 + double(testing::test_seed() % 100000) / 1e6;
  g.add_output(g.mul(g.input("x", Shape{9}), g.scalar(unique)));
  auto before = vk::spirv_cache_stats();
  vk::make_vulkan_backend()->compile(g);
  auto after = vk::spirv_cache_stats();
  EXPECT_EQ(after.compiled, before.compiled + 1);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(vk::spirv_cache_dir())) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u) << "one .spv per shader under " << vk::spirv_cache_dir();
  EXPECT_EQ(files[0].extension(), ".spv");

  vk::make_vulkan_backend()->compile(g);
  EXPECT_EQ(vk::spirv_cache_stats().memory_hits, after.memory_hits + 1);

  vk::forget_compiled_shaders();  // as a new process would start
  before = vk::spirv_cache_stats();
  vk::make_vulkan_backend()->compile(g);
  EXPECT_EQ(vk::spirv_cache_stats().disk_hits, before.disk_hits + 1);

  std::ofstream(files[0], std::ios::trunc) << "not spir-v";
  vk::forget_compiled_shaders();
  before = vk::spirv_cache_stats();
  auto c = vk::make_vulkan_backend()->compile(g);
  EXPECT_EQ(vk::spirv_cache_stats().compiled, before.compiled + 1) << "a corrupt file is compiled again";
  check_run(*c.exe, c.result->lir, g, {}, testing::test_seed());
}

TEST_F(Vulkan, CalibrationIsMeasuredOnceThenReadUntilTheFileGoesBad) {
  TempCache cache;
  auto first = vk::calibrate();
  auto path = fs::path(vk::calibration_path());
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_EQ(path.parent_path(), cache.dir());
  EXPECT_EQ(path.filename().string().rfind("vulkan-calib-", 0), 0u) << path;
  EXPECT_GT(first.sgemm_gflops, 0);
  EXPECT_GT(first.roundtrip_overhead_ns, 0);
  EXPECT_GT(first.memory_bw_gbps, 0);
  EXPECT_EQ(first.device, vk::selected_device().name);
  EXPECT_NE(first.source.find("measured"), std::string::npos) << first.source;

  auto again = vk::calibrate();
  EXPECT_NE(again.source.find("cache"), std::string::npos) << again.source;
  EXPECT_EQ(again.measured_at, first.measured_at);
  EXPECT_EQ(again.sgemm_gflops, first.sgemm_gflops);

  // The cost model's reader sees the same file.
  auto rt = runtime::load_calibration(path);
  ASSERT_TRUE(rt.has_value());
  EXPECT_EQ(rt->sgemm_gflops, first.sgemm_gflops);

  std::ofstream(path, std::ios::trunc) << "{ corrupt";
  auto remeasured = vk::calibrate();
  EXPECT_NE(remeasured.source.find("corrupt"), std::string::npos) << remeasured.source;
  fs::remove(path);
  remeasured = vk::calibrate();
  EXPECT_NE(remeasured.source.find("measured"), std::string::npos) << remeasured.source;
  EXPECT_TRUE(fs::exists(path));
}

// A custom op whose only device implementation is a raw GLSL kernel.
class Twice final : public ir::OpExtension {
 public:
  std::string_view name() const override { return "vk_test_twice"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs&,
                                      const ir::TypeInfo&) const override {
    ir::Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, 2 * in[0].get(i));
    return out;
  }
};

const char* kTwiceGlsl = R"(#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Arena { float arena[]; };
layout(std430, binding = 1) readonly buffer Offsets { uint off[]; };
layout(push_constant) uniform Push { uint n; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < n) arena[off[1] + i] = 2.0 * arena[off[0] + i];
}
)";

TEST_F(Vulkan, RawKernelSeamRunsAgainstTheArena) {
  static const bool registered = [] {
    ir::register_op(std::make_shared<Twice>());
    runtime::register_vulkan_kernel("vk_test_twice", {.glsl = kTwiceGlsl, .local_size = {64, 1, 1}});
    return true;
  }();
  (void)registered;
  Graph g;
  auto x = g.input("x", Shape{5, 41});
  auto w = g.param("w", Shape{41});
  // Operands from the arena (x + 1) and from the weights (w), results feeding other kernels.
  g.add_output(g.mul(g.custom_op("vk_test_twice", {}, {g.add(x, g.scalar(1))}), g.scalar(3)));
  g.add_output(g.add(g.custom_op("vk_test_twice", {}, {w}), x));
  auto c = vk::make_vulkan_backend()->compile(g);
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap params{{"w", testing::random_tensor(DType::F32, {41}, rng)}};
  c.exe->set_param(0, params["w"].data(), params["w"].nbytes());
  check_run(*c.exe, c.result->lir, g, params, testing::test_seed());
  for (const auto& k : vk::last_run_times(*c.exe)) EXPECT_FALSE(k.host) << k.kernel;
  EXPECT_EQ(runtime::custom_op_route("vk_test_twice", runtime::Device::Vulkan), runtime::CustomRoute::RawGpuKernel);
}

TEST_F(Vulkan, ShaderCompileErrorsNameTheKernelAndQuoteShaderc) {
  static const bool registered = [] {
    struct Broken final : public ir::OpExtension {
      std::string_view name() const override { return "vk_test_broken"; }
      int num_inputs() const override { return 1; }
      ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
    };
    ir::register_op(std::make_shared<Broken>());
    runtime::register_vulkan_kernel("vk_test_broken",
                                    {.glsl = "#version 450\nvoid main() { undeclared_thing = 1; }\n"});
    return true;
  }();
  (void)registered;
  Graph g;
  g.add_output(g.custom_op("vk_test_broken", {}, {g.input("x", Shape{4})}));
  auto msg = error_of([&] { Session(runtime::Device::Vulkan).compile(g); });
  EXPECT_NE(msg.find("vk_test_broken"), std::string::npos) << msg;
  EXPECT_NE(msg.find("failed to compile"), std::string::npos) << msg;
  EXPECT_NE(msg.find("undeclared_thing"), std::string::npos) << msg;
}

TEST_F(Vulkan, OversizedArenaIsAnErrorNamingItsSize) {
  Graph g;
  auto x = g.param("x", Shape{1 << 20, 1 << 16});  // 256 GiB of f32
  g.add_output(g.exp(x));
  auto msg = error_of([&] { Session(runtime::Device::Vulkan).compile(g); });
  EXPECT_NE(msg.find("262144.0 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("arena"), std::string::npos) << msg;
}

TEST_F(Vulkan, IndexOutOfRangeAtRunTimeIsAnError) {
  Graph g;
  auto x = g.input("x", Shape{5, 3});
  auto idx = g.input("i", Shape{4}, DType::I32);
  g.add_output(g.index_select(x, idx, 0));
  auto exe = Session(runtime::Device::Vulkan).compile(g);
  ir::Tensor xv(DType::F32, {5, 3}), iv(DType::I32, {4});
  iv.set(2, 7);
  auto msg = error_of([&] { exe.run({{"x", xv}, {"i", iv}}); });
  EXPECT_NE(msg.find("index 7 out of range for extent 5 on axis 0"), std::string::npos) << msg;
  iv.set(2, -1);  // wraps once, Python-style
  EXPECT_NO_THROW(exe.run({{"x", xv}, {"i", iv}}));
  Graph g64;
  g64.add_output(g64.gather(g64.input("x", Shape{5, 3}), g64.input("i", Shape{2, 3}, DType::I64), 0));
  auto exe64 = Session(runtime::Device::Vulkan).compile(g64);
  ir::Tensor i64(DType::I64, {2, 3});
  i64.set(4, -5);
  EXPECT_NO_THROW(exe64.run({{"x", xv}, {"i", i64}}));
  i64.set(4, -6);
  msg = error_of([&] { exe64.run({{"x", xv}, {"i", i64}}); });
  EXPECT_NE(msg.find("index -6 out of range for extent 5 on axis 0"), std::string::npos) << msg;
}

TEST_F(Vulkan, DispatchReportNamesEachTier) {
  rlx::testing::register_test_ops();
  Graph body;
  auto c0 = body.input("c0", Shape{4});
  body.add_output(body.mul(c0, body.scalar(2)));
  Graph cond;
  auto k0 = cond.input("c0", Shape{4});
  cond.add_output(cond.binary(OpKind::Lt, cond.sum(k0, {0}), cond.scalar(100)));
  Graph g;
  auto x = g.input("x", Shape{4});
  auto loop = ir::while_loop(g, ir::body_ref(std::move(cond)), ir::body_ref(std::move(body)), {g.exp(x)});
  auto h = g.custom_op("test_host_cube", {}, {g.add(loop[0], x)});
  g.add_output(g.softmax(g.linear(g.reshape(h, std::vector<std::int64_t>{1, 4}), g.param("w", Shape{4, 4})), -1));
  auto c = vk::make_vulkan_backend()->compile(g);
  std::map<OpKind, compile::DispatchTier> tier;
  for (const auto& e : c.result->dispatch.entries) tier[e.op] = e.tier;
  using T = compile::DispatchTier;
  EXPECT_EQ(tier.at(OpKind::Exp), T::Native);
  EXPECT_EQ(tier.at(OpKind::Softmax), T::Native);
  EXPECT_EQ(tier.at(OpKind::Linear), T::Decomposed);
  EXPECT_EQ(tier.at(OpKind::While), T::HostFallback);
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap params{{"w", testing::random_tensor(DType::F32, {4, 4}, rng, -0.1, 0.1)}};
  c.exe->set_param(0, params["w"].data(), params["w"].nbytes());
  check_run(*c.exe, c.result->lir, g, params, testing::test_seed());
  // The loop and the custom op's host kernel ran on the host, everything else on the device.
  std::size_t host = 0;
  for (const auto& k : vk::last_run_times(*c.exe)) host += k.host;
  EXPECT_EQ(host, 2u) << c.result->dispatch.to_text();
}

}  // namespace
}  // namespace rlx
