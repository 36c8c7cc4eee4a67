#ifdef RLX_HAVE_VULKAN
#include "backends/vulkan/spirv.hpp"

#include <fmt/format.h>
#include <shaderc/shaderc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/code_cache.hpp"

namespace rlx::backends::vulkan {

namespace {

std::atomic<std::uint64_t> n_compiled{0}, n_disk{0}, n_memory{0};

struct MemoryCache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<std::uint32_t>> map;
};
MemoryCache& memory_cache() {
  static auto* c = new MemoryCache;
  return *c;
}

shaderc_compiler_t compiler() {
  static shaderc_compiler_t c = shaderc_compiler_initialize();  // compiles are thread-safe; never released
  return c;
}

bool valid_spirv(const std::vector<std::uint32_t>& w) { return w.size() >= 5 && w[0] == 0x07230203u; }

// SPIR-V from the disk cache; empty unless it is whole SPIR-V (a torn or foreign file is compiled again).
std::vector<std::uint32_t> read_spv(const std::filesystem::path& p) {
  const std::string bytes = runtime::read_code_file(p);
  if (bytes.empty() || bytes.size() % 4) return {};
  std::vector<std::uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return valid_spirv(words) ? words : std::vector<std::uint32_t>{};
}

void write_spv(const std::filesystem::path& p, const std::vector<std::uint32_t>& words) {
  runtime::write_code_file(p, std::string_view(reinterpret_cast<const char*>(words.data()), words.size() * 4));
}

std::string key_prefix() {
  unsigned version = 0, revision = 0;
  shaderc_get_spv_version(&version, &revision);
  return fmt::format("rlx-spirv-1|spv {}.{}|vulkan1.2|", version, revision);
}

}  // namespace

std::string cache_root() { return runtime::cache_dir().string(); }

std::string spirv_cache_dir() {
  auto root = cache_root();
  return root.empty() ? root : root + "/vulkan-spirv";
}

void forget_compiled_shaders() {
  auto& mc = memory_cache();
  std::lock_guard lock(mc.mu);
  mc.map.clear();
}

SpirvCacheStats spirv_cache_stats() { return {n_compiled.load(), n_disk.load(), n_memory.load()}; }

std::vector<std::uint32_t> compile_glsl(const std::string& source, std::string_view kernel, bool optimize) {
  static const std::string prefix = key_prefix();
  const std::string key = runtime::code_key(prefix + (optimize ? "O|" : "O0|") + source);
  auto& mc = memory_cache();
  {
    std::lock_guard lock(mc.mu);
    if (auto it = mc.map.find(key); it != mc.map.end()) {
      ++n_memory;
      return it->second;
    }
  }
  std::filesystem::path file;
  if (auto dir = spirv_cache_dir(); !dir.empty()) file = std::filesystem::path(dir) / (key + ".spv");
  std::vector<std::uint32_t> words;
  if (!file.empty()) words = read_spv(file);
  if (!words.empty()) {
    ++n_disk;
  } else {
    shaderc_compile_options_t opts = shaderc_compile_options_initialize();
    shaderc_compile_options_set_target_env(opts, shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_optimization_level(
        opts, optimize ? shaderc_optimization_level_performance : shaderc_optimization_level_zero);
    shaderc_compilation_result_t res = shaderc_compile_into_spv(
        compiler(), source.data(), source.size(), shaderc_compute_shader, "rlx_kernel.comp", "main", opts);
    shaderc_compile_options_release(opts);
    bool ok = shaderc_result_get_compilation_status(res) == shaderc_compilation_status_success;
    if (!ok) {
      std::string msg = shaderc_result_get_error_message(res);
      shaderc_result_release(res);
      throw Error(fmt::format("vulkan: the shader for kernel '{}' failed to compile:\n{}", kernel, msg));
    }
    const auto* bytes = reinterpret_cast<const std::uint32_t*>(shaderc_result_get_bytes(res));
    words.assign(bytes, bytes + shaderc_result_get_length(res) / 4);
    shaderc_result_release(res);
    ++n_compiled;
    if (!file.empty()) write_spv(file, words);
  }
  std::lock_guard lock(mc.mu);
  mc.map.emplace(key, words);
  return words;
}

}  // namespace rlx::backends::vulkan
#endif
