// DevicePolicy: built in code and read from RLX_* (or another prefix) through
// the env catalog's overrides; malformed values name the variable.
#include <gtest/gtest.h>

#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/policy.hpp"
#include "support/testing.hpp"

using namespace rlx;
using runtime::Device;
using runtime::DevicePolicy;

namespace {

// Unsets every device variable for the test, so the developer's environment cannot leak in.
struct CleanEnv {
  std::vector<std::unique_ptr<env::ScopedOverride>> o;
  CleanEnv() {
    for (const char* v : {"RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE", "RLX_DEVICE_CHAIN",
                          "RLX_BENCHMARK_PICK", "MYAPP_DEVICES", "MYAPP_DENY_DEVICES", "MYAPP_PREFER_DEVICES",
                          "MYAPP_DEVICE", "MYAPP_DEVICE_CHAIN", "MYAPP_BENCHMARK_PICK"})
      o.push_back(std::make_unique<env::ScopedOverride>(v, std::nullopt));
  }
};

using rlx::testing::expect_error;

TEST(DevicePolicy, BuiltInCode) {
  auto all = DevicePolicy::all();
  for (auto d : runtime::kAllDevices) EXPECT_TRUE(all.allows(d));
  EXPECT_EQ(all.strategy().kind, runtime::DevicePickStrategy::Kind::CostModel);

  auto p = DevicePolicy::only({Device::Cpu, Device::Vulkan}).with_deny({Device::Vulkan}).with_prefer({Device::Vulkan});
  EXPECT_TRUE(p.allows(Device::Cpu));
  EXPECT_FALSE(p.allows(Device::Cuda));
  EXPECT_NE(p.blocked_reason(Device::Cuda).find("allow-list (cpu,vulkan)"), std::string::npos)
      << p.blocked_reason(Device::Cuda);
  EXPECT_NE(p.blocked_reason(Device::Vulkan).find("denied"), std::string::npos);
  EXPECT_EQ(p.preferred(), std::vector<Device>{Device::Vulkan});
  EXPECT_EQ(p.describe(), "allow cpu,vulkan; deny vulkan; prefer vulkan; pick cost model");

  auto b = p.with_benchmark_pick(5);
  EXPECT_EQ(b.strategy(), runtime::DevicePickStrategy::benchmark(5));
  EXPECT_EQ(p.strategy().kind, runtime::DevicePickStrategy::Kind::CostModel);  // a value: p is unchanged
  EXPECT_THROW(p.with_benchmark_pick(0), Error);
  EXPECT_EQ(p.with_default_device(Device::Cpu).default_device(), Device::Cpu);
  EXPECT_EQ(p.with_chain({Device::Cuda, Device::Cpu}).chain(), (std::vector<Device>{Device::Cuda, Device::Cpu}));
}

TEST(DevicePolicy, FromEnv) {
  CleanEnv clean;
  EXPECT_EQ(DevicePolicy::from_env().describe(), "allow all; deny -; prefer -; pick cost model (from RLX_*)");
  env::ScopedOverride a("RLX_DEVICES", "cpu, vulkan,nvidia");
  env::ScopedOverride b("RLX_DENY_DEVICES", "vulkan");
  env::ScopedOverride c("RLX_PREFER_DEVICES", "vulkan,cpu");
  env::ScopedOverride d("RLX_DEVICE", "cpu");
  env::ScopedOverride e("RLX_DEVICE_CHAIN", "cuda,vulkan,cpu");
  env::ScopedOverride f("RLX_BENCHMARK_PICK", "7");
  auto p = DevicePolicy::from_env();
  EXPECT_EQ(*p.allowed(), (std::vector<Device>{Device::Cpu, Device::Vulkan, Device::Cuda}));
  EXPECT_EQ(p.denied(), std::vector<Device>{Device::Vulkan});
  EXPECT_EQ(p.preferred(), (std::vector<Device>{Device::Vulkan, Device::Cpu}));
  EXPECT_EQ(p.default_device(), Device::Cpu);
  EXPECT_EQ(p.chain(), (std::vector<Device>{Device::Cuda, Device::Vulkan, Device::Cpu}));
  EXPECT_EQ(p.strategy(), runtime::DevicePickStrategy::benchmark(7));
  EXPECT_NE(p.blocked_reason(Device::Metal).find("RLX_DEVICES"), std::string::npos) << p.blocked_reason(Device::Metal);
  EXPECT_NE(p.blocked_reason(Device::Vulkan).find("RLX_DENY_DEVICES"), std::string::npos);
  {
    env::ScopedOverride off("RLX_BENCHMARK_PICK", "0");
    EXPECT_EQ(DevicePolicy::from_env().strategy().kind, runtime::DevicePickStrategy::Kind::CostModel);
  }
  // Overrides undo in reverse order, leaving the environment as it was.
  {
    env::ScopedOverride inner("RLX_DEVICE", "vulkan");
    EXPECT_EQ(DevicePolicy::from_env().default_device(), Device::Vulkan);
  }
  EXPECT_EQ(DevicePolicy::from_env().default_device(), Device::Cpu);
}

TEST(DevicePolicy, FromEnvKeyReadsThePrefixedNames) {
  CleanEnv clean;
  env::ScopedOverride rlx_side("RLX_DEVICES", "cuda");  // ignored under another prefix
  env::ScopedOverride a("MYAPP_DEVICES", "cpu");
  env::ScopedOverride b("MYAPP_BENCHMARK_PICK", "3");
  auto p = DevicePolicy::from_env_key("MYAPP");
  EXPECT_EQ(*p.allowed(), std::vector<Device>{Device::Cpu});
  EXPECT_EQ(p.strategy().runs, 3);
  EXPECT_NE(p.blocked_reason(Device::Cuda).find("MYAPP_DEVICES"), std::string::npos) << p.blocked_reason(Device::Cuda);
  EXPECT_NE(p.describe().find("from MYAPP_*"), std::string::npos);
  EXPECT_EQ(env::get("RLX_DEVICES", "MYAPP"), "cpu");
}

TEST(DevicePolicy, MalformedValuesNameTheVariable) {
  CleanEnv clean;
  {
    env::ScopedOverride a("RLX_DEVICES", "cpu,quantum");
    expect_error([] { DevicePolicy::from_env(); }, {"RLX_DEVICES", "'quantum'", "known: cpu"});
  }
  {
    env::ScopedOverride a("RLX_BENCHMARK_PICK", "lots");
    expect_error([] { DevicePolicy::from_env(); }, {"RLX_BENCHMARK_PICK", "'lots'", "integer"});
  }
  {
    env::ScopedOverride a("RLX_BENCHMARK_PICK", "-2");
    expect_error([] { DevicePolicy::from_env(); }, {"RLX_BENCHMARK_PICK"});
  }
  {
    env::ScopedOverride a("MYAPP_DEVICE", "tpu9");
    expect_error([] { DevicePolicy::from_env_key("MYAPP"); }, {"MYAPP_DEVICE", "'tpu9'"});
  }
  {
    env::ScopedOverride a("MYAPP_DENY_DEVICES", ",,gpu,,");  // empty items are skipped
    EXPECT_EQ(DevicePolicy::from_env_key("MYAPP").denied(), std::vector<Device>{Device::Gpu});
  }
  expect_error([] { DevicePolicy::from_env_key(""); }, {"prefix"});
}

TEST(Devices, ParseAndLabel) {
  EXPECT_EQ(runtime::parse_device("nvidia"), Device::Cuda);
  EXPECT_EQ(runtime::parse_device("wgpu"), Device::Gpu);
  EXPECT_EQ(runtime::parse_device("Vulkan"), Device::Vulkan);
  for (auto d : runtime::kAllDevices) EXPECT_EQ(runtime::parse_device(runtime::device_label(d)), d);
  expect_error([] { runtime::parse_device("gpu0"); }, {"'gpu0'", "aliases"});
  std::vector<std::string> names{"cpu", "cpu", "metal"};
  EXPECT_EQ(runtime::parse_device_list(names, "arg"), (std::vector<Device>{Device::Cpu, Device::Metal}));
  EXPECT_EQ(runtime::device_list_str(std::vector<Device>{}), "-");
}

// ctest runs each case in a process of its own, so claiming the GPU here touches no other case.
TEST(Devices, TheProcessGpuIsChosenOnceABackendClaimsIt) {
  EXPECT_EQ(runtime::gpu(), 0);
  expect_error([] { runtime::set_gpu(-1); }, {"GPU -1"});
  runtime::set_gpu(3);  // free to move until a backend starts on it
  EXPECT_EQ(runtime::gpu(), 3);
  runtime::set_gpu(1);
  EXPECT_EQ(runtime::claim_gpu(), 1);
  runtime::set_gpu(1);  // the same GPU again is fine
  expect_error([] { runtime::set_gpu(2); }, {"already runs the CUDA backend on GPU 1", "GPU 2"});
  EXPECT_EQ(runtime::gpu(), 1);
}

}  // namespace
