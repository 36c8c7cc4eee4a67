#pragma once
// The Vulkan entry points RLX uses, loaded at run time: libvulkan.so.1 is
// dlopen'ed and every function comes through vkGetInstanceProcAddr /
// vkGetDeviceProcAddr (VK_NO_PROTOTYPES), so librlx has no link-time
// dependency on a loader and a machine without one only loses this backend.
#include <vulkan/vulkan_core.h>

#include <string>

namespace rlx::backends::vulkan {

#define RLX_VK_GLOBAL(X) \
  X(vkCreateInstance)    \
  X(vkEnumerateInstanceVersion)

#define RLX_VK_INSTANCE(X)                    \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define RLX_VK_DEVICE(X)           \
  X(vkDestroyDevice)               \
  X(vkGetDeviceQueue)              \
  X(vkDeviceWaitIdle)              \
  X(vkCreateBuffer)                \
  X(vkDestroyBuffer)               \
  X(vkGetBufferMemoryRequirements) \
  X(vkAllocateMemory)              \
  X(vkFreeMemory)                  \
  X(vkBindBufferMemory)            \
  X(vkMapMemory)                   \
  X(vkUnmapMemory)                 \
  X(vkCreateShaderModule)          \
  X(vkDestroyShaderModule)         \
  X(vkCreateComputePipelines)      \
  X(vkDestroyPipeline)             \
  X(vkCreatePipelineLayout)        \
  X(vkDestroyPipelineLayout)       \
  X(vkCreateDescriptorSetLayout)   \
  X(vkDestroyDescriptorSetLayout)  \
  X(vkCreateDescriptorPool)        \
  X(vkDestroyDescriptorPool)       \
  X(vkAllocateDescriptorSets)      \
  X(vkUpdateDescriptorSets)        \
  X(vkCreateCommandPool)           \
  X(vkDestroyCommandPool)          \
  X(vkAllocateCommandBuffers)      \
  X(vkFreeCommandBuffers)          \
  X(vkBeginCommandBuffer)          \
  X(vkEndCommandBuffer)            \
  X(vkCmdBindPipeline)             \
  X(vkCmdBindDescriptorSets)       \
  X(vkCmdPushConstants)            \
  X(vkCmdDispatch)                 \
  X(vkCmdCopyBuffer)               \
  X(vkCmdFillBuffer)               \
  X(vkResetCommandPool)            \
  X(vkCmdPipelineBarrier)          \
  X(vkCmdWriteTimestamp)           \
  X(vkCmdResetQueryPool)           \
  X(vkCreateQueryPool)             \
  X(vkDestroyQueryPool)            \
  X(vkGetQueryPoolResults)         \
  X(vkQueueSubmit)                 \
  X(vkCreateFence)                 \
  X(vkDestroyFence)                \
  X(vkWaitForFences)               \
  X(vkResetFences)

struct Vk {
#define RLX_VK_MEMBER(name) PFN_##name name = nullptr;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  RLX_VK_GLOBAL(RLX_VK_MEMBER)
  RLX_VK_INSTANCE(RLX_VK_MEMBER)
  RLX_VK_DEVICE(RLX_VK_MEMBER)
#undef RLX_VK_MEMBER
};

// Opens the loader once per process and fills the global entry points. Returns
// an empty string on success, else why not ("no Vulkan loader (libvulkan.so.1): <dlerror>").
std::string load_loader(Vk& vk);
void load_instance(Vk& vk, VkInstance instance);
void load_device(Vk& vk, VkDevice device);

std::string_view result_name(VkResult r);
// Throws rlx::Error "vulkan: <what>: <VkResult>" unless r is VK_SUCCESS; out-of-memory
// and device-lost results get a sentence of their own.
void check(VkResult r, std::string_view what);

}  // namespace rlx::backends::vulkan
