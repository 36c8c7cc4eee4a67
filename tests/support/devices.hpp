#pragma once
// Shared by the tests that run one case on every built-in device (concurrency,
// load, run control): a fixture that skips, with the reason, a device whose
// backend is unavailable here; named inputs from a map; bitwise equality.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::testing {

using Feeds = std::map<std::string, ir::Tensor, std::less<>>;

class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    try {
      runtime::make_backend(GetParam());
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
  }
};

inline std::string device_name(const ::testing::TestParamInfo<Device>& info) {
  return std::string(runtime::device_label(info.param));
}

inline std::vector<runtime::NamedTensor> named(const Feeds& m) {
  std::vector<runtime::NamedTensor> out;
  for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
  return out;
}

// Same dtypes, shapes and bytes (the serial-versus-concurrent checks want bit equality, not closeness).
inline bool same_bits(const std::vector<ir::Tensor>& a, const std::vector<ir::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].dtype() != b[i].dtype() || a[i].shape() != b[i].shape() || a[i].nbytes() != b[i].nbytes() ||
        (a[i].nbytes() != 0 && std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()) != 0))
      return false;
  return true;
}

}  // namespace rlx::testing
