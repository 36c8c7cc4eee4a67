#include "rlx/runtime/custom_kernels.hpp"

#include <map>
#include <mutex>
#include <set>

#include "rlx/ir/custom_op.hpp"

namespace rlx::runtime {

namespace {
// Entries are never erased, so pointers handed out stay valid; re-registering
// a name replaces the kernel in place.
struct Kernels {
  std::mutex mu;
  std::map<std::string, HostKernel, std::less<>> host;
  std::map<std::string, VulkanKernel, std::less<>> vulkan;
  std::map<std::string, CudaKernel, std::less<>> cuda;
  std::set<std::pair<Device, std::string>, std::less<>> backend;  // names only: the backend keeps the kernels
};
Kernels& kernels() {
  static Kernels k;
  return k;
}

template <class Map, class V>
void put(Map& m, std::string name, V v) {
  std::lock_guard lock(kernels().mu);
  m[std::move(name)] = std::move(v);
}
template <class Map>
const typename Map::mapped_type* get(const Map& m, std::string_view name) {
  std::lock_guard lock(kernels().mu);
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}
}  // namespace

void register_host_kernel(std::string op_name, HostKernel kernel) {
  put(kernels().host, std::move(op_name), std::move(kernel));
}
void register_vulkan_kernel(std::string op_name, VulkanKernel kernel) {
  put(kernels().vulkan, std::move(op_name), std::move(kernel));
}
void register_cuda_kernel(std::string op_name, CudaKernel kernel) {
  put(kernels().cuda, std::move(op_name), std::move(kernel));
}
void register_backend_kernel_name(Device device, std::string op_name) {
  std::lock_guard lock(kernels().mu);
  kernels().backend.emplace(device, std::move(op_name));
}
bool has_backend_kernel(std::string_view op_name, Device device) {
  std::lock_guard lock(kernels().mu);
  return kernels().backend.contains(std::pair{device, std::string(op_name)});
}
const HostKernel* find_host_kernel(std::string_view op_name) { return get(kernels().host, op_name); }
const VulkanKernel* find_vulkan_kernel(std::string_view op_name) { return get(kernels().vulkan, op_name); }
const CudaKernel* find_cuda_kernel(std::string_view op_name) { return get(kernels().cuda, op_name); }

namespace {
template <class Map>
std::vector<std::string> names_of(const Map& m) {
  std::lock_guard lock(kernels().mu);
  std::vector<std::string> out;
  for (const auto& [name, k] : m) out.push_back(name);
  return out;
}
}  // namespace

std::vector<std::string> vulkan_kernel_names() { return names_of(kernels().vulkan); }
std::vector<std::string> cuda_kernel_names() { return names_of(kernels().cuda); }
std::vector<std::string> host_kernel_names() { return names_of(kernels().host); }

CustomRoute custom_op_route(std::string_view op_name, Device device) {
  if ((device == Device::Vulkan && find_vulkan_kernel(op_name)) ||
      (device == Device::Cuda && find_cuda_kernel(op_name)))
    return CustomRoute::RawGpuKernel;
  if (has_backend_kernel(op_name, device)) return CustomRoute::BackendKernel;
  // Vulkan, CUDA and MLX run host kernels through host staging.
  if ((device == Device::Cpu || device == Device::Vulkan || device == Device::Cuda || device == Device::Mlx) &&
      find_host_kernel(op_name))
    return CustomRoute::HostKernel;
  if (ir::is_op_registered(op_name)) {
    // A lowering is tried by the inline pass; an op without one falls back to
    // a host kernel through staging where the backend offers it.
    return CustomRoute::Lowering;
  }
  return CustomRoute::None;
}

std::string_view custom_route_name(CustomRoute r) {
  switch (r) {
    case CustomRoute::RawGpuKernel: return "raw_gpu_kernel";
    case CustomRoute::HostKernel: return "host_kernel";
    case CustomRoute::Lowering: return "lowering";
    case CustomRoute::None: return "none";
    case CustomRoute::BackendKernel: return "backend_kernel";
  }
  return "?";
}

}  // namespace rlx::runtime
