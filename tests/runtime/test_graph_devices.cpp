// Device selection and GraphDevices / FlexibleSession, on the CPU plus test
// twins (the CPU backend under other Device values, some failing, some slow)
// and on Vulkan where it is available. Estimates come from calibration files
// the tests write, so picks are deterministic; the one timing-driven pick
// (benchmark) compares a 25 ms sleep against a sub-millisecond run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rlx/reference/interpreter.hpp"
#include "runtime/test_backends.hpp"
#include "support/testing.hpp"

using namespace rlx;
using runtime::Device;
using runtime::DevicePolicy;
using runtime::GraphDevices;

namespace {

ir::Graph model() {
  ir::Graph g("tiny");
  auto x = g.input("x", {4, 8});
  auto h = g.relu(g.add(g.matmul(x, g.param("w", {8, 8})), g.param("b", {8})));
  g.add_output(g.unary(ir::OpKind::Sin, h), "y");
  return g;
}

struct Data {
  reference::TensorMap inputs, params;
  std::vector<runtime::NamedTensor> named;
  explicit Data(std::uint64_t salt = 0) {
    std::mt19937_64 rng(rlx::testing::test_seed() + salt);
    inputs["x"] = rlx::testing::random_tensor(ir::DType::F32, {4, 8}, rng);
    params["w"] = rlx::testing::random_tensor(ir::DType::F32, {8, 8}, rng);
    params["b"] = rlx::testing::random_tensor(ir::DType::F32, {8}, rng);
    for (const auto& [k, v] : inputs) named.push_back({k, ir::view(v)});
  }
  ir::Tensor want(const ir::Graph& g) const { return reference::run(g, inputs, params)[0]; }
};

using rlx::testing::expect_error;

class Selection : public rlx::testing::MultiBackendTest {
 protected:
  void set_params(GraphDevices& r, const Data& d) {
    for (const auto& [k, v] : d.params) r.set_param(k, v);
  }
};

TEST_F(Selection, IntrospectionListsWhatRunsHere) {
  twin(Device::Gpu);
  twin(Device::Cuda, {.name = "nosin", .unsupported = {ir::OpKind::Sin}});
  auto avail = runtime::available_devices();
  for (auto d : {Device::Cpu, Device::Gpu, Device::Cuda})
    EXPECT_NE(std::find(avail.begin(), avail.end(), d), avail.end()) << runtime::device_label(d);
  EXPECT_EQ(std::find(avail.begin(), avail.end(), Device::Metal), avail.end());
  auto for_graph = runtime::devices_for(model());
  EXPECT_NE(std::find(for_graph.begin(), for_graph.end(), Device::Gpu), for_graph.end());
  EXPECT_EQ(std::find(for_graph.begin(), for_graph.end(), Device::Cuda), for_graph.end());  // no sin

  auto m = runtime::BackendsManifest::current();
  ASSERT_EQ(m.backends.size(), std::size(runtime::kAllDevices));
  EXPECT_TRUE(m.backends[0].available);
  EXPECT_EQ(m.backends[0].backend, "cpu");
  const auto& metal = m.backends[std::size_t(Device::Metal)];
  EXPECT_FALSE(metal.available);
  EXPECT_NE(metal.reason.find("no backend"), std::string::npos) << metal.reason;
  auto j = nlohmann::json::parse(m.to_json());
  EXPECT_EQ(j["backends"][0]["device"], "cpu");
  EXPECT_EQ(j["backends"][std::size_t(Device::Gpu)]["backend"], "twin-gpu");
  EXPECT_NE(m.to_text().find("twin-gpu"), std::string::npos);
  for (auto d : runtime::kAllDevices) EXPECT_TRUE(runtime::advisory_capabilities(d).clone);
}

TEST_F(Selection, ReportNamesBlockersEstimatesAndThePick) {
  twin(Device::Gpu);
  twin(Device::Cuda, {.name = "nosin", .unsupported = {ir::OpKind::Sin}});
  twin(Device::Rocm);
  calibrate(Device::Cpu, 10);
  calibrate(Device::Gpu, 1000, 100, 100);
  auto policy = DevicePolicy::only({Device::Cpu, Device::Gpu, Device::Cuda, Device::Metal}).with_deny({Device::Cuda});
  auto r = runtime::device_report(model(), policy);
  ASSERT_EQ(r.recommended, Device::Gpu) << r.to_text();
  ASSERT_EQ(r.candidates.size(), std::size(runtime::kAllDevices));
  const auto& best = r.candidates[0];
  EXPECT_EQ(best.label, "gpu");
  EXPECT_TRUE(best.recommended);
  EXPECT_NE(best.why.find("lowest estimate"), std::string::npos) << best.why;
  ASSERT_TRUE(best.estimate);
  EXPECT_NE(best.estimate->explain.find("FLOP"), std::string::npos);
  EXPECT_NE(best.calibration_source.find("cache"), std::string::npos) << best.calibration_source;
  EXPECT_FALSE(best.capabilities.empty());
  EXPECT_EQ(r.candidates[1].device, Device::Cpu);
  EXPECT_NE(r.candidates[1].why.find("rank 2"), std::string::npos) << r.candidates[1].why;
  auto find = [&](Device d) {
    return *std::find_if(r.candidates.begin(), r.candidates.end(), [&](const auto& c) { return c.device == d; });
  };
  auto cuda = find(Device::Cuda);
  EXPECT_FALSE(cuda.viable());
  EXPECT_NE(cuda.why.find("blocked"), std::string::npos) << cuda.why;
  ASSERT_FALSE(cuda.blockers.empty());
  EXPECT_NE(cuda.blockers[0].find("sin"), std::string::npos) << cuda.blockers[0];
  EXPECT_NE(find(Device::Metal).why.find("unavailable"), std::string::npos);
  EXPECT_NE(find(Device::Rocm).why.find("not in the policy's allow-list"), std::string::npos) << find(Device::Rocm).why;
  auto text = r.to_text();
  for (auto part : {"recommended: gpu", "blocked", "unavailable", "estimate:", "capabilities (advisory)"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

TEST_F(Selection, TiesGoToThePreferListThenTheCpu) {
  twin(Device::Gpu);
  calibrate(Device::Cpu, 100);
  calibrate(Device::Gpu, 105);  // within 10%: a tie
  auto policy = DevicePolicy::only({Device::Cpu, Device::Gpu});
  EXPECT_EQ(runtime::fastest_device_for(model(), policy), Device::Cpu);
  auto r = runtime::device_report(model(), policy.with_prefer({Device::Gpu}));
  EXPECT_EQ(r.recommended, Device::Gpu);
  EXPECT_NE(r.why.find("prefer list"), std::string::npos) << r.why;
  calibrate(Device::Gpu, 1000, 100, 100);  // no longer a tie: the estimate wins over the prefer list
  EXPECT_EQ(runtime::fastest_device_for(model(), policy.with_prefer({Device::Cpu})), Device::Gpu);
}

TEST_F(Selection, ResolveOrderAndClearErrors) {
  twin(Device::Gpu);
  twin(Device::Cuda, {.name = "nosin", .unsupported = {ir::OpKind::Sin}});
  calibrate(Device::Cpu, 10);
  calibrate(Device::Gpu, 1000, 100, 100);
  auto g = model();
  auto policy = DevicePolicy::only({Device::Cpu, Device::Gpu, Device::Cuda});
  EXPECT_EQ(runtime::resolve_device(g, std::nullopt, policy), Device::Gpu);  // cost model
  EXPECT_EQ(runtime::resolve_device(g, Device::Cpu, policy), Device::Cpu);   // hint
  {
    env::ScopedOverride env_hint("RLX_DEVICE", "cpu");
    EXPECT_EQ(runtime::resolve_device(g, std::nullopt, policy), Device::Cpu);
    EXPECT_EQ(runtime::resolve_device(g, std::nullopt, policy.with_default_device(Device::Gpu)), Device::Gpu);
    EXPECT_EQ(runtime::resolve_device(g, Device::Gpu, policy), Device::Gpu);  // the hint wins over RLX_DEVICE
  }
  {
    env::ScopedOverride bad("RLX_DEVICE", "fpga");
    expect_error([&] { runtime::resolve_device(g, std::nullopt, policy); }, {"RLX_DEVICE", "'fpga'"});
  }
  expect_error([&] { runtime::resolve_device(g, Device::Metal, policy); }, {"hint", "metal", "allow-list"});
  expect_error([&] { runtime::resolve_device(g, Device::Cuda, policy); }, {"cuda", "sin"});
  expect_error([&] { runtime::resolve_device(g, Device::Metal, DevicePolicy::all()); }, {"metal", "unavailable"});
  expect_error([&] { runtime::fastest_device_for(g, DevicePolicy::only({Device::Cuda})); },
               {"no device can run graph 'tiny'", "sin"});
}

TEST_F(Selection, ParamsAreMirroredToEveryDeviceAndResultsAgree) {
  twin(Device::Gpu);
  twin(Device::Tpu, {.name = "bare", .forward_optional = false});  // no typed_io: converted on the host
  calibrate(Device::Cpu, 100);
  calibrate(Device::Gpu, 100);
  calibrate(Device::Tpu, 100);
  std::vector<Device> devices{Device::Cpu, Device::Gpu, Device::Tpu};
  if (runtime::is_available(Device::Vulkan)) devices.push_back(Device::Vulkan);
  auto g = model();
  GraphDevices r = GraphDevices::with_policy(g, DevicePolicy::only(devices));
  Data d;
  set_params(r, d);  // before any compile: applied as each device compiles
  r.compile(Device::Cpu);
  for (auto dev : devices)
    EXPECT_TRUE(rlx::testing::tensors_close(r.run(dev, d.named)[0], d.want(g))) << runtime::device_label(dev);

  // After compiles: mirrored to all of them, including f64 values through set_param_typed.
  Data d2(7);
  r.set_param("b", d2.params.at("b"));
  ir::Tensor w64(ir::DType::F64, {8, 8});
  for (std::int64_t i = 0; i < w64.numel(); ++i) w64.set(i, d2.params.at("w").get(i));
  r.set_param_typed("w", w64);
  d2.inputs = d.inputs;
  for (auto dev : devices)
    EXPECT_TRUE(rlx::testing::tensors_close(r.run(dev, d.named)[0], d2.want(g))) << runtime::device_label(dev);
  EXPECT_EQ(r.cached_devices().size(), devices.size());

  // A change made behind the mirror's back is undone by sync_params_to_all.
  r.compile(Device::Gpu).set_param("b", d.params.at("b"));
  EXPECT_FALSE(rlx::testing::tensors_close(r.run(Device::Gpu, d.named)[0], d2.want(g)));
  r.sync_params_to_all();
  EXPECT_TRUE(rlx::testing::tensors_close(r.run(Device::Gpu, d.named)[0], d2.want(g)));

  expect_error([&] { r.set_param("w", ir::Tensor(ir::DType::F64, {8, 8})); }, {"'w'", "f32", "set_param_typed"});
  expect_error([&] { r.set_param("w", ir::Tensor(ir::DType::F32, {8, 9})); }, {"'w'", "[8,8]"});
  expect_error([&] { r.set_param("nope", d.params.at("b")); }, {"nope"});
  expect_error([&] { r.run(Device::Rocm, d.named); }, {"rocm", "allow-list"});
  r.invalidate_cache();
  EXPECT_TRUE(r.cached_devices().empty());
  EXPECT_TRUE(rlx::testing::tensors_close(r.run(Device::Cpu, d.named)[0], d2.want(g)));  // params survive
}

TEST_F(Selection, RunResolvedFollowsHintEnvAndCostModel) {
  twin(Device::Gpu);
  calibrate(Device::Cpu, 10);
  calibrate(Device::Gpu, 1000, 100, 100);
  auto g = model();
  GraphDevices r(g, DevicePolicy::only({Device::Cpu, Device::Gpu}));
  Data d;
  set_params(r, d);
  EXPECT_EQ(r.fastest(), Device::Gpu);
  EXPECT_EQ(r.resolve(), Device::Gpu);
  EXPECT_EQ(r.resolve(Device::Cpu), Device::Cpu);
  EXPECT_EQ(r.devices(), (std::vector<Device>{Device::Gpu, Device::Cpu}));
  EXPECT_EQ(r.report().recommended, Device::Gpu);
  EXPECT_TRUE(rlx::testing::tensors_close(r.run_resolved_with_inputs(std::nullopt, d.named)[0], d.want(g)));
  EXPECT_EQ(r.cached_devices(), std::vector<Device>{Device::Gpu});
  env::ScopedOverride env_hint("RLX_DEVICE", "cpu");
  EXPECT_TRUE(rlx::testing::tensors_close(r.run_resolved_with_inputs(std::nullopt, d.named)[0], d.want(g)));
  EXPECT_EQ(r.cached_devices(), (std::vector<Device>{Device::Cpu, Device::Gpu}));
}

TEST_F(Selection, RunChainFallsBackPastFailingBackends) {
  twin(Device::Cuda, {.name = "broken-compile", .fail_compile = true});
  auto run_fails = twin(Device::Rocm, {.name = "broken-run", .fail_run = true});
  auto g = model();
  GraphDevices r(g);
  Data d;
  set_params(r, d);
  auto [device, out] = r.run_chain(std::vector{Device::Cuda, Device::Rocm, Device::Metal, Device::Cpu}, d.named);
  EXPECT_EQ(device, Device::Cpu);
  EXPECT_TRUE(rlx::testing::tensors_close(out[0], d.want(g)));
  ASSERT_EQ(r.failures().size(), 3u);
  EXPECT_NE(r.failures()[0].second.find("injected compile failure"), std::string::npos) << r.failures()[0].second;
  EXPECT_NE(r.failures()[1].second.find("injected run failure"), std::string::npos) << r.failures()[1].second;
  EXPECT_NE(r.failures()[2].second.find("unavailable"), std::string::npos) << r.failures()[2].second;
  EXPECT_EQ(*run_fails.runs, 0);

  // The chain from the policy, then from RLX_DEVICE_CHAIN.
  GraphDevices p(g, DevicePolicy::all().with_chain({Device::Rocm, Device::Cpu}));
  set_params(p, d);
  EXPECT_EQ(p.run_chain(std::nullopt, d.named).first, Device::Cpu);
  {
    env::ScopedOverride chain("RLX_DEVICE_CHAIN", "cuda,cpu");
    EXPECT_EQ(r.run_chain(std::nullopt, d.named).first, Device::Cpu);
    EXPECT_EQ(r.failures().size(), 1u);
  }
  expect_error(
      [&] {
        r.run_chain(std::vector{Device::Cuda, Device::Rocm}, d.named);
      },
      {"no device ran graph 'tiny'", "cuda: ", "injected compile failure", "rocm: ", "injected run failure"});
}

TEST_F(Selection, RunTryKeepsTheGivenOrder) {
  auto gpu = twin(Device::Gpu);
  auto metal = twin(Device::Metal);
  auto g = model();
  GraphDevices r(g, DevicePolicy::all().with_deny({Device::Cpu}));
  Data d;
  set_params(r, d);
  EXPECT_EQ(r.run_try(std::vector{Device::Metal, Device::Gpu}, d.named).first, Device::Metal);
  EXPECT_EQ(*metal.runs, 1);
  EXPECT_EQ(*gpu.runs, 0);
  EXPECT_EQ(r.run_try(std::vector{Device::Gpu, Device::Metal}, d.named).first, Device::Gpu);
  EXPECT_EQ(*gpu.runs, 1);
  EXPECT_EQ(*metal.runs, 1);
  // A device the policy denies is passed over, with the reason recorded.
  EXPECT_EQ(r.run_try(std::vector{Device::Cpu, Device::Metal}, d.named).first, Device::Metal);
  ASSERT_EQ(r.failures().size(), 1u);
  EXPECT_NE(r.failures()[0].second.find("denied"), std::string::npos) << r.failures()[0].second;
}

TEST_F(Selection, BenchmarkPickChoosesTheDeviceMeasuredFaster) {
  for (bool gpu_slow : {true, false}) {
    SCOPED_TRACE(gpu_slow ? "gpu slow" : "metal slow");
    auto slow = std::chrono::milliseconds(25);
    twin(Device::Gpu, {.name = "twin-gpu", .delay = gpu_slow ? slow : std::chrono::milliseconds(0)});
    twin(Device::Metal, {.name = "twin-metal", .delay = gpu_slow ? std::chrono::milliseconds(0) : slow});
    // The cost model would pick the slow one: only the measurement can get this right.
    calibrate(gpu_slow ? Device::Gpu : Device::Metal, 1000, 100, 100);
    calibrate(gpu_slow ? Device::Metal : Device::Gpu, 1);
    auto g = model();
    auto policy = DevicePolicy::only({Device::Gpu, Device::Metal});
    const Device fast = gpu_slow ? Device::Metal : Device::Gpu;
    EXPECT_NE(runtime::fastest_device_for(g, policy), fast);

    GraphDevices r(g, policy.with_benchmark_pick(2));
    Data d;
    set_params(r, d);
    EXPECT_TRUE(rlx::testing::tensors_close(r.run_resolved_with_inputs(std::nullopt, d.named)[0], d.want(g)));
    EXPECT_EQ(r.benchmark_winner(), fast);
    EXPECT_EQ(r.resolve(), fast);

    auto results = r.benchmark(d.named, 2);
    ASSERT_EQ(results.size(), 2u);
    for (const auto& b : results) {
      EXPECT_TRUE(b.ok) << b.error;
      EXPECT_EQ(b.runs, 2);
      EXPECT_LE(b.min_ms, b.median_ms);
    }
    // Without the benchmark strategy the measured winner is not used.
    GraphDevices c(g, policy);
    set_params(c, d);
    c.benchmark(d.named, 1);
    EXPECT_NE(c.resolve(), fast);
  }
}

TEST_F(Selection, WarmAllCompilesEveryViableDevice) {
  twin(Device::Gpu);
  twin(Device::Cuda, {.name = "broken-compile", .fail_compile = true});
  calibrate(Device::Cpu, 10);
  calibrate(Device::Gpu, 10);
  calibrate(Device::Cuda, 10);
  GraphDevices r(model(), DevicePolicy::only({Device::Cpu, Device::Gpu, Device::Cuda}));
  auto warmed = r.warm_all();
  EXPECT_EQ(warmed, (std::vector<Device>{Device::Cpu, Device::Gpu}));
  EXPECT_EQ(r.cached_devices(), (std::vector<Device>{Device::Cpu, Device::Gpu}));
  ASSERT_EQ(r.failures().size(), 1u);
  EXPECT_EQ(r.failures()[0].first, Device::Cuda);
}

TEST_F(Selection, FlexibleSessionCompilesOnTheResolvedDevice) {
  twin(Device::Gpu);
  calibrate(Device::Cpu, 10);
  calibrate(Device::Gpu, 1000, 100, 100);
  auto g = model();
  runtime::FlexibleSession s(DevicePolicy::only({Device::Cpu, Device::Gpu}));
  EXPECT_EQ(s.compile_resolved(g).device(), Device::Gpu);
  EXPECT_EQ(s.compile_resolved(g, Device::Cpu).device(), Device::Cpu);
  auto c = s.compile_on(g, Device::Cpu);
  Data d;
  for (const auto& [k, v] : d.params) c.set_param(k, v);
  EXPECT_TRUE(rlx::testing::tensors_close(c.run(d.named)[0], d.want(g)));
  expect_error([&] { s.compile_on(g, Device::Vulkan); }, {"compile_on", "vulkan", "allow-list"});
  env::ScopedOverride only_cpu("RLX_DEVICES", "cpu");
  auto from_env = runtime::FlexibleSession::from_env();
  EXPECT_EQ(from_env.compile_resolved(g).device(), Device::Cpu);
  expect_error([&] { from_env.compile_on(g, Device::Gpu); }, {"RLX_DEVICES"});
}

}  // namespace
