// The optional ExecutableGraph surface: capability names, the defaults that
// refuse with the capability bit named, and Backend's shared compile path.
#include <fmt/format.h>

#include <algorithm>

#include "rlx/error.hpp"
#include "rlx/ir/random.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

namespace {
using Bit = bool ExecutableCapabilities::*;
constexpr std::pair<std::string_view, Bit> kBits[] = {
    {"clone", &ExecutableCapabilities::clone},
    {"persistent_handles", &ExecutableCapabilities::persistent_handles},
    {"gpu_handles", &ExecutableCapabilities::gpu_handles},
    {"kv_resident", &ExecutableCapabilities::kv_resident},
    {"typed_io", &ExecutableCapabilities::typed_io},
    {"async_pipeline", &ExecutableCapabilities::async_pipeline},
    {"active_extent", &ExecutableCapabilities::active_extent},
    {"read_outputs", &ExecutableCapabilities::read_outputs},
    {"rng", &ExecutableCapabilities::rng},
    {"copy_params", &ExecutableCapabilities::copy_params},
    {"kernel_times", &ExecutableCapabilities::kernel_times},
    {"shared_params", &ExecutableCapabilities::shared_params},
    {"handle_addresses", &ExecutableCapabilities::handle_addresses},
};
}  // namespace

std::vector<std::string_view> ExecutableCapabilities::names() const {
  std::vector<std::string_view> out;
  for (const auto& [name, bit] : kBits)
    if (this->*bit) out.push_back(name);
  return out;
}

const std::vector<std::string_view>& ExecutableCapabilities::all_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const auto& [name, bit] : kBits) v.push_back(name);
    return v;
  }();
  return names;
}

bool ExecutableCapabilities::has(std::string_view name) const {
  for (const auto& [n, bit] : kBits)
    if (n == name) return this->*bit;
  throw Error(fmt::format("unknown capability '{}' (known: {})", name, fmt::join(all_names(), ", ")));
}

std::uint64_t effective_seed(std::uint64_t graph_seed, const RngOptions& rng) {
  return rng.seed == 0 ? graph_seed : ir::rng_mix(graph_seed, rng.seed);
}

void ExecutableGraph::not_offered(std::string_view method, std::string_view bit) const {
  throw Error(fmt::format("{}: backend '{}' does not offer it (capability '{}' is false)", method, backend_name_, bit));
}

void ExecutableGraph::set_param_typed(std::size_t, const ir::TensorView&) {
  not_offered("set_param_typed", "typed_io");
}
std::vector<ir::Tensor> ExecutableGraph::run_typed(std::span<const ir::TensorView>) {
  not_offered("run_typed", "typed_io");
}
void ExecutableGraph::run_read_outputs(std::span<const void* const>, std::span<void* const>) {
  not_offered("run_read_outputs", "read_outputs");
}
void ExecutableGraph::commit_no_wait(std::span<const void* const>, std::span<void* const>) {
  not_offered("commit_no_wait", "async_pipeline");
}
void ExecutableGraph::sync_pending() { not_offered("sync_pending", "async_pipeline"); }
void ExecutableGraph::run_pipelined(std::span<const std::vector<const void*>>, std::span<const std::vector<void*>>) {
  not_offered("run_pipelined", "async_pipeline");
}
void ExecutableGraph::bind_handle(std::size_t, const void*, std::size_t) {
  not_offered("bind_handle", "persistent_handles");
}
void ExecutableGraph::read_handle(std::size_t, void*, std::size_t) const {
  not_offered("read_handle", "persistent_handles");
}
void ExecutableGraph::copy_handle_to(std::size_t input_index, ExecutableGraph& dst, std::size_t nbytes) const {
  std::vector<std::byte> value(nbytes);
  read_handle(input_index, value.data(), nbytes);
  dst.bind_handle(input_index, value.data(), nbytes);
}
void ExecutableGraph::feed_handle(std::size_t, std::size_t) { not_offered("feed_handle", "kv_resident"); }
DeviceAddress ExecutableGraph::handle_address(std::size_t) const { not_offered("handle_address", "handle_addresses"); }
void ExecutableGraph::share_params_from(const ExecutableGraph&) { not_offered("share_params_from", "active_extent"); }
void ExecutableGraph::set_profiling(bool) { not_offered("set_profiling", "kernel_times"); }
std::vector<KernelTime> ExecutableGraph::kernel_times() const { not_offered("kernel_times", "kernel_times"); }
void ExecutableGraph::set_rng(const RngOptions&) { not_offered("set_rng", "rng"); }
RngOptions ExecutableGraph::rng() const { not_offered("rng", "rng"); }
void ExecutableGraph::copy_params_from(const ExecutableGraph&) { not_offered("copy_params_from", "copy_params"); }

Backend::Compiled Backend::compile(const ir::Graph& graph, const compile::CompileOptions& options) {
  const auto t = traits();
  auto result = std::make_shared<compile::CompileResult>(compile::compile(graph, t, options));
  result->dispatch = kernel_dispatch_report(*result, t);
  auto exe = executable(*result, options);
  return {std::move(result), std::move(exe)};
}

std::unique_ptr<ExecutableGraph> Backend::executable(const compile::CompileResult& result,
                                                     const compile::CompileOptions& options) {
  auto exe = compile_lir(result.lir, options);
  exe->set_backend_name(std::string(name()));
  return exe;
}

std::set<ir::OpKind> Backend::supported_ops() const {
  const auto t = traits();
  std::set<ir::OpKind> out;
  for (auto op : ir::kAllOps)
    if (dispatch_tier(op, t) != compile::DispatchTier::Unsupported) out.insert(op);
  return out;
}

// What each kind of device's backend typically offers; real bits come from
// ExecutableGraph::capabilities() after a compile.
ExecutableCapabilities advisory_capabilities(Device device) {
  ExecutableCapabilities c;
  c.clone = true;
  switch (device) {
    case Device::Cpu:
      c.persistent_handles = c.kv_resident = c.typed_io = c.async_pipeline = c.read_outputs = c.rng = c.copy_params =
          c.kernel_times = c.shared_params = c.active_extent = true;
      break;
    case Device::Cuda:  // what the CUDA backend's executables claim today (the same test keeps the two equal)
      c.persistent_handles = c.gpu_handles = c.kv_resident = c.async_pipeline = c.active_extent = c.read_outputs =
          c.kernel_times = c.handle_addresses = true;
      break;
    case Device::Mlx:  // what the MLX backend's executables claim today (the same test keeps the two equal)
      c.persistent_handles = c.gpu_handles = c.kv_resident = c.typed_io = c.async_pipeline = c.active_extent =
          c.read_outputs = c.rng = c.copy_params = c.kernel_times = true;
      break;
    case Device::Rocm:
    case Device::Metal:
      c.persistent_handles = c.gpu_handles = c.kv_resident = c.typed_io = c.async_pipeline = c.active_extent =
          c.read_outputs = true;
      break;
    case Device::Vulkan:  // what the Vulkan backend's executables claim today (a test keeps the two equal)
      c.persistent_handles = c.gpu_handles = c.kv_resident = c.async_pipeline = c.read_outputs = c.kernel_times = true;
      break;
    case Device::Gpu:
      c.persistent_handles = c.gpu_handles = c.async_pipeline = c.read_outputs = c.kernel_times = true;
      break;
    case Device::CoreMl: c.typed_io = true; break;
    case Device::Tpu: break;
  }
  return c;
}

}  // namespace rlx::runtime
