#pragma once
// Kernels for custom ops (rlx/ir/custom_op.hpp), by op name.
//
//  - A host kernel runs on the CPU backend natively, and on other backends
//    through host staging once they offer it.
//  - A raw GPU kernel (Vulkan GLSL/SPIR-V, CUDA C through NVRTC) is dispatched
//    straight against the backend's arena and takes precedence over a host
//    kernel of the same name on that device. Vulkan's binding convention:
//    binding 0 is the arena (a storage buffer of floats), binding 1 a
//    uint array of element offsets: inputs in order, then the output. CUDA's
//    launch signature: extern "C" __global__ void entry(float* arena,
//    const unsigned long long* offsets, unsigned long long n_out).
// When a backend has no kernel for a custom op, the `inline` pass uses the
// op's lowering instead.
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

// Inputs as views (dtype, shape, bytes); the kernel writes the node's result
// (its dtype and shape) into `out`.
using HostKernel = std::function<void(std::span<const ir::TensorView> inputs, const ir::MutableTensorView& out,
                                      const ir::Attrs& attrs)>;
void register_host_kernel(std::string op_name, HostKernel kernel);
inline void register_cpu_kernel(std::string op_name, HostKernel kernel) {
  register_host_kernel(std::move(op_name), std::move(kernel));
}
// The host kernel for `op_name`, or null.
const HostKernel* find_host_kernel(std::string_view op_name);
std::vector<std::string> host_kernel_names();

struct VulkanKernel {
  std::string glsl;                  // compiled with shaderc; or:
  std::vector<std::uint32_t> spirv;  // SPIR-V words, used as they are
  std::array<std::uint32_t, 3> local_size{64, 1, 1};
};
struct CudaKernel {
  std::string source;  // CUDA C, compiled with NVRTC and cached
  std::string entry;   // the __global__ function's name
  std::uint32_t block = 256;
};
void register_vulkan_kernel(std::string op_name, VulkanKernel kernel);
void register_cuda_kernel(std::string op_name, CudaKernel kernel);
const VulkanKernel* find_vulkan_kernel(std::string_view op_name);
std::vector<std::string> vulkan_kernel_names();
const CudaKernel* find_cuda_kernel(std::string_view op_name);

// A backend whose kernels are not source text (MLX's functions over mx::array:
// rlx/backends/mlx/mlx_kernel.hpp, register_mlx_kernel) keeps them itself and
// names them here, so that routes and reports see them; such a kernel takes
// precedence over a host kernel of the same name on its device.
void register_backend_kernel_name(Device device, std::string op_name);
bool has_backend_kernel(std::string_view op_name, Device device);

// How a custom op runs on `device`, by the precedence above.
enum class CustomRoute { RawGpuKernel, HostKernel, Lowering, None, BackendKernel };
CustomRoute custom_op_route(std::string_view op_name, Device device);
std::string_view custom_route_name(CustomRoute r);

}  // namespace rlx::runtime
