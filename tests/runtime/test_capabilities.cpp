// The optional ExecutableGraph surface behaves as each capability bit says:
// every bit a backend claims works (checked against the reference), every bit
// it does not claim throws rlx::Error naming the method, the backend and the
// bit. Runs on the CPU, on a forwarding twin, on a twin that offers nothing,
// and on Vulkan, CUDA and MLX when they are available.
#include <gtest/gtest.h>

#include <cmath>

#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "runtime/test_backends.hpp"
#include "support/testing.hpp"

using namespace rlx;
using runtime::Device;

namespace {

// y = x @ w + state (state is feedable from y), noise = uniform(seed 7), s = sum(x).
ir::Graph cap_graph(std::uint64_t seed = 7) {
  ir::Graph g("caps");
  auto x = g.input("x", {4, 8});
  auto state = g.input("state", {4, 8});
  auto w = g.param("w", {8, 8});
  g.add_output(g.add(g.matmul(x, w), state), "y");
  g.add_output(g.random_uniform(ir::Shape{4, 8}, seed), "noise");
  g.add_output(g.sum(x, {0, 1}), "s");
  return g;
}

std::vector<runtime::NamedTensor> named(const reference::TensorMap& m) {
  std::vector<runtime::NamedTensor> out;
  for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
  return out;
}

ir::Tensor as(ir::DType t, const ir::Tensor& v) {
  ir::Tensor o(t, v.shape());
  for (std::int64_t i = 0; i < v.numel(); ++i) o.set(i, v.get(i));
  return o;
}

// Asserts that `f` throws rlx::Error naming the method, the backend and the bit.
template <class F>
void expect_refused(F&& f, std::string_view method, std::string_view backend, std::string_view bit) {
  try {
    f();
    ADD_FAILURE() << method << " did not throw although '" << bit << "' is not claimed";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (auto part : {method, backend, bit})
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' missing from: " << msg;
  }
}

class Capabilities : public rlx::testing::MultiBackendTest, public ::testing::WithParamInterface<Device> {
 protected:
  void SetUp() override {
    MultiBackendTest::SetUp();
    twin(Device::Gpu);
    twin(Device::Tpu, {.name = "bare", .forward_optional = false});
    try {
      runtime::make_backend(GetParam());
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
    std::mt19937_64 rng(rlx::testing::test_seed());
    for (const char* n : {"x", "state"}) in_[n] = rlx::testing::random_tensor(ir::DType::F32, {4, 8}, rng);
    params_["w"] = rlx::testing::random_tensor(ir::DType::F32, {8, 8}, rng);
    want_ = reference::run(g_, in_, params_);
  }
  CompiledGraph compile() {
    auto c = Session(GetParam()).compile(g_);
    c.set_param("w", params_.at("w"));
    return c;
  }
  void expect_outputs(const std::vector<ir::Tensor>& got, const std::vector<ir::Tensor>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(rlx::testing::tensors_close(got[i], want[i])) << "output " << i;
  }
  // x [S, 8] with S bound to 6: y = x @ w (a weight the CPU packs), s = sum(y, 0) + state. The graph runs at
  // extents 6, 3 and 1 against the reference at each, with the param set once and again while an extent other
  // than the bound runs, and (with kv_resident) the state a handle fed from s, moving from extent to extent.
  void expect_active_extents(const runtime::ExecutableCapabilities& caps) {
    ir::Graph g("extents");
    auto x = g.input("x", ir::Shape(std::vector<ir::Dim>{ir::Dim::symbol("S"), ir::Dim(8)}));
    auto state = g.input("state", {8});
    auto y = g.matmul(x, g.param("w", {8, 8}));
    g.add_output(y, "y");
    g.add_output(g.add(g.sum(y, {0}), state), "s");
    compile::CompileOptions o;
    o.bind = {{"S", 6}};
    auto c = Session(GetParam()).compile(g, o);
    reference::TensorMap params = params_;
    c.set_param("w", params.at("w"));
    std::mt19937_64 rng(rlx::testing::test_seed() + 2);
    ir::Tensor held = rlx::testing::random_tensor(ir::DType::F32, {8}, rng);  // the state's value
    // One run at extent n against the reference; the state comes from `held` (updated from s with a handle).
    auto expect_run = [&](std::int64_t n, bool handle) {
      SCOPED_TRACE("extent " + std::to_string(n) + (handle ? ", state in a handle" : ""));
      EXPECT_EQ(c.active_extent(), n);
      EXPECT_EQ(c.active_extent("S"), n);
      EXPECT_EQ(c.input_specs()[0].shape, (std::vector<std::int64_t>{n, 8}));
      EXPECT_EQ(c.output_specs()[0].shape, (std::vector<std::int64_t>{n, 8}));
      reference::TensorMap in{{"x", rlx::testing::random_tensor(ir::DType::F32, {n, 8}, rng)}, {"state", held}};
      const auto want = reference::run(ir::bind_symbols(g, {{"S", n}}), in, params);
      if (handle) in.erase("state");
      expect_outputs(c.run(named(in)), want);
      if (handle) {
        held = want[1];
        EXPECT_TRUE(rlx::testing::tensors_close(c.read_handle("state"), held));
      }
    };
    expect_run(6, false);
    c.set_active_extent(3);
    expect_run(3, false);
    c.set_active_extent(1);
    expect_run(1, false);
    // A param written while extent 1 runs is the param of every extent (they share it).
    params["w"] = rlx::testing::random_tensor(ir::DType::F32, {8, 8}, rng);
    c.set_param("w", params.at("w"));
    expect_run(1, false);
    c.set_active_extent(3);  // compiled before: kept
    expect_run(3, false);
    c.set_active_extent(std::nullopt);
    expect_run(6, false);
    if (caps.kv_resident) {
      c.bind_handle("state", ir::view(held));
      c.feed_handle("state", "s");
      expect_run(6, true);
      c.set_active_extent(2);  // a new extent: the handle and its feed move to it
      expect_run(2, true);
      expect_run(2, true);
      c.set_active_extent("S", 6);
      expect_run(6, true);
    }
    // A clone runs at its original's extent.
    c.set_active_extent(4);
    auto twin = c.clone();
    EXPECT_EQ(twin.active_extent(), 4);
    reference::TensorMap in{{"x", rlx::testing::random_tensor(ir::DType::F32, {4, 8}, rng)}, {"state", held}};
    expect_outputs(twin.run(named(in)), reference::run(ir::bind_symbols(g, {{"S", 4}}), in, params));
    // Errors name the method, the symbol and the range.
    for (std::int64_t bad : {0, 7})
      rlx::testing::expect_error([&] { c.set_active_extent(bad); },
                                 {"set_active_extent", "'S'", "[1, 6]", std::to_string(bad)});
    rlx::testing::expect_error([&] { c.set_active_extent("T", 2); }, {"set_active_extent", "'T'", "S=6"});
    EXPECT_EQ(c.active_extent(), 4);  // a refused call changes nothing
    in["x"] = rlx::testing::random_tensor(ir::DType::F32, {6, 8}, rng);
    if (caps.kv_resident) in.erase("state");
    rlx::testing::expect_error([&] { c.run(named(in)); }, {"input 'x'", "f32[4,8]", "f32[6,8]"});
    rlx::testing::expect_error([&] { Session(GetParam()).compile(g_).set_active_extent(2); },
                               {"set_active_extent", "no bound symbolic dim"});
  }

  ir::Graph g_ = cap_graph();
  reference::TensorMap in_, params_;
  std::vector<ir::Tensor> want_;
};

TEST_P(Capabilities, ClaimedBitsWorkAndOthersRefuse) {
  auto c = compile();
  const auto caps = c.capabilities();
  const auto backend = c.backend_name();
  expect_outputs(c.run(named(in_)), want_);

  if (caps.clone)
    expect_outputs(c.clone().run(named(in_)), want_);
  else
    expect_refused([&] { c.clone(); }, "clone", backend, "clone");

  if (caps.typed_io) {
    auto t = compile();
    t.set_param_typed("w", ir::view(as(ir::DType::F64, params_.at("w"))));
    auto typed_in = in_;
    typed_in["x"] = as(ir::DType::F64, in_.at("x"));
    expect_outputs(t.run_typed(named(typed_in)), want_);
  } else {
    expect_refused([&] { c.set_param_typed("w", ir::view(as(ir::DType::F64, params_.at("w")))); }, "set_param_typed",
                   backend, "typed_io");
    expect_refused([&] { c.run_typed(named(in_)); }, "run_typed", backend, "typed_io");
  }

  const std::size_t pick[] = {2, 0};
  if (caps.read_outputs) {
    auto got = c.run_read_outputs(named(in_), pick);
    expect_outputs(got, {want_[2], want_[0]});
  } else {
    expect_refused([&] { c.run_read_outputs(named(in_), pick); }, "run_read_outputs", backend, "read_outputs");
  }

  if (caps.async_pipeline) {
    auto inputs = named(in_);
    c.commit_no_wait(inputs);
    EXPECT_THROW(c.run(inputs), Error);  // one run at a time
    expect_outputs(c.sync_pending(), want_);
    std::mt19937_64 rng(rlx::testing::test_seed() + 1);
    auto in2 = in_;
    in2["x"] = rlx::testing::random_tensor(ir::DType::F32, {4, 8}, rng);
    std::vector<std::vector<runtime::NamedTensor>> sets{named(in_), named(in2)};
    auto outs = c.run_pipelined(sets);
    ASSERT_EQ(outs.size(), 2u);
    expect_outputs(outs[0], want_);
    expect_outputs(outs[1], reference::run(g_, in2, params_));
  } else {
    expect_refused([&] { c.commit_no_wait(named(in_)); }, "commit_no_wait", backend, "async_pipeline");
    expect_refused([&] { c.sync_pending(); }, "sync_pending", backend, "async_pipeline");
    std::vector<std::vector<runtime::NamedTensor>> sets{named(in_)};
    expect_refused([&] { c.run_pipelined(sets); }, "run_pipelined", backend, "async_pipeline");
  }

  if (caps.persistent_handles) {
    auto h = compile();
    h.bind_handle("state", ir::view(in_.at("state")));
    EXPECT_TRUE(rlx::testing::tensors_close(h.read_handle("state"), in_.at("state")));
    reference::TensorMap without_state{{"x", in_.at("x")}};
    expect_outputs(h.run(named(without_state)), want_);
    EXPECT_THROW(h.run(named(in_)), Error);  // a bound input is not passed again
    if (caps.kv_resident) {
      // The state accumulates: after run k, state = y_k, and y_{k+1} = x w + y_k.
      h.feed_handle("state", "y");
      auto y1 = h.run(named(without_state))[0];
      EXPECT_TRUE(rlx::testing::tensors_close(y1, want_[0]));
      EXPECT_TRUE(rlx::testing::tensors_close(h.read_handle("state"), y1));
      auto y2 = h.run(named(without_state))[0];
      auto in_k = in_;
      in_k["state"] = y1;
      EXPECT_TRUE(rlx::testing::tensors_close(y2, reference::run(g_, in_k, params_)[0]));
    } else {
      expect_refused([&] { h.feed_handle("state", "y"); }, "feed_handle", backend, "kv_resident");
    }
  } else {
    expect_refused([&] { c.bind_handle("state", ir::view(in_.at("state"))); }, "bind_handle", backend,
                   "persistent_handles");
    expect_refused([&] { c.read_handle("state"); }, "read_handle", backend, "persistent_handles");
    if (!caps.kv_resident) expect_refused([&] { c.feed_handle("state", "y"); }, "feed_handle", backend, "kv_resident");
  }

  if (caps.handle_addresses) {
    auto h = compile();
    EXPECT_THROW(h.handle_address("state"), Error);  // nothing bound yet
    h.bind_handle("state", ir::view(in_.at("state")));
    const runtime::DeviceAddress a = h.handle_address("state");
    EXPECT_NE(a.data, nullptr);
    EXPECT_EQ(a.bytes, in_.at("state").nbytes());
    EXPECT_EQ(a.gpu, runtime::gpu());
    EXPECT_EQ(h.handle_address("state").data, a.data);  // the handle's for the executable's lifetime
  } else {
    expect_refused([&] { c.handle_address("state"); }, "handle_address", backend, "handle_addresses");
  }

  if (caps.active_extent) {
    expect_active_extents(caps);
  } else {
    expect_refused([&] { c.set_active_extent(2); }, "set_active_extent", backend, "active_extent");
  }

  if (caps.rng) {
    auto r = compile();
    EXPECT_EQ(r.rng(), runtime::RngOptions{});
    r.set_rng({12345});
    EXPECT_EQ(r.rng(), runtime::RngOptions{12345});
    auto reseeded = cap_graph(runtime::effective_seed(7, {12345}));
    auto want = reference::run(reseeded, in_, params_);
    auto got = r.run(named(in_));
    EXPECT_TRUE(rlx::testing::tensors_close(got[1], want[1]));
    EXPECT_FALSE(rlx::testing::tensors_close(got[1], want_[1]));  // other samples than the graph's seed
    expect_outputs(r.clone().run(named(in_)), want);              // the setting carries over to clones
    r.set_rng({});
    expect_outputs(r.run(named(in_)), want_);
  } else {
    expect_refused([&] { c.set_rng({3}); }, "set_rng", backend, "rng");
    expect_refused([&] { c.rng(); }, "rng", backend, "rng");
  }

  if (caps.kernel_times) {
    auto p = compile();
    p.set_profiling(true);
    EXPECT_TRUE(p.kernel_times().empty());  // nothing has run yet
    expect_outputs(p.run(named(in_)), want_);
    const auto times = p.kernel_times();
    const auto& kernels = p.compile_result().lir.kernels;
    ASSERT_EQ(times.size(), kernels.size());
    for (std::size_t k = 0; k < times.size(); ++k) {
      EXPECT_EQ(times[k].kernel, kernels[k].name);
      EXPECT_TRUE(times[k].micros >= 0 && std::isfinite(times[k].micros)) << times[k].kernel;
    }
  } else {
    expect_refused([&] { c.set_profiling(true); }, "set_profiling", backend, "kernel_times");
    expect_refused([&] { c.kernel_times(); }, "kernel_times", backend, "kernel_times");
  }

  auto fresh = Session(GetParam()).compile(g_);
  if (caps.copy_params) {
    fresh.copy_params_from(c);
    expect_outputs(fresh.run(named(in_)), want_);
  } else {
    expect_refused([&] { fresh.copy_params_from(c); }, "copy_params_from", backend, "copy_params");
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Capabilities,
                         ::testing::Values(Device::Cpu, Device::Gpu, Device::Tpu, Device::Vulkan, Device::Cuda,
                                           Device::Mlx),
                         [](const auto& info) { return std::string(runtime::device_label(info.param)); });

TEST(CpuCapabilities, ClaimsWhatItImplementsAndMatchesTheAdvisoryBits) {
  auto c = Session(Device::Cpu).compile(cap_graph());
  const auto caps = c.capabilities();
  EXPECT_EQ(caps.names(), (std::vector<std::string_view>{"clone", "persistent_handles", "kv_resident", "typed_io",
                                                         "async_pipeline", "active_extent", "read_outputs", "rng",
                                                         "copy_params", "kernel_times", "shared_params"}));
  EXPECT_FALSE(caps.gpu_handles);  // host memory
  EXPECT_EQ(runtime::advisory_capabilities(Device::Cpu), caps);
  EXPECT_TRUE(caps.has("typed_io"));
  EXPECT_THROW(caps.has("warp_drive"), Error);
  EXPECT_EQ(c.backend_name(), "cpu");
  EXPECT_EQ(c.device(), Device::Cpu);
}

// The advisory bits (what device selection reads before compiling) must be the bits the built-in backend's
// executables really have: a device report must not promise a capability the executable refuses.
TEST(AdvisoryCapabilities, MatchTheCompiledExecutableOfEveryBuiltInBackend) {
  int checked = 0;
  for (Device d : {Device::Cpu, Device::Vulkan, Device::Cuda, Device::Mlx}) {
    try {
      runtime::make_backend(d);
    } catch (const Error&) {
      continue;  // not built or not available on this machine
    }
    auto c = Session(d).compile(cap_graph());
    EXPECT_EQ(runtime::advisory_capabilities(d).names(), c.capabilities().names()) << runtime::device_label(d);
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

TEST(CpuCapabilities, TypedIoConvertsNarrowParamsAndChecksSizes) {
  ir::Graph g("half");
  auto x = g.input("x", {3, 4}, ir::DType::F16);
  g.add_output(g.add(x, g.param("b", {3, 4}, ir::DType::F16)));
  auto c = Session().compile(g);
  std::mt19937_64 rng(rlx::testing::test_seed());
  auto b = rlx::testing::random_tensor(ir::DType::F32, {3, 4}, rng);
  auto xin = rlx::testing::random_tensor(ir::DType::F32, {3, 4}, rng);
  c.set_param_typed("b", ir::view(b));  // f32 values into an f16 param
  auto got = c.run_typed(std::vector<runtime::NamedTensor>{{"x", ir::view(xin)}});
  auto want = reference::run(g, {{"x", as(ir::DType::F16, xin)}}, {{"b", as(ir::DType::F16, b)}});
  EXPECT_TRUE(rlx::testing::tensors_close(got[0], want[0]));
  ir::Tensor wrong(ir::DType::F32, {4, 3});
  EXPECT_THROW(c.set_param_typed("b", ir::view(wrong)), Error);
  EXPECT_THROW(c.set_param_typed("nope", ir::view(b)), Error);
}

TEST(CpuCapabilities, CommitChecksInputsBeforeStarting) {
  auto g = cap_graph();
  auto c = Session().compile(g);  // w never set: the CompiledGraph refuses before anything is pending
  std::mt19937_64 rng(rlx::testing::test_seed());
  reference::TensorMap in{{"x", rlx::testing::random_tensor(ir::DType::F32, {4, 8}, rng)},
                          {"state", rlx::testing::random_tensor(ir::DType::F32, {4, 8}, rng)}};
  EXPECT_THROW(c.commit_no_wait(named(in)), Error);
  EXPECT_TRUE(c.sync_pending().empty());  // nothing was pending
}

}  // namespace
