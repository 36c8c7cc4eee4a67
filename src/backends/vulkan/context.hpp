#pragma once
// One Vulkan device for the whole process: instance, the selected physical
// device, a compute queue, the single descriptor-set and pipeline layout every
// RLX shader uses, and a pipeline cache shared by all executables. Contexts
// are created on first use and never destroyed (drivers' own static
// destructors make tearing a device down at exit fragile).
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/vulkan/vk.hpp"
#include "rlx/backends/vulkan/vulkan_backend.hpp"

namespace rlx::backends::vulkan {

struct Caps {
  bool int64_atomics = false;  // shaderBufferInt64Atomics: i64 scatter_add on the device
  bool fp64 = false;           // shaderFloat64: exact float mod
  bool timestamps = false;
  double timestamp_period_ns = 1;
  std::uint64_t max_storage_range = 0;  // maxStorageBufferRange: the most one binding shows a shader
  std::uint64_t storage_align = 16;     // minStorageBufferOffsetAlignment
  // Storage-buffer bindings of the descriptor set every shader sees (<= maxPerStageDescriptorStorageBuffers,
  // even): the arena and the weights are each bound as windows (windows.hpp), 2w and 2w + 1.
  std::uint32_t bindings = 2;
  std::uint64_t max_allocation = 0;
  std::uint32_t max_groups[3] = {65535, 65535, 65535};
  std::uint32_t max_shared_bytes = 16384;
  std::uint32_t max_invocations = 128;
  std::uint32_t subgroup_size = 32;
};

class Context;

// A buffer with its own memory: device-local, or host-visible and mapped.
class GpuBuffer {
 public:
  GpuBuffer() = default;
  GpuBuffer(Context& ctx, std::uint64_t bytes, bool host_visible, std::string_view what);
  GpuBuffer(GpuBuffer&& o) noexcept { *this = std::move(o); }
  GpuBuffer& operator=(GpuBuffer&& o) noexcept;
  ~GpuBuffer();
  VkBuffer get() const { return buf_; }
  std::byte* mapped() const { return static_cast<std::byte*>(mapped_); }
  std::uint64_t size() const { return size_; }

 private:
  Context* ctx_ = nullptr;
  VkBuffer buf_ = VK_NULL_HANDLE;
  VkDeviceMemory mem_ = VK_NULL_HANDLE;
  void* mapped_ = nullptr;
  std::uint64_t size_ = 0;
};

// A compute pipeline built from SPIR-V; shared between executables through
// Context::pipeline while any of them holds it.
struct Pipeline {
  Context* ctx = nullptr;
  VkShaderModule module = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  ~Pipeline();
};

class Context {
 public:
  // The context for the device RLX_VULKAN_DEVICE selects (created once per
  // device); throws rlx::Error saying why there is none.
  static std::shared_ptr<Context> get();
  // Every device the loader lists, with whether RLX can use it.
  static std::vector<DeviceInfo> devices();

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Vk vk;
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  std::uint32_t queue_family = 0;
  DeviceInfo info;
  Caps caps;
  std::uint32_t device_memory_type = 0, host_memory_type = 0;
  // Binding 0 and 1 are storage buffers (generated kernels: arena and weights;
  // raw custom kernels: arena and operand offsets); 128 bytes of push constants.
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout = VK_NULL_HANDLE;

  // A pipeline for `spirv` (words), shared with other users of the same code.
  std::shared_ptr<Pipeline> pipeline(const std::vector<std::uint32_t>& spirv, std::string_view kernel);
  // Submits under the queue lock (the queue is shared by every executable and thread).
  void submit(VkCommandBuffer cb, VkFence fence);
  // Waits for a fence; a lost device marks the context lost and throws.
  void wait(VkFence fence, std::string_view what);
  // Records with `record` into a transient command buffer, submits and waits.
  void run_once(const std::function<void(VkCommandBuffer)>& record, std::string_view what);
  void check(VkResult r, std::string_view what);
  bool lost() const { return lost_.load(); }
  // Shaders get SPIR-V's optimizer on GPUs; a CPU device (lavapipe) optimizes in its own LLVM back end.
  bool optimize_shaders() const { return info.type != "cpu"; }

 private:
  Context() = default;
  void init(std::uint32_t index);

  std::mutex queue_mu_, pipelines_mu_, once_mu_;
  std::map<std::uint64_t, std::weak_ptr<Pipeline>> pipelines_;  // by SPIR-V hash
  VkCommandPool once_pool_ = VK_NULL_HANDLE;
  std::atomic<bool> lost_{false};
};

// A full memory barrier between compute/transfer work in one command buffer.
void barrier(const Vk& vk, VkCommandBuffer cb);
// Makes device writes to host-visible memory readable by the host after the fence.
void host_barrier(const Vk& vk, VkCommandBuffer cb);

}  // namespace rlx::backends::vulkan
