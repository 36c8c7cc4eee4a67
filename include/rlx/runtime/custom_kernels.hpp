#pragma once
// Kernels for custom ops (rlx/ir/custom_op.hpp), by op name.
//
//  - A host kernel runs on the CPU backend natively, and on other backends
//    through host staging once they offer it.
//  - A raw GPU kernel (Vulkan GLSL/SPIR-V, CUDA C through NVRTC) is dispatched
//    straight against the backend's arena and takes precedence over a host
//    kernel of the same name on that device. Vulkan's binding convention:
//    binding 0 is the arena (a storage buffer of floats), binding 1 a
//    uint array of element offsets: inputs in order, then the output.
//    CUDA's fixed launch signature (CudaKernel below):
//      extern "C" __global__ void entry(float* arena, unsigned long long in0, unsigned long long in1,
//                                       unsigned long long in2, unsigned long long in3,
//                                       unsigned long long out, unsigned long long n)
//    in0..in3 are the op's inputs' offsets in the arena in 4-byte words (at most 4 inputs; unused slots
//    are 0), out the output's, n the output's element count.
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
// CUDA C compiled by NVRTC for the device's architecture (with -minimal: no headers, the built-ins only),
// cached like the generated kernels, and launched against the arena with the signature above. Operands that
// live outside the arena (params, constants) are copied into arena scratch first, in the captured graph. The
// launch: `grid` blocks of `block` threads, grid 0 meaning ceil(n / block) (a thread per output element, at
// most 2^31 - 1 blocks: a grid-stride loop is correct for any n). Every operand must start on 4 bytes.
struct CudaKernel {
  std::string source;  // CUDA C
  std::string entry;   // the extern "C" __global__ function's name
  std::uint32_t block = 256;
  std::uint32_t grid = 0;
};
void register_vulkan_kernel(std::string op_name, VulkanKernel kernel);
void register_cuda_kernel(std::string op_name, CudaKernel kernel);
const VulkanKernel* find_vulkan_kernel(std::string_view op_name);
std::vector<std::string> vulkan_kernel_names();
const CudaKernel* find_cuda_kernel(std::string_view op_name);
std::vector<std::string> cuda_kernel_names();

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
