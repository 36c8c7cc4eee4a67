#ifdef RLX_HAVE_VULKAN
#include "backends/vulkan/vk.hpp"

#include <dlfcn.h>

#include <mutex>

#include "rlx/error.hpp"

namespace rlx::backends::vulkan {

std::string load_loader(Vk& vk) {
  // The handle is never closed: function pointers into it live as long as the process.
  static void* handle = nullptr;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    handle = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      failure = std::string("no Vulkan loader (libvulkan.so.1): ") + (why ? why : "dlopen failed");
    }
  });
  if (!handle) return failure;
  vk.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(handle, "vkGetInstanceProcAddr"));
  if (!vk.vkGetInstanceProcAddr) return "the Vulkan loader has no vkGetInstanceProcAddr";
#define RLX_VK_LOAD(name) vk.name = reinterpret_cast<PFN_##name>(vk.vkGetInstanceProcAddr(nullptr, #name));
  RLX_VK_GLOBAL(RLX_VK_LOAD)
#undef RLX_VK_LOAD
  if (!vk.vkCreateInstance) return "the Vulkan loader has no vkCreateInstance";
  return {};
}

void load_instance(Vk& vk, VkInstance instance) {
#define RLX_VK_LOAD(name)                                                            \
  vk.name = reinterpret_cast<PFN_##name>(vk.vkGetInstanceProcAddr(instance, #name)); \
  if (!vk.name) throw Error("vulkan: the instance has no " #name);
  RLX_VK_INSTANCE(RLX_VK_LOAD)
#undef RLX_VK_LOAD
}

void load_device(Vk& vk, VkDevice device) {
#define RLX_VK_LOAD(name)                                                        \
  vk.name = reinterpret_cast<PFN_##name>(vk.vkGetDeviceProcAddr(device, #name)); \
  if (!vk.name) throw Error("vulkan: the device has no " #name);
  RLX_VK_DEVICE(RLX_VK_LOAD)
#undef RLX_VK_LOAD
}

std::string_view result_name(VkResult r) {
  switch (r) {
#define RLX_VK_RESULT(x) \
  case x: return #x;
    RLX_VK_RESULT(VK_SUCCESS)
    RLX_VK_RESULT(VK_NOT_READY)
    RLX_VK_RESULT(VK_TIMEOUT)
    RLX_VK_RESULT(VK_INCOMPLETE)
    RLX_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
    RLX_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    RLX_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
    RLX_VK_RESULT(VK_ERROR_DEVICE_LOST)
    RLX_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
    RLX_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
    RLX_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
    RLX_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
    RLX_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
    RLX_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
    RLX_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
    RLX_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
    RLX_VK_RESULT(VK_ERROR_UNKNOWN)
    RLX_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
#undef RLX_VK_RESULT
    default: return "VkResult(?)";
  }
}

void check(VkResult r, std::string_view what) {
  if (r == VK_SUCCESS) return;
  std::string msg = "vulkan: " + std::string(what) + ": " + std::string(result_name(r));
  if (r == VK_ERROR_DEVICE_LOST) msg += " (the device was lost: a kernel faulted or ran too long; recompile to retry)";
  throw Error(msg);
}

}  // namespace rlx::backends::vulkan
#endif
